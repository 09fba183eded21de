"""The work directory as the run that trains there writes it: its lock, config.json, checkpoints.

The lock is an exclusive `fcntl.flock` on WORKDIR/run.lock, held by process 0 and recording its
holder so that a second run is refused naming it. The kernel releases a flock however its process
ends, so the next run takes over a killed run's lock; over NFS, Linux emulates flock with POSIX
locks, which the NFS lock manager keeps across machines. Object stores have no locks.
"""

import contextlib
import datetime
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from typing import Any, Iterator

from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from vit_jax.workdir import checksums
from vit_jax.workdir import disk_writes
from vit_jax.workdir import pins
from vit_jax.workdir import reader
from vit_jax.workdir import run_files
from vit_jax.workdir import shape_diff


class WorkdirInUse(ValueError):
  """Another live run holds the work directory."""


def _disk_bytes(path: epath.Path) -> int:
  """The bytes of the files under a local `path` (0 on an object store)."""
  return sum(
      os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(str(path)) for f in names
  )


def check_path(workdir: str | None) -> None:
  """Raises ValueError for a --workdir that cannot be one: empty, an existing file, a store that
  cannot be reached, a place that refuses files, or one whose files are of the wrong kind."""
  if not workdir or not str(workdir).strip():
    raise ValueError(
        '--workdir is empty: name a directory for the run (it is created if '
        'missing), e.g. --workdir=/tmp/vit_run.'
    )
  if '://' not in workdir and os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(
        f'--workdir={workdir} is a file, not a directory: name a directory for the '
        'run (it is created if missing).'
    )
  if '://' in workdir:
    try:
      epath.Path(workdir).exists()
    except Exception as e:  # The store's client: OSError, auth errors. pylint: disable=broad-except
      reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise ValueError(
          f'--workdir={workdir} cannot be reached ({reason}): check the network and the '
          "store's credentials, or name a local directory."
      ) from None
  disk_writes.check_writable(workdir, run_files.ROOM, directory=True)
  disk_writes.check_files(
      workdir,
      run_files.RUN_FILES,
      run_files.ROOM,
      directories=(run_files.CHECKPOINT_DIR, run_files.UNREADABLE_DIR),
  )
  checkpoints = os.path.join(workdir, run_files.CHECKPOINT_DIR)
  if '://' not in workdir and os.path.isdir(checkpoints):
    steps = [name for name in os.listdir(checkpoints) if name.isdigit()]
    disk_writes.check_files(checkpoints, (), run_files.ROOM, directories=steps)


def _holder() -> dict[str, Any]:
  return {
      'host': socket.gethostname(),
      'pid': os.getpid(),
      'started': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
      'command': ' '.join([os.path.basename(sys.executable), *sys.argv]),
  }


def _describe(text: str | dict[str, Any]) -> str:
  """'pid 123 on host, started 2026-…, command: python -m …' from a lock file's content (or its
  record, `pins.live_holder`)."""
  try:
    holder = json.loads(text) if isinstance(text, str) else text
    return (
        f'pid {holder["pid"]} on {holder["host"]}, started {holder["started"]}, command: '
        f'{holder["command"]}'
    )
  except (ValueError, KeyError, TypeError):
    return 'a run that recorded no details'


@contextlib.contextmanager
def lock(workdir: str) -> Iterator[None]:
  """Holds `workdir` (created if missing) for the block; WorkdirInUse if another run has it."""
  path = epath.Path(workdir)
  path.mkdir(parents=True, exist_ok=True)
  if '://' in workdir:
    logging.warning(
        '%s is on an object store, which has no file locks: nothing stops a second '
        'run from writing to it at the same time; start only one.',
        workdir,
    )
    (path / run_files.LOCK_FILE).write_text(json.dumps(_holder()))
    yield
    return
  lock_path = os.path.join(workdir, run_files.LOCK_FILE)
  with open(lock_path, 'a+', encoding='utf-8') as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.seek(0)
      raise _in_use(workdir, f.read()) from None
    f.seek(0)
    previous = f.read()
    if previous.strip():  # Released by the kernel, not by its run: that run ended abruptly.
      logging.warning(
          'Taking over the lock of %s, which ended without releasing it.', _describe(previous)
      )
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


def _in_use(workdir: str, holder: str | dict[str, Any]) -> WorkdirInUse:
  return WorkdirInUse(
      f'The work directory {workdir!r} is in use by another run: {_describe(holder)}. Wait '
      'for it to finish or stop it (SIGTERM saves a checkpoint), or choose another --workdir.'
  )


def refuse_if_in_use(workdir: str) -> None:
  """Raises WorkdirInUse where another run holds `workdir`'s lock, taking and creating nothing:
  before a run reads (and reports on) the work directory's contents."""
  holder = pins.live_holder(workdir)  # None where unreadable: `hold` decides then.
  if holder is not None:
    raise _in_use(workdir, holder)


def hold(workdir: str, run_scope: contextlib.ExitStack) -> None:
  """Process 0 takes `lock(workdir)` until `run_scope` closes; every process raises if it can't."""
  error = None
  if jax.process_index() == 0:
    try:
      run_scope.enter_context(lock(workdir))
    except WorkdirInUse as e:
      error = e
  if jax.process_count() > 1 and not int(
      multihost_utils.broadcast_one_to_all(np.int32(error is None))
  ):
    error = error or WorkdirInUse(
        f'Process 0 found the work directory {workdir!r} in use by '
        'another run (its log names the holder).'
    )
  if error is not None:
    raise error


class RunWriter(reader.Workdir):
  """The work directory of the run that trains (or writes a run) here: `Workdir`'s reads, and the
  lock, the saves and their retention (`keep_checkpoints`: the newest that many are kept; None
  keeps it read-only until `start`)."""

  def __init__(self, path: str, *, keep_checkpoints: int | None = None):
    super().__init__(path)
    self._keep = keep_checkpoints
    self._saving: tuple[int | None, int] = (None, 0)  # The step being saved and its bytes.

  def start(
      self, config: ml_collections.ConfigDict, run_scope: contextlib.ExitStack
  ) -> 'RunWriter':
    """Makes this the run that trains here with `config`: locked until `run_scope` closes
    (`hold`), its saves finished by then, its config.json written, abandoned pins removed."""
    with disk_writes.writing(self.path, run_files.ROOM):
      hold(self.path, run_scope)
      # However the run ends, its save in flight is finished (or, refused, removed) while the lock
      # is held, so that what a stop message names as kept is what the next run resumes from.
      run_scope.callback(self.wait_until_finished)
      if jax.process_index() == 0:
        self.write_whole(run_files.CONFIG_FILE, run_files.config_json(config))
        pins.remove_abandoned_pins(self.path)
    if self._manager is not None:  # Read-only until now.
      self._manager.close()
      self._manager = None
    self._keep = config.keep_checkpoints
    return self

  def _layout_or_none(self, step: int) -> dict[str, tuple[int, ...]] | None:
    try:
      return self.saved_shapes(step)
    except Exception:  # Orbax, tensorstore, json: many kinds. pylint: disable=broad-except
      return None

  def resume(self, like: Any) -> Any | None:
    """The newest readable training state, on the shardings of `like`; None without checkpoints.
    Unreadable newer checkpoints are set aside (`_set_aside`); if none is readable, ValueError."""
    steps = self.steps()
    if not steps:
      return None
    wanted = shape_diff.flat_shapes(like)

    def read(step):
      try:
        return self._restore(step, like)['state']
      except Exception:  # pylint: disable=broad-except
        if self._layout_or_none(step) not in (None, wanted):  # Reads, but another layout.
          raise reader.IncompatibleLayout(
              f'The checkpoint of step {step} in {self.file(run_files.CHECKPOINT_DIR)} holds '
              'another layout of the training state than the newer ones; it was not moved. Move '
              'it out of the way by hand to resume from an older one, or start a new run.'
          ) from None
        raise

    found = self._newest_readable(read, on_unreadable=self._set_aside)
    if found is None:
      raise ValueError(
          f'None of the {len(steps)} checkpoints in {self.file(run_files.CHECKPOINT_DIR)} could '
          f'be read (steps {steps}); each was moved to {run_files.UNREADABLE_DIR}/ beside it, '
          'see the warnings above. Rerun to train afresh from step 0, or move a repaired one back.'
      )
    return found[1]

  def save(self, step: int, state: Any, *, model_name: str) -> None:
    """Saves the training state at `step` (asynchronously) with its model's name and `checksums`;
    a refused write raises `Unwritable` here or at the next save or wait (`_refusals_reported`)."""
    self.wait_until_finished()  # A refusal of the save before names that save's step.
    self._saving = (step, sum(int(x.nbytes) for x in jax.tree.leaves(state)))
    with self._refusals_reported():
      self.manager.save(
          step,
          args=ocp.args.Composite(
              state=ocp.args.StandardSave(state),
              meta=ocp.args.JsonSave(
                  {'model': model_name, checksums.CHECKSUMS: checksums.checksums(state)}
              ),
          ),
          force=True,
      )

  def wait_until_finished(self) -> None:
    """Blocks until every checkpoint save has been written."""
    if self._manager is not None:
      with self._refusals_reported():
        self._manager.wait_until_finished()

  @contextlib.contextmanager
  def _refusals_reported(self) -> Iterator[None]:
    """Turns a save the file system refused into `Unwritable`, removing the half-written one."""
    try:
      yield
    except Exception as e:  # Orbax re-raises its threads' errors. pylint: disable=broad-except
      step, size = self._saving
      finished = [s for s in self._finished_steps() if s != step]
      if finished:  # Its newest checkpoint on disk, metadata included, says best.
        size = max(size, _disk_bytes(self.file(run_files.CHECKPOINT_DIR) / str(finished[-1])))
      refusal = disk_writes.unwritable(
          e,
          str(self.file(run_files.CHECKPOINT_DIR)),
          f'about {disk_writes.size_words(size)} for the checkpoint of step {step}',
      )
      if refusal is None:
        raise
      if jax.process_index() == 0:
        for partial in self.file(run_files.CHECKPOINT_DIR).glob(
            f'*{ocp.path.atomicity.TMP_DIR_SUFFIX}*'
        ):
          shutil.rmtree(partial, ignore_errors=True)
      remedy = (
          'Raise the limit (ulimit -f unlimited)'
          if disk_writes.refused_write(e) == errno.EFBIG
          else 'Make room (or --workdir elsewhere, copying this one)'
      )
      raise disk_writes.Unwritable(
          f'{refusal} Removed its partial checkpoint; '
          + (f'the earlier ones (steps {finished}) are intact. ' if finished else '')
          + f'{remedy}, then rerun the same command to resume.'
      ) from None

  def _finished_steps(self) -> list[int]:
    """Finished checkpoints by their directory names (orbax's manager may be mid-failure)."""
    root = self.file(run_files.CHECKPOINT_DIR)
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.exists() else []

  def reached_preemption(self, step: int) -> bool:
    """Whether the processes agreed to stop at `step` on a SIGTERM (orbax's preemption sync)."""
    return self.manager.reached_preemption(step)

  def _set_aside(self, step: int, reason: str) -> None:
    """Moves step `step`'s unreadable checkpoint, with a reason.txt, to
    WORKDIR/unreadable_checkpoints/<step>.<time>: out of orbax's sight and retention."""
    target = self.file(run_files.UNREADABLE_DIR) / f'{step}.{time.strftime("%Y%m%d-%H%M%S")}'
    if jax.process_index() == 0:
      target.parent.mkdir(parents=True, exist_ok=True)
      (self.manager.directory / str(step)).rename(target)
      (target / 'reason.txt').write_text(f'step {step} could not be read: {reason}\n')
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f'vit_jax.training.run_writer:set_aside_{step}')
    self.manager.reload()
    logging.warning(
        'Moved the unreadable checkpoint of step %d to %s (kept; nothing deleted).', step, target
    )
