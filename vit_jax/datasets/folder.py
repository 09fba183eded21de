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
"""

import dataclasses
import hashlib
import os

from PIL import Image as pil_image
import tensorflow_datasets as tfds

from vit_jax.datasets import convert

PREFIX = 'folder:'
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


def scan(root: str) -> FolderConfig:
  """Checks the folder layout and returns its description; ValueError on any problem."""
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
  fingerprint.update(root.encode())
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


def prepare(root: str, data_dir: str | None = None) -> tfds.core.DatasetBuilder:
  """The builder for the image folder `root`, prepared under `data_dir` on first use."""
  builder = Folder(config=scan(root), data_dir=data_dir)
  if not builder.is_prepared():
    builder.download_and_prepare(file_format=convert.ARRAY_RECORD)
  convert.add_array_record(builder)  # A folder prepared as TFRecord by an earlier version.
  return builder
