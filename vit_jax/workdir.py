"""The work directory of a run as everything that reads it sees it: its layout and its reads.

    WORKDIR/
      run.lock                 the lock of the run writing here (`vit_jax.training.run_writer`)
      config.json              the resolved config (`RunWriter.start` writes, `config` reads;
                               `imports`: the modules of your own it uses, `vit_jax.extensions`)
      dataset.json             what the run's data was (its classes by name, its split sizes) and
                               eval_images.npz, its first eval images as the model sees them: side
                               commands read these, not the data, which need not stay
      checkpoints/<step>/      orbax: `state` (the training state) and `meta` ({'model': name,
                               'checksums': of the state's arrays, checked by every read})
      unreadable_checkpoints/  checkpoints that resuming found unreadable, set aside with reason.txt
      results.json             final metrics of the run and of `vit_jax.evaluate` (`write_results`)
      results.lock             the lock under which each writer merges its metrics into results.json
      .pin-*/                  a checkpoint of a live run pinned while a side command reads it
      eval_report.json         what `eval_only` scored (`write_json`)
      analysis/                `vit_jax.analyze`'s figures, analysis.json and pruned runs
      events.out.tfevents.*    TensorBoard summaries

`Workdir(path)` reads a run without changing it; `Workdir.open(path)` does so after checking that
it is a trained run. The run that trains here writes it through `training.run_writer.RunWriter`,
which extends this class with the lock, the saves and resuming. Reads go through one orbax reader:
onto a training state's shardings to resume, or whole into host memory (whatever mesh, device or
process count wrote them) for evaluation, analysis, export, teachers and fine-tuning, with the
run's EMA of the variables first where it kept one. Without a step, the newest checkpoint that can
be read is used: readers skip unreadable newer ones with a warning. Saved shapes (`newest_layout`,
for `vit_jax.training.resume`) come from orbax's own metadata. The small results a side command
writes here (`write_results`, `write_json`, `analysis_dir`) are written through this class too.

Beside a live run (`live_holder`: a process holds its lock), a reader says so in one line and reads
a pinned checkpoint: the step's files hard-linked (copied where links are refused) into a
temporary directory, so that the run's retention cannot delete them mid-read; a step deleted while
it is being pinned gives way to the newest one, and one deleted while orbax lists the steps is
listed again. A pin holds a lock while it is read; the next reader or run removes a pin whose lock
is free (its reader was killed), so that it does not keep deleted checkpoints on the disk.

Every writer of results.json merges its metrics into it under a file lock, so that the run's final
metrics and an evaluation's are both kept, in either order, each with the step it was measured at
(`steps`: an evaluation beside a live run scores an earlier step than the run's final one).

A write the file system refuses (a full or read-only device, no permission), here or to any other
output of a command (exported weights, reports), is one line: `writing(path, needs)` turns it into
`Unwritable`, naming the path, why and what the write needs; `check_writable` asks before the work
that ends in the write.
"""

import contextlib
import dataclasses
import errno
import fcntl
import io
import json
import logging as std_logging
import os
import re
import shutil
import tempfile
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

from absl import logging
from etils import epath
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from vit_jax import extensions
from vit_jax.models import layouts

LOCK_FILE = 'run.lock'
CONFIG_FILE = 'config.json'
CHECKPOINT_DIR = 'checkpoints'
DATASET_FILE = 'dataset.json'
EVAL_IMAGES_FILE = 'eval_images.npz'
RECORDED_EVAL_IMAGES = 64  # How many a run records: what analysis averages over by default.
UNREADABLE_DIR = 'unreadable_checkpoints'  # Beside CHECKPOINT_DIR: checkpoints set aside.
RESULTS_FILE = 'results.json'
RESULTS_LOCK_FILE = 'results.lock'
RESULTS_FILES = (RESULTS_FILE, RESULTS_LOCK_FILE)  # What a writer of results writes.
RUN_FILES = (LOCK_FILE, CONFIG_FILE, DATASET_FILE, EVAL_IMAGES_FILE, *RESULTS_FILES)  # A run's.
RESULTS_STEPS = 'steps'  # In results.json: the step each metric was measured at.
PIN_PREFIX = '.pin-'  # Checkpoints of a live run pinned by a reader, beside CHECKPOINT_DIR.
PIN_LOCK_FILE = 'pin.lock'  # In a pin, locked by its reader: a pin whose lock is free is abandoned.
PIN_ATTEMPTS = 5  # Steps tried in turn while the run's retention deletes them under the reader.
_ORBAX_METADATA_GONE = (  # Orbax's lines for a step's metadata file that is not there.
    'Metadata file does not exist: %s',
    'Failed to read Metadata file: %s, error: %s',
)
ANALYSIS_DIR = 'analysis'
ROOM = 'write access and room for its config, logs and checkpoints'  # What a run needs.


class IncompatibleLayout(ValueError):
  """A checkpoint that reads, but holds another layout of the training state: never set aside."""


class _Vanished(Exception):
  """A live run's retention deleted the checkpoint being pinned."""


class DamagedCheckpoint(ValueError):
  """A checkpoint reads, but its arrays are not the ones saved (`checksums` differ)."""


CHECKSUMS = 'checksums'  # In a checkpoint's meta: `checksums` of its state as saved.


def checksums(tree: Any) -> list[int]:
  """Each array leaf's bits summed as unsigned words of up to 32 bits (wrapping at 2**32), in
  leaf order: a changed bit changes its array's sum. Arrays on accelerators, or not all held by
  this process, are summed on their devices (one program, compiled once per state's layout);
  host arrays and CPU arrays this process holds whole, on the host (nothing to compile)."""
  leaves = jax.tree.leaves(tree)
  on_device = [i for i, leaf in enumerate(leaves) if _summed_on_device(leaf)]
  sums: dict[int, int] = {}
  if on_device:
    device_sums = _device_sums([_plain(leaves[i]) for i in on_device])
    sums.update(zip(on_device, (int(x) for x in jax.device_get(device_sums))))
  for i, leaf in enumerate(leaves):
    if i not in sums:
      sums[i] = _host_sum(leaf)
  return [sums[i] for i in range(len(leaves))]


def _summed_on_device(leaf: Any) -> bool:
  """Whether `checksums` sums `leaf` on its devices: a device array that is not on CPUs only, or
  whose shards other processes hold (the same answer in every process)."""
  return isinstance(leaf, jax.Array) and (
      not leaf.is_fully_addressable
      or any(device.platform != 'cpu' for device in leaf.sharding.device_set)
  )


def _host_sum(leaf: Any) -> int:
  """`checksums` of one host array (or CPU array), as `_device_sums` computes it."""
  if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(leaf)
  array = np.ascontiguousarray(np.asarray(leaf))
  if array.dtype == bool:
    array = array.astype(np.uint8)
  words = array.reshape(-1).view(f'uint{min(array.dtype.itemsize, 4) * 8}')
  return int(np.sum(words, dtype=np.uint64) % 2**32)


def _plain(leaf: jax.Array) -> jax.Array:
  """A device array as plain numbers: typed PRNG keys as their data, booleans as bytes."""
  if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(leaf)
  return leaf.astype(jnp.uint8) if leaf.dtype == jnp.bool_ else leaf


@jax.jit
def _device_sums(leaves: list[jax.Array]) -> list[jax.Array]:
  """`checksums` of device arrays, in one program (compiled once per state's layout)."""
  sums = []
  for leaf in leaves:
    bits = jax.lax.bitcast_convert_type(leaf, f'uint{min(leaf.dtype.itemsize, 4) * 8}')
    sums.append(jnp.sum(bits.astype(jnp.uint32), dtype=jnp.uint32))
  return sums


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
  while error is not None:
    if isinstance(error, OSError) and error.errno in _REFUSALS:
      return error.errno
    for text, code in _REFUSAL_TEXTS.items():
      if text in str(error):
        return code
    error = error.__cause__ or error.__context__
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
  """Raises `Unwritable`'s one line where a file `names` that the directory `path` holds (a run's
  lock, config.json, results.json, ...) is a directory instead, or one of its `directories` a
  file, before the work that writes there."""
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


# A live run beside a reader.


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


def _not_of_a_deleted_step(record: std_logging.LogRecord) -> bool:
  """False for orbax's notice that a listed step's metadata is gone when the whole step is gone
  (a live run's retention deleted it; `Workdir._listed` lists again), True for any other line."""
  if record.msg in _ORBAX_METADATA_GONE and record.args:
    return os.path.exists(os.path.dirname(str(record.args[0])))
  return True


def remove_abandoned_pins(path: str) -> list[str]:
  """Removes the pins in work directory `path` whose reader ended without removing them (killed:
  its pin's lock is free), which would otherwise keep deleted checkpoints' files on the disk;
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


def _file_names(root: str) -> set[str]:
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
  """A run's work directory, read (see the module docstring); reading changes nothing there."""

  def __init__(self, path: str):
    self.path = os.path.expanduser(path)  # '--workdir=~/run': the shell leaves '~' after '='.
    self._keep: int | None = None  # Checkpoints kept: None reads only (a `RunWriter` keeps some).
    self._manager: ocp.CheckpointManager | None = None

  @classmethod
  def open(cls, path: str) -> 'Workdir':
    """The trained run in `path`; ValueError unless it has a config.json and a checkpoint."""
    run = cls(path)
    checkpoints = run.file(CHECKPOINT_DIR)
    if checkpoints.exists() and not checkpoints.is_dir():
      raise ValueError(
          f"{checkpoints} is a file, not the directory of the run's checkpoints: move it away "
          '(a rerun of the training then trains afresh) or restore the directory.'
      )
    if not run.file(CONFIG_FILE).exists():
      raise ValueError(
          f'{path!r} is not a work directory of a vit_jax.main run: expected '
          f'{CONFIG_FILE} and a checkpoint in {run.file(CHECKPOINT_DIR)}/<step>.'
      )
    if not run.steps():  # A run that has started and not yet saved, or one that never did.
      raise ValueError(
          f'{path!r} is a vit_jax.main run with no checkpoint yet: a run in progress saves '
          f'its first at --config.checkpoint_every steps (in {run.file(CHECKPOINT_DIR)}/<step>); '
          'read it then.'
      )
    return run

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
    saved.setdefault('augment_on_device', False)  # Runs from before it augmented on the host.
    return ml_collections.ConfigDict(saved)

  def dataset(self) -> dict[str, Any] | None:
    """What dataset.json records of the run's data ({'name', 'num_classes', 'class_names', ...},
    as `write_dataset` wrote it); None for a run that did not record it (written before runs
    did). ValueError naming the file where it is damaged."""
    path = self.file(DATASET_FILE)
    if not path.exists():
      return None
    try:
      record = json.loads(path.read_text())
      names = record['class_names'] if isinstance(record, dict) else None
      if not (
          isinstance(names, list)
          and all(isinstance(name, str) for name in names)
          and record.get('num_classes') == len(names)
      ):
        raise ValueError('expected {"num_classes": N, "class_names": [N names], ...}')
    except (ValueError, UnicodeDecodeError, KeyError) as e:
      raise ValueError(
          f"{path} is damaged ({e}); restore it from a copy, or delete it to read the run's "
          'classes from its dataset.'
      ) from None
    return record

  def eval_images(self) -> np.ndarray | None:
    """The eval images the run recorded ((N, S, S, 3) float32, as the model sees them); None
    where it recorded none; ValueError naming the file where it is damaged."""
    path = self.file(EVAL_IMAGES_FILE)
    if not path.exists():
      return None
    try:
      with path.open('rb') as f, np.load(f) as saved:
        images = saved['images'].astype(np.float32)
    except Exception as e:  # zipfile, numpy, a refused pickle. pylint: disable=broad-except
      raise ValueError(
          f'{path} is damaged ({type(e).__name__}: {str(e)[:200]}); delete it to read eval '
          "images from the run's dataset."
      ) from None
    if images.ndim != 4 or images.shape[-1] != 3:
      raise ValueError(f'{path} is damaged: images of shape {images.shape}, not (N, S, S, 3).')
    return images

  def steps(self) -> list[int]:
    """The steps of the finished checkpoints, ascending."""
    if not self.file(CHECKPOINT_DIR).is_dir():
      return []
    return sorted(self.manager.all_steps())

  def has_checkpoint(self) -> bool:
    """Whether the run has saved at least one finished checkpoint (so training resumes it)."""
    return bool(self.steps())

  def results(self) -> dict[str, Any]:
    """The metrics in results.json; {} before there are any; ValueError naming the file where it
    is damaged (not JSON, or not {name: value, ..., 'steps': {name: step}})."""
    path = self.file(RESULTS_FILE)
    if not path.exists():
      return {}
    try:
      results = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f'{path} is damaged: not JSON ({e}).') from None
    if not isinstance(results, dict) or not isinstance(results.get(RESULTS_STEPS, {}), dict):
      raise ValueError(
          f'{path} is damaged: expected {{metric: value, ..., {RESULTS_STEPS!r}: {{metric: '
          f'step}}}}, found a {type(results).__name__}.'
      )
    return results

  def read_state(self, step: int | None = None, *, like: Any = None) -> Any:
    """The training state at `step` (default: the newest readable; unreadable newer ones are
    skipped with a warning and left in place).

    Onto the shardings of the abstract state `like`, or, without it, as a tree of host arrays
    read whole, whatever mesh, device count or process count wrote them, never passing through a
    device (for teachers, fine-tuning, evaluation and analysis, which need no optimizer).
    """
    holder = live_holder(self.path) if self._keep is None else None  # A RunWriter reads its own.
    read = lambda s: self._restore(s, like)['state']
    if holder is not None:
      read = lambda s: self._read_pinned(s, like)
    for _ in range(PIN_ATTEMPTS if holder is not None else 1):
      try:
        found = self._read_step(step, read)
      except _Vanished:
        self._listed(self.manager.reload)
        continue
      if holder is not None:
        logging.warning(
            '%s is being trained (pid %s on host %s); reading its checkpoint at step %d, '
            'pinned against retention.',
            self.path,
            holder.get('pid', '?'),
            holder.get('host', '?'),
            found[0],
        )
      return found[1]
    raise ValueError(
        f'{self.path!r} is being trained (pid {holder.get("pid", "?")} on host '
        f'{holder.get("host", "?")}), and its retention deleted each of {PIN_ATTEMPTS} checkpoints '
        'while they were being pinned; read it again, or once it has finished.'
    )

  def _read_step(self, step: int | None, read: Callable[[int], Any]) -> tuple[int, Any]:
    """(step, read(step)) at `step`, or without one at the newest step that `read` can read."""
    if step is not None:
      if step not in self.steps():
        raise ValueError(f'No checkpoint at step {step} in {self.path!r}; steps: {self.steps()}.')
      try:
        return step, read(step)
      except _Vanished:
        raise
      except Exception as e:  # Orbax, tensorstore, json: many kinds. pylint: disable=broad-except
        raise ValueError(
            f'The checkpoint of step {step} in {self.path!r} cannot be read '
            f'({_reason(e)}); it may be truncated or corrupt.'
        ) from e
    found = self._newest_readable(read)
    if found is None:
      raise ValueError(f'{self.path!r} holds no readable checkpoint (steps {self.steps()}).')
    return found

  def _read_pinned(self, step: int, like: Any = None) -> Any:
    """The training state at `step`, read from a pin of its files (`pin`); _Vanished when the
    live run's retention deletes the step while it is being pinned."""
    source = str(self.file(CHECKPOINT_DIR) / str(step))
    with self.pin(step) as pinned:
      try:
        return pinned._restore(step, like)['state']  # pylint: disable=protected-access
      except Exception:  # pylint: disable=broad-except
        pinned_names = _file_names(str(pinned.file(CHECKPOINT_DIR) / str(step)))
        for _ in range(10):  # Retention deletes a step's files, then its directory.
          if not os.path.isdir(source) or _file_names(source) != pinned_names:
            raise _Vanished(step) from None
          time.sleep(0.1)
        raise
      finally:
        if pinned._manager is not None:  # pylint: disable=protected-access
          pinned._manager.close()  # pylint: disable=protected-access

  @contextlib.contextmanager
  def pin(self, step: int) -> Iterator['Workdir']:
    """A read-only `Workdir` holding checkpoint `step` as hard links to its files (copies where
    links are refused), in WORKDIR/.pin-*/ (or, where the work directory refuses it, the system's
    temporary directory), removed when the block ends: the run's retention cannot delete what
    it reads. _Vanished when the step is deleted while it is being pinned. The pins of readers
    that were killed are removed first (`remove_abandoned_pins`)."""
    remove_abandoned_pins(self.path)
    try:
      root = tempfile.mkdtemp(prefix=PIN_PREFIX, dir=str(self.file('')))
    except OSError:
      root = tempfile.mkdtemp(prefix=f'vit_jax{PIN_PREFIX}')
    try:
      with open(os.path.join(root, PIN_LOCK_FILE), 'w', encoding='utf-8') as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # Released by the kernel however this process ends.
        try:
          _link_tree(
              str(self.file(CHECKPOINT_DIR) / str(step)),
              os.path.join(root, CHECKPOINT_DIR, str(step)),
          )
        except FileNotFoundError:
          raise _Vanished(step) from None
        yield Workdir(root)
    finally:
      shutil.rmtree(root, ignore_errors=True)

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

  def saved_shapes(self, step: int) -> dict[str, tuple[int, ...]]:
    """Every array of step `step`'s training state by path, with its shape (orbax's metadata)."""
    return flat_shapes(self.manager.item_metadata(step)['state'].tree)

  # Small results beside the run.

  def write_results(self, metrics: Mapping[str, float], *, step: int | None) -> str:
    """Merges `metrics`, measured at `step` (None: weights of no run), into results.json: each
    under its name, its step under 'steps' (process 0 writes; read it with `results`); its path.

    Under an exclusive lock of WORKDIR/results.lock, read, merged and atomically replaced: the
    run's final metrics and those of `vit_jax.evaluate` beside it are both kept, in either order.
    """
    if jax.process_index() != 0:
      return str(self.file(RESULTS_FILE))
    with contextlib.ExitStack() as locked:
      if '://' not in self.path:  # Object stores have no locks.
        self.file('').mkdir(parents=True, exist_ok=True)
        lock = locked.enter_context(open(self.file(RESULTS_LOCK_FILE), 'a', encoding='utf-8'))
        fcntl.flock(lock, fcntl.LOCK_EX)
      try:
        old = self.results()
      except ValueError as e:  # Set aside, not fatal: the metrics just measured are kept.
        aside = self.file(f'{RESULTS_FILE}.damaged')
        self.file(RESULTS_FILE).rename(aside)
        logging.warning(
            '%s Set aside as %s; the new metrics go to a fresh %s.', e, aside, RESULTS_FILE
        )
        old = {}
      steps = {**old.get(RESULTS_STEPS, {}), **dict.fromkeys(metrics, step)}
      return self.write_json(RESULTS_FILE, {**old, **metrics, RESULTS_STEPS: steps})

  def write_dataset(self, record: Mapping[str, Any], eval_images: np.ndarray | None) -> None:
    """Writes dataset.json (`dataset`) and, given, eval_images.npz (float16): what side commands
    read of the run's data (process 0 writes)."""
    self.write_json(DATASET_FILE, record)
    if eval_images is not None and jax.process_index() == 0:
      packed = io.BytesIO()
      np.savez_compressed(packed, images=eval_images.astype(np.float16))
      self.write_whole(EVAL_IMAGES_FILE, packed.getvalue())

  def write_json(self, name: str, data: Mapping[str, Any]) -> str:
    """Writes `data` as JSON to `name` inside the work directory (`write_whole`); its path."""
    return self.write_whole(name, json.dumps(data, indent=1))

  def write_whole(self, name: str, data: str | bytes) -> str:
    """Writes `data` (text as UTF-8) to `name` inside the work directory, whole or not at all
    (process 0 writes): a reader, a kill or a full disk never leaves it in part; its path."""
    path = self.file(name)
    content = data.encode('utf-8') if isinstance(data, str) else data
    if jax.process_index() == 0:
      path.parent.mkdir(parents=True, exist_ok=True)
      if '://' in self.path:  # An object store's write is whole.
        path.write_bytes(content)
      else:
        with replaced_whole(str(path)) as partial:
          with open(partial, 'wb') as f:
            f.write(content)
    return str(path)

  def analysis_dir(self) -> str:
    """WORKDIR/analysis, created: where analyses write figures, reports and pruned runs."""
    path = self.file(ANALYSIS_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return str(path)

  # Orbax.

  @property
  def manager(self) -> ocp.CheckpointManager:
    """The orbax manager of WORKDIR/checkpoints: read-only unless a `RunWriter` keeps some."""
    if self._manager is None:
      read_only = self._keep is None
      options = ocp.CheckpointManagerOptions(  # Read-only: nothing to keep or save, as orbax wants.
          max_to_keep=None if read_only else self._keep,
          save_interval_steps=0 if read_only else 1,
          create=not read_only,
          read_only=read_only,
          cleanup_tmp_directories=not read_only,
      )  # A killed or refused save's partial one.
      self._manager = self._listed(
          lambda: ocp.CheckpointManager(
              self.file(CHECKPOINT_DIR),
              options=options,
              item_handlers={
                  'state': ocp.StandardCheckpointHandler(),
                  'meta': ocp.JsonCheckpointHandler(),
              },
          )
      )
    return self._manager

  def _listed(self, list_steps: Callable[[], Any]) -> Any:
    """list_steps() (orbax listing the steps, then reading each one's time), listed again when a
    live run's retention deletes a listed step before its time is read."""
    absl_logger = std_logging.getLogger('absl')  # Orbax's, from its listing threads too.
    absl_logger.addFilter(_not_of_a_deleted_step)
    try:
      for _ in range(PIN_ATTEMPTS):
        try:
          return list_steps()
        except FileNotFoundError:
          if not self.file(CHECKPOINT_DIR).is_dir():
            raise
    finally:
      absl_logger.removeFilter(_not_of_a_deleted_step)
    raise ValueError(
        f'The checkpoints of {self.path!r} changed under each of {PIN_ATTEMPTS} listings '
        '(a live run saving and deleting them); read it again, or once it has finished.'
    )

  def _restore(self, step: int, like: Any = None, *, state: bool = True) -> Any:
    """The one reader: step `step`'s items, {'meta'[, 'state']}.

    The state onto `like`'s shardings, or without it as host arrays, checked against the
    checksums the save recorded (`checksums`; DamagedCheckpoint where a bit changed since) unless
    `like` casts it (a resume with another `mu_dtype`); the meta item always, as a checkpoint
    whose metadata is lost cannot be checked.
    """
    items = {'meta': ocp.args.JsonRestore()}
    as_saved = True  # Whether the state is read in the dtypes it was saved in (else: cast).
    if state:
      saved = self.manager.item_metadata(step)['state'].tree
      if like is None:
        like = jax.tree.map(lambda leaf: np.empty(leaf.shape, leaf.dtype), saved)
      dtypes = lambda tree: sorted(str(leaf.dtype) for leaf in jax.tree.leaves(tree))
      as_saved = dtypes(saved) == dtypes(like)
      items['state'] = ocp.args.StandardRestore(like)
    restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    recorded = restored['meta'].get(CHECKSUMS) if state and as_saved else None
    if recorded is not None and sorted(checksums(restored['state'])) != sorted(recorded):
      raise DamagedCheckpoint(
          f'the arrays of step {step} differ from what was saved (checksums): its files were '
          'changed or damaged since'
      )
    return restored

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
      except (IncompatibleLayout, _Vanished):
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
