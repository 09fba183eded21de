"""The work directory of a run: the one owner of everything a run reads and writes there.

    WORKDIR/
      run.lock                 the lock of the run writing here (`lock`, `hold`)
      config.json              the resolved config (`Workdir.start` writes, `Workdir.config` reads;
                               `imports`: the modules of your own it uses, `vit_jax.extensions`)
      checkpoints/<step>/      orbax: `state` (the training state) and `meta` ({'model': name})
      unreadable_checkpoints/  checkpoints that resuming found unreadable, set aside with reason.txt
      results.json             final metrics (`write_results`, `results`)
      eval_report.json         what `eval_only` scored (`write_json`)
      analysis/                `vit_jax.analyze`'s figures, analysis.json and pruned runs
      events.out.tfevents.*    TensorBoard summaries

`Workdir(path)` reads a run without changing it; `Workdir.open(path)` does so after checking that
it is a trained run; `Workdir(path).start(config, scope)` takes the lock and writes the config for
a run that trains (or is written, as a pruned model is) here. Reads go through one orbax reader:
onto a training state's shardings to resume, or whole into host memory (whatever mesh, device or
process count wrote them) for evaluation, analysis, export, teachers and fine-tuning, with the
run's EMA of the variables first where it kept one. Without a step, the newest checkpoint that can
be read is used: readers skip unreadable newer ones with a warning, and resuming moves them to
`unreadable_checkpoints/` (never deleting them); a checkpoint that reads but holds another layout
is never moved. Saved shapes (`newest_layout`, for `vit_jax.training.resume`) come from orbax's own
metadata.

The lock: `lock(workdir)` is held by a run's process 0 from its first write to its end. It is an
exclusive `fcntl.flock` on `WORKDIR/run.lock`, which also records the holder (host, pid, start
time, command) so that a second run is refused with a message naming it. The kernel releases a
flock when its process ends, however it ends: a lock left by a killed run (kill -9, a crash, a lost
node) is free, and the next run takes it over, saying whose it was. Over NFS, Linux emulates flock
with POSIX byte-range locks, which the NFS lock manager keeps across machines. Object stores
(gs://, s3://) have no locks: there the holder is still recorded in `run.lock` for the record, with
a warning that nothing stops a second run: start one run per directory.
"""

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, Mapping

from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from vit_jax import extensions
from vit_jax.models import layouts

LOCK_FILE = 'run.lock'
CONFIG_FILE = 'config.json'
CHECKPOINT_DIR = 'checkpoints'
UNREADABLE_DIR = 'unreadable_checkpoints'  # Beside CHECKPOINT_DIR: checkpoints set aside.
RESULTS_FILE = 'results.json'
ANALYSIS_DIR = 'analysis'
ROOM = 'write access and room for its config, logs and checkpoints'  # What a run needs.


class WorkdirInUse(ValueError):
  """Another live run holds the work directory."""


class IncompatibleLayout(ValueError):
  """A checkpoint that reads, but holds another layout of the training state: never set aside."""


class Unwritable(ValueError):
  """The work directory refused a write: the device is full, read-only, or not ours to write."""


# errno of a refused write, and how tensorstore words the same (it raises ValueError, not OSError).
_REFUSALS = {
    errno.ENOSPC: 'no space left on the device',
    errno.EDQUOT: 'the disk quota is used up',
    errno.EROFS: 'the file system is read-only',
    errno.EACCES: 'permission denied',
    errno.EPERM: 'permission denied',
}
_REFUSAL_TEXTS = {
    'No space left on device': errno.ENOSPC,
    "os_error_code='28'": errno.ENOSPC,
    'Disk quota exceeded': errno.EDQUOT,
    'Read-only file system': errno.EROFS,
    'Permission denied': errno.EACCES,
}


def refused_write(error: BaseException) -> int | None:
  """The errno of a write refusal anywhere in `error`'s chain (OSError or tensorstore's text)."""
  while error is not None:
    if isinstance(error, OSError) and error.errno in _REFUSALS:
      return error.errno
    for text, code in _REFUSAL_TEXTS.items():
      if text in str(error):
        return code
    error = error.__cause__ or error.__context__
  return None


def _size(count: int) -> str:
  """'512 KB', '3.2 MB', '1.5 GB'."""
  for unit, scale in (('GB', 2**30), ('MB', 2**20)):
    if count >= scale:
      return f'{count / scale:.1f} {unit}'
  return f'{max(count, 0) // 1024} KB'


def _disk_bytes(path: epath.Path) -> int:
  """The bytes of the files under a local `path` (0 on an object store)."""
  return sum(
      os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(str(path)) for f in names
  )


def unwritable(error: BaseException, path: str, needs: str) -> Unwritable | None:
  """One line for a write that the file system refused: the path, why, and what it `needs`;
  None when `error` is no such refusal."""
  code = refused_write(error)
  if code is None:
    return None
  why = _REFUSALS[code]
  if code in (errno.ENOSPC, errno.EDQUOT):
    try:
      usage = shutil.disk_usage(_existing_parent(path))
      why += f' ({_size(usage.free)} free of {_size(usage.total)})'
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


def _existing_parent(path: str) -> str:
  path = os.path.abspath(path)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return path


def check_path(workdir: str | None) -> None:
  """Raises ValueError for a --workdir that cannot be one: empty, or an existing file."""
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


def check_writable(path: str, needs: str, *, directory: bool) -> None:
  """Raises `Unwritable`'s one line unless a file (or with `directory`, a directory) can be
  written at local `path`, by writing a byte beside it: before the work that ends in the write."""
  if '://' in path:  # Object stores: their own client reports a refused write.
    return
  if os.path.isdir(path) and not directory:
    raise Unwritable(f'cannot write {path}: it is a directory, not a file; it needs {needs}.')
  if os.path.exists(path) and not os.path.isdir(path) and directory:
    raise Unwritable(f'cannot write {path}: it is a file, not a directory; it needs {needs}.')
  parent = _existing_parent(os.path.dirname(os.path.abspath(path)) if not directory else path)
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


def _holder() -> dict[str, Any]:
  return {
      'host': socket.gethostname(),
      'pid': os.getpid(),
      'started': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
      'command': ' '.join([os.path.basename(sys.executable), *sys.argv]),
  }


def _describe(text: str) -> str:
  """'pid 123 on host, started 2026-…, command: python -m …' from a lock file's content."""
  try:
    holder = json.loads(text)
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
          '--workdir.'
      ) from None
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


def refuse_if_in_use(workdir: str) -> None:
  """Raises WorkdirInUse where another run holds `workdir`'s lock; takes nothing and creates
  nothing, so a run can say so before it reads (and reports on) the work directory's contents."""
  lock_path = os.path.join(workdir, LOCK_FILE)
  if '://' in workdir or not os.path.isfile(lock_path):
    return
  try:
    with open(lock_path, 'r', encoding='utf-8') as f:
      try:
        fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
      except BlockingIOError:
        raise WorkdirInUse(
            f'The work directory {workdir!r} is in use by another run: {_describe(f.read())}. '
            'Wait for it to finish or stop it (SIGTERM saves a checkpoint), or choose another '
            '--workdir.'
        ) from None
      fcntl.flock(f, fcntl.LOCK_UN)
  except PermissionError:  # Unreadable here: `hold` decides when the run takes it.
    return


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


# Comparing variables by shape.


def flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """Maps every leaf's path ('params/blocks_0/attn/qkv/kernel') to its shape.

  Leaves are arrays, `jax.ShapeDtypeStruct`s or orbax's `ArrayMetadata`.
  """
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  name = lambda k: getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k)))  # dict, list, attr
  return {
      '/'.join(str(name(k)) for k in path): tuple(getattr(leaf, 'shape', np.shape(leaf)))
      for path, leaf in flat
  }


@dataclasses.dataclass(frozen=True)
class ShapeDiff:
  """How the variables found (in a checkpoint) differ from those wanted (by a model), by path."""

  missing: list[str]
  unexpected: list[str]
  reshaped: list[str]  # 'path (found shape) vs (wanted shape)'

  @classmethod
  def between(
      cls, found: Mapping[str, tuple[int, ...]], wanted: Mapping[str, tuple[int, ...]]
  ) -> 'ShapeDiff':
    return cls(
        sorted(set(wanted) - set(found)),
        sorted(set(found) - set(wanted)),
        sorted(
            f'{k} {tuple(found[k])} vs {tuple(wanted[k])}'
            for k in set(found) & set(wanted)
            if tuple(found[k]) != tuple(wanted[k])
        ),
    )

  def __bool__(self) -> bool:
    return bool(self.missing or self.unexpected or self.reshaped)

  def listing(self, limit: int = 12) -> str:
    """One indented line per kind of difference, each naming up to `limit` paths."""

    def line(title, items):
      shown = ', '.join(items[:limit]) + (
          f', … ({len(items) - limit} more)' if len(items) > limit else ''
      )
      return f'\n  {title} ({len(items)}): {shown}' if items else ''

    return (
        line('missing from the checkpoint', self.missing)
        + line('unexpected in the checkpoint', self.unexpected)
        + line('wrong shape, checkpoint vs model', self.reshaped)
    )


# The run.


@dataclasses.dataclass(frozen=True)
class SavedVariables:
  """A run's model variables ({'params'[, 'batch_stats']}) at `step`; `ema`: they are its EMA."""

  variables: dict[str, Any]
  step: int
  ema: bool


def _reason(error: Exception) -> str:
  """The first line of an error, without tensorstore's spec dump."""
  lines = str(error).strip().splitlines()
  first = lines[0] if lines else ''
  text = re.split(r' \[tensorstore_spec| See full TensorStore details', first)[0]
  return f'{type(error).__name__}: {text[:300]}'


def config_json(config: ml_collections.ConfigDict) -> str:
  """The config.json of a run of `config`: the config, and under `imports` the modules outside
  vit_jax that registered what it uses (`extensions.recorded_imports`), when there are any."""
  imports = extensions.recorded_imports(config)
  if not imports:
    return config.to_json_best_effort(indent=2)
  return json.dumps(
      {**json.loads(config.to_json_best_effort()), extensions.IMPORTS: imports}, indent=2
  )


def import_recorded_modules(path: str) -> None:
  """Imports the modules that the run in `path` records in its config.json (`imports`), as
  reading its config does: for a command that names the run's evaluators before loading it."""
  Workdir(path).config()


class Workdir:
  """A run's work directory: opens, reads, writes and checks it (see the module docstring).

  `keep_checkpoints` (the newest that many are kept) makes it writable; without it, reading
  changes nothing there.
  """

  def __init__(self, path: str, *, keep_checkpoints: int | None = None):
    self.path = path
    self._keep = keep_checkpoints
    self._manager: ocp.CheckpointManager | None = None
    self._saving: tuple[int | None, int] = (None, 0)  # The step being saved and its bytes.

  @classmethod
  def open(cls, path: str) -> 'Workdir':
    """The trained run in `path`; ValueError unless it has a config.json and a checkpoint."""
    run = cls(path)
    if not run.file(CONFIG_FILE).exists() or not run.steps():
      raise ValueError(
          f'{path!r} is not a work directory of a vit_jax.main run: expected '
          f'{CONFIG_FILE} and a checkpoint in {run.file(CHECKPOINT_DIR)}/<step>.'
      )
    return run

  def start(self, config: ml_collections.ConfigDict, run_scope: contextlib.ExitStack) -> 'Workdir':
    """Makes this the run that trains here with `config`: locked until `run_scope` closes
    (`hold`), its saves finished by then, its config.json written, its checkpoints kept by
    `config.keep_checkpoints`."""
    with writing(self.path, ROOM):
      hold(self.path, run_scope)
      # However the run ends, its save in flight is finished (or, refused, removed) while the lock
      # is held, so that what a stop message names as kept is what the next run resumes from.
      run_scope.callback(self.wait_until_finished)
      if jax.process_index() == 0:
        self.file(CONFIG_FILE).write_text(config_json(config))
    if self._manager is not None:  # Read-only until now.
      self._manager.close()
      self._manager = None
    self._keep = config.keep_checkpoints
    return self

  def file(self, name: str) -> epath.Path:
    """`name` inside the work directory (local paths made absolute, as orbax needs; URIs kept)."""
    root = self.path if '://' in self.path else os.path.abspath(self.path)
    return epath.Path(root) / name

  # Reading.

  def config(self) -> ml_collections.ConfigDict | None:
    """The resolved config the run saved, None if none; list fields of the model (JSON's
    rendering of tuples such as SA-conv's `layer_heads`) are tuples again, as models hash them."""
    path = self.file(CONFIG_FILE)
    if not path.exists():
      return None
    try:
      saved = json.loads(path.read_text())
      if not isinstance(saved, dict) or not isinstance(saved.get('model'), dict):
        raise ValueError('it is not a config: no "model" section')
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError.
      raise ValueError(
          f'{path} is damaged ({e}); restore it from a copy, or write it again with '
          'the command that trained this run.'
      ) from None
    # The modules of the user's own kinds, stems and evaluators, before the config is read.
    extensions.import_recorded(saved.pop(extensions.IMPORTS, []), str(path))
    saved['model'] = {k: tuple(v) if isinstance(v, list) else v for k, v in saved['model'].items()}
    return ml_collections.ConfigDict(saved)

  def steps(self) -> list[int]:
    """The steps of the finished checkpoints, ascending."""
    if not self.file(CHECKPOINT_DIR).is_dir():
      return []
    return sorted(self.manager.all_steps())

  def has_checkpoint(self) -> bool:
    """Whether the run has saved at least one finished checkpoint (so training resumes it)."""
    return bool(self.steps())

  def results(self) -> dict[str, Any]:
    """The metrics in results.json; {} before there are any."""
    path = self.file(RESULTS_FILE)
    return json.loads(path.read_text()) if path.exists() else {}

  def read_state(self, step: int | None = None, *, like: Any = None) -> Any:
    """The training state at `step` (default: the newest readable; unreadable newer ones are
    skipped with a warning and left in place).

    Onto the shardings of the abstract state `like`, or, without it, as a tree of host arrays
    read whole, whatever mesh, device count or process count wrote them, never passing through a
    device (for teachers, fine-tuning, evaluation and analysis, which need no optimizer).
    """
    if step is not None:
      if step not in self.steps():
        raise ValueError(f'No checkpoint at step {step} in {self.path!r}; steps: {self.steps()}.')
      try:
        return self._restore(step, like)['state']
      except Exception as e:  # Orbax, tensorstore, json: many kinds. pylint: disable=broad-except
        raise ValueError(
            f'The checkpoint of step {step} in {self.path!r} cannot be read '
            f'({_reason(e)}); it may be truncated or corrupt.'
        ) from e
    found = self._newest_readable(lambda s: self._restore(s, like)['state'])
    if found is None:
      raise ValueError(f'{self.path!r} holds no readable checkpoint (steps {self.steps()}).')
    return found[1]

  def read_variables(
      self, step: int | None = None, *, use_ema: bool = True, unrolled: bool = False
  ) -> SavedVariables:
    """The model variables at `step` (default: newest readable) as host arrays: the run's EMA
    when it kept one (`ema_decay` > 0) and `use_ema`, as the published DeiT/CaiT/T2T numbers are
    the EMA model's, else the trained variables; in the layout the run trained in, or with
    `unrolled` the blocks of a `scan_layers` run one by one (`blocks_i`)."""
    state = self.read_state(step)
    ema = bool(use_ema and state.get('ema'))
    source = state['ema'] if ema else state
    variables = {'params': source['params']}
    if source.get('batch_stats'):
      variables['batch_stats'] = source['batch_stats']
    if unrolled:
      variables = layouts.unstack_layers(variables)
    logging.info(
        'Read the %s weights of %s (step %d).',
        'EMA' if ema else 'raw',
        self.path,
        int(state['step']),
    )
    return SavedVariables(variables, int(state['step']), ema)

  def newest_layout(self) -> tuple[int, str, dict[str, tuple[int, ...]]] | None:
    """(step, model name, every saved array's shape by path) of the newest checkpoint whose
    metadata reads (orbax's own, no array is read); None if none does."""
    if not self.has_checkpoint():
      return None
    found = self._newest_readable(
        lambda step: (self._restore(step, state=False)['meta']['model'], self.saved_shapes(step)),
        quiet=True,
    )
    return None if found is None else (found[0], *found[1])

  def _layout_or_none(self, step: int) -> dict[str, tuple[int, ...]] | None:
    try:
      return self.saved_shapes(step)
    except Exception:  # Orbax, tensorstore, json: many kinds. pylint: disable=broad-except
      return None

  def saved_shapes(self, step: int) -> dict[str, tuple[int, ...]]:
    """Every array of step `step`'s training state by path, with its shape (orbax's metadata)."""
    return flat_shapes(self.manager.item_metadata(step)['state'].tree)

  # Writing.

  def resume(self, like: Any) -> Any | None:
    """The newest readable training state, on the shardings of `like`; None without checkpoints.

    Unreadable newer checkpoints (truncated or garbage files, lost metadata, an empty step
    directory) are skipped and set aside (`_set_aside`); if none is readable, ValueError.
    """
    steps = self.steps()
    if not steps:
      return None
    wanted = flat_shapes(like)

    def read(step):
      try:
        return self._restore(step, like)['state']
      except Exception:  # pylint: disable=broad-except
        if self._layout_or_none(step) not in (None, wanted):  # Reads, but another layout.
          raise IncompatibleLayout(
              f'The checkpoint of step {step} in {self.file(CHECKPOINT_DIR)} holds another '
              'layout of the training state than the newer ones; it was not moved. Move it out '
              'of the way by hand to resume from an older one, or start a new run.'
          ) from None
        raise

    found = self._newest_readable(read, on_unreadable=self._set_aside)
    if found is None:
      raise ValueError(
          f'None of the {len(steps)} checkpoints in {self.file(CHECKPOINT_DIR)} could be read '
          f'(steps {steps}); each was moved to {UNREADABLE_DIR}/ beside it, see the warnings '
          'above. Rerun to train afresh from step 0, or move a repaired one back.'
      )
    return found[1]

  def save(self, step: int, state: Any, *, model_name: str) -> None:
    """Saves the training state at `step` (asynchronously), with the model name it belongs to.

    A write the file system refuses (full, read-only) raises `Unwritable` here or at the next
    save or wait, with the temporary checkpoint removed and every earlier checkpoint intact.
    """
    self._saving = (step, sum(int(x.nbytes) for x in jax.tree.leaves(state)))
    with self._refusals_reported():
      self.manager.save(
          step,
          args=ocp.args.Composite(
              state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave({'model': model_name})
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
        size = max(size, _disk_bytes(self.file(CHECKPOINT_DIR) / str(finished[-1])))
      refusal = unwritable(
          e,
          str(self.file(CHECKPOINT_DIR)),
          f'about {_size(size)} for the checkpoint of step {step}',
      )
      if refusal is None:
        raise
      if jax.process_index() == 0:
        for partial in self.file(CHECKPOINT_DIR).glob(f'*{ocp.path.atomicity.TMP_DIR_SUFFIX}*'):
          shutil.rmtree(partial, ignore_errors=True)
      raise Unwritable(
          f'{refusal} Removed its partial checkpoint; '
          + (f'the earlier ones (steps {finished}) are intact. ' if finished else '')
          + 'Make room (or --workdir elsewhere, copying this one), then rerun the '
          'same command to resume.'
      ) from None

  def _finished_steps(self) -> list[int]:
    """Finished checkpoints by their directory names (orbax's manager may be mid-failure)."""
    root = self.file(CHECKPOINT_DIR)
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.exists() else []

  def reached_preemption(self, step: int) -> bool:
    """Whether the processes agreed to stop at `step` on a SIGTERM (orbax's preemption sync)."""
    return self.manager.reached_preemption(step)

  def write_results(self, results: Mapping[str, Any]) -> str:
    """Replaces results.json (process 0 writes; read it with `results`); its path."""
    return self.write_json(RESULTS_FILE, results)

  def write_json(self, name: str, data: Mapping[str, Any]) -> str:
    """Writes `data` as JSON to `name` inside the work directory (process 0 writes); its path."""
    path = self.file(name)
    if jax.process_index() == 0:
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(json.dumps(data, indent=1))
    return str(path)

  def analysis_dir(self) -> str:
    """WORKDIR/analysis, created: where analyses write figures, reports and pruned runs."""
    path = self.file(ANALYSIS_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return str(path)

  # Orbax.

  @property
  def manager(self) -> ocp.CheckpointManager:
    """The orbax manager of WORKDIR/checkpoints: read-only unless `keep_checkpoints` was given."""
    if self._manager is None:
      read_only = self._keep is None
      options = ocp.CheckpointManagerOptions(  # Read-only: nothing to keep or save, as orbax wants.
          max_to_keep=None if read_only else self._keep,
          save_interval_steps=0 if read_only else 1,
          create=not read_only,
          read_only=read_only,
          cleanup_tmp_directories=not read_only,
      )  # A killed or refused save's partial one.
      self._manager = ocp.CheckpointManager(
          self.file(CHECKPOINT_DIR),
          options=options,
          item_handlers={
              'state': ocp.StandardCheckpointHandler(),
              'meta': ocp.JsonCheckpointHandler(),
          },
      )
    return self._manager

  def _restore(self, step: int, like: Any = None, *, state: bool = True) -> Any:
    """The one reader: step `step`'s items, {'meta'[, 'state']}.

    The state onto `like`'s shardings, or without it as host arrays; the meta item always, as a
    checkpoint whose metadata is lost cannot be checked.
    """
    items = {'meta': ocp.args.JsonRestore()}
    if state:
      if like is None:
        saved = self.manager.item_metadata(step)['state'].tree
        like = jax.tree.map(lambda leaf: np.empty(leaf.shape, leaf.dtype), saved)
      items['state'] = ocp.args.StandardRestore(like)
    return self.manager.restore(step, args=ocp.args.Composite(**items))

  def _newest_readable(
      self,
      read: Callable[[int], Any],
      *,
      on_unreadable: Callable[[int, str], None] | None = None,
      quiet: bool = False,
  ) -> tuple[int, Any] | None:
    """(step, read(step)) of the newest checkpoint that `read` can read, or None if none can.

    Each newer checkpoint that fails to read is logged (unless `quiet`) with its path and the
    reason, then passed to `on_unreadable(step, reason)` when given.
    """
    for step in reversed(self.steps()):
      try:
        return step, read(step)
      except IncompatibleLayout:
        raise
      except Exception as e:  # Orbax, tensorstore, json: many kinds. pylint: disable=broad-except
        reason = _reason(e)
        if not quiet:
          logging.warning(
              'Skipping the checkpoint of step %d in %s, which cannot be read (%s).',
              step,
              self.manager.directory / str(step),
              reason,
          )
        if on_unreadable is not None:
          on_unreadable(step, reason)
    return None

  def _set_aside(self, step: int, reason: str) -> None:
    """Moves step `step`'s unreadable checkpoint to WORKDIR/unreadable_checkpoints/<step>.<time>.

    Out of orbax's directory it is never restored, counted or deleted by the retention policy,
    and a later save of the same step number writes a fresh checkpoint. A `reason.txt` beside it
    says why it was moved; delete the folder when done with it.
    """
    target = self.file(UNREADABLE_DIR) / f'{step}.{time.strftime("%Y%m%d-%H%M%S")}'
    if jax.process_index() == 0:
      target.parent.mkdir(parents=True, exist_ok=True)
      (self.manager.directory / str(step)).rename(target)
      (target / 'reason.txt').write_text(f'step {step} could not be read: {reason}\n')
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f'vit_jax.training.workdir:set_aside_{step}')
    self.manager.reload()
    logging.warning(
        'Moved the unreadable checkpoint of step %d to %s (kept; nothing deleted).', step, target
    )
