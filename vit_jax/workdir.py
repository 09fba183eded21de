"""The work directory's lock: one run at a time writes to a work directory.

`lock(workdir)` is held by a run's process 0 from its first write to its end. It is an exclusive
`fcntl.flock` on `WORKDIR/run.lock`, which also records the holder (host, pid, start time,
command) so that a second run is refused with a message naming it. The kernel releases a flock
when its process ends, however it ends: a lock left by a killed run (kill -9, a crash, a lost
node) is free, and the next run takes it over, saying whose it was. Over NFS, Linux emulates
flock with POSIX byte-range locks, which the NFS lock manager keeps across machines.

Object stores (gs://, s3://) have no locks. There the holder is still recorded in `run.lock`
for the record, with a warning that nothing stops a second run: start one run per directory.
"""

import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
from typing import Any, Iterator

from absl import logging
from etils import epath
import numpy as np

LOCK_FILE = 'run.lock'


class WorkdirInUse(ValueError):
  """Another live run holds the work directory."""


def _holder() -> dict[str, Any]:
  return {'host': socket.gethostname(), 'pid': os.getpid(),
          'started': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
          'command': ' '.join([os.path.basename(sys.executable), *sys.argv])}


def _describe(text: str) -> str:
  """'pid 123 on host, started 2026-…, command: python -m …' from a lock file's content."""
  try:
    holder = json.loads(text)
    return (f'pid {holder["pid"]} on {holder["host"]}, started {holder["started"]}, command: '
            f'{holder["command"]}')
  except (ValueError, KeyError, TypeError):
    return 'a run that recorded no details'


@contextlib.contextmanager
def lock(workdir: str) -> Iterator[None]:
  """Holds `workdir` (created if missing) for the block; WorkdirInUse if another run has it."""
  path = epath.Path(workdir)
  path.mkdir(parents=True, exist_ok=True)
  if '://' in workdir:
    logging.warning('%s is on an object store, which has no file locks: nothing stops a second '
                    'run from writing to it at the same time; start only one.', workdir)
    (path / LOCK_FILE).write_text(json.dumps(_holder()))
    yield
    return
  lock_path = os.path.join(workdir, LOCK_FILE)
  with open(lock_path, 'a+', encoding='utf-8') as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.seek(0)
      raise WorkdirInUse(
          f'The work directory {workdir!r} is in use by another run: {_describe(f.read())}. Wait '
          'for it to finish or stop it (SIGTERM saves a checkpoint), or choose another '
          '--workdir.') from None
    f.seek(0)
    previous = f.read()
    if previous.strip():  # Released by the kernel, not by its run: that run ended abruptly.
      logging.warning('Taking over the lock of %s, which ended without releasing it.',
                      _describe(previous))
    f.seek(0)
    f.truncate()
    f.write(json.dumps(_holder()))
    f.flush()
    try:
      yield
    finally:
      f.seek(0)
      f.truncate()  # Released cleanly: the next run has nobody to take over from.
      f.flush()
      fcntl.flock(f, fcntl.LOCK_UN)


def hold(workdir: str, run_scope: contextlib.ExitStack) -> None:
  """Process 0 takes `lock(workdir)` until `run_scope` closes; every process raises if it can't."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  error = None
  if jax.process_index() == 0:
    try:
      run_scope.enter_context(lock(workdir))
    except WorkdirInUse as e:
      error = e
  if jax.process_count() > 1 and not int(
      multihost_utils.broadcast_one_to_all(np.int32(error is None))):
    error = error or WorkdirInUse(f'Process 0 found the work directory {workdir!r} in use by '
                                  'another run (its log names the holder).')
  if error is not None:
    raise error
