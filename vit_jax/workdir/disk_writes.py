"""Writes to the disk: a write the file system refuses, worded in one line, and files written whole.

`writing(path, needs)` turns a refused write into `Unwritable`, naming the path, why and what the
write needs; `check_writable` asks before the work that ends in the write.
"""

import contextlib
import errno
import os
import shutil
import tempfile
from typing import Iterator, Sequence


class Unwritable(ValueError):
  """The work directory (or another output) refused a write: the device is full, read-only, or not
  ours to write."""


# errno of a refused write, and how tensorstore words the same (it raises ValueError, not OSError).
_REFUSALS = {
    errno.ENOSPC: 'no space left on the device',
    errno.EDQUOT: 'the disk quota is used up',
    errno.EROFS: 'the file system is read-only',
    errno.EACCES: 'permission denied',
    errno.EPERM: 'permission denied',
    errno.EFBIG: "a file would pass this process's file size limit (`ulimit -f`)",
}
_REFUSAL_TEXTS = {
    'No space left on device': errno.ENOSPC,
    "os_error_code='28'": errno.ENOSPC,
    'Disk quota exceeded': errno.EDQUOT,
    'Read-only file system': errno.EROFS,
    'Permission denied': errno.EACCES,
    'File too large': errno.EFBIG,
}


def refused_write(error: BaseException) -> int | None:
  """The errno of a write refusal anywhere in `error`'s chain (OSError or tensorstore's text)."""
  cause: BaseException | None = error
  while cause is not None:
    if isinstance(cause, OSError) and cause.errno in _REFUSALS:
      return cause.errno
    for text, code in _REFUSAL_TEXTS.items():
      if text in str(cause):
        return code
    cause = cause.__cause__ or cause.__context__
  return None


def size_words(count: int) -> str:
  """'512 KB', '3.2 MB', '1.5 GB'."""
  for unit, scale in (('GB', 2**30), ('MB', 2**20)):
    if count >= scale:
      return f'{count / scale:.1f} {unit}'
  return f'{max(count, 0) // 1024} KB'


def unwritable(error: BaseException, path: str, needs: str) -> Unwritable | None:
  """One line for a write that the file system refused: the path, why, and what it `needs`;
  None when `error` is no such refusal."""
  code = refused_write(error)
  if code is None:
    return None
  why = _REFUSALS[code]
  if code in (errno.ENOSPC, errno.EDQUOT):
    try:
      usage = shutil.disk_usage(existing_parent(path))
      why += f' ({size_words(usage.free)} free of {size_words(usage.total)})'
    except OSError:
      pass
  return Unwritable(f'cannot write {path}: {why}; it needs {needs}.')


@contextlib.contextmanager
def writing(path: str, needs: str) -> Iterator[None]:
  """Raises `unwritable`'s one line for a write into `path` that the file system refuses."""
  try:
    yield
  except Exception as e:  # OSError, or a library's own error type. pylint: disable=broad-except
    refusal = unwritable(e, path, needs)
    if refusal is None:
      raise
    raise refusal from None


@contextlib.contextmanager
def replaced_whole(path: str) -> Iterator[str]:
  """A partial file beside `path` to write; it replaces `path` when the block ends well and is
  removed otherwise: `path` is written whole or not at all."""
  partial = os.path.join(os.path.dirname(path), f'.{os.path.basename(path)}.partial')
  try:
    yield partial
    os.replace(partial, path)
  finally:
    if os.path.exists(partial):
      os.remove(partial)


def existing_parent(path: str) -> str:
  """`path` made absolute, or its nearest ancestor that exists."""
  path = os.path.abspath(path)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return path


def check_writable(path: str, needs: str, *, directory: bool) -> None:
  """Raises `Unwritable`'s one line unless a file (or with `directory`, a directory) can be
  written at local `path`, by writing a byte beside it: before the work that ends in the write."""
  if '://' in path:  # Object stores: their own client reports a refused write.
    return
  if os.path.isdir(path) and not directory:
    raise Unwritable(f'cannot write {path}: it is a directory, not a file; it needs {needs}.')
  if os.path.exists(path) and not os.path.isdir(path) and directory:
    raise Unwritable(f'cannot write {path}: it is a file, not a directory; it needs {needs}.')
  parent = existing_parent(os.path.dirname(os.path.abspath(path)) if not directory else path)
  if not os.path.isdir(parent):
    raise Unwritable(f'cannot write {path}: {parent} is a file, not a directory; it needs {needs}.')
  try:
    probe, probe_path = tempfile.mkstemp(dir=parent, prefix='.write_check_')
    try:
      os.write(probe, b'\0')
    finally:
      os.close(probe)
      os.remove(probe_path)
  except OSError as e:
    raise unwritable(e, path, needs) or Unwritable(
        f'cannot write {path}: {parent} refused a file ({e.strerror}); it needs {needs}.'
    ) from None


def check_files(
    path: str, names: Sequence[str], needs: str, *, directories: Sequence[str] = ()
) -> None:
  """Raises `Unwritable`'s one line where one of the files `names` in directory `path` is a
  directory, or one of its `directories` a file, before the work that writes there."""
  if '://' in path:
    return
  for name, kind, wrong in [(n, 'file', 'directory') for n in names] + [
      (n, 'directory', 'file') for n in directories
  ]:
    full = os.path.join(path, name)
    if os.path.lexists(full) and os.path.isdir(full) == (kind == 'file'):
      raise Unwritable(
          f'cannot write {full}: it is a {wrong}, not a {kind}; it needs {needs} (move it away).'
      )
