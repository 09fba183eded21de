"""The run config's one validation pass: every field range-checked before anything is built.

`validate(config)` checks each field of `configs/common.py` and the family configs against its
rule in `RULES` (type and range), then the settings that only make sense together (batch sizes
over devices, processes, micro-batches and repeated augmentation; warm-up within training; a
teacher for distillation; the digits default on another dataset), then the model's own fields
(`check_fields` of the registered model) and the evaluators' settings (checked by the evaluators).
It raises one `ConfigError` that lists every bad field with its value and what would be valid, so
a run never starts, compiles or writes with a setting that cannot work. Defaults live in the config files only; this module knows ranges, not values.
"""

import dataclasses
import math
from typing import Any, Callable, Iterable

import ml_collections

from vit_jax import augment
from vit_jax import evaluators
from vit_jax import input_pipeline
from vit_jax import models
from vit_jax import sharding
from vit_jax.datasets import digits
from vit_jax.datasets import folder

DTYPES = ('float32', 'bfloat16', 'float16')
OPTIMIZERS = ('adamw', 'sgd')
DISTILLATION_TYPES = ('none', 'hard', 'soft')


class ConfigError(ValueError):
  """Every problem of a config at once: `problems` holds one line per bad field."""

  def __init__(self, problems: list[str]):
    self.problems = problems
    if len(problems) == 1:
      super().__init__(f'Config field not valid: {problems[0]}')
    else:
      super().__init__(f'{len(problems)} config fields are not valid:\n'
                       + '\n'.join(f'  {p}' for p in problems))


@dataclasses.dataclass(frozen=True)
class Rule:
  """What one field accepts: a predicate, and the words that tell a user what is valid."""
  accepts: Callable[[Any], bool]
  valid: str


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer(low: int | None = None) -> Rule:
  """An int (not a bool) of at least `low`."""
  return Rule(lambda v: isinstance(v, int) and not isinstance(v, bool)
              and (low is None or v >= low),
              'an integer' if low is None else f'an integer >= {low}')


def number(low: float, high: float = math.inf, *, low_open: bool = False,
           high_open: bool = False, optional: bool = False) -> Rule:
  """A finite number in the interval; `optional` also accepts None (unset)."""
  def accepts(v):
    if v is None:
      return optional
    return (_is_number(v) and (v > low if low_open else v >= low)
            and (v < high if high_open else v <= high))
  if high == math.inf:
    words = f'a number {">" if low_open else ">="} {low:g}'
  else:
    words = f'a number in {"(" if low_open else "["}{low:g}, {high:g}{")" if high_open else "]"}'
  return Rule(accepts, words + (', or None (unset)' if optional else ''))


def choice(values: Iterable[Any]) -> Rule:
  values = tuple(values)
  return Rule(lambda v: v in values, f'one of {list(values)}')


def text(*, empty: bool = False, optional: bool = False) -> Rule:
  """A string (non-empty unless `empty`); `optional` also accepts None."""
  return Rule(lambda v: (v is None and optional) or (isinstance(v, str) and (empty or bool(v))),
              ('a string' if empty else 'a non-empty string') + (' or None' if optional else ''))


BOOLEAN = Rule(lambda v: isinstance(v, bool), 'true or false')
PROBABILITY = number(0.0, 1.0)
RATE_BELOW_ONE = number(0.0, 1.0, high_open=True)
NAMES = Rule(lambda v: isinstance(v, (tuple, list)) and all(isinstance(n, str) for n in v),
             'a tuple of parameter names')


def _randaugment(spec: Any) -> bool:
  if not isinstance(spec, str):
    return False
  if spec:
    augment.parse_randaugment(spec)  # Its ValueError says what is wrong with the spec.
  return True


# Every field of configs/common.py and the family configs ('model.*' belongs to the model).
RULES: dict[str, Rule] = {
    'seed': integer(),
    'dataset': text(),
    'data_dir': text(optional=True),
    'train_split': text(),
    'eval_split': text(),
    'image_size': integer(1),
    'augment': choice(input_pipeline.AUGMENTS),
    'crop_padding': integer(0),
    'flip': BOOLEAN,
    'eval_crop_ratio': number(0.0, 1.0, low_open=True),
    'normalization': choice(input_pipeline.NORMALIZATIONS),
    'shuffle_buffer': integer(1),
    'prefetch': integer(1),
    'randaugment': Rule(_randaugment, "'' (off) or a timm spec such as 'rand-m9-mstd0.5-inc1'"),
    'random_erase_prob': PROBABILITY,
    'repeated_aug': integer(1),
    'mixup_alpha': number(0.0),
    'cutmix_alpha': number(0.0),
    'mix_switch_prob': PROBABILITY,
    'mix_prob': PROBABILITY,
    'batch_size': integer(1),
    'eval_batch_size': integer(1),
    'optimizer': choice(OPTIMIZERS),
    'base_lr': number(0.0, low_open=True),
    'lr_scaling_batch': integer(0),
    'min_lr': number(0.0),
    'warmup_lr': number(0.0),
    'warmup_steps': integer(0),
    'total_steps': integer(1),
    'num_epochs': number(0.0, low_open=True, optional=True),
    'warmup_epochs': number(0.0, optional=True),
    'weight_decay': number(0.0),
    'momentum': RATE_BELOW_ONE,
    'b1': RATE_BELOW_ONE,
    'b2': RATE_BELOW_ONE,
    'eps': number(0.0, low_open=True),
    'grad_clip_norm': number(0.0),
    'label_smoothing': RATE_BELOW_ONE,
    'grad_accum_steps': integer(1),
    'ema_decay': RATE_BELOW_ONE,
    'dtype': choice(DTYPES),
    'mu_dtype': Rule(lambda v: v == '' or v in DTYPES,
                     f"'' (the parameters' dtype) or one of {list(DTYPES)}"),
    'no_decay_names': NAMES,
    'log_every': integer(1),
    'eval_every': integer(1),
    'checkpoint_every': integer(1),
    'keep_checkpoints': integer(1),
    'mesh.fsdp': integer(1),
    'mesh.fsdp_min_size': integer(0),
    'distillation.type': choice(DISTILLATION_TYPES),
    'distillation.alpha': PROBABILITY,
    'distillation.tau': number(0.0, low_open=True),
    'distillation.teacher': text(empty=True),
    'distillation.teacher_normalization': Rule(
        lambda v: v == '' or v in input_pipeline.NORMALIZATIONS,
        f"'' (the student's) or one of {list(input_pipeline.NORMALIZATIONS)}"),
    'init_from': text(empty=True),
    'eval_only': BOOLEAN,
    'use_ema': BOOLEAN,
    'skip_unreadable_images': BOOLEAN,
}


def _flatten(config: ml_collections.ConfigDict, prefix: str = '') -> dict[str, Any]:
  """'distillation.alpha' -> value for every leaf field except the model's and evaluators'."""
  flat = {}
  for key, value in config.items():
    path = f'{prefix}{key}'
    if path in ('model', 'evaluators'):  # Checked by their owners (`_model_problems` and
      continue                           # `_evaluator_problems`).
    if isinstance(value, ml_collections.ConfigDict):
      flat.update(_flatten(value, f'{path}.'))
    else:
      flat[path] = value
  return flat


def _field_problems(fields: dict[str, Any]) -> list[str]:
  problems = []
  for path, value in fields.items():
    rule = RULES.get(path)
    if rule is None:
      problems.append(f'{path}={value!r}: not a known field; valid fields: {sorted(RULES)}.')
      continue
    try:
      if not rule.accepts(value):
        problems.append(f'{path}={value!r}: must be {rule.valid}.')
    except ValueError as e:
      problems.append(f'{path}={value!r}: {e}')
  return problems


def _batch_problems(c: dict[str, Any], devices: int, processes: int) -> list[str]:
  """Global batches that do not split evenly over processes, devices and micro-batches."""
  problems = []
  batch, accumulate = c['batch_size'], c['grad_accum_steps']
  if batch % (devices * accumulate) or batch % processes:
    step = math.lcm(devices * accumulate, processes)
    problems.append(
        f'batch_size={batch}: must be a multiple of the {devices} device(s) × grad_accum_steps='
        f'{accumulate} and of the {processes} process(es), i.e. of {step} (e.g. '
        f'{max(step, batch // step * step)}), so that every micro-batch spans every device equally.')
  eval_batch = c['eval_batch_size']
  if eval_batch % math.lcm(devices, processes):
    step = math.lcm(devices, processes)
    problems.append(f'eval_batch_size={eval_batch}: must be a multiple of the {devices} device(s) '
                    f'and {processes} process(es), i.e. of {step} (e.g. '
                    f'{max(step, eval_batch // step * step)}).')
  return problems


def _schedule_problems(c: dict[str, Any]) -> list[str]:
  """A warm-up longer than the training it belongs to."""
  problems = []
  if c['num_epochs'] is None and c['warmup_epochs'] is None and c['warmup_steps'] > c['total_steps']:
    problems.append(f'warmup_steps={c["warmup_steps"]}: must be <= total_steps='
                    f'{c["total_steps"]}.')
  if c['num_epochs'] is not None and c['warmup_epochs'] is not None and (
      c['warmup_epochs'] > c['num_epochs']):
    problems.append(f'warmup_epochs={c["warmup_epochs"]}: must be <= num_epochs={c["num_epochs"]}.')
  return problems


def _distillation_problems(c: dict[str, Any]) -> list[str]:
  """Distillation without a teacher."""
  problems = []
  if c['distillation.type'] != 'none' and not c['distillation.teacher']:
    problems.append(f"distillation.type={c['distillation.type']!r}: needs distillation.teacher, "
                    'the --workdir of a run of vit_jax.main or MODEL:FILE (or '
                    "distillation.type='none').")
  return problems


def _dataset_problems(c: dict[str, Any]) -> list[str]:
  """The quick digits default (its model and normalization) asked to train on another named dataset.

  An image folder may hold digits itself (or anything the user chose the digits settings for).
  """
  problems = []
  if (c['normalization'] == digits.NAME and c['dataset'] != digits.NAME
      and not c['dataset'].startswith(folder.PREFIX)):
    problems.append(
        f"dataset={c['dataset']!r}: the config's default is the quick model for the embedded "
        "digits (normalization='digits'); pick a published size with the config's variant= "
        f"argument, e.g. --config='configs/vit.py:variant=S/4,dataset={c['dataset']}', or set "
        'every field for it yourself (at least --config.normalization).')
  return problems


_BATCH_FIELDS = ('batch_size', 'eval_batch_size', 'grad_accum_steps', 'repeated_aug')
_JOINT_CHECKS = (
    (('num_epochs', 'warmup_epochs', 'warmup_steps', 'total_steps'), _schedule_problems),
    (('distillation.type', 'distillation.teacher'), _distillation_problems),
    (('normalization', 'dataset'), _dataset_problems),
)


def _model_problems(model: ml_collections.ConfigDict) -> list[str]:
  """The registered model's own field checks (`check_fields`), as one problem."""
  name = model.get('name')
  overrides = {k: v for k, v in model.items() if k != 'name'}
  try:
    models.create(name, num_classes=1, **overrides).check_fields()
  except (ValueError, TypeError) as e:
    return [f'model.name={name!r}: {e}' if name not in models.names() else f'model: {e}']
  return []


def _evaluator_problems(config: ml_collections.ConfigDict) -> list[str]:
  """Every evaluator's settings, checked by the evaluator itself (`vit_jax.evaluators`)."""
  problems = []
  for name, settings in config.get('evaluators', {}).items():
    try:
      evaluators.create(name, settings)
    except ValueError as e:
      problems.append(f'evaluators.{name}: {e}')
  return problems


def validate(config: ml_collections.ConfigDict, *, devices: int | None = None,
             processes: int | None = None) -> None:
  """Raises `ConfigError` listing every bad field of `config`; compiles and reads nothing.

  `devices` and `processes` (default: JAX's global counts) are what the batches must divide.
  """
  if devices is None or processes is None:
    import jax  # pylint: disable=g-import-not-at-top
    devices = jax.device_count() if devices is None else devices
    processes = jax.process_count() if processes is None else processes
  fields = _flatten(config)
  problems = _field_problems(fields)
  problems += [f'{path}: missing; every config needs it (see configs/common.py).'
               for path in sorted(set(RULES) - set(fields))]
  bad = {p.split('=', 1)[0].split(':', 1)[0] for p in problems}
  # Each joint check runs only when the fields it reads are valid on their own.
  if not bad & set(_BATCH_FIELDS):
    problems += _batch_problems(fields, devices, processes)
  if 'mesh.fsdp' not in bad:
    try:
      sharding.check_mesh(fields['mesh.fsdp'], devices)
    except ValueError as e:
      problems.append(str(e))
  for needed, check in _JOINT_CHECKS:
    if not bad & set(needed):
      problems += check(fields)
  problems += _model_problems(config.model)
  problems += _evaluator_problems(config)
  if problems:
    raise ConfigError(problems)
