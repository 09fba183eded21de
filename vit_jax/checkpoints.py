"""Checkpoints: the training state in the work directory, saved and restored with orbax."""

import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

CHECKPOINT_DIR = 'checkpoints'


def param_shapes(params: Any) -> dict[str, list[int]]:
  """Maps every parameter path ('block_0/attn/qkv/kernel') to its shape."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return {
      '/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path): list(np.shape(leaf))
      for path, leaf in flat
  }


def checkpoint_manager(workdir: str, *, keep: int, read_only: bool = False
                       ) -> ocp.CheckpointManager:
  """An orbax manager over `workdir/checkpoints`, keeping the newest `keep` steps."""
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                         read_only=read_only)
  return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR),
                               options=options, item_names=('state', 'meta'))


def has_checkpoint(workdir: str) -> bool:
  """Whether `workdir` holds at least one finished training checkpoint."""
  directory = os.path.join(workdir, CHECKPOINT_DIR)
  if not os.path.isdir(directory):
    return False
  return checkpoint_manager(workdir, keep=1, read_only=True).latest_step() is not None


def check_compatible(workdir: str, model_name: str, params: Any) -> None:
  """Raises ValueError if `workdir`'s newest checkpoint belongs to another model.

  Compares the model name and every parameter shape recorded in the checkpoint with the model
  about to be trained, so a typo in --workdir never silently overwrites someone else's run.
  """
  if not has_checkpoint(workdir):
    return
  manager = checkpoint_manager(workdir, keep=1, read_only=True)
  step = manager.latest_step()
  meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))['meta']
  saved, wanted = meta['param_shapes'], param_shapes(params)
  missing = sorted(set(wanted) - set(saved))
  unexpected = sorted(set(saved) - set(wanted))
  reshaped = sorted(k for k in set(saved) & set(wanted) if saved[k] != wanted[k])
  if meta['model'] != model_name or missing or unexpected or reshaped:
    details = []
    if missing:
      details.append(f'missing from the checkpoint: {missing[:5]}' + ('…' if len(missing) > 5 else ''))
    if unexpected:
      details.append(f'not in the model: {unexpected[:5]}' + ('…' if len(unexpected) > 5 else ''))
    if reshaped:
      details.append('different shapes: ' + ', '.join(
          f'{k} {saved[k]} vs {wanted[k]}' for k in reshaped[:5]))
    raise ValueError(
        f'The work directory {workdir!r} holds a checkpoint (step {step}) of model '
        f'{meta["model"]!r}, but the config trains {model_name!r}'
        + (': ' + '; '.join(details) if details else '')
        + '. Use a new --workdir, or the config that wrote this one (see its config.json).')


def save(manager: ocp.CheckpointManager, step: int, state: Any, *, model_name: str,
         force: bool = False) -> None:
  """Saves the training state together with what `check_compatible` needs."""
  meta = {'model': model_name, 'step': int(step), 'param_shapes': param_shapes(state.params)}
  manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                             meta=ocp.args.JsonSave(meta)), force=force)


def restore(manager: ocp.CheckpointManager, abstract_state: Any, step: int | None = None) -> Any:
  """Restores the state at `step` (default: newest) onto the shardings of `abstract_state`."""
  step = manager.latest_step() if step is None else step
  restored = manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
  return restored['state']


def restore_arrays(workdir: str, step: int | None = None) -> dict[str, Any]:
  """The newest (or `step`'s) training state of `workdir` as a plain tree of host arrays.

  Needs no model or optimizer: for teachers, fine-tuning and analysis, which use the parameters.
  """
  manager = checkpoint_manager(workdir, keep=1, read_only=True)
  step = manager.latest_step() if step is None else step
  if step is None:
    raise ValueError(f'{workdir!r} holds no checkpoint.')
  restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return jax.device_get(restored['state'])


def read_config(workdir: str) -> dict[str, Any] | None:
  """The resolved config a run saved in its work directory, or None."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)
