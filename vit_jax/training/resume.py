"""Resuming a run whose config changed since its checkpoints were written.

Changes that only add or drop state carry over: gradient clipping, the EMA (started from the
current weights when turned on), the schedule and step count, and `mu_dtype` (moments cast). Any
other change (another model, another optimizer) is refused from the checkpoint's metadata and
config.json, before anything is read or written, naming the changed fields.
"""

import dataclasses
import json
from typing import Any, Callable, Mapping

from absl import logging
import jax

from vit_jax.schema import config as config_lib
from vit_jax.training import run_writer
from vit_jax.training import steps
from vit_jax.workdir import reader
from vit_jax.workdir import run_files
from vit_jax.workdir import shape_diff

_HARMLESS = 'nothing saved depends on it'


class IncompatibleCheckpoint(ValueError):
  """The work directory's checkpoint reads, but this config cannot resume it."""


@dataclasses.dataclass(frozen=True)
class Plan:
  """How to resume: read the checkpoint (of `step`) in this run's layout with gradient clipping
  and the EMA on or off as `clip` and `ema` say (the saved run's), then carry it over."""

  step: int
  clip: bool
  ema: bool
  changed: dict[str, tuple[Any, Any]]


def changed_fields(
    saved: Mapping[str, Any] | None, fields: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
  """field -> (saved value, new value) for every field that differs, both given by name as
  config.json holds them (`config.json_fields`); {} without a saved config."""
  if saved is None:
    return {}
  return {
      k: (saved.get(k), fields.get(k))
      for k in sorted(set(saved) | set(fields))
      if saved.get(k) != fields.get(k)
  }


_FIELDS = {field.name: field for field in config_lib.FIELDS}
_SECTIONS = {section.name: section for section in config_lib.SECTIONS}


def _saved(name: str) -> bool:
  """Whether a saved array depends on config field `name` (a section's field: on its section)."""
  if name in _FIELDS:
    return _FIELDS[name].resume.saved
  section = _SECTIONS.get(name.split('.')[0])
  return section is None or section.saved


def _flag(value: Any) -> str:
  if value == '':
    return "''"
  return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def _shown(field: str, value: Any) -> str:
  """`value` of `field` as a message names it: an empty one with what it stands for."""
  if value is None:
    return 'unset'
  unset = _FIELDS[field].rule.unset if field in _FIELDS else ''
  return f"'' ({unset})" if value == '' and unset else _flag(value)


def _note(field: str, old: Any, new: Any) -> str:
  """What resuming does about one changed field."""
  declared = _FIELDS.get(field)
  if declared is None:
    return _HARMLESS
  resume = declared.resume
  if resume.started:
    if bool(old) != bool(new):
      return resume.started if new else resume.stopped
    return 'the saved state carries over as it is'
  return resume.note.format(new=new or declared.rule.unset) if resume.note else _HARMLESS


def plan(
    run: reader.Workdir,
    fields: Mapping[str, Any],
    abstract_state: Any,
    abstract_for: Callable[[bool, bool], Any],
) -> Plan | None:
  """How this run (its `fields` as config.json holds them, its `abstract_state`, and
  `abstract_for(clip, ema)` that state with clipping and EMA on or off) resumes `run`'s newest
  checkpoint; None without one. IncompatibleCheckpoint, touching nothing, where none fits."""
  if jax.process_index() == 0:  # Said before anything about the checkpoints is.
    run_writer.refuse_if_in_use(run.path)
  found = run.newest_layout()
  if found is None:
    return None
  step, saved_model, saved_shapes = found
  try:
    saved = run.config()
  except ValueError as e:  # Damaged: the checkpoint's metadata alone decides; the run rewrites it.
    logging.warning('%s', e)
    saved = None
  changed = changed_fields(None if saved is None else config_lib.json_fields(saved), fields)
  recorded_model = None if saved is None else saved.model.get('name')
  if saved_model != recorded_model == fields['model.name']:
    raise IncompatibleCheckpoint(
        f'The checkpoint of step {step} in {run.path!r} names the model {saved_model!r} in its '
        f"metadata, but the run's {run_files.CONFIG_FILE} and this config name "
        f'{recorded_model!r}: its metadata is damaged. Move '
        f'{run.file(run_files.CHECKPOINT_DIR) / str(step)} away to resume from the checkpoint '
        'before it.'
    )
  if saved_model == fields['model.name']:
    layouts = [(bool(fields['grad_clip_norm']), bool(fields['ema_decay']))]
    layouts += [(c, e) for c in (False, True) for e in (False, True) if (c, e) not in layouts]
    for clip, ema in layouts:
      abstract = abstract_state if (clip, ema) == layouts[0] else abstract_for(clip, ema)
      if shape_diff.flat_shapes(abstract) == saved_shapes:
        for field, (old, new) in changed.items():
          note = _note(field, old, new)
          log = logging.info if note == _HARMLESS else logging.warning
          log(
              'Resuming step %d of %s with %s changed from %s to %s: %s.',
              step,
              run.path,
              field,
              _shown(field, old),
              _shown(field, new),
              note,
          )
        return Plan(step=step, clip=clip, ema=ema, changed=changed)
  raise IncompatibleCheckpoint(
      _refusal(
          run,
          step,
          saved_model,
          fields,
          changed,
          shape_diff.ShapeDiff.between(saved_shapes, shape_diff.flat_shapes(abstract_state)),
      )
  )


def _refusal(
    run: reader.Workdir,
    step: int,
    saved_model: str,
    fields: Mapping[str, Any],
    changed: dict[str, tuple[Any, Any]],
    diff: shape_diff.ShapeDiff,
) -> str:
  """One error: what differs, and both ways forward."""
  named = {k: v for k, v in changed.items() if _saved(k)}
  if saved_model != fields['model.name']:
    named.setdefault('model.name', (saved_model, fields['model.name']))
  if named:
    what = 'changed ' + ', '.join(
        f'{k} ({_shown(k, old)} -> {_shown(k, new)})' for k, (old, new) in named.items()
    )
    revert = ' '.join(
        f'--config.{k}={_flag(old)}' for k, (old, _) in named.items() if old is not None
    )
  else:  # No config.json to compare with: the saved arrays say what differs.
    what = "its saved arrays differ from this config's" + diff.listing(limit=5)
    revert = f'the config in its {run_files.CONFIG_FILE}'
  return (
      f'The work directory {run.path!r} holds a checkpoint (step {step}) that this config '
      f'cannot resume: {what}. Nothing was changed. Either revert ({revert}) to resume it, '
      f'or start a new run from its weights: --workdir=NEW_DIR '
      f'--config.init_from={run.path}.'
  )


def carry_over(
    state: steps.TrainState, ema: bool, abstract_state: Any, state_sharding: Any
) -> steps.TrainState:
  """A saved state read in its own layout (`Plan`'s) in this run's (`abstract_state`, with an EMA
  if `ema`), its arrays bit for bit: clipping adds no array to the optimizer state, so the saved
  ones fill this optimizer's in order; the EMA is kept, started from the variables, or dropped."""
  opt_leaves = jax.tree.leaves(state.opt_state)
  abstract_leaves, opt_structure = jax.tree.flatten(abstract_state.opt_state)
  if len(abstract_leaves) != len(opt_leaves):  # plan() compared every shape: cannot happen.
    raise IncompatibleCheckpoint('The saved optimizer state does not fit this optimizer.')
  state = state.replace(opt_state=jax.tree.unflatten(opt_structure, opt_leaves))
  if not (ema and state.ema):
    state = steps.with_fresh_ema(state, ema)
  return jax.jit(lambda s: s, out_shardings=state_sharding)(state)
