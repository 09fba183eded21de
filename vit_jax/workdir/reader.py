"""`Workdir`: a run's work directory as every command reads it, and the small results they write.

All reads go through one orbax reader (`_restore`); without a step, the newest readable checkpoint
is read, newer unreadable ones skipped with a warning; beside a live run, a pinned copy (`pins`).
`training.run_writer.RunWriter` extends it with the lock, the saves and resuming.
"""

import contextlib
import dataclasses
import fcntl
import io
import json
import logging as std_logging
import os
import re
import time
from typing import Any, Callable, Iterator, Mapping

from absl import logging
from etils import epath
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from vit_jax.process import extensions
from vit_jax.models import layouts
from vit_jax.workdir import checksums
from vit_jax.workdir import disk_writes
from vit_jax.workdir import pins
from vit_jax.workdir import run_files
from vit_jax.workdir import shape_diff


class IncompatibleLayout(ValueError):
  """A checkpoint that reads, but holds another layout of the training state: never set aside."""


class DamagedCheckpoint(ValueError):
  """A checkpoint reads, but its arrays are not the ones saved (`checksums` differ)."""


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


class Workdir:
  """A run's work directory, read: reading changes nothing there."""

  def __init__(self, path: str):
    self.path = os.path.expanduser(path)  # '--workdir=~/run': the shell leaves '~' after '='.
    self._keep: int | None = None  # Checkpoints kept: None reads only (a `RunWriter` keeps some).
    self._manager: ocp.CheckpointManager | None = None

  @classmethod
  def open(cls, path: str) -> 'Workdir':
    """The trained run in `path`; ValueError unless it has a config.json and a checkpoint."""
    run = cls(path)
    checkpoints = run.file(run_files.CHECKPOINT_DIR)
    if checkpoints.exists() and not checkpoints.is_dir():
      raise ValueError(
          f"{checkpoints} is a file, not the directory of the run's checkpoints: move it away "
          '(a rerun of the training then trains afresh) or restore the directory.'
      )
    if not run.file(run_files.CONFIG_FILE).exists():
      raise ValueError(
          f'{path!r} is not a work directory of a vit_jax.main run: expected '
          f'{run_files.CONFIG_FILE} and a checkpoint in {checkpoints}/<step>.'
      )
    if not run.steps():  # A run that has started and not yet saved, or one that never did.
      raise ValueError(
          f'{path!r} is a vit_jax.main run with no checkpoint yet: a run in progress saves '
          f'its first at --config.checkpoint_every steps (in {checkpoints}/<step>); '
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
    path = self.file(run_files.CONFIG_FILE)
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

  def required_config(self) -> ml_collections.ConfigDict:
    """`config()` of a run that must have one (as `open` checks); ValueError where it has none."""
    config = self.config()
    if config is None:
      raise ValueError(
          f'{self.path!r} is not a work directory of a vit_jax.main run: it has no '
          f'{run_files.CONFIG_FILE}.'
      )
    return config

  def dataset(self) -> dict[str, Any] | None:
    """dataset.json's record of the run's data ({'name', 'num_classes', 'class_names', ...});
    None for a run from before runs recorded it; ValueError naming the file where it is damaged."""
    path = self.file(run_files.DATASET_FILE)
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
    path = self.file(run_files.EVAL_IMAGES_FILE)
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
    if not self.file(run_files.CHECKPOINT_DIR).is_dir():
      return []
    return sorted(self.manager.all_steps())

  def has_checkpoint(self) -> bool:
    """Whether the run has saved at least one finished checkpoint (so training resumes it)."""
    return bool(self.steps())

  def results(self) -> dict[str, Any]:
    """The metrics in results.json; {} before there are any; ValueError naming the file where it
    is damaged (not JSON, or not {name: value, ..., 'steps': {name: step}})."""
    path = self.file(run_files.RESULTS_FILE)
    if not path.exists():
      return {}
    try:
      results = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f'{path} is damaged: not JSON ({e}).') from None
    if not isinstance(results, dict) or not isinstance(
        results.get(run_files.RESULTS_STEPS, {}), dict
    ):
      raise ValueError(
          f'{path} is damaged: expected {{metric: value, ..., {run_files.RESULTS_STEPS!r}: '
          f'{{metric: step}}}}, found a {type(results).__name__}.'
      )
    return results

  def read_state(self, step: int | None = None, *, like: Any = None) -> Any:
    """The training state at `step` (default: the newest readable), onto the shardings of the
    abstract state `like`, or without it as host arrays, whatever mesh or process count wrote it."""
    holder = pins.live_holder(self.path) if self._keep is None else None  # A RunWriter's own.
    read = lambda s: self._restore(s, like)['state']
    if holder is not None:
      read = lambda s: self._read_pinned(s, like)
    for _ in range(pins.PIN_ATTEMPTS if holder is not None else 1):
      try:
        found = self._read_step(step, read)
      except pins.Vanished:
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
    assert holder is not None  # Only a pinned read is tried again.
    raise ValueError(
        f'{self.path!r} is being trained (pid {holder.get("pid", "?")} on host '
        f'{holder.get("host", "?")}), and its retention deleted each of {pins.PIN_ATTEMPTS} '
        'checkpoints while they were being pinned; read it again, or once it has finished.'
    )

  def _read_step(self, step: int | None, read: Callable[[int], Any]) -> tuple[int, Any]:
    """(step, read(step)) at `step`, or without one at the newest step that `read` can read."""
    if step is not None:
      if step not in self.steps():
        raise ValueError(f'No checkpoint at step {step} in {self.path!r}; steps: {self.steps()}.')
      try:
        return step, read(step)
      except pins.Vanished:
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
    """The training state at `step`, read from a pin of its files (`pin`); `pins.Vanished`
    when the live run's retention deletes the step while it is being pinned."""
    source = str(self.file(run_files.CHECKPOINT_DIR) / str(step))
    with self.pin(step) as pinned:
      try:
        return pinned._restore(step, like)['state']  # pylint: disable=protected-access
      except Exception:  # pylint: disable=broad-except
        pinned_names = pins.file_names(str(pinned.file(run_files.CHECKPOINT_DIR) / str(step)))
        for _ in range(10):  # Retention deletes a step's files, then its directory.
          if not os.path.isdir(source) or pins.file_names(source) != pinned_names:
            raise pins.Vanished(step) from None
          time.sleep(0.1)
        raise
      finally:
        if pinned._manager is not None:  # pylint: disable=protected-access
          pinned._manager.close()  # pylint: disable=protected-access

  @contextlib.contextmanager
  def pin(self, step: int) -> Iterator['Workdir']:
    """A read-only `Workdir` of checkpoint `step` pinned (`pins.pinned_checkpoint`)."""
    with pins.pinned_checkpoint(str(self.file('')), step) as root:
      yield Workdir(root)

  def read_variables(
      self, step: int | None = None, *, use_ema: bool = True, unrolled: bool = False
  ) -> SavedVariables:
    """The model variables at `step` (default: newest readable) as host arrays: the run's EMA
    where it kept one and `use_ema` (published DeiT/CaiT/T2T numbers are the EMA model's); with
    `unrolled`, a `scan_layers` run's blocks one by one (`blocks_i`)."""
    state = self.read_state(step)
    ema = bool(use_ema and state.get('ema'))
    source = state['ema'] if ema else state
    variables = {'params': source['params']}
    if source.get('batch_stats'):
      variables['batch_stats'] = source['batch_stats']
    if unrolled:
      variables = layouts.unstack_layers(variables)
    step = int(state['step'])
    logging.info('Read the %s weights of %s (step %d).', 'EMA' if ema else 'raw', self.path, step)
    return SavedVariables(variables, step, ema)

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
    return shape_diff.flat_shapes(self.manager.item_metadata(step)['state'].tree)

  # Small results beside the run.

  def write_results(self, metrics: Mapping[str, float], *, step: int | None) -> str:
    """Merges `metrics`, measured at `step` (None: weights of no run), into results.json under
    results.lock (process 0 writes), so the run's and `vit_jax.evaluate`'s are both kept; its path.
    """
    if jax.process_index() != 0:
      return str(self.file(run_files.RESULTS_FILE))
    with contextlib.ExitStack() as locked:
      if '://' not in self.path:  # Object stores have no locks.
        self.file('').mkdir(parents=True, exist_ok=True)
        lock = locked.enter_context(
            open(self.file(run_files.RESULTS_LOCK_FILE), 'a', encoding='utf-8')
        )
        fcntl.flock(lock, fcntl.LOCK_EX)
      try:
        old = self.results()
      except ValueError as e:  # Set aside, not fatal: the metrics just measured are kept.
        aside = self.file(f'{run_files.RESULTS_FILE}.damaged')
        self.file(run_files.RESULTS_FILE).rename(aside)
        logging.warning(
            '%s Set aside as %s; the new metrics go to a fresh %s.',
            e,
            aside,
            run_files.RESULTS_FILE,
        )
        old = {}
      steps = {**old.get(run_files.RESULTS_STEPS, {}), **dict.fromkeys(metrics, step)}
      return self.write_json(
          run_files.RESULTS_FILE, {**old, **metrics, run_files.RESULTS_STEPS: steps}
      )

  def write_dataset(self, record: Mapping[str, Any], eval_images: np.ndarray | None) -> None:
    """Writes dataset.json (`dataset`) and, given, eval_images.npz (float16): what side commands
    read of the run's data (process 0 writes)."""
    self.write_json(run_files.DATASET_FILE, record)
    if eval_images is not None and jax.process_index() == 0:
      packed = io.BytesIO()
      np.savez_compressed(packed, images=eval_images.astype(np.float16))
      self.write_whole(run_files.EVAL_IMAGES_FILE, packed.getvalue())

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
        with disk_writes.replaced_whole(str(path)) as partial:
          with open(partial, 'wb') as f:
            f.write(content)
    return str(path)

  def analysis_dir(self) -> str:
    """WORKDIR/analysis, created: where analyses write figures, reports and pruned runs."""
    path = self.file(run_files.ANALYSIS_DIR)
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
              self.file(run_files.CHECKPOINT_DIR),
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
    absl_logger.addFilter(pins.not_of_a_deleted_step)
    try:
      for _ in range(pins.PIN_ATTEMPTS):
        try:
          return list_steps()
        except FileNotFoundError:
          if not self.file(run_files.CHECKPOINT_DIR).is_dir():
            raise
    finally:
      absl_logger.removeFilter(pins.not_of_a_deleted_step)
    raise ValueError(
        f'The checkpoints of {self.path!r} changed under each of {pins.PIN_ATTEMPTS} listings '
        '(a live run saving and deleting them); read it again, or once it has finished.'
    )

  def _restore(self, step: int, like: Any = None, *, state: bool = True) -> Any:
    """The one reader: step `step`'s items, {'meta'[, 'state']}; the state onto `like`'s
    shardings (or host arrays), DamagedCheckpoint where it differs from the saved `checksums`
    (unless `like` casts it: a resume with another `mu_dtype`)."""
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
    recorded = restored['meta'].get(checksums.CHECKSUMS) if state and as_saved else None
    if recorded is not None and sorted(checksums.checksums(restored['state'])) != sorted(recorded):
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
    """(step, read(step)) of the newest checkpoint that `read` can read, or None; each newer one
    that fails is logged (unless `quiet`) and passed to `on_unreadable(step, reason)`."""
    for step in reversed(self.steps()):
      try:
        return step, read(step)
      except (IncompatibleLayout, pins.Vanished):
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
