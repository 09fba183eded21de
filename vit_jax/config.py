"""The run config's schema: every field declared once, with its default, rule and meaning.

`FIELDS` declares each field a config may hold: its name as typed after `--config.`, its default,
its rule (type and range) and what it does. `defaults()` builds the ConfigDict that every family
config starts from (`configs/common.py`), and `validate(config)` checks a finished config once,
before anything reads data or compiles: each field against its rule, then the settings that only
make sense together (batch sizes over devices, processes, micro-batches and repeated augmentation;
warm-up within training; a teacher for distillation; the quick digits model on another dataset),
then the model's own fields (`check_fields` of the registered model) and the evaluators' settings.
It raises one `ConfigError` that lists every bad field with its value and what would be valid.
`validate_fields(config)` checks what the fields alone show without importing JAX, TensorFlow or
a model (each rule that needs no slow import, the dataset's name among them, and the settings that
only make sense together); a command calls it first, to answer a mistyped field at once.

The training loop's set-up resolves a validated config once into the typed settings of the
modules that read it (`vit_jax.training.train.Settings`); no default is restated anywhere else. `create_model(config, num_classes)` builds the model a config describes, for
training, analysis, inference and the benchmark alike (`model_overrides` turns the `model`
section into the registry's arguments). Print every field with its default and rule:

  python -m vit_jax.config

Reading a config file imports only this module and ml_collections; the owners of the values some
rules accept (the input pipeline's normalisations, the models, the evaluators) are imported when a
config is checked.
"""

import dataclasses
import math
import sys
import types
import typing
from typing import Any, Callable, Iterable, Sequence

import ml_collections

from vit_jax.data import dataset_names as datasets

DTYPES = ('float32', 'bfloat16', 'float16')
OPTIMIZERS = ('adamw', 'sgd', 'lamb')
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
  """What one field accepts: a predicate, and the words that tell a user what is valid.

  `describe` is called when the words are needed, so that a rule may name values owned by a
  module that is only imported when a config is checked. `owner` names that module where
  importing it takes seconds (it imports JAX or TensorFlow): `validate_fields` leaves such a rule
  to `validate` unless the module is imported already.
  """

  accepts: Callable[[Any], bool]
  describe: Callable[[], str]
  owner: str = ''

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


def choice(
    values: Iterable[Any] | Callable[[], Iterable[Any]], *, unset: str = '', owner: str = ''
) -> Rule:
  """One of `values` (or of what the callable returns, for values owned elsewhere: by the module
  `owner`, where importing it is slow); with `unset`, also '' meaning what `unset` says."""
  read = values if callable(values) else (lambda fixed=tuple(values): fixed)
  words = lambda: f'one of {list(read())}'
  if not unset:
    return Rule(lambda v: v in tuple(read()), words, owner)
  return Rule(lambda v: v == '' or v in tuple(read()), lambda: f"'' ({unset}) or {words()}", owner)


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


_INPUT_PIPELINE = 'vit_jax.data.input_pipeline'  # The owners that import TensorFlow or JAX.
_AUGMENT = 'vit_jax.data.augment'
_STEPS = 'vit_jax.training.steps'
_EVAL_SETS = 'vit_jax.evaluators.eval_sets'


def _is_normalization(value: Any) -> bool:
  from vit_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top

  try:
    input_pipeline.mean_std(value)
  except ValueError:
    return False
  return True


def _normalization(*, unset: str = '') -> Rule:
  """A name of `input_pipeline.NORMALIZATIONS`, or per-channel numbers 'R,G,B/R,G,B' (mean/std);
  with `unset`, also '' meaning what `unset` says."""

  def describe() -> str:
    from vit_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top

    words = f"one of {list(input_pipeline.NORMALIZATIONS)}, or numbers 'R,G,B/R,G,B' (mean/std)"
    return f"'' ({unset}) or {words}" if unset else words

  return Rule(
      lambda v: (bool(unset) and v == '') or _is_normalization(v), describe, _INPUT_PIPELINE
  )


def _augments() -> tuple[str, ...]:
  from vit_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top

  return input_pipeline.AUGMENTS


def _losses() -> tuple[str, ...]:
  from vit_jax.training import steps  # pylint: disable=g-import-not-at-top

  return tuple(steps.LOSSES)


def _randaugment(spec: Any) -> bool:
  if not isinstance(spec, str):
    return False
  if spec:
    from vit_jax.data import augment  # pylint: disable=g-import-not-at-top

    augment.parse_randaugment(spec)  # Its ValueError says what is wrong with the spec.
  return True


def _eval_sets(specs: Any) -> bool:
  from vit_jax.evaluators import eval_sets  # pylint: disable=g-import-not-at-top

  eval_sets.parse_all(specs)  # Its ValueError names the bad set and what is valid.
  return True


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field: `name` as typed after --config., its default, rule and meaning.

  `field_type` is needed only where the default is None (ml_collections must know what the field
  will hold to accept it from the command line).
  """

  name: str
  default: Any
  rule: Rule
  doc: str
  field_type: type | None = None


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
    Field('seed', 0, integer(), 'Seeds parameters, data order and augmentation.'),
    # Data.
    Field(
        'dataset',
        datasets.DIGITS,
        Rule(datasets.named, lambda: 'a non-empty string'),
        "'digits' (embedded, nothing to download), 'folder:/path/to/images' or a TFDS name.",
    ),
    Field(
        'data_dir',
        None,
        text(optional=True),
        'TFDS data directory; None: TFDS default.',
        field_type=str,
    ),
    Field('train_split', 'train', text(), "TFDS split to train on, e.g. 'train[:90%]'."),
    Field('eval_split', 'test', text(), 'TFDS split to evaluate on.'),
    Field(
        'eval_sets',
        (),
        Rule(
            _eval_sets,
            lambda: "a tuple of test-set names 'DATASET[:SPLIT]' "
            "(vit_jax/evaluators/eval_sets.py), e.g. ('imagenet2012_real', 'imagenet_v2')",
            _EVAL_SETS,
        ),
        'Test sets scored beside eval_split, when it is, each under its own name: any TFDS '
        "'name:split', digits, 'folder:/path:split'; ImageNet-ReaL multi-label, ImageNet-A/-R "
        'on their 200 classes.',
    ),
    Field('image_size', 32, integer(1), 'Model input resolution; the pipeline resizes to it.'),
    Field(
        'augment',
        'crop_flip',
        choice(_augments, owner=_INPUT_PIPELINE),
        "Training crop: pad and random crop, inception crop, DeiT III's simple random crop, or "
        'resize only.',
    ),
    Field(
        'crop_padding',
        4,
        integer(0),
        "Padding before the random crop: zeros ('crop_flip'), reflected ('simple_random_crop').",
    ),
    Field('flip', True, boolean(), 'Random horizontal flips during training.'),
    Field(
        'eval_crop_ratio',
        1.0,
        number(0.0, 1.0, low_open=True),
        'Evaluation: resize to image_size / ratio, then centre crop.',
    ),
    Field(
        'normalization',
        'imagenet',
        _normalization(),
        "Per-channel mean and std of the inputs ('inception': 0.5/0.5), by name or as numbers, "
        "e.g. '0.5,0.5,0.5/0.25,0.25,0.25'.",
    ),
    Field('shuffle_buffer', 10_000, integer(1), 'Shuffle buffer of a streamed TFRecord dataset.'),
    Field('prefetch', 2, integer(1), 'Batches prepared ahead.'),
    Field(
        'in_memory',
        None,
        boolean(optional=True),
        'A TFRecord-only dataset held in memory (True) or streamed (False); None: held when '
        'its images are of one shape and fit in input_pipeline.IN_MEMORY_MAX_BYTES.',
        field_type=bool,
    ),
    Field(
        'skip_unreadable_images',
        False,
        boolean(),
        'Image folders: leave out, with a warning naming each, files that do not decode.',
    ),
    # Recipe augmentations, per example in the tf.data pipeline.
    Field(
        'randaugment',
        '',
        Rule(
            _randaugment,
            lambda: "'' (off) or a timm spec such as 'rand-m9-mstd0.5-inc1'",
            _AUGMENT,
        ),
        "timm RandAugment spec, e.g. 'rand-m9-mstd0.5-inc1'; '' = off.",
    ),
    Field(
        'three_augment',
        False,
        boolean(),
        "DeiT III's 3-Augment: one of grayscale, solarization, Gaussian blur per image.",
    ),
    Field(
        'color_jitter',
        0.0,
        number(0.0),
        'Colour jitter strength (brightness, contrast, saturation; DeiT III: 0.3); 0 = off.',
    ),
    Field(
        'random_erase_prob', 0.0, PROBABILITY, 'Random erasing (one box, per-pixel normal noise).'
    ),
    Field(
        'repeated_aug',
        1,
        integer(1),
        'Copies of each example per batch (DeiT: 3); batch_size counts the copies.',
    ),
    # Mixup / CutMix on device, per device's share of the batch (timm Mixup, mode 'batch').
    Field('mixup_alpha', 0.0, number(0.0), 'Mixup Beta(alpha, alpha); 0 = off (DeiT: 0.8).'),
    Field('cutmix_alpha', 0.0, number(0.0), 'CutMix Beta(alpha, alpha); 0 = off (DeiT: 1.0).'),
    Field('mix_switch_prob', 0.5, PROBABILITY, 'P(CutMix) when both are on.'),
    Field('mix_prob', 1.0, PROBABILITY, 'P(a batch is mixed at all).'),
    # Optimisation.
    Field(
        'batch_size', 128, integer(1), 'Global batch, summed over every device of every process.'
    ),
    Field('eval_batch_size', 256, integer(1), 'Global evaluation batch.'),
    Field(
        'optimizer',
        'adamw',
        choice(OPTIMIZERS),
        "'adamw', 'sgd' with momentum, or 'lamb' (DeiT III; apex FusedLAMB's semantics).",
    ),
    Field('base_lr', 1e-3, number(0.0, low_open=True), 'Peak learning rate.'),
    Field(
        'lr_scaling_batch', 0, integer(0), 'If > 0, lr = base_lr * batch_size / lr_scaling_batch.'
    ),
    Field('min_lr', 0.0, number(0.0), 'Learning rate at the end of the cosine.'),
    Field('warmup_lr', 0.0, number(0.0), 'Learning rate at the first warm-up step (DeiT: 1e-6).'),
    Field('warmup_steps', 100, integer(0), 'Linear warm-up steps.'),
    Field('total_steps', 1000, integer(1), 'Optimizer steps.'),
    Field(
        'num_epochs',
        None,
        number(0.0, low_open=True, optional=True),
        'Epochs; when set, overrides total_steps.',
        field_type=float,
    ),
    Field(
        'warmup_epochs',
        None,
        number(0.0, optional=True),
        'Warm-up epochs; when set, overrides warmup_steps.',
        field_type=float,
    ),
    Field('weight_decay', 0.05, number(0.0), 'Decoupled weight decay.'),
    Field('momentum', 0.9, RATE_BELOW_ONE, 'SGD momentum.'),
    Field('b1', 0.9, RATE_BELOW_ONE, 'Adam beta1.'),
    Field('b2', 0.999, RATE_BELOW_ONE, 'Adam beta2.'),
    Field('eps', 1e-8, number(0.0, low_open=True), 'Adam epsilon.'),
    Field(
        'layer_decay',
        1.0,
        number(0.0, 1.0, low_open=True),
        'Layer-wise lr decay: the lr of layer l (0 = embeddings, depth + 1 = head) is scaled '
        "by layer_decay^(depth + 1 - l), as timm's --layer-decay (BEiT, MAE: 0.65-0.75); "
        '1 = off.',
    ),
    Field(
        'grad_clip_norm',
        0.0,
        number(0.0),
        "Global gradient-norm clipping; 0 = off ('lamb' always clips at 1, as apex's).",
    ),
    Field('label_smoothing', 0.0, RATE_BELOW_ONE, 'Label smoothing (folded into mixed targets).'),
    Field(
        'loss',
        'softmax_xent',
        choice(_losses, owner=_STEPS),
        "'softmax_xent', or 'bce': binary cross-entropy on targets > 0 (deit --bce-loss).",
    ),
    Field(
        'grad_accum_steps',
        1,
        integer(1),
        'Micro-batches per optimizer step (batch_size is per step).',
    ),
    Field(
        'ema_decay',
        0.0,
        RATE_BELOW_ONE,
        'Per-step EMA of the variables, evaluated beside them; 0 = off.',
    ),
    # Precision: parameters, softmax, norms and the loss stay float32.
    Field('dtype', 'float32', choice(DTYPES), 'Compute dtype of the model.'),
    Field(
        'mu_dtype',
        '',
        choice(DTYPES, unset="the parameters' dtype"),
        "Adam first moment / SGD momentum dtype; '' = the parameters'.",
    ),
    Field(
        'no_decay_names',
        ('bias', 'scale', 'pos_embed', 'cls_token'),
        NAMES,
        'Parameters never decayed (besides every 1-D one). DeiT does decay dist_token.',
    ),
    # Devices: a (data x fsdp) mesh over every device (vit_jax.parallel.sharding).
    Field(
        'mesh.fsdp',
        1,
        integer(1),
        'Devices that split parameters, gradients, optimizer state and EMA; 1 = replicated. '
        'Must divide the number of devices.',
    ),
    Field(
        'mesh.fsdp_min_size',
        2**18,
        integer(0),
        'Arrays with fewer elements (1 MiB in float32) stay replicated.',
    ),
    # Logging, evaluation and checkpoints.
    Field('log_every', 50, integer(1), 'Steps between progress lines.'),
    Field('eval_every', 500, integer(1), 'Steps between evaluations.'),
    Field('checkpoint_every', 500, integer(1), 'Steps between checkpoints.'),
    Field(
        'profile_steps',
        0,
        integer(0),
        'Training steps after the first traced by jax.profiler into WORKDIR/plugins/profile '
        "(TensorBoard's profile tab); 0 = off.",
    ),
    Field('keep_checkpoints', 3, integer(1), 'Checkpoints kept.'),
    # DeiT distillation from a teacher.
    Field('distillation.type', 'none', choice(DISTILLATION_TYPES), 'Distillation loss.'),
    Field('distillation.alpha', 0.5, PROBABILITY, 'Weight of the distillation term.'),
    Field('distillation.tau', 1.0, number(0.0, low_open=True), "Temperature of 'soft'."),
    Field(
        'distillation.teacher',
        '',
        text(empty=True),
        "The teacher: a run's --workdir, Hub weights (hf-hub:timm/regnety_160.deit_in1k), or "
        'MODEL:FILE (e.g. regnety_160:/path/regnety.pth).',
    ),
    Field(
        'distillation.teacher_normalization',
        '',
        _normalization(unset="the student's"),
        "Inputs the teacher was trained on; '' = the student's (a work directory's: its own).",
    ),
    # Weights to start from, or to evaluate.
    Field(
        'init_from',
        '',
        text(empty=True),
        'Pretrained weights (timm/DeiT/CaiT/DeepViT/T2T .pth or .safetensors, Google ViT .npz, '
        'Hub weights hf-hub:ORG/NAME, or a work directory) to start from; a --workdir holding '
        'a checkpoint resumes instead.',
    ),
    Field(
        'eval_only',
        False,
        boolean(),
        "Only evaluate init_from (else --workdir's newest checkpoint) on eval_split.",
    ),
    Field(
        'use_ema',
        True,
        boolean(),
        "Read a run's EMA weights where it kept them (eval_only, init_from, the teacher).",
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
  """The backbone's parts and shared fields (`vit_jax.models.parts.Parts`, which the model
  declares them in) and the fields of the part kinds' own settings (`parts.part_fields`), with
  the type a config holds them as. Any config may set them from the command line; unset (None)
  they keep the registered model's value, and the model checks them (`check_fields`)."""
  from vit_jax.models import parts  # pylint: disable=g-import-not-at-top

  return {field.name: _part_field_type(field.type) for field in parts.part_fields()}


# Config fields that say a part field's value in an earlier spelling, still accepted: when set,
# the part field takes the value they spell (over the config file's value of it, as before).
MODEL_FIELD_SPELLINGS: dict[str, tuple[type, Callable[[Any], tuple[str, Any] | None]]] = {
    'paper_layer_scale': (bool, lambda paper: ('layer_scale_init', 'paper') if paper else None),
}


def _hashable(value: Any) -> Any:
  """`value` with lists as tuples, at any depth: a saved config.json gives JSON lists, and a Flax
  module's fields must hash (T2T's `soft_splits`, say)."""
  return tuple(map(_hashable, value)) if isinstance(value, (list, tuple)) else value


def model_overrides(model: Any) -> dict[str, Any]:
  """The fields of a `model` config section to pass to `models.create`: all but the name and the
  unset (None) part fields, which keep the registered model's own values."""
  part_fields = model_part_fields()
  overrides, spelled_overrides = {}, []
  for key, value in model.items():
    if key == 'name' or (key in part_fields and value is None):
      continue
    if key in MODEL_FIELD_SPELLINGS:
      spelled = MODEL_FIELD_SPELLINGS[key][1](value) if value is not None else None
      if spelled is not None:
        spelled_overrides.append(spelled)
      continue
    overrides[key] = _hashable(value)
  return {**overrides, **dict(spelled_overrides)}


def create_model(config: ml_collections.ConfigDict, num_classes: int) -> Any:
  """The registered model `config.model.name` with the config's overrides (a Flax module).

  `config.dtype` is the compute dtype of every model ('bfloat16': mixed precision with float32
  parameters, softmax, norms and loss); a `model.dtype` override takes precedence.
  """
  return model_from_section(config.model, num_classes, config.dtype)


def model_from_section(model: Any, num_classes: int, dtype: str) -> Any:
  """The model a `model` section ({'name': ..., fields}) describes, computing in `dtype` unless
  the section sets its own (`create_model`; a teacher's section, saved or from the Hub)."""
  from vit_jax import models  # pylint: disable=g-import-not-at-top

  overrides = model_overrides(model)
  overrides.setdefault('dtype', dtype)
  return models.create(model['name'], num_classes=num_classes, **overrides)


_BY_NAME = {field.name: field for field in FIELDS}


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
  for name, (field_type, _) in MODEL_FIELD_SPELLINGS.items():
    config.model[name] = ml_collections.FieldReference(None, field_type=field_type)
  return config


def _flatten(config: ml_collections.ConfigDict, prefix: str = '') -> dict[str, Any]:
  """'distillation.alpha' -> value for every leaf field, sections (model, evaluators) excepted."""
  flat = {}
  sections = {section.name for section in SECTIONS}
  for key, value in config.items():
    path = f'{prefix}{key}'
    if path in sections:  # Checked by their owners (`_model_problems`, `_evaluator_problems`).
      continue
    if isinstance(value, ml_collections.ConfigDict):
      flat.update(_flatten(value, f'{path}.'))
    else:
      flat[path] = value
  return flat


def _field_problems(fields: dict[str, Any], *, light: bool = False) -> list[str]:
  """Each field against its rule, in the order `FIELDS` declares them (unknown fields last);
  `light`: leaving out the rules whose owner is not imported yet."""
  problems = []
  rank = {name: i for i, name in enumerate(_BY_NAME)}
  for path, value in sorted(fields.items(), key=lambda item: rank.get(item[0], len(rank))):
    field = _BY_NAME.get(path)
    if field is None:
      problems.append(
          f'{FLAG}{path}={value!r}: not a known field; valid fields: '
          f'{sorted(_BY_NAME)} (python -m vit_jax.config lists them).'
      )
      continue
    if light and field.rule.owner and field.rule.owner not in sys.modules:
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


def _model_problems(model: ml_collections.ConfigDict) -> list[str]:
  """The registered model's own field checks (`check_fields`), as one problem."""
  from vit_jax import models  # pylint: disable=g-import-not-at-top

  name = model.get('name')
  overrides = model_overrides(model)
  try:
    models.create(name, num_classes=1, **overrides).check_fields()
  except (ValueError, TypeError) as e:
    return [
        f'{FLAG}model.name={name!r}: {e}' if name not in models.names() else f'{FLAG}model: {e}'
    ]
  return []


def _evaluator_problems(config: ml_collections.ConfigDict) -> list[str]:
  """Every evaluator's settings, checked by the evaluator itself (`vit_jax.evaluators`)."""
  from vit_jax import evaluators  # pylint: disable=g-import-not-at-top

  problems = []
  for name, settings in config.evaluators.items():
    try:
      evaluators.create(name, settings)
    except ValueError as e:
      problems.append(f'{FLAG}evaluators.{name}: {e}')
  return problems


def _problems_alone(
    config: ml_collections.ConfigDict, fields: dict[str, Any], *, light: bool = False
) -> list[str]:
  """Each field against its rule and the fields every config needs (`_field_problems`)."""
  problems = _field_problems(fields, light=light)
  problems += [
      f'{FLAG}{path}: missing; every config needs it (see vit_jax/config.py).'
      for path in sorted(set(_BY_NAME) - set(fields))
  ]
  problems += [
      f'{FLAG}{section.name}: missing; every config needs it (see vit_jax/config.py).'
      for section in SECTIONS
      if section.name not in config
  ]
  return problems


def _bad_fields(problems: list[str]) -> set[str]:
  """The fields (and sections) that `problems` name."""
  return {p.removeprefix(FLAG).split('=', 1)[0].split(':', 1)[0] for p in problems}


def _joint_problems(fields: dict[str, Any], bad: set[str]) -> list[str]:
  """The settings that only make sense together, each checked where the fields it reads are
  valid on their own (not in `bad`)."""
  return [p for needed, check in _JOINT_CHECKS if not bad & set(needed) for p in check(fields)]


def validate_fields(config: ml_collections.ConfigDict) -> None:
  """Raises `ConfigError` listing what can be found without JAX, TensorFlow or a model: each
  field against its rule (the dataset's name included) and the joint checks of fields alone.

  A command calls it before importing them, to answer a mistyped field in a fraction of a
  second; `validate` checks the rest (rules whose owner is not imported yet, the batch sizes over
  the devices, the model, the evaluators).
  """
  fields = _flatten(config)
  problems = _problems_alone(config, fields, light=True)
  problems += _joint_problems(fields, _bad_fields(problems))
  if problems:
    raise ConfigError(problems)


def validate(
    config: ml_collections.ConfigDict, *, devices: int | None = None, processes: int | None = None
) -> None:
  """Raises `ConfigError` listing every bad field of `config`; compiles and reads nothing.

  `devices` and `processes` (default: JAX's global counts) are what the batches must divide.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax.parallel import sharding  # pylint: disable=g-import-not-at-top

  devices = jax.device_count() if devices is None else devices
  processes = jax.process_count() if processes is None else processes
  fields = _flatten(config)
  problems = _problems_alone(config, fields)
  bad = _bad_fields(problems)
  # Each joint check runs only when the fields it reads are valid on their own.
  if not bad & set(_BATCH_FIELDS):
    problems += _batch_problems(fields, devices, processes)
  if 'mesh.fsdp' not in bad:
    try:
      sharding.check_mesh(fields['mesh.fsdp'], devices)
    except ValueError as e:
      problems.append(f'{FLAG}{e}')
  problems += _joint_problems(fields, bad)
  if 'model' not in bad:
    problems += _model_problems(config.model)
  if 'evaluators' not in bad:
    problems += _evaluator_problems(config)
  if problems:
    raise ConfigError(problems)


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
