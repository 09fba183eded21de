"""Your own images as a dataset: `config.dataset = 'folder:/path/to/images'`.

The folder holds one directory per split and, inside each, one directory per class:

  /path/to/images/train/<class>/*.{jpg,jpeg,png}
  /path/to/images/test/<class>/*.{jpg,jpeg,png}

Sub-folders of a class directory hold its images too (as torchvision's `ImageFolder` reads them);
classes are the sorted class-directory names, the same in every split. On first use the images are
copied, still encoded, into an ArrayRecord TFDS dataset keyed by a fingerprint of the folder's file
names, sizes and modification times (an edited folder is prepared afresh). Every image is decoded
once first, so that a file that does not decode stops preparation, not a run at whatever step
reads it; `skip_unreadable=True` leaves such files out instead (a separate dataset).
"""

import collections
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import logging as std_logging
import os
import shutil
from typing import Iterator, Mapping
import warnings

from absl import logging
from PIL import Image as pil_image
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax.data import convert
from vit_jax.data import storage
from vit_jax.workdir import disk_writes

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')
_LAYOUT = '<root>/<split>/<class>/*.jpg|*.jpeg|*.png, e.g. <root>/train/cat/1.jpg'
_STRAY_NAMED = 5  # Files beside the class directories named in the warning; the rest counted.


@dataclasses.dataclass(eq=False, repr=False)
class FolderConfig(tfds.core.BuilderConfig):
  """A scanned image folder: root, classes, files per split, common image shape, unreadable files."""

  root: str = ''
  classes: tuple[str, ...] = ()
  files: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()  # (split, ((class, path), ...))
  image_shape: tuple[int | None, int | None, int] = (None, None, 3)
  unreadable: tuple[tuple[str, str], ...] = ()  # ((path, reason), ...)

  def __repr__(self) -> str:  # Not every file path, as the dataclass's would list.
    count = sum(len(files) for _, files in self.files)
    return f'FolderConfig({self.root}: {count} images in {len(self.classes)} classes, {self.name})'


def _not_tfds_folder_config_line(record: std_logging.LogRecord) -> bool:
  """Drops TFDS's 'Using custom data configuration: <config>' for image folders (`prepare` logs
  the folder's name, image count and fingerprint once instead)."""
  return not (
      record.msg == 'Using custom data configuration: %s'
      and isinstance(record.args, tuple)
      and len(record.args) == 1
      and isinstance(record.args[0], FolderConfig)
  )


logging.get_absl_logger().addFilter(_not_tfds_folder_config_line)
_reported: set[str] = set()  # Folders whose description (and left-out formats) this process logged.


# Folders that archivers add beside the data (macOS's zip keeps resource forks in one).
_NOT_DATA = ('__MACOSX',)
_DESCRIPTION = 'Images under {root}.'  # A prepared folder's description: names its root.


def _is_data(name: str) -> bool:
  return not name.startswith('.') and name not in _NOT_DATA


def _list_dirs(path: str) -> list[str]:
  return sorted(
      name
      for name in os.listdir(path)
      if os.path.isdir(os.path.join(path, name)) and _is_data(name)
  )


def _files_under(class_dir: str) -> list[str]:
  """The files in `class_dir` and, as torchvision's `ImageFolder` takes them, in its sub-folders
  at any depth (hidden and `__MACOSX` ones apart), relative to it."""
  found, seen = [], {os.path.realpath(class_dir)}
  for folder, dirs, names in os.walk(class_dir, followlinks=True):
    dirs[:] = sorted(
        d
        for d in dirs
        if _is_data(d) and os.path.realpath(os.path.join(folder, d)) not in seen  # Links up: once.
    )
    seen.update(os.path.realpath(os.path.join(folder, d)) for d in dirs)
    relative = os.path.relpath(folder, class_dir)
    found += [os.path.normpath(os.path.join(relative, name)) for name in names]
  return found


def _warn_of_files_beside_classes(root: str, splits: list[str]) -> None:
  """Logs one warning naming the files that lie directly in split directories, beside the class
  directories, where no class claims them (hidden files apart)."""
  stray = [
      os.path.join(split, name)
      for split in splits
      for name in sorted(os.listdir(os.path.join(root, split)))
      if not name.startswith('.') and not os.path.isdir(os.path.join(root, split, name))
  ]
  if not stray or root in _reported:
    return
  shown = ', '.join(stray[:_STRAY_NAMED]) + (
      f' and {len(stray) - _STRAY_NAMED} more' if len(stray) > _STRAY_NAMED else ''
  )
  logging.warning(
      'Image folder %s: left out %d file(s) lying directly in a split directory, outside every '
      'class directory (%s); move images into their class directory to use them.',
      root,
      len(stray),
      shown,
  )


def check_splits(root: str, splits: Mapping[str, str]) -> None:
  """Raises ValueError, before the folder is scanned or prepared, where a split that `splits`
  names ({flag: split spec}, e.g. {'--config.eval_split': 'test[:50%]'}) has no directory."""
  root = os.path.abspath(os.path.expanduser(root))
  known = _list_dirs(root) if os.path.isdir(root) else []
  if not known:  # No folder or no splits at all: `scan` says so.
    return
  for flag, spec in splits.items():
    for part in spec.split('+'):
      base = part.split('[')[0].strip()
      if base in known:
        continue
      if flag.endswith('train_split'):
        example = known[0]
      else:
        example = f"{'train' if 'train' in known else known[0]}[:10%]"
      raise ValueError(
          f'Image folder {root!r} has no {base}/ directory, which {flag}={spec!r} names (its '
          f'split directories: {known}): add {base}/ with the same class directories, or set '
          f'{flag} to a split it has, e.g. {flag}={example!r}.'
      )


def scan(root: str, skip_unreadable: bool = False) -> FolderConfig:
  """Checks the folder layout and returns its description (`skip_unreadable` is part of its
  fingerprint); ValueError on any problem."""
  root = os.path.abspath(os.path.expanduser(root))
  if not os.path.isdir(root):
    raise ValueError(f'Image folder {root!r} does not exist; expected the layout {_LAYOUT}.')
  splits = _list_dirs(root)
  if not splits:
    raise ValueError(f'Image folder {root!r} has no split directories; expected {_LAYOUT}.')
  classes_of = {split: _list_dirs(os.path.join(root, split)) for split in splits}
  for split, classes in classes_of.items():
    if not classes:
      raise ValueError(
          f'Split directory {os.path.join(root, split)!r} has no class '
          f'directories; expected {_LAYOUT}.'
      )
  _warn_of_files_beside_classes(root, splits)
  reference_split = splits[0]
  classes = classes_of[reference_split]
  unprintable = [name for name in classes if not name.isprintable()]
  if unprintable:
    raise ValueError(
        f'Image folder {root!r}: class directories {unprintable} have names with line breaks or '
        'other control characters, which no output can show as one name; rename them.'
    )
  for split in splits[1:]:
    if classes_of[split] != classes:
      only_here = sorted(set(classes_of[split]) - set(classes))
      only_there = sorted(set(classes) - set(classes_of[split]))
      raise ValueError(
          f'Image folder {root!r}: splits {reference_split!r} and {split!r} have different '
          f'classes (only in {split!r}: {only_here}; only in {reference_split!r}: {only_there}).'
      )
  files, sizes, fingerprint = [], set(), hashlib.sha256()
  unreadable: list[tuple[str, str]] = []
  other_formats: collections.Counter[str] = collections.Counter()
  for split in splits:
    split_files = []
    for name in classes:
      class_dir = os.path.join(root, split, name)
      names = _files_under(class_dir)
      paths = sorted(
          os.path.join(class_dir, f) for f in names if f.lower().endswith(IMAGE_EXTENSIONS)
      )
      other_formats.update(
          os.path.splitext(f)[1].lower() or os.path.basename(f)
          for f in names
          if not f.lower().endswith(IMAGE_EXTENSIONS) and not os.path.basename(f).startswith('.')
      )
      if not paths:
        raise ValueError(
            f'Class directory {class_dir!r} holds no images (extensions '
            f'{IMAGE_EXTENSIONS}); every class needs at least one per split.'
        )
      for path in paths:
        try:
          stat = os.stat(path)
        except OSError as error:  # A link to nothing, a file gone since the listing.
          unreadable.append((path, f'not readable ({error.strerror})'))
          continue
        size = _image_size(path)
        fingerprint.update(
            f'{os.path.relpath(path, root)}\0{stat.st_size}\0' f'{stat.st_mtime_ns}\n'.encode()
        )
        if isinstance(size, str):
          unreadable.append((path, size))
          continue
        sizes.add(size)
        split_files.append((name, path))
    files.append((split, tuple(split_files)))
  if unreadable and not skip_unreadable:
    raise _cannot_train_on(root, unreadable)
  if other_formats and root not in _reported:
    logging.warning(
        'Image folder %s: left out %d file(s) of formats the pipeline does not read '
        '(%s); only %s are read: convert them to use them.',
        root,
        sum(other_formats.values()),
        ', '.join(f'{ext}: {n}' for ext, n in sorted(other_formats.items())),
        '/'.join(IMAGE_EXTENSIONS),
    )
  width, height = next(iter(sizes)) if len(sizes) == 1 else (None, None)
  fingerprint.update(root.encode() + (b'\0skip_unreadable' if skip_unreadable else b''))
  return FolderConfig(
      name=f'f{fingerprint.hexdigest()[:16]}',
      description=_DESCRIPTION.format(root=root),
      root=root,
      classes=tuple(classes),
      files=tuple(files),
      image_shape=(height, width, 3),
      unreadable=tuple(unreadable),
  )


def _image_size(path: str) -> tuple[int, int] | str:
  """(width, height) of an image training can read, else why it cannot, from its header (PIL)."""
  if os.path.basename(path).startswith('._'):
    return 'an AppleDouble resource fork (macOS metadata), not an image'
  try:
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', pil_image.DecompressionBombWarning)  # Said below instead.
      with pil_image.open(path) as image:
        kind, size = image.format, image.size
  except pil_image.DecompressionBombError as error:
    return f'a decompression bomb: {error}'
  except OSError as error:
    return f'not a readable image ({error})'
  if kind not in ('JPEG', 'PNG'):
    return f'a {kind} named {os.path.splitext(path)[1]}, which training does not decode'
  limit = pil_image.MAX_IMAGE_PIXELS  # None: PIL's check turned off.
  if limit is not None and size[0] * size[1] > limit:
    return (
        f'{size[0]}x{size[1]} pixels, more than the {limit:,} '
        'beyond which decoding is treated as a decompression bomb'
    )
  return size


def _cannot_train_on(root: str, failures: list[tuple[str, str]]) -> ValueError:
  listing = '; '.join(f'{path} ({reason})' for path, reason in failures)
  return ValueError(
      f'{len(failures)} file(s) in the image folder {root!r} cannot be decoded: '
      f'{listing}. Repair or remove them, or set '
      '--config.skip_unreadable_images=true to train without them.'
  )


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
        features=tfds.features.FeaturesDict(
            {
                'image': tfds.features.Image(shape=config.image_shape),
                'label': tfds.features.ClassLabel(names=config.classes),
                'filename': tfds.features.Text(),
            }
        ),
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
  failures = list(config.unreadable) + [
      (path, reason)
      for _, files in config.files
      for _, path in files
      if (reason := _decode_error(path)) is not None
  ]
  if not failures:
    return config
  if not skip_unreadable:
    raise _cannot_train_on(config.root, failures)
  for path, reason in failures:
    logging.warning('Leaving out %s, which cannot be decoded (%s).', path, reason)
  bad = {path for path, _ in failures}
  files = tuple(
      (split, tuple((name, path) for name, path in split_files if path not in bad))
      for split, split_files in config.files
  )
  return dataclasses.replace(config, files=files)


def prepare(
    root: str,
    data_dir: str | None = None,
    *,
    skip_unreadable: bool = False,
    splits: Mapping[str, str] | None = None,
) -> tfds.core.DatasetBuilder:
  """The builder for the image folder `root`, prepared under `data_dir` on first use, after
  `check_splits(root, splits)`."""
  check_splits(root, splits or {})
  config = scan(root, skip_unreadable)
  builder = Folder(config=config, data_dir=data_dir)
  if not builder.is_prepared() or storage.missing_files(builder):
    what = f'the image folder {config.root}'
    storage.check_writable(builder.data_dir_root, what)
    leftovers = functools.partial(storage.preparation_leftovers, builder)
    with storage.writing(builder.data_dir_root, what, leftovers), preparing(builder):
      # Another process may have prepared it meanwhile: look again.
      builder = Folder(config=config, data_dir=data_dir)
      if storage.remove_if_incomplete(builder, what):
        builder = Folder(config=config, data_dir=data_dir)
      if not builder.is_prepared():
        _remove_incomplete(builder)
        builder = Folder(config=_without_undecodable(config, skip_unreadable), data_dir=data_dir)
        builder.download_and_prepare(file_format=convert.ARRAY_RECORD)
        _name_earlier_copies(builder, config.root)
      convert.add_array_record(builder)  # A folder prepared as TFRecord by an earlier version.
  if config.root not in _reported:
    _reported.add(config.root)
    logging.info(
        'Image folder %s: %d images in %d classes (%s), prepared as %s.',
        config.root,
        sum(len(files) for _, files in config.files),
        len(config.classes),
        ', '.join(f'{split} {len(files)}' for split, files in config.files),
        builder.data_dir,
    )
  return builder


def _name_earlier_copies(builder: tfds.core.DatasetBuilder, root: str) -> None:
  """Warns of the copies prepared from `root` before it changed (other fingerprints beside the
  one `builder` just prepared): they are no longer read, and take space until removed."""
  folders = os.path.dirname(os.path.dirname(str(builder.data_dir)))
  earlier = []
  for name in sorted(os.listdir(folders)):
    info = os.path.join(folders, name, str(builder.version), 'dataset_info.json')
    if name == builder.builder_config.name or not os.path.isfile(info):
      continue
    try:
      with open(info, encoding='utf-8') as f:
        described = json.load(f).get('configDescription')
    except (OSError, ValueError, AttributeError):
      continue
    if described == _DESCRIPTION.format(root=root):
      earlier.append(os.path.join(folders, name))
  if earlier:
    size = sum(
        os.path.getsize(os.path.join(folder, file))
        for path in earlier
        for folder, _, files in os.walk(path)
        for file in files
    )
    logging.warning(
        'Image folder %s changed since it was prepared: its earlier copies, no longer read, '
        'remain at %s (%s); remove them to free the space.',
        root,
        ', '.join(earlier),
        disk_writes.size_words(size),
    )


@contextlib.contextmanager
def preparing(builder: tfds.core.DatasetBuilder) -> Iterator[None]:
  """Holds the lock beside a dataset's directory (`<data_dir>/folder/<fingerprint>.lock`,
  `<data_dir>/digits.lock`): one process prepares it while the others (of one run, or of runs on
  the same data) wait."""
  dataset_dir = os.path.dirname(builder.data_dir)
  os.makedirs(os.path.dirname(dataset_dir), exist_ok=True)
  with open(f'{dataset_dir}.lock', 'a', encoding='utf-8') as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      logging.info(
          'Waiting for another process preparing %s (lock %s.lock).',
          getattr(builder.builder_config, 'root', builder.name),
          dataset_dir,
      )
      fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _remove_incomplete(builder: tfds.core.DatasetBuilder) -> None:
  """Removes what a killed preparation left (TFDS's `incomplete.*` directories); called under
  the lock, so no live process is writing them."""
  dataset_dir = os.path.dirname(builder.data_dir)
  if not os.path.isdir(dataset_dir):
    return
  for name in os.listdir(dataset_dir):
    if name.startswith('incomplete.'):
      logging.warning(
          'Removing %s, left by a preparation that was stopped.', os.path.join(dataset_dir, name)
      )
      shutil.rmtree(os.path.join(dataset_dir, name), ignore_errors=True)
