"""Your own images as a dataset: `config.dataset = 'folder:/path/to/images'`.

The folder holds one directory per split and, inside each, one directory per class:

  /path/to/images/train/<class>/*.{jpg,jpeg,png}
  /path/to/images/test/<class>/*.{jpg,jpeg,png}

Classes are the sorted class-directory names, which must be the same in every split. On first use
the images are copied, still encoded, into a TFDS dataset under the TFDS data dir, keyed by a
fingerprint of the folder's file names, sizes and modification times (so an edited folder is
prepared afresh). They are stored as ArrayRecord, which training reads by example index (exact
resume in constant time, however large the folder), and from there take the same `tfds` ->
`tf.data` path as every other dataset. Grayscale and RGBA images are decoded to RGB.

Before the copy every image is decoded once, by the decoder training uses (`tf.io.decode_image`):
a file that does not decode (truncated, corrupt, not really an image) would otherwise stop the
run at whatever step reads it. Such files are named in one error, or, with
`skip_unreadable=True` (config field `skip_unreadable_images`), left out with a warning naming
each; the two settings prepare separate datasets.
"""

import dataclasses
import hashlib
import os

from absl import logging
from PIL import Image as pil_image
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax import datasets
from vit_jax.datasets import convert

PREFIX = datasets.FOLDER_PREFIX
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')
_LAYOUT = '<root>/<split>/<class>/*.jpg|*.jpeg|*.png, e.g. <root>/train/cat/1.jpg'


@dataclasses.dataclass(eq=False)
class FolderConfig(tfds.core.BuilderConfig):
  """A scanned image folder: its root, classes, files per split and common image shape."""
  root: str = ''
  classes: tuple[str, ...] = ()
  files: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()  # (split, ((class, path), ...))
  image_shape: tuple[int | None, int | None, int] = (None, None, 3)


def _list_dirs(path: str) -> list[str]:
  return sorted(name for name in os.listdir(path)
                if os.path.isdir(os.path.join(path, name)) and not name.startswith('.'))


def scan(root: str, skip_unreadable: bool = False) -> FolderConfig:
  """Checks the folder layout and returns its description; ValueError on any problem.

  `skip_unreadable` is part of the fingerprint: a dataset prepared without the files that do
  not decode is not the one prepared with all of them.
  """
  root = os.path.abspath(os.path.expanduser(root))
  if not os.path.isdir(root):
    raise ValueError(f'Image folder {root!r} does not exist; expected the layout {_LAYOUT}.')
  splits = _list_dirs(root)
  if not splits:
    raise ValueError(f'Image folder {root!r} has no split directories; expected {_LAYOUT}.')
  classes_of = {split: _list_dirs(os.path.join(root, split)) for split in splits}
  for split, classes in classes_of.items():
    if not classes:
      raise ValueError(f'Split directory {os.path.join(root, split)!r} has no class '
                       f'directories; expected {_LAYOUT}.')
  reference_split = splits[0]
  classes = classes_of[reference_split]
  for split in splits[1:]:
    if classes_of[split] != classes:
      only_here = sorted(set(classes_of[split]) - set(classes))
      only_there = sorted(set(classes) - set(classes_of[split]))
      raise ValueError(
          f'Image folder {root!r}: splits {reference_split!r} and {split!r} have different '
          f'classes (only in {split!r}: {only_here}; only in {reference_split!r}: {only_there}).')
  files, sizes, fingerprint = [], set(), hashlib.sha256()
  for split in splits:
    split_files = []
    for name in classes:
      class_dir = os.path.join(root, split, name)
      paths = sorted(os.path.join(class_dir, f) for f in os.listdir(class_dir)
                     if f.lower().endswith(IMAGE_EXTENSIONS))
      if not paths:
        raise ValueError(f'Class directory {class_dir!r} holds no images (extensions '
                         f'{IMAGE_EXTENSIONS}); every class needs at least one per split.')
      for path in paths:
        try:
          with pil_image.open(path) as image:
            sizes.add(image.size)
        except OSError as error:
          raise ValueError(f'{path!r} is not a readable image: {error}') from None
        stat = os.stat(path)
        fingerprint.update(f'{os.path.relpath(path, root)}\0{stat.st_size}\0'
                           f'{stat.st_mtime_ns}\n'.encode())
        split_files.append((name, path))
    files.append((split, tuple(split_files)))
  width, height = next(iter(sizes)) if len(sizes) == 1 else (None, None)
  fingerprint.update(root.encode() + (b'\0skip_unreadable' if skip_unreadable else b''))
  return FolderConfig(
      name=f'f{fingerprint.hexdigest()[:16]}', description=f'Images under {root}.', root=root,
      classes=tuple(classes), files=tuple(files), image_shape=(height, width, 3))


class Folder(tfds.core.GeneratorBasedBuilder):
  """A folder of JPEG/PNG images, one directory per split and class (see the module docstring)."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Encoded images copied from <root>/<split>/<class>/.'}
  # Nothing is downloaded, so there are no URL checksums to look up beside the module.
  url_infos = None

  def _info(self) -> tfds.core.DatasetInfo:
    config = self.builder_config
    return tfds.core.DatasetInfo(
        builder=self,
        description=config.description,
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=config.image_shape),
            'label': tfds.features.ClassLabel(names=config.classes),
            'filename': tfds.features.Text(),
        }),
        supervised_keys=('image', 'label'),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # The images are local.
    return {split: self._generate_examples(files) for split, files in self.builder_config.files}

  def _generate_examples(self, files):
    root = self.builder_config.root
    for name, path in files:
      relative = os.path.relpath(path, root)
      yield relative, {'image': path, 'label': name, 'filename': relative}


def _decode_error(path: str) -> str | None:
  """Why `path` does not decode as training decodes it, or None if it does."""
  try:
    tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
    return (error.message.strip().splitlines() or ['cannot be decoded'])[0]
  return None


def _without_undecodable(config: FolderConfig, skip_unreadable: bool) -> FolderConfig:
  """`config` with every file decoded once; ValueError naming those that fail, unless skipping."""
  failures = [(path, reason) for _, files in config.files for _, path in files
              if (reason := _decode_error(path)) is not None]
  if not failures:
    return config
  listing = '; '.join(f'{path} ({reason})' for path, reason in failures)
  if not skip_unreadable:
    raise ValueError(f'{len(failures)} file(s) in the image folder {config.root!r} cannot be '
                     f'decoded: {listing}. Repair or remove them, or set '
                     '--config.skip_unreadable_images=true to train without them.')
  for path, reason in failures:
    logging.warning('Leaving out %s, which cannot be decoded (%s).', path, reason)
  bad = {path for path, _ in failures}
  files = tuple((split, tuple((name, path) for name, path in split_files if path not in bad))
                for split, split_files in config.files)
  return dataclasses.replace(config, files=files)


def prepare(root: str, data_dir: str | None = None, *,
            skip_unreadable: bool = False) -> tfds.core.DatasetBuilder:
  """The builder for the image folder `root`, prepared under `data_dir` on first use.

  Preparing decodes every image once (see the module docstring for files that do not decode).
  """
  config = scan(root, skip_unreadable)
  builder = Folder(config=config, data_dir=data_dir)
  if not builder.is_prepared():
    builder = Folder(config=_without_undecodable(config, skip_unreadable), data_dir=data_dir)
    builder.download_and_prepare(file_format=convert.ARRAY_RECORD)
  convert.add_array_record(builder)  # A folder prepared as TFRecord by an earlier version.
  return builder
