"""The run config's schema: every field declared once, with its default, rule and meaning.

`FIELDS` declares each field a config may hold: its name as typed after `--config.`, its default,
its rule (type and range), what it does, and which settings types hold it (`into`, under another
attribute name where one is given, e.g. 'EvalTransform.crop_ratio'; `convert` turns the value
into what they hold). `defaults()` builds the ConfigDict that every family config starts from
(`configs/common.py`). `problems(config)` finds, without JAX, TensorFlow or a model, each field
against its rule (the dataset's name and the test sets' names included), the batch sizes over
devices, processes, micro-batches and repeated augmentation (given the devices), and the settings
that only make sense together (warm-up within training; a teacher for distillation; the quick
digits model on another dataset); `validate_fields(config)` raises them as one `ConfigError`, so
that a command answers a mistyped field at once. `vit_jax.training.setup.validate` adds what the
owners above this module check (the mesh, the model's fields, the evaluators' settings).

The settings types of the modules that read a config (`data_settings.DataSettings`,
`optim.OptimizerSettings`, ..., `training.train.Settings`) are derived from `FIELDS` by
`settings_type`, and built by one function, `from_config`: the training loop's set-up resolves a
validated config once into them; no field or default is restated anywhere else. Print every field
with its default and rule:

  python -m vit_jax.config

Reading a config file imports only this module, ml_collections and the light modules it reads
names from (`data.normalization`, `data.augment_spec`, `data.eval_set_names`, `data.dataset_names`,
`models.parts`), none of which imports JAX or TensorFlow.
"""

import dataclasses
import json
import math
import types
import typing
from typing import Any, Callable, Iterable, Sequence

import ml_collections

from vit_jax.data import augment_spec
from vit_jax.data import dataset_names as datasets
from vit_jax.data import eval_set_names
from vit_jax.data import normalization
from vit_jax.models import parts

DTYPES = ('float32', 'bfloat16', 'float16')
OPTIMIZERS = ('adamw', 'sgd', 'lamb')
LOSSES = ('softmax_xent', 'bce')  # The keys of `vit_jax.training.steps.LOSSES`.
DISTILLATION_TYPES = ('none', 'hard', 'soft')
FLAG = '--config.'  # How a field is named on the command line, and in every message about it.


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


@dataclasses.dataclass(frozen=True)
class Rule:
  """What one field accepts: a predicate, and the words that tell a user what is valid."""

  accepts: Callable[[Any], bool]
  describe: Callable[[], str]

  @property
  def valid(self) -> str:
    return self.describe()


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer(low: int | None = None) -> Rule:
  """An int (not a bool) of at least `low`."""
  return Rule(
      lambda v: isinstance(v, int) and not isinstance(v, bool) and (low is None or v >= low),
      lambda: 'an integer' if low is None else f'an integer >= {low}',
  )


def number(
    low: float,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
) -> Rule:
  """A finite number in the interval; `optional` also accepts None (unset)."""

  def accepts(v):
    if v is None:
      return optional
    return (
        _is_number(v)
        and (v > low if low_open else v >= low)
        and (v < high if high_open else v <= high)
    )

  if high == math.inf:
    words = f'a number {">" if low_open else ">="} {low:g}'
  else:
    words = f'a number in {"(" if low_open else "["}{low:g}, {high:g}{")" if high_open else "]"}'
  return Rule(accepts, lambda: words + (', or None (unset)' if optional else ''))


def choice(values: Iterable[Any], *, unset: str = '') -> Rule:
  """One of `values`; with `unset`, also '' meaning what `unset` says."""
  values = tuple(values)
  words = f'one of {list(values)}'
  if not unset:
    return Rule(lambda v: v in values, lambda: words)
  return Rule(lambda v: v == '' or v in values, lambda: f"'' ({unset}) or {words}")


def text(*, empty: bool = False, optional: bool = False) -> Rule:
  """A string (non-empty unless `empty`); `optional` also accepts None."""
  return Rule(
      lambda v: (v is None and optional) or (isinstance(v, str) and (empty or bool(v))),
      lambda: ('a string' if empty else 'a non-empty string') + (' or None' if optional else ''),
  )


def boolean(*, optional: bool = False) -> Rule:
  """True or false; `optional` also accepts None (unset: decided automatically)."""
  return Rule(
      lambda v: isinstance(v, bool) or (v is None and optional),
      lambda: 'true or false' + (', or None (unset: automatic)' if optional else ''),
  )


PROBABILITY = number(0.0, 1.0)
RATE_BELOW_ONE = number(0.0, 1.0, high_open=True)
NAMES = Rule(
    lambda v: isinstance(v, (tuple, list)) and all(isinstance(n, str) for n in v),
    lambda: 'a tuple of parameter names',
)


def _is_normalization(value: Any) -> bool:
  try:
    normalization.mean_std(value)
  except ValueError:
    return False
  return True


def _normalization(*, unset: str = '') -> Rule:
  """A name of `normalization.NORMALIZATIONS`, or per-channel numbers 'R,G,B/R,G,B' (mean/std);
  with `unset`, also '' meaning what `unset` says."""
  words = f"one of {list(normalization.NORMALIZATIONS)}, or numbers 'R,G,B/R,G,B' (mean/std)"
  return Rule(
      lambda v: (bool(unset) and v == '') or _is_normalization(v),
      lambda: f"'' ({unset}) or {words}" if unset else words,
  )


def _randaugment(spec: Any) -> bool:
  if not isinstance(spec, str):
    return False
  if spec:
    augment_spec.parse_randaugment(spec)  # Its ValueError says what is wrong with the spec.
  return True


def _eval_sets(specs: Any) -> bool:
  eval_set_names.parse_all(specs)  # Its ValueError names the bad set and what is valid.
  return True


def _randaugment_spec(spec: str) -> augment_spec.RandAugmentSpec | None:
  """A `randaugment` field as the training transform holds it: parsed, or None when off."""
  return augment_spec.parse_randaugment(spec) if spec else None


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field: `name` as typed after --config., its default, rule and meaning.

  `field_type` is needed only where the default is None (ml_collections must know what the field
  will hold to accept it from the command line). `into` names the settings types that hold it
  (`settings_type`), each as 'Type' (under the field's last name part) or 'Type.attribute';
  `convert` turns the config's value into what they hold (and the default into their default).
  """

  name: str
  default: Any
  rule: Rule
  doc: str
  field_type: type | None = None
  into: tuple[str, ...] = ()
  convert: Callable[[Any], Any] | None = None


@dataclasses.dataclass(frozen=True)
class Section:
  """A sub-config checked by its owner (the model family, the evaluators), not by a `Rule`.

  A `default` value that is a type declares a field unset (None) until the command line sets it:
  its owner's own default applies.
  """

  name: str
  default: dict[str, Any]
  owner: str
  doc: str


FIELDS: tuple[Field, ...] = (
    Field(
        'seed',
        0,
        integer(),
        'Seeds parameters, data order and augmentation.',
        into=('DataSettings', 'Settings'),
    ),
    # Data.
    Field(
        'dataset',
        datasets.DIGITS,
        Rule(datasets.named, lambda: 'a non-empty string'),
        "'digits' (embedded, nothing to download), 'folder:/path/to/images' or a TFDS name.",
        into=('DataSettings',),
    ),
    Field(
        'data_dir',
        None,
        text(optional=True),
        'TFDS data directory; None: TFDS default.',
        field_type=str,
        into=('DataSettings',),
    ),
    Field(
        'train_split',
        'train',
        text(),
        "TFDS split to train on, e.g. 'train[:90%]'.",
        into=('DataSettings',),
    ),
    Field('eval_split', 'test', text(), 'TFDS split to evaluate on.', into=('DataSettings',)),
    Field(
        'eval_sets',
        (),
        Rule(
            _eval_sets,
            lambda: "a tuple of test-set names 'DATASET[:SPLIT]' "
            "(vit_jax/evaluators/eval_sets.py), e.g. ('imagenet2012_real', 'imagenet_v2')",
        ),
        'Test sets scored beside eval_split, when it is, each under its own name: any TFDS '
        "'name:split', digits, 'folder:/path:split'; ImageNet-ReaL multi-label, ImageNet-A/-R "
        'on their 200 classes.',
        into=('Settings',),
        convert=tuple,
    ),
    Field(
        'image_size',
        32,
        integer(1),
        'Model input resolution; the pipeline resizes to it.',
        into=('TrainTransform', 'EvalTransform', 'DataSettings', 'TeacherSettings'),
    ),
    Field(
        'augment',
        'crop_flip',
        choice(augment_spec.AUGMENTS),
        "Training crop: pad and random crop, inception crop, DeiT III's simple random crop, or "
        'resize only.',
        into=('TrainTransform',),
    ),
    Field(
        'crop_padding',
        4,
        integer(0),
        "Padding before the random crop: zeros ('crop_flip'), reflected ('simple_random_crop').",
        into=('TrainTransform',),
    ),
    Field(
        'flip',
        True,
        boolean(),
        'Random horizontal flips during training.',
        into=('TrainTransform',),
    ),
    Field(
        'eval_crop_ratio',
        1.0,
        number(0.0, 1.0, low_open=True),
        'Evaluation: resize to image_size / ratio, then centre crop.',
        into=('EvalTransform.crop_ratio',),
    ),
    Field(
        'normalization',
        'imagenet',
        _normalization(),
        "Per-channel mean and std of the inputs ('inception': 0.5/0.5), by name or as numbers, "
        "e.g. '0.5,0.5,0.5/0.25,0.25,0.25'.",
        into=('TrainTransform', 'EvalTransform', 'TeacherSettings'),
    ),
    Field(
        'shuffle_buffer',
        10_000,
        integer(1),
        'Shuffle buffer of a streamed TFRecord dataset.',
        into=('DataSettings',),
    ),
    Field('prefetch', 2, integer(1), 'Batches prepared ahead.', into=('DataSettings',)),
    Field(
        'in_memory',
        None,
        boolean(optional=True),
        'A TFRecord-only dataset held in memory (True) or streamed (False); None: held when '
        'its images are of one shape and fit in input_pipeline.IN_MEMORY_MAX_BYTES.',
        field_type=bool,
        into=('DataSettings',),
    ),
    Field(
        'skip_unreadable_images',
        False,
        boolean(),
        'Image folders: leave out, with a warning naming each, files that do not decode.',
        into=('DataSettings',),
    ),
    # Recipe augmentations, per example in the tf.data pipeline.
    Field(
        'randaugment',
        '',
        Rule(
            _randaugment,
            lambda: "'' (off) or a timm spec such as 'rand-m9-mstd0.5-inc1'",
        ),
        "timm RandAugment spec, e.g. 'rand-m9-mstd0.5-inc1'; '' = off.",
        into=('TrainTransform',),
        convert=_randaugment_spec,
    ),
    Field(
        'three_augment',
        False,
        boolean(),
        "DeiT III's 3-Augment: one of grayscale, solarization, Gaussian blur per image.",
        into=('TrainTransform',),
    ),
    Field(
        'color_jitter',
        0.0,
        number(0.0),
        'Colour jitter strength (brightness, contrast, saturation; DeiT III: 0.3); 0 = off.',
        into=('TrainTransform',),
    ),
    Field(
        'random_erase_prob',
        0.0,
        PROBABILITY,
        'Random erasing (one box, per-pixel normal noise).',
        into=('TrainTransform',),
    ),
    Field(
        'repeated_aug',
        1,
        integer(1),
        'Copies of each example per batch (DeiT: 3); batch_size counts the copies.',
        into=('DataSettings',),
    ),
    # Mixup / CutMix on device, per device's share of the batch (timm Mixup, mode 'batch').
    Field(
        'mixup_alpha',
        0.0,
        number(0.0),
        'Mixup Beta(alpha, alpha); 0 = off (DeiT: 0.8).',
        into=('MixSettings',),
    ),
    Field(
        'cutmix_alpha',
        0.0,
        number(0.0),
        'CutMix Beta(alpha, alpha); 0 = off (DeiT: 1.0).',
        into=('MixSettings',),
    ),
    Field(
        'mix_switch_prob',
        0.5,
        PROBABILITY,
        'P(CutMix) when both are on.',
        into=('MixSettings.switch_prob',),
    ),
    Field('mix_prob', 1.0, PROBABILITY, 'P(a batch is mixed at all).', into=('MixSettings',)),
    # Optimisation.
    Field(
        'batch_size',
        128,
        integer(1),
        'Global batch, summed over every device of every process.',
        into=('DataSettings', 'ScheduleSettings'),
    ),
    Field('eval_batch_size', 256, integer(1), 'Global evaluation batch.', into=('DataSettings',)),
    Field(
        'optimizer',
        'adamw',
        choice(OPTIMIZERS),
        "'adamw', 'sgd' with momentum, or 'lamb' (DeiT III; apex FusedLAMB's semantics).",
        into=('OptimizerSettings',),
    ),
    Field(
        'base_lr',
        1e-3,
        number(0.0, low_open=True),
        'Peak learning rate.',
        into=('ScheduleSettings',),
    ),
    Field(
        'lr_scaling_batch',
        0,
        integer(0),
        'If > 0, lr = base_lr * batch_size / lr_scaling_batch.',
        into=('ScheduleSettings',),
    ),
    Field(
        'min_lr',
        0.0,
        number(0.0),
        'Learning rate at the end of the cosine.',
        into=('ScheduleSettings',),
    ),
    Field(
        'warmup_lr',
        0.0,
        number(0.0),
        'Learning rate at the first warm-up step (DeiT: 1e-6).',
        into=('ScheduleSettings',),
    ),
    Field('warmup_steps', 100, integer(0), 'Linear warm-up steps.', into=('ScheduleSettings',)),
    Field('total_steps', 1000, integer(1), 'Optimizer steps.', into=('ScheduleSettings',)),
    Field(
        'num_epochs',
        None,
        number(0.0, low_open=True, optional=True),
        'Epochs; when set, overrides total_steps.',
        field_type=float,
        into=('ScheduleSettings',),
    ),
    Field(
        'warmup_epochs',
        None,
        number(0.0, optional=True),
        'Warm-up epochs; when set, overrides warmup_steps.',
        field_type=float,
        into=('ScheduleSettings',),
    ),
    Field(
        'weight_decay', 0.05, number(0.0), 'Decoupled weight decay.', into=('OptimizerSettings',)
    ),
    Field('momentum', 0.9, RATE_BELOW_ONE, 'SGD momentum.', into=('OptimizerSettings',)),
    Field('b1', 0.9, RATE_BELOW_ONE, 'Adam beta1.', into=('OptimizerSettings',)),
    Field('b2', 0.999, RATE_BELOW_ONE, 'Adam beta2.', into=('OptimizerSettings',)),
    Field('eps', 1e-8, number(0.0, low_open=True), 'Adam epsilon.', into=('OptimizerSettings',)),
    Field(
        'layer_decay',
        1.0,
        number(0.0, 1.0, low_open=True),
        'Layer-wise lr decay: the lr of layer l (0 = embeddings, depth + 1 = head) is scaled '
        "by layer_decay^(depth + 1 - l), as timm's --layer-decay (BEiT, MAE: 0.65-0.75); "
        '1 = off.',
        into=('OptimizerSettings',),
    ),
    Field(
        'grad_clip_norm',
        0.0,
        number(0.0),
        "Global gradient-norm clipping; 0 = off ('lamb' always clips at 1, as apex's).",
        into=('OptimizerSettings',),
    ),
    Field(
        'label_smoothing',
        0.0,
        RATE_BELOW_ONE,
        'Label smoothing (folded into mixed targets).',
        into=('StepSettings', 'MixSettings'),
    ),
    Field(
        'loss',
        'softmax_xent',
        choice(LOSSES),
        "'softmax_xent', or 'bce': binary cross-entropy on targets > 0 (deit --bce-loss).",
        into=('StepSettings',),
    ),
    Field(
        'grad_accum_steps',
        1,
        integer(1),
        'Micro-batches per optimizer step (batch_size is per step).',
        into=('StepSettings',),
    ),
    Field(
        'ema_decay',
        0.0,
        RATE_BELOW_ONE,
        'Per-step EMA of the variables, evaluated beside them; 0 = off.',
        into=('StepSettings',),
    ),
    # Precision: parameters, softmax, norms and the loss stay float32.
    Field(
        'dtype',
        'float32',
        choice(DTYPES),
        'Compute dtype of the model.',
        into=('Settings', 'TeacherSettings'),
    ),
    Field(
        'mu_dtype',
        '',
        choice(DTYPES, unset="the parameters' dtype"),
        "Adam first moment / SGD momentum dtype; '' = the parameters'.",
        into=('OptimizerSettings',),
    ),
    Field(
        'no_decay_names',
        ('bias', 'scale', 'pos_embed', 'cls_token'),
        NAMES,
        'Parameters never decayed (besides every 1-D one). DeiT does decay dist_token.',
        into=('OptimizerSettings',),
        convert=tuple,
    ),
    # Devices: a (data x fsdp) mesh over every device (vit_jax.parallel.sharding).
    Field(
        'mesh.fsdp',
        1,
        integer(1),
        'Devices that split parameters, gradients, optimizer state and EMA; 1 = replicated. '
        'Must divide the number of devices.',
        into=('MeshSettings',),
    ),
    Field(
        'mesh.fsdp_min_size',
        2**18,
        integer(0),
        'Arrays with fewer elements (1 MiB in float32) stay replicated.',
        into=('MeshSettings',),
    ),
    # Logging, evaluation and checkpoints.
    Field('log_every', 50, integer(1), 'Steps between progress lines.', into=('Settings',)),
    Field('eval_every', 500, integer(1), 'Steps between evaluations.', into=('Settings',)),
    Field('checkpoint_every', 500, integer(1), 'Steps between checkpoints.', into=('Settings',)),
    Field(
        'profile_steps',
        0,
        integer(0),
        'Training steps after the first traced by jax.profiler into WORKDIR/plugins/profile '
        "(TensorBoard's profile tab); 0 = off.",
        into=('Settings',),
    ),
    Field('keep_checkpoints', 3, integer(1), 'Checkpoints kept.'),
    # DeiT distillation from a teacher.
    Field(
        'distillation.type',
        'none',
        choice(DISTILLATION_TYPES),
        'Distillation loss.',
        into=('DistillationLoss.kind',),
    ),
    Field(
        'distillation.alpha',
        0.5,
        PROBABILITY,
        'Weight of the distillation term.',
        into=('DistillationLoss',),
    ),
    Field(
        'distillation.tau',
        1.0,
        number(0.0, low_open=True),
        "Temperature of 'soft'.",
        into=('DistillationLoss',),
    ),
    Field(
        'distillation.teacher',
        '',
        text(empty=True),
        "The teacher: a run's --workdir, Hub weights (hf-hub:timm/regnety_160.deit_in1k), or "
        'MODEL:FILE (e.g. regnety_160:/path/regnety.pth).',
        into=('TeacherSettings',),
    ),
    Field(
        'distillation.teacher_normalization',
        '',
        _normalization(unset="the student's"),
        "Inputs the teacher was trained on; '' = the student's (a work directory's: its own).",
        into=('TeacherSettings',),
    ),
    # Weights to start from, or to evaluate.
    Field(
        'init_from',
        '',
        text(empty=True),
        'Pretrained weights (timm/DeiT/CaiT/DeepViT/T2T .pth or .safetensors, Google ViT .npz, '
        'Hub weights hf-hub:ORG/NAME, or a work directory) to start from; a --workdir holding '
        'a checkpoint resumes instead.',
        into=('Settings',),
    ),
    Field(
        'eval_only',
        False,
        boolean(),
        "Only evaluate init_from (else --workdir's newest checkpoint) on eval_split.",
        into=('Settings',),
    ),
    Field(
        'use_ema',
        True,
        boolean(),
        "Read a run's EMA weights where it kept them (eval_only, init_from, the teacher).",
        into=('Settings', 'TeacherSettings'),
    ),
)

SECTIONS: tuple[Section, ...] = (
    Section(
        'evaluators',
        {
            'fewshot': {'every': int, 'datasets': tuple, 'shots': tuple, 'seeds': int},
            'linear_probe': {'every': int, 'datasets': tuple},
        },
        'vit_jax.evaluators',
        'Evaluators of frozen pre-logits, run every `every` steps and at the end when '
        "`every` > 0. Unset (None) fields take the evaluator's own defaults "
        '(vit_jax/evaluators), under which it is off; e.g. '
        '--config.evaluators.fewshot.every=400.',
    ),
    Section(
        'model',
        {'name': 'vit_ti4'},
        'vit_jax.models',
        'name: a registry key (vit_jax.models.names()); every other field is passed to '
        "vit_jax.models.create(). The backbone's parts and shared fields "
        '(vit_jax.models.parts.Parts: scan_layers, remat, attention, ...) and the own settings '
        'of part kinds (parts.register_settings: soft_splits, centre_init_std, ...) are unset (None: '
        "the registered model's own value) until set, e.g. "
        '--config.model.attention=talking_heads.',
    ),
)


def _part_field_type(annotation: Any) -> type:
  """What ml_collections must accept for a part field of `annotation` (`X | None` -> X, a
  `tuple[...]` -> tuple; a field of several types, such as `layer_scale_init`'s float or 'paper',
  takes any literal)."""
  union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
  kinds = [kind for kind in typing.get_args(annotation) if kind is not type(None)]
  kinds = kinds if union else [annotation]
  return typing.get_origin(kinds[0]) or kinds[0] if len(kinds) == 1 else object


def model_part_fields() -> dict[str, type]:
  """The backbone's parts and shared fields and the fields of the part kinds' own settings
  (`vit_jax.models.parts.part_fields`), with the type a config holds them as. Any config may set
  them from the command line; unset (None) they keep the registered model's value, and the model
  checks them (`check_fields`)."""
  return {field.name: _part_field_type(field.type) for field in parts.part_fields()}


def _config_dict(tree: dict[str, Any]) -> ml_collections.ConfigDict:
  """Nested dicts as nested ConfigDicts (tuples stay tuples; a type: unset, of that type)."""

  def value(v):
    if isinstance(v, dict):
      return _config_dict(v)
    return ml_collections.FieldReference(None, field_type=v) if isinstance(v, type) else v

  return ml_collections.ConfigDict({k: value(v) for k, v in tree.items()})


def _shown(tree: Any) -> Any:
  """A section's default as a config holds it: a declared type as None (unset)."""
  if isinstance(tree, dict):
    return {k: _shown(v) for k, v in tree.items()}
  return None if isinstance(tree, type) else tree


def defaults() -> ml_collections.ConfigDict:
  """A ConfigDict of every field at its default: the start of every family config."""
  config = ml_collections.ConfigDict()
  for field in FIELDS:
    *parents, leaf = field.name.split('.')
    target = config
    for parent in parents:
      if parent not in target:
        target[parent] = ml_collections.ConfigDict()
      target = target[parent]
    target[leaf] = (
        field.default
        if field.default is not None
        else ml_collections.FieldReference(None, field_type=field.field_type)
    )
  for section in SECTIONS:
    config[section.name] = _config_dict(section.default)
  for name, field_type in model_part_fields().items():
    config.model[name] = ml_collections.FieldReference(None, field_type=field_type)
  for name, (field_type, _) in parts.FIELD_SPELLINGS.items():
    config.model[name] = ml_collections.FieldReference(None, field_type=field_type)
  return config


def _flatten(config: ml_collections.ConfigDict, prefix: str = '') -> dict[str, Any]:
  """'distillation.alpha' -> value for every leaf field, sections (model, evaluators) excepted."""
  flat = {}
  sections = {section.name for section in SECTIONS}
  for key, value in config.items():
    path = f'{prefix}{key}'
    if path in sections:  # Checked by their owners (`vit_jax.training.setup.validate`).
      continue
    if isinstance(value, ml_collections.ConfigDict):
      flat.update(_flatten(value, f'{path}.'))
    else:
      flat[path] = value
  return flat


def json_fields(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Every leaf of `config` by name ('model.hidden_size'), as its config.json holds it (tuples as
  lists), sections included: what a run's saved config is compared with."""

  def leaves(tree: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(tree, dict):
      return {prefix[:-1]: tree}
    return {
        k: v for key, value in tree.items() for k, v in leaves(value, f'{prefix}{key}.').items()
    }

  return leaves(json.loads(config.to_json_best_effort()), '')


def field_problems(fields: dict[str, Any]) -> list[str]:
  """Each field against its rule, in the order `FIELDS` declares them (unknown fields last)."""
  problems = []
  by_name = {field.name: field for field in FIELDS}
  rank = {name: i for i, name in enumerate(by_name)}
  for path, value in sorted(fields.items(), key=lambda item: rank.get(item[0], len(rank))):
    field = by_name.get(path)
    if field is None:
      problems.append(
          f'{FLAG}{path}={value!r}: not a known field; valid fields: '
          f'{sorted(by_name)} (python -m vit_jax.config lists them).'
      )
      continue
    try:
      if not field.rule.accepts(value):
        problems.append(f'{FLAG}{path}={value!r}: must be {field.rule.valid}.')
    except ValueError as e:
      problems.append(f'{FLAG}{path}={value!r}: {e}')
  return problems


def _batch_problems(c: dict[str, Any], devices: int, processes: int) -> list[str]:
  """Global batches that do not split evenly over processes, devices and micro-batches."""
  problems = []
  batch, accumulate = c['batch_size'], c['grad_accum_steps']
  if batch % (devices * accumulate) or batch % processes:
    step = math.lcm(devices * accumulate, processes)
    problems.append(
        f'{FLAG}batch_size={batch}: must be a multiple of the {devices} device(s) × '
        f'{FLAG}grad_accum_steps={accumulate} and of the {processes} process(es), i.e. of {step} '
        f'(e.g. {max(step, batch // step * step)}), so that every micro-batch spans every device '
        'equally.'
    )
  eval_batch = c['eval_batch_size']
  if eval_batch % math.lcm(devices, processes):
    step = math.lcm(devices, processes)
    problems.append(
        f'{FLAG}eval_batch_size={eval_batch}: must be a multiple of the {devices} '
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
        f'{FLAG}warmup_steps={c["warmup_steps"]}: must be <= {FLAG}total_steps='
        f'{c["total_steps"]}.'
    )
  if (
      c['num_epochs'] is not None
      and c['warmup_epochs'] is not None
      and (c['warmup_epochs'] > c['num_epochs'])
  ):
    problems.append(
        f'{FLAG}warmup_epochs={c["warmup_epochs"]}: must be <= {FLAG}num_epochs='
        f'{c["num_epochs"]}.'
    )
  return problems


def _distillation_problems(c: dict[str, Any]) -> list[str]:
  """Distillation without a teacher."""
  problems = []
  if c['distillation.type'] != 'none' and not c['distillation.teacher']:
    problems.append(
        f"{FLAG}distillation.type={c['distillation.type']!r}: needs "
        f'{FLAG}distillation.teacher, the --workdir of a run of vit_jax.main or '
        f"MODEL:FILE (or {FLAG}distillation.type='none')."
    )
  return problems


def quick_default_problems(
    dataset: str, normalization: str, variants: Sequence[str] = (), *, name: str = f'{FLAG}dataset'
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
      f'yourself (at least {FLAG}normalization).'
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
        f'{FLAG}three_augment=True: replaces RandAugment (deit main.py swaps the whole '
        f"training transform for 3-Augment); set {FLAG}randaugment='' or "
        f'{FLAG}three_augment=False.'
    )
  if c['loss'] == 'bce' and c['label_smoothing'] > 0:
    problems.append(
        f"{FLAG}loss='bce' with {FLAG}label_smoothing={c['label_smoothing']}: BCE "
        'targets are the classes with weight > 0 (deit engine.py), and smoothing '
        f'gives every class weight > 0; set {FLAG}label_smoothing=0.0 (DeiT III) or '
        f"{FLAG}loss='softmax_xent'."
    )
  return problems


_BATCH_FIELDS = ('batch_size', 'eval_batch_size', 'grad_accum_steps', 'repeated_aug')
_JOINT_CHECKS = (
    (('num_epochs', 'warmup_epochs', 'warmup_steps', 'total_steps'), _schedule_problems),
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
      f'{FLAG}{path}: missing; every config needs it (see vit_jax/config.py).'
      for path in sorted({field.name for field in FIELDS} - set(fields))
  ]
  problems += [
      f'{FLAG}{section.name}: missing; every config needs it (see vit_jax/config.py).'
      for section in SECTIONS
      if section.name not in config
  ]
  return problems


def bad_fields(problems: list[str]) -> set[str]:
  """The fields (and sections) that `problems` name."""
  return {p.removeprefix(FLAG).split('=', 1)[0].split(':', 1)[0] for p in problems}


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
  evaluators and the mesh are checked above this module (`vit_jax.training.setup.validate`).
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
  second; `vit_jax.training.setup.validate` checks the rest (the batch sizes over the devices,
  the mesh, the model, the evaluators).
  """
  found = problems(config)
  if found:
    raise ConfigError(found)


# The settings types that are None, their settings off, for a config: no mixing, no distillation.
SETTINGS_OFF: dict[str, Callable[[Any], bool]] = {
    'MixSettings': lambda c: c.mixup_alpha == 0 and c.cutmix_alpha == 0,
    'DistillationLoss': lambda c: c.distillation.type == 'none',
    'TeacherSettings': lambda c: c.distillation.type == 'none',
}
_SETTINGS_FIELD = 'vit_jax.config.field'  # A settings field's metadata key: the `Field` it holds.
_SECTION_CONVERT = 'vit_jax.config.convert'  # A section field's: what turns the section into it.


def _into(field: Field) -> dict[str, str]:
  """Settings type name -> the attribute that holds `field` (its last name part unless renamed)."""
  attributes = {}
  for target in field.into:
    settings, _, attribute = target.partition('.')
    attributes[settings] = attribute or field.name.rsplit('.', 1)[-1]
  return attributes


def _annotation(field: Field) -> Any:
  """The type a settings type holds `field` as."""
  if field.convert is not None:
    return Any
  kind = field.field_type or type(field.default)
  return kind | None if field.default is None else kind


def section(convert: Callable[[Any], Any]) -> Any:
  """A settings type's field that holds a section (`SECTIONS`, by the field's name) as `convert`
  turns its dict."""
  return dataclasses.field(metadata={_SECTION_CONVERT: convert})


def settings_type(cls: type) -> type:
  """`cls` as a frozen dataclass of the fields that `FIELDS` declares `into` it (by its name), in
  their order and with their defaults, then the fields `cls` itself annotates (keyword-only):
  other settings types, built from the same config, or sections (`SECTIONS`). `cls.from_config`
  builds it from a config (`from_config`)."""
  own = dict(cls.__dict__.get('__annotations__', {}))
  annotations = {}
  for field in FIELDS:
    attribute = _into(field).get(cls.__name__)
    if attribute is None:
      continue
    if attribute in own or attribute in annotations:
      raise TypeError(f'{cls.__name__}.{attribute} is declared twice ({field.name}).')
    annotations[attribute] = _annotation(field)
    default = field.default if field.convert is None else field.convert(field.default)
    setattr(cls, attribute, dataclasses.field(default=default, metadata={_SETTINGS_FIELD: field}))
  for name in own:
    declared = cls.__dict__.get(name, dataclasses.MISSING)
    if not isinstance(declared, dataclasses.Field):
      declared = dataclasses.field(default=declared)
    declared.kw_only = True
    setattr(cls, name, declared)
  cls.__annotations__ = {**annotations, **own}
  cls.from_config = classmethod(from_config)
  return dataclasses.dataclass(frozen=True)(cls)


def _settings_types(annotation: Any) -> tuple[type, ...]:
  """The settings types an annotation names (`X` or `X | None`)."""
  kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
  return tuple(kind for kind in kinds if hasattr(kind, '__dataclass_fields__'))


def _value(config: Any, name: str) -> Any:
  """The value of field `name` ('distillation.alpha') in `config`."""
  for key in name.split('.'):
    config = config[key]
  return config


def from_config(cls: type, config: ml_collections.ConfigDict) -> Any:
  """The settings type `cls` (`settings_type`) with the values of `config`, or None when its
  settings are off (`SETTINGS_OFF`)."""
  off = SETTINGS_OFF.get(cls.__name__)
  if off is not None and off(config):
    return None
  values = {}
  for declared in dataclasses.fields(cls):
    field = declared.metadata.get(_SETTINGS_FIELD)
    if field is not None:
      value = _value(config, field.name)
      values[declared.name] = value if field.convert is None else field.convert(value)
    elif _SECTION_CONVERT in declared.metadata:
      tree = config[declared.name]
      tree = tree.to_dict() if isinstance(tree, ml_collections.ConfigDict) else dict(tree)
      values[declared.name] = declared.metadata[_SECTION_CONVERT](tree)
    else:
      (settings,) = _settings_types(declared.type)
      values[declared.name] = settings.from_config(config)
  return cls(**values)


def describe() -> str:
  """Every field with its default, rule and meaning, as `python -m vit_jax.config` prints it."""
  lines = []
  for field in FIELDS:
    lines.append(f'{FLAG}{field.name}={field.default!r}')
    lines.append(f'    {field.rule.valid}. {field.doc}')
  for section in SECTIONS:
    lines.append(f'{FLAG}{section.name}={_shown(section.default)!r}')
    lines.append(f'    checked by {section.owner}. {section.doc}')
  return '\n'.join(lines)


if __name__ == '__main__':
  print(describe())
