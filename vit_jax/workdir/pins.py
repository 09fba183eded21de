"""Beside a live run, a reader reads a pinned copy of a checkpoint, which retention cannot delete.

A pin holds a lock while it is read; the next reader or run removes a pin whose lock is free (its
reader was killed), so that it does not keep deleted checkpoints on the disk.
"""

import contextlib
import fcntl
import json
import logging as std_logging
import os
import shutil
import tempfile
from typing import Any, Iterator

from absl import logging

from vit_jax.workdir.run_files import CHECKPOINT_DIR
from vit_jax.workdir.run_files import LOCK_FILE

PIN_PREFIX = '.pin-'  # Checkpoints of a live run pinned by a reader, beside CHECKPOINT_DIR.
PIN_LOCK_FILE = 'pin.lock'  # In a pin, locked by its reader: a pin whose lock is free is abandoned.
PIN_ATTEMPTS = 5  # Steps tried in turn while the run's retention deletes them under the reader.
_ORBAX_METADATA_GONE = (  # Orbax's lines for a step's metadata file that is not there.
    'Metadata file does not exist: %s',
    'Failed to read Metadata file: %s, error: %s',
)


class Vanished(Exception):
  """A live run's retention deleted the checkpoint being pinned."""


def live_holder(path: str) -> dict[str, Any] | None:
  """The record ({'pid', 'host', 'started', 'command'}; {} if it wrote none yet) of the live
  process that holds `path`'s run lock; None where none does (or where it cannot be told: an
  object store, an unreadable lock file)."""
  lock_path = os.path.join(path, LOCK_FILE)
  if '://' in path or not os.path.isfile(lock_path):
    return None
  try:
    with open(lock_path, 'r', encoding='utf-8') as f:
      try:
        fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
      except BlockingIOError:
        text = f.read()
      else:
        fcntl.flock(f, fcntl.LOCK_UN)
        return None
  except OSError:
    return None
  try:
    holder = json.loads(text)
  except ValueError:
    return {}
  return holder if isinstance(holder, dict) else {}


def not_of_a_deleted_step(record: std_logging.LogRecord) -> bool:
  """False for orbax's notice that a listed step's metadata is gone when the whole step is gone
  (a live run's retention deleted it; `Workdir._listed` lists again), True for any other line."""
  if record.msg in _ORBAX_METADATA_GONE and isinstance(record.args, tuple) and record.args:
    return os.path.exists(os.path.dirname(str(record.args[0])))
  return True


def remove_abandoned_pins(path: str) -> list[str]:
  """Removes the pins in work directory `path` whose lock is free (their reader was killed);
  returns their paths. A pin still being read, or made before it holds its lock, stays."""
  if '://' in path or not os.path.isdir(path):
    return []
  removed = []
  for name in sorted(os.listdir(path)):
    pin_dir = os.path.join(path, name)
    if not name.startswith(PIN_PREFIX) or not os.path.isdir(pin_dir):
      continue
    try:
      with open(os.path.join(pin_dir, PIN_LOCK_FILE), 'r', encoding='utf-8') as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shutil.rmtree(pin_dir, ignore_errors=True)
    except OSError:  # In use (BlockingIOError), no lock yet, or removed meanwhile: left alone.
      continue
    removed.append(pin_dir)
  if removed:
    logging.info('Removed %d abandoned pin(s) of checkpoints in %s.', len(removed), path)
  return removed


def file_names(root: str) -> set[str]:
  """The paths of the files under `root`, relative to it."""
  return {
      os.path.relpath(os.path.join(directory, name), root)
      for directory, _, names in os.walk(root)
      for name in names
  }


def _link_tree(source: str, target: str) -> None:
  """Hard-links every file under `source` into `target` (a copy where links are refused: another
  file system, no permission); FileNotFoundError when part of `source` vanishes meanwhile."""

  def vanished(error: OSError) -> None:
    raise error

  for directory, _, names in os.walk(source, onerror=vanished):
    into = os.path.join(target, os.path.relpath(directory, source))
    os.makedirs(into, exist_ok=True)
    for name in names:
      try:
        os.link(os.path.join(directory, name), os.path.join(into, name))
      except FileNotFoundError:
        raise
      except OSError:
        shutil.copy2(os.path.join(directory, name), os.path.join(into, name))


@contextlib.contextmanager
def pinned_checkpoint(path: str, step: int) -> Iterator[str]:
  """A directory holding checkpoint `step` of work directory `path` hard-linked (`_link_tree`), in
  PATH/.pin-*/ (else the system's temporary directory), removed when the block ends; Vanished when
  the step is deleted while it is being pinned."""
  remove_abandoned_pins(path)
  try:
    root = tempfile.mkdtemp(prefix=PIN_PREFIX, dir=path)
  except OSError:
    root = tempfile.mkdtemp(prefix=f'vit_jax{PIN_PREFIX}')
  try:
    with open(os.path.join(root, PIN_LOCK_FILE), 'w', encoding='utf-8') as held:
      fcntl.flock(held, fcntl.LOCK_EX)  # Released by the kernel however this process ends.
      try:
        _link_tree(
            os.path.join(path, CHECKPOINT_DIR, str(step)),
            os.path.join(root, CHECKPOINT_DIR, str(step)),
        )
      except FileNotFoundError:
        raise Vanished(step) from None
      yield root
  finally:
    shutil.rmtree(root, ignore_errors=True)
