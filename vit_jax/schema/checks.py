"""The checks of a config's fields, without JAX, TensorFlow or a model: each field against its
rule (`vit_jax.schema.config.FIELDS`; the dataset's name and the test sets' names included), the fields
every config needs, the batch sizes over devices, processes, micro-batches and repeated
augmentation (given the devices), and the settings that only make sense together (warm-up within
training; a teacher for distillation; the quick digits model on another dataset).
`validate_fields(config)` raises them as one `ConfigError`, so that a command answers a mistyped
field at once; `vit_jax.loop.setup.validate` adds what the owners above check (the mesh, the
model's fields, the evaluators' settings).
"""

import math
from typing import Any, Sequence

import ml_collections

from vit_jax.schema import config as config_lib
from vit_jax.schema import dataset_names as datasets


class ConfigError(ValueError):
  """Every problem of a config at once: `problems` holds one line per bad field."""

  def __init__(self, problems: list[str]):
    self.problems = problems
    if len(problems) == 1:
      super().__init__(f'Config field not valid: {problems[0]}')
    else:
      super().__init__(
          f'{len(problems)} config fields are not valid:\n' + '\n'.join(f'  {p}' for p in problems)
      )


def _flatten(config: ml_collections.ConfigDict, prefix: str = '') -> dict[str, Any]:
  """'distillation.alpha' -> value for every leaf field, sections (model, evaluators) excepted."""
  flat = {}
  sections = {section.name for section in config_lib.SECTIONS}
  for key, value in config.items():
    path = f'{prefix}{key}'
    if path in sections:  # Checked by their owners (`vit_jax.loop.setup.validate`).
      continue
    if isinstance(value, ml_collections.ConfigDict):
      flat.update(_flatten(value, f'{path}.'))
    else:
      flat[path] = value
  return flat


def field_problems(fields: dict[str, Any]) -> list[str]:
  """Each field against its rule, in the order `FIELDS` declares them (unknown fields last)."""
  problems = []
  by_name = {field.name: field for field in config_lib.FIELDS}
  rank = {name: i for i, name in enumerate(by_name)}
  for path, value in sorted(fields.items(), key=lambda item: rank.get(item[0], len(rank))):
    field = by_name.get(path)
    if field is None:
      problems.append(
          f'{config_lib.FLAG}{path}={value!r}: not a known field; valid fields: '
          f'{sorted(by_name)} (python -m vit_jax.config lists them).'
      )
      continue
    try:
      if not field.rule.accepts(value):
        problems.append(f'{config_lib.FLAG}{path}={value!r}: must be {field.rule.valid}.')
    except ValueError as e:
      problems.append(f'{config_lib.FLAG}{path}={value!r}: {e}')
  return problems


def _batch_problems(c: dict[str, Any], devices: int, processes: int) -> list[str]:
  """Global batches that do not split evenly over processes, devices and micro-batches."""
  problems = []
  batch, accumulate = c['batch_size'], c['grad_accum_steps']
  if batch % (devices * accumulate) or batch % processes:
    step = math.lcm(devices * accumulate, processes)
    problems.append(
        f'{config_lib.FLAG}batch_size={batch}: must be a multiple of the {devices} device(s) × '
        f'{config_lib.FLAG}grad_accum_steps={accumulate} and of the {processes} process(es), '
        f'i.e. of {step} (e.g. {max(step, batch // step * step)}), so that every micro-batch '
        'spans every device equally.'
    )
  if c['repeated_aug'] > batch // processes:
    problems.append(
        f'{config_lib.FLAG}repeated_aug={c["repeated_aug"]}: must be <= the '
        f'{batch // processes} examples each process loads per batch '
        f'({config_lib.FLAG}batch_size={batch} over {processes} process(es)), which count the '
        'copies of each example.'
    )
  eval_batch = c['eval_batch_size']
  if eval_batch % math.lcm(devices, processes):
    step = math.lcm(devices, processes)
    problems.append(
        f'{config_lib.FLAG}eval_batch_size={eval_batch}: must be a multiple of the {devices} '
        f'device(s) and {processes} process(es), i.e. of {step} (e.g. '
        f'{max(step, eval_batch // step * step)}).'
    )
  return problems


def _schedule_problems(c: dict[str, Any]) -> list[str]:
  """A warm-up longer than the training it belongs to."""
  problems = []
  if (
      c['num_epochs'] is None
      and c['warmup_epochs'] is None
      and c['warmup_steps'] > c['total_steps']
  ):
    problems.append(
        f'{config_lib.FLAG}warmup_steps={c["warmup_steps"]}: must be <= '
        f'{config_lib.FLAG}total_steps={c["total_steps"]}.'
    )
  if (
      c['num_epochs'] is not None
      and c['warmup_epochs'] is not None
      and (c['warmup_epochs'] > c['num_epochs'])
  ):
    problems.append(
        f'{config_lib.FLAG}warmup_epochs={c["warmup_epochs"]}: must be <= '
        f'{config_lib.FLAG}num_epochs={c["num_epochs"]}.'
    )
  return problems


def _learning_rate_problems(c: dict[str, Any]) -> list[str]:
  """A cosine that would climb: its end above its peak."""
  if c['min_lr'] > c['base_lr']:
    return [
        f'{config_lib.FLAG}min_lr={c["min_lr"]}: must be <= {config_lib.FLAG}base_lr='
        f'{c["base_lr"]}, the peak the cosine decays from to it.'
    ]
  return []


def _distillation_problems(c: dict[str, Any]) -> list[str]:
  """Distillation without a teacher."""
  problems = []
  if c['distillation.type'] != 'none' and not c['distillation.teacher']:
    problems.append(
        f"{config_lib.FLAG}distillation.type={c['distillation.type']!r}: needs "
        f'{config_lib.FLAG}distillation.teacher, the --workdir of a run of vit_jax.main or '
        f"MODEL:FILE (or {config_lib.FLAG}distillation.type='none')."
    )
  return problems


def quick_default_problems(
    dataset: str,
    normalization: str,
    variants: Sequence[str] = (),
    *,
    name: str = f'{config_lib.FLAG}dataset',
) -> list[str]:
  """The quick model of a family config (for the embedded 8×8 digits, normalization='digits')
  asked to train on another named dataset, which it does not fit; an image folder may hold
  digits itself. `variants` (the family's published sizes) are named as the ones to pick."""
  if (
      normalization != 'digits'
      or dataset == datasets.DIGITS
      or dataset.startswith(datasets.FOLDER_PREFIX)
  ):
    return []
  unknown = datasets.unknown(dataset)
  if unknown:  # Said first: no variant makes an unknown name train.
    return [f'{name}={dataset!r}: {unknown}']
  if variants:
    pick = (
        f'add variant= with one of {", ".join(variants)} after the config file\'s colon, '
        f'e.g. variant={list(variants)[0]},dataset={dataset}'
    )
  else:
    pick = (
        "add variant= after the config file's colon (its docstring lists the published "
        f"sizes), e.g. --config='configs/vit.py:variant=S/16,dataset={dataset}' (S/4 for "
        '32-pixel images)'
    )
  return [
      f"{name}={dataset!r}: does not fit the config's default, the quick model for the "
      f"embedded digits (normalization='digits'): {pick}; or set every field for it "
      f'yourself (at least {config_lib.FLAG}normalization).'
  ]


def require_fit(config: ml_collections.ConfigDict, variants: Sequence[str]) -> None:
  """Raises ValueError when a family config's quick digits default got another dataset (as the
  `dataset=` argument after the config file's colon)."""
  problems = quick_default_problems(config.dataset, config.normalization, variants, name='dataset')
  if problems:
    raise ValueError(problems[0])


def _recipe_problems(c: dict[str, Any]) -> list[str]:
  """DeiT III's pieces with the settings they replace or cannot work with."""
  problems = []
  if c['three_augment'] and c['randaugment']:
    problems.append(
        f'{config_lib.FLAG}three_augment=True: replaces RandAugment (deit main.py swaps the whole '
        f"training transform for 3-Augment); set {config_lib.FLAG}randaugment='' or "
        f'{config_lib.FLAG}three_augment=False.'
    )
  if c['loss'] == 'bce' and c['label_smoothing'] > 0:
    problems.append(
        f"{config_lib.FLAG}loss='bce' with {config_lib.FLAG}label_smoothing="
        f"{c['label_smoothing']}: BCE targets are the classes with weight > 0 (deit engine.py), "
        'and smoothing gives every class weight > 0; set '
        f'{config_lib.FLAG}label_smoothing=0.0 (DeiT III) or '
        f"{config_lib.FLAG}loss='softmax_xent'."
    )
  return problems


_BATCH_FIELDS = ('batch_size', 'eval_batch_size', 'grad_accum_steps', 'repeated_aug')
_JOINT_CHECKS = (
    (('num_epochs', 'warmup_epochs', 'warmup_steps', 'total_steps'), _schedule_problems),
    (('min_lr', 'base_lr'), _learning_rate_problems),
    (('distillation.type', 'distillation.teacher'), _distillation_problems),
    (
        ('normalization', 'dataset'),
        lambda c: quick_default_problems(c['dataset'], c['normalization']),
    ),
    (('three_augment', 'randaugment', 'loss', 'label_smoothing'), _recipe_problems),
)


def _problems_alone(config: ml_collections.ConfigDict, fields: dict[str, Any]) -> list[str]:
  """Each field against its rule and the fields every config needs (`field_problems`)."""
  problems = field_problems(fields)
  problems += [
      f'{config_lib.FLAG}{path}: missing; every config needs it (python -m vit_jax.config lists them).'
      for path in sorted({field.name for field in config_lib.FIELDS} - set(fields))
  ]
  problems += [
      f'{config_lib.FLAG}{section.name}: missing; every config needs it (python -m vit_jax.config lists them).'
      for section in config_lib.SECTIONS
      if section.name not in config
  ]
  return problems


def bad_fields(problems: list[str]) -> set[str]:
  """The fields (and sections) that `problems` name."""
  return {p.removeprefix(config_lib.FLAG).split('=', 1)[0].split(':', 1)[0] for p in problems}


def _joint_problems(fields: dict[str, Any], bad: set[str]) -> list[str]:
  """The settings that only make sense together, each checked where the fields it reads are
  valid on their own (not in `bad`)."""
  return [p for needed, check in _JOINT_CHECKS if not bad & set(needed) for p in check(fields)]


def problems(
    config: ml_collections.ConfigDict, *, devices: int | None = None, processes: int = 1
) -> list[str]:
  """What the fields show, in one line each: every field against its rule (the dataset's name
  included), the fields every config needs, the batches over `devices` and `processes` (when
  `devices` is given) and the settings that only make sense together.

  Each joint check runs only when the fields it reads are valid on their own. The model, the
  evaluators and the mesh are checked above this module (`vit_jax.loop.setup.validate`).
  """
  fields = _flatten(config)
  found = _problems_alone(config, fields)
  bad = bad_fields(found)
  if devices is not None and not bad & set(_BATCH_FIELDS):
    found += _batch_problems(fields, devices, processes)
  return found + _joint_problems(fields, bad)


def validate_fields(config: ml_collections.ConfigDict) -> None:
  """Raises `ConfigError` listing what the fields alone show (`problems`), without JAX,
  TensorFlow or a model.

  A command calls it before importing them, to answer a mistyped field in a fraction of a
  second; `vit_jax.loop.setup.validate` checks the rest (the batch sizes over the devices,
  the mesh, the model, the evaluators).
  """
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(
        f"the config file's get_config() returned {config!r} ({type(config).__name__}), not an "
        'ml_collections.ConfigDict; start it from a family config, e.g. '
        '`config = vit.get_config()` (vit_jax.configs), and return that.'
    )
  found = problems(config)
  if found:
    raise ConfigError(found)
