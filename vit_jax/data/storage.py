"""The TFDS data dir as a place datasets are read from and prepared in.

Every fault of it (a file, no write access, a full disk, missing, damaged or truncated dataset
files) is one line naming the data dir and the cause, found before anything compiles where it can.
"""

import contextlib
import json
import os
import re
import shutil
import traceback
from typing import Any, Callable, Iterator, Sequence

from absl import logging
from array_record.python import array_record_module
from google.protobuf import json_format
import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core import file_adapters
from tensorflow_datasets.core.proto import dataset_info_pb2

from vit_jax.workdir import disk_writes

TFDS_DATA_DIR = 'TFDS_DATA_DIR'
DATA_DIR_FLAG = '--data_dir'  # How a command that reads a run names a data dir of the user's.
# Inside `runs_read_only` (a command that reads runs): data dirs read and never prepared in ->
# who named them. A run's config.json is data from anyone, and reading it writes nowhere it names.
_READ_ONLY: dict[str, str] | None = None


@contextlib.contextmanager
def runs_read_only() -> Iterator[None]:
  """The scope (a command's) in which the data dirs that runs name are read only (`read_only`)."""
  global _READ_ONLY
  _READ_ONLY = {}
  try:
    yield
  finally:
    _READ_ONLY = None


def read_only(data_dir: str | None, named_by: str) -> None:
  """Inside `runs_read_only`: makes `data_dir` one datasets are read from and never prepared in,
  since `named_by` (a run's config.json), not the user, names it."""
  if data_dir and _READ_ONLY is not None:
    _READ_ONLY[os.path.abspath(os.path.expanduser(data_dir))] = named_by


def check_location(data_dir: str | None) -> None:
  """ValueError of one line where the data dir (`data_dir`, else `$TFDS_DATA_DIR`) is a file or
  lies under one: TFDS would stop with a traceback at its first directory."""
  given = data_dir or os.environ.get(TFDS_DATA_DIR)
  if not given or '://' in given:
    return
  named = f'data_dir={given}' if data_dir else f'{TFDS_DATA_DIR}={given}'
  path = os.path.abspath(os.path.expanduser(given))
  existing = disk_writes.existing_parent(path)
  if os.path.isdir(existing):
    return
  why = 'is a file, not a directory' if existing == path else f'lies under the file {existing}'
  raise ValueError(
      f'{named} {why}: name the folder where datasets are prepared (it is created if missing).'
  )


def _needs(what: str) -> str:
  return f'write access and room, as the data_dir where {what} is prepared'


def check_writable(data_dir: str, what: str) -> None:
  """`workdir.Unwritable`'s one line unless `what` can be prepared in `data_dir`; ValueError
  where `data_dir` is `read_only`."""
  named_by = (_READ_ONLY or {}).get(os.path.abspath(os.path.expanduser(str(data_dir))))
  if named_by is not None:
    raise ValueError(
        f'{what} is not prepared in data_dir={data_dir}, which {named_by} names; reading a run '
        f'prepares nothing where it points. Give {DATA_DIR_FLAG}=DIR, a folder of yours to '
        'read and prepare datasets in.'
    )
  disk_writes.check_writable(str(data_dir), _needs(what), directory=True)


def check_preparable(builder: tfds.core.DatasetBuilder, name: str) -> None:
  """`check_writable` for a TFDS dataset that is not prepared yet, before its download starts."""
  if not builder.is_prepared():
    check_writable(str(builder.data_dir_root), f'dataset {name!r}')


@contextlib.contextmanager
def writing(data_dir: str, what: str, partial: Callable[[], Sequence[str]]) -> Iterator[None]:
  """A write refused while `what` is written into `data_dir` (a full or read-only disk) removes
  the paths `partial()` names, so that no later run trusts them, and is raised as one line."""
  try:
    yield
  except Exception as e:  # OSError, or a library's own error type. pylint: disable=broad-except
    refusal: disk_writes.Unwritable | None
    if isinstance(e, disk_writes.Unwritable):  # A nested write's, said already.
      refusal = e
    elif isinstance(e, ValueError):  # Bad input (an image that does not decode), named already.
      raise
    else:
      refusal = disk_writes.unwritable(e, str(data_dir), _needs(what))
    if refusal is None:
      raise
    removed = [path for path in partial() if _remove(path)]
    note = f' Removed what was half written: {", ".join(removed)}.' if removed else ''
    raise disk_writes.Unwritable(f'{refusal}{note}') from None


def _remove(path: str) -> bool:
  """Removes a file or directory tree; whether there was one."""
  if os.path.isdir(path):
    shutil.rmtree(path, ignore_errors=True)
    return True
  if os.path.lexists(path):
    os.remove(path)
    return True
  return False


def preparation_leftovers(builder: tfds.core.DatasetBuilder) -> list[str]:
  """What preparing `builder` writes: its version directory, TFDS's `incomplete.*` directories
  beside it and the lock file beside the dataset's directory (`folder.preparing`)."""
  version_dir = str(builder.data_dir)
  dataset_dir = os.path.dirname(version_dir)
  incomplete = (
      [os.path.join(dataset_dir, n) for n in os.listdir(dataset_dir) if n.startswith('incomplete.')]
      if os.path.isdir(dataset_dir)
      else []
  )
  return [version_dir, *incomplete, f'{dataset_dir}.lock']


def missing_files(builder: tfds.core.DatasetBuilder) -> list[str]:
  """The data files that a prepared `builder`'s metadata lists, in every format it registers,
  and that are not there (deleted, or lost in a copy)."""
  if '://' in str(builder.data_dir) or not builder.is_prepared():
    return []  # An object store: thousands of requests, and its reads name a missing file.
  info = builder.info
  formats = {info.file_format or file_adapters.DEFAULT_FILE_FORMAT}
  formats |= {
      file_adapters.FileFormat.from_value(v) for v in info.as_proto.alternative_file_formats
  }
  missing = []
  for split in info.splits.values():
    for fmt in sorted(formats, key=lambda f: f.value):
      template = split.filename_template.replace(filetype_suffix=fmt.file_suffix)
      for path in template.sharded_filepaths(len(split.shard_lengths)):
        if not path.exists():
          missing.append(str(path))
  return missing


def remove_if_incomplete(builder: tfds.core.DatasetBuilder, what: str) -> bool:
  """Removes the prepared `builder` whose files are not all there, to be prepared again from its
  source; whether it did. Called under the preparation lock."""
  missing = missing_files(builder)
  if not missing:
    return False
  logging.warning(
      'The prepared data of %s in %s lacks %d of the files its metadata lists (%s); preparing '
      'it again.',
      what,
      builder.data_dir,
      len(missing),
      ', '.join(os.path.basename(p) for p in missing),
  )
  shutil.rmtree(str(builder.data_dir), ignore_errors=True)
  return True


def check_complete(builder: tfds.core.DatasetBuilder, name: str) -> None:
  """ValueError of one line naming the files that a prepared dataset's metadata lists and that
  are gone: training would stop with a traceback at the first batch read from one."""
  missing = missing_files(builder)
  if missing:
    raise ValueError(
        f'Dataset {name!r} prepared in {builder.data_dir} lacks {len(missing)} of the files its '
        f'dataset_info.json lists: {", ".join(missing)}. Restore them, or remove '
        f'{builder.data_dir} and prepare it again (`tfds build {builder.name} '
        f'--data_dir={builder.data_dir_root} --file_format=array_record`).'
    )


def _prepare_again(builder: tfds.core.DatasetBuilder) -> str:
  """How to replace a damaged prepared `builder`: the digits and image folders prepare themselves
  again once their directory is gone; a TFDS dataset is built again."""
  if type(builder).__module__.startswith('vit_jax.'):
    return f'remove {builder.data_dir} and the next run prepares it again'
  return (
      f'remove {builder.data_dir} and prepare it again (`tfds build {builder.name} '
      f'--data_dir={builder.data_dir_root} --file_format=array_record`)'
  )


def _damaged(builder: tfds.core.DatasetBuilder, path: str, why: str) -> ValueError:
  return ValueError(
      f'Dataset {builder.name!r} prepared in {builder.data_dir} has a damaged file {path} '
      f'({why}): {_prepare_again(builder)}.'
  )


def _corruption(error: Exception) -> str:
  """The first clause of array_record's error, without its checksums (its byte offsets follow)."""
  first = (str(error).strip().splitlines() or [type(error).__name__])[0].split(';')[0]
  return re.sub(r' \(computed \w+, stored \w+\)', '', first)


def _array_record_files(builder: tfds.core.DatasetBuilder) -> list[str]:
  """The ArrayRecord files that a prepared `builder`'s metadata lists."""
  fmt = file_adapters.FileFormat.ARRAY_RECORD
  if fmt not in builder.info.available_file_formats():
    return []
  return [
      str(path)
      for split in builder.info.splits.values()
      for path in split.filename_template.replace(
          filetype_suffix=fmt.file_suffix
      ).sharded_filepaths(len(split.shard_lengths))
  ]


def _open_error(path: str) -> str | None:
  """Why array_record cannot open `path` (a truncated file: its footer does not check out), or
  None where it can."""
  try:
    array_record_module.ArrayRecordReader(path, 'readahead_buffer_size:0').close()
  except RuntimeError as e:
    return _corruption(e)
  return None


_READABLE: set[str] = set()  # Version directories whose ArrayRecord files all opened.


def check_readable(builder: tfds.core.DatasetBuilder) -> None:
  """ValueError of one line naming an ArrayRecord file of a prepared `builder` that does not open
  (truncated, or its footer corrupted): training would stop with a traceback at the first record
  read from it. Opening reads a file's footer and index only; once per directory and process."""
  version_dir = str(builder.data_dir)
  if '://' in version_dir or version_dir in _READABLE or not builder.is_prepared():
    return  # An object store: thousands of requests; a corrupted record is named when read.
  for path in _array_record_files(builder):
    why = _open_error(path)
    if why is not None:
      raise _damaged(builder, path, why)
  _READABLE.add(version_dir)


def damaged_records(
    builder: tfds.core.DatasetBuilder, split: Any, keys: Sequence[int]
) -> ValueError:
  """The ValueError of one line for a read of records `keys` of `split` that array_record
  refused: it names the file that holds a record that does not read (each file is read again
  alone to find it)."""
  instructions = builder.info.splits[split].file_instructions
  starts = np.cumsum([0] + [i.take for i in instructions])
  positions: dict[str, list[int]] = {}
  for key in keys:
    index = int(np.searchsorted(starts, key, side='right')) - 1
    instruction = instructions[index]
    positions.setdefault(instruction.filename, []).append(instruction.skip + key - starts[index])
  for path, wanted in positions.items():
    why = _open_error(path)
    if why is None:
      try:
        reader = array_record_module.ArrayRecordReader(path, 'readahead_buffer_size:0')
        reader.read(wanted)
        reader.close()
      except RuntimeError as e:
        why = _corruption(e)
    if why is not None:
      return _damaged(builder, path, why)
  return _damaged(builder, ', '.join(positions), 'a record does not read')


def _info_error(path: str) -> str | None:
  """Why TFDS cannot read the dataset_info.json `path` (not JSON, not an object, fields TFDS does
  not know), or None where it can."""
  try:
    with open(path, encoding='utf-8') as f:
      info = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    return f'not JSON: {e}'
  if not isinstance(info, dict):
    return f'a JSON {type(info).__name__}, not an object'
  try:
    json_format.ParseDict(info, dataset_info_pb2.DatasetInfo())
  except json_format.ParseError as e:
    return f'not dataset metadata: {_corruption(e)}'
  return None


def damaged_info(error: BaseException) -> ValueError | None:
  """The ValueError of one line for `error`, raised where TFDS read a prepared dataset's
  dataset_info.json while creating its builder, where that file is damaged; None otherwise."""
  for frame, _ in traceback.walk_tb(error.__traceback__):
    builder = frame.f_locals.get('self')
    if isinstance(builder, tfds.core.DatasetBuilder) and hasattr(builder, '_data_dir'):
      path = os.path.join(str(builder.data_dir), 'dataset_info.json')
      why = _info_error(path)
      if why is not None:
        return _damaged(builder, path, why)
  return None
