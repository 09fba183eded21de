"""The run config's schema: every field declared once, with its default, rule and meaning.

`FIELDS` declares each field a config may hold: its name as typed after `--config.`, its default,
its rule (type and range, `vit_jax.config_rules`), what it does, and which settings types hold it
(`into`, under another attribute name where one is given, e.g. 'EvalTransform.crop_ratio';
`convert` turns the value into what they hold). `defaults()` builds the ConfigDict that every
family config starts from (`configs/common.py`). `vit_jax.config_checks` checks a config against
these fields, without JAX, TensorFlow or a model; `vit_jax.config_settings` derives from them the
settings types of the modules that read a config. Print every field with its default and rule:

  python -m vit_jax.config

Reading a config file imports only this module, `config_rules`, `config_checks`, ml_collections
and the light modules they read names from (`data.normalization`, `data.augment_spec`,
`data.eval_set_names`, `data.dataset_names`, `models.parts`), none of which imports JAX or
TensorFlow.
"""

import dataclasses
import json
import types
import typing
from typing import Any, Callable

import ml_collections

from vit_jax import config_rules
from vit_jax import exits
from vit_jax.data import augment_spec
from vit_jax.data import dataset_names as datasets
from vit_jax.models import parts
from vit_jax.schema import evaluators as evaluator_settings

DTYPES = ('float32', 'bfloat16', 'float16')
OPTIMIZERS = ('adamw', 'sgd', 'lamb')
LOSSES = ('softmax_xent', 'bce')  # Each the name of its loss in `vit_jax.training.steps.LOSSES`.
DISTILLATION_TYPES = ('none', 'hard', 'soft')
FLAG = '--config.'  # How a field is named on the command line, and in every message about it.


def _randaugment_spec(spec: str) -> augment_spec.RandAugmentSpec | None:
  """A `randaugment` field as the training transform holds it: parsed, or None when off."""
  return augment_spec.parse_randaugment(spec) if spec else None


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field: `name` as typed after --config., its default, rule and meaning.

  `field_type` is needed only where the default is None (ml_collections must know what the field
  will hold to accept it from the command line). `into` names the settings types that hold it
  (`config_settings.settings_type`), each as 'Type' (under the field's last name part) or
  'Type.attribute'; `convert` turns the config's value into what they hold (and the default into
  their default).
  """

  name: str
  default: Any
  rule: config_rules.Rule
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
        config_rules.integer(-(2**31), 2**31 - 1),  # What every random generator takes.
        'Seeds parameters, data order and augmentation.',
        into=('DataSettings', 'Settings'),
    ),
    # Data.
    Field(
        'dataset',
        datasets.DIGITS,
        config_rules.DATASET,
        "'digits' (embedded, nothing to download), 'folder:/path/to/images' or a TFDS name.",
        into=('DataSettings',),
    ),
    Field(
        'data_dir',
        None,
        config_rules.text(optional=True),
        'TFDS data directory; None: TFDS default.',
        field_type=str,
        into=('DataSettings',),
    ),
    Field(
        'train_split',
        'train',
        config_rules.text(),
        "TFDS split to train on, e.g. 'train[:90%]'.",
        into=('DataSettings',),
    ),
    Field(
        'eval_split',
        'test',
        config_rules.text(),
        'TFDS split to evaluate on.',
        into=('DataSettings',),
    ),
    Field(
        'eval_sets',
        (),
        config_rules.EVAL_SETS,
        'Test sets scored beside eval_split, when it is, each under its own name: any TFDS '
        "'name:split', digits, 'folder:/path:split'; ImageNet-ReaL multi-label, ImageNet-A/-R "
        'on their 200 classes.',
        into=('Settings',),
        convert=tuple,
    ),
    Field(
        'image_size',
        32,
        config_rules.integer(1),
        'Model input resolution; the pipeline resizes to it.',
        into=('TrainTransform', 'EvalTransform', 'DataSettings', 'TeacherSettings'),
    ),
    Field(
        'augment',
        'crop_flip',
        config_rules.choice(augment_spec.AUGMENTS),
        "Training crop: pad and random crop, inception crop, DeiT III's simple random crop, or "
        'resize only.',
        into=('TrainTransform',),
    ),
    Field(
        'crop_padding',
        4,
        config_rules.integer(0),
        "Padding before the random crop: zeros ('crop_flip'), reflected ('simple_random_crop').",
        into=('TrainTransform',),
    ),
    Field(
        'flip',
        True,
        config_rules.boolean(),
        'Random horizontal flips during training.',
        into=('TrainTransform',),
    ),
    Field(
        'eval_crop_ratio',
        1.0,
        config_rules.number(0.0, 1.0, low_open=True),
        'Evaluation: resize to image_size / ratio, then centre crop.',
        into=('EvalTransform.crop_ratio',),
    ),
    Field(
        'normalization',
        'imagenet',
        config_rules.normalization_rule(),
        "Per-channel mean and std of the inputs ('inception': 0.5/0.5), by name or as numbers, "
        "e.g. '0.5,0.5,0.5/0.25,0.25,0.25'.",
        into=('TrainTransform', 'EvalTransform', 'TeacherSettings', 'BatchAugment'),
    ),
    Field(
        'shuffle_buffer',
        10_000,
        config_rules.integer(1),
        'Shuffle buffer of a streamed TFRecord dataset.',
        into=('DataSettings',),
    ),
    Field(
        'prefetch', 2, config_rules.integer(1), 'Batches prepared ahead.', into=('DataSettings',)
    ),
    Field(
        'in_memory',
        None,
        config_rules.boolean(optional=True),
        'A TFRecord-only dataset held in memory (True) or streamed (False); None: held when '
        'its images are of one shape and fit in input_pipeline.IN_MEMORY_MAX_BYTES.',
        field_type=bool,
        into=('DataSettings',),
    ),
    Field(
        'skip_unreadable_images',
        False,
        config_rules.boolean(),
        'Image folders: leave out, with a warning naming each, files that do not decode.',
        into=('DataSettings',),
    ),
    # Recipe augmentations, per example in the tf.data pipeline.
    Field(
        'randaugment',
        '',
        config_rules.RANDAUGMENT,
        "timm RandAugment spec, e.g. 'rand-m9-mstd0.5-inc1'; '' = off.",
        into=('TrainTransform', 'BatchAugment'),
        convert=_randaugment_spec,
    ),
    Field(
        'three_augment',
        False,
        config_rules.boolean(),
        "DeiT III's 3-Augment: one of grayscale, solarization, Gaussian blur per image.",
        into=('TrainTransform',),
    ),
    Field(
        'color_jitter',
        0.0,
        config_rules.number(0.0),
        'Colour jitter strength (brightness, contrast, saturation; DeiT III: 0.3); 0 = off.',
        into=('TrainTransform',),
    ),
    Field(
        'random_erase_prob',
        0.0,
        config_rules.PROBABILITY,
        'Random erasing (one box, per-pixel normal noise).',
        into=('TrainTransform', 'BatchAugment'),
    ),
    Field(
        'augment_on_device',
        None,
        config_rules.boolean(optional=True),
        'RandAugment, normalisation and random erasing of each batch in the training step on the '
        'accelerator, in float32 (True; the host sends uint8 crops), or per image in tf.data, '
        "PIL's arithmetic to the bit (False); None: True where JAX's default backend is a GPU or "
        'TPU. With 3-Augment or colour jitter the host does all.',
        field_type=bool,
        into=('TrainTransform',),
    ),
    Field(
        'repeated_aug',
        1,
        config_rules.integer(1),
        'Copies of each example per batch (DeiT: 3); batch_size counts the copies.',
        into=('DataSettings',),
    ),
    # Mixup / CutMix on device, per device's share of the batch (timm Mixup, mode 'batch').
    Field(
        'mixup_alpha',
        0.0,
        config_rules.number(0.0),
        'Mixup Beta(alpha, alpha); 0 = off (DeiT: 0.8).',
        into=('MixSettings',),
    ),
    Field(
        'cutmix_alpha',
        0.0,
        config_rules.number(0.0),
        'CutMix Beta(alpha, alpha); 0 = off (DeiT: 1.0).',
        into=('MixSettings',),
    ),
    Field(
        'mix_switch_prob',
        0.5,
        config_rules.PROBABILITY,
        'P(CutMix) when both are on.',
        into=('MixSettings.switch_prob',),
    ),
    Field(
        'mix_prob',
        1.0,
        config_rules.PROBABILITY,
        'P(a batch is mixed at all).',
        into=('MixSettings',),
    ),
    # Optimisation.
    Field(
        'batch_size',
        128,
        config_rules.integer(1),
        'Global batch, summed over every device of every process.',
        into=('DataSettings', 'ScheduleSettings'),
    ),
    Field(
        'eval_batch_size',
        256,
        config_rules.integer(1),
        'Global evaluation batch.',
        into=('DataSettings',),
    ),
    Field(
        'optimizer',
        'adamw',
        config_rules.choice(OPTIMIZERS),
        "'adamw', 'sgd' with momentum, or 'lamb' (DeiT III; apex FusedLAMB's semantics).",
        into=('OptimizerSettings',),
    ),
    Field(
        'base_lr',
        1e-3,
        config_rules.number(0.0, low_open=True),
        'Peak learning rate.',
        into=('ScheduleSettings',),
    ),
    Field(
        'lr_scaling_batch',
        0,
        config_rules.integer(0),
        'If > 0, lr = base_lr * batch_size / lr_scaling_batch.',
        into=('ScheduleSettings',),
    ),
    Field(
        'min_lr',
        0.0,
        config_rules.number(0.0),
        'Learning rate at the end of the cosine.',
        into=('ScheduleSettings',),
    ),
    Field(
        'warmup_lr',
        0.0,
        config_rules.number(0.0),
        'Learning rate at the first warm-up step (DeiT: 1e-6).',
        into=('ScheduleSettings',),
    ),
    Field(
        'warmup_steps',
        100,
        config_rules.integer(0),
        'Linear warm-up steps.',
        into=('ScheduleSettings',),
    ),
    Field(
        'total_steps', 1000, config_rules.integer(1), 'Optimizer steps.', into=('ScheduleSettings',)
    ),
    Field(
        'num_epochs',
        None,
        config_rules.number(0.0, low_open=True, optional=True),
        'Epochs; when set, overrides total_steps.',
        field_type=float,
        into=('ScheduleSettings',),
    ),
    Field(
        'warmup_epochs',
        None,
        config_rules.number(0.0, optional=True),
        'Warm-up epochs; when set, overrides warmup_steps.',
        field_type=float,
        into=('ScheduleSettings',),
    ),
    Field(
        'weight_decay',
        0.05,
        config_rules.number(0.0),
        'Decoupled weight decay.',
        into=('OptimizerSettings',),
    ),
    Field(
        'momentum', 0.9, config_rules.RATE_BELOW_ONE, 'SGD momentum.', into=('OptimizerSettings',)
    ),
    Field('b1', 0.9, config_rules.RATE_BELOW_ONE, 'Adam beta1.', into=('OptimizerSettings',)),
    Field('b2', 0.999, config_rules.RATE_BELOW_ONE, 'Adam beta2.', into=('OptimizerSettings',)),
    Field(
        'eps',
        1e-8,
        config_rules.number(0.0, low_open=True),
        'Adam epsilon.',
        into=('OptimizerSettings',),
    ),
    Field(
        'layer_decay',
        1.0,
        config_rules.number(0.0, 1.0, low_open=True),
        'Layer-wise lr decay: the lr of layer l (0 = embeddings, depth + 1 = head) is scaled '
        "by layer_decay^(depth + 1 - l), as timm's --layer-decay (BEiT, MAE: 0.65-0.75); "
        '1 = off.',
        into=('OptimizerSettings',),
    ),
    Field(
        'grad_clip_norm',
        0.0,
        config_rules.number(0.0),
        "Global gradient-norm clipping; 0 = off ('lamb' always clips at 1, as apex's).",
        into=('OptimizerSettings',),
    ),
    Field(
        'label_smoothing',
        0.0,
        config_rules.RATE_BELOW_ONE,
        'Label smoothing (folded into mixed targets).',
        into=('StepSettings', 'MixSettings'),
    ),
    Field(
        'loss',
        'softmax_xent',
        config_rules.choice(LOSSES),
        "'softmax_xent', or 'bce': binary cross-entropy on targets > 0 (deit --bce-loss).",
        into=('StepSettings',),
    ),
    Field(
        'grad_accum_steps',
        1,
        config_rules.integer(1),
        'Micro-batches per optimizer step (batch_size is per step).',
        into=('StepSettings',),
    ),
    Field(
        'ema_decay',
        0.0,
        config_rules.RATE_BELOW_ONE,
        'Per-step EMA of the variables, evaluated beside them; 0 = off.',
        into=('StepSettings',),
    ),
    # Precision: parameters, softmax, norms and the loss stay float32.
    Field(
        'dtype',
        'float32',
        config_rules.choice(DTYPES),
        'Compute dtype of the model.',
        into=('Settings', 'TeacherSettings'),
    ),
    Field(
        'mu_dtype',
        '',
        config_rules.choice(DTYPES, unset="the parameters' dtype"),
        "Adam first moment / SGD momentum dtype; '' = the parameters'.",
        into=('OptimizerSettings',),
    ),
    Field(
        'no_decay_names',
        ('bias', 'scale', 'pos_embed', 'cls_token'),
        config_rules.NAMES,
        'Parameters never decayed (besides every 1-D one). DeiT does decay dist_token.',
        into=('OptimizerSettings',),
        convert=tuple,
    ),
    # Devices: a (data x fsdp) mesh over every device (vit_jax.parallel.sharding).
    Field(
        'mesh.fsdp',
        1,
        config_rules.integer(1),
        'Devices that split parameters, gradients, optimizer state and EMA; 1 = replicated. '
        'Must divide the number of devices.',
        into=('MeshSettings',),
    ),
    Field(
        'mesh.fsdp_min_size',
        2**18,
        config_rules.integer(0),
        'Arrays with fewer elements (1 MiB in float32) stay replicated.',
        into=('MeshSettings',),
    ),
    # Logging, evaluation and checkpoints.
    Field(
        'log_every',
        50,
        config_rules.integer(1),
        'Steps between progress lines.',
        into=('Settings',),
    ),
    Field(
        'eval_every', 500, config_rules.integer(1), 'Steps between evaluations.', into=('Settings',)
    ),
    Field(
        'checkpoint_every',
        500,
        config_rules.integer(1),
        'Steps between checkpoints.',
        into=('Settings',),
    ),
    Field(
        'profile_steps',
        0,
        config_rules.integer(0),
        'Training steps after the first traced by jax.profiler into WORKDIR/plugins/profile '
        "(TensorBoard's profile tab); 0 = off.",
        into=('Settings',),
    ),
    Field('keep_checkpoints', 3, config_rules.integer(1), 'Checkpoints kept.'),
    # DeiT distillation from a teacher.
    Field(
        'distillation.type',
        'none',
        config_rules.choice(DISTILLATION_TYPES),
        'Distillation loss.',
        into=('DistillationLoss.kind',),
    ),
    Field(
        'distillation.alpha',
        0.5,
        config_rules.PROBABILITY,
        'Weight of the distillation term.',
        into=('DistillationLoss',),
    ),
    Field(
        'distillation.tau',
        1.0,
        config_rules.number(0.0, low_open=True),
        "Temperature of 'soft'.",
        into=('DistillationLoss',),
    ),
    Field(
        'distillation.teacher',
        '',
        config_rules.text(empty=True),
        "The teacher: a run's --workdir, Hub weights (hf-hub:timm/regnety_160.deit_in1k), or "
        'MODEL:FILE (e.g. regnety_160:/path/regnety.pth).',
        into=('TeacherSettings',),
    ),
    Field(
        'distillation.teacher_normalization',
        '',
        config_rules.normalization_rule(unset="the student's"),
        "Inputs the teacher was trained on; '' = the student's (a work directory's: its own).",
        into=('TeacherSettings',),
    ),
    # Weights to start from, or to evaluate.
    Field(
        'init_from',
        '',
        config_rules.text(empty=True),
        'Pretrained weights (timm/DeiT/CaiT/DeepViT/T2T .pth or .safetensors, Google ViT .npz, '
        'Hub weights hf-hub:ORG/NAME, or a work directory) to start from; a --workdir holding '
        'a checkpoint resumes instead.',
        into=('Settings',),
    ),
    Field(
        'eval_only',
        False,
        config_rules.boolean(),
        "Only evaluate init_from (else --workdir's newest checkpoint) on eval_split.",
        into=('Settings',),
    ),
    Field(
        'use_ema',
        True,
        config_rules.boolean(),
        "Read a run's EMA weights where it kept them (eval_only, init_from, the teacher).",
        into=('Settings', 'TeacherSettings'),
    ),
)

SECTIONS: tuple[Section, ...] = (
    Section(
        'evaluators',
        evaluator_settings.SECTION,
        'vit_jax.evaluators',
        'The settings of every registered evaluator (vit_jax.schema.evaluators: the fields of '
        'its dataclass), run every `every` steps and at the end when `every` > 0. Unset (None) '
        "fields take the evaluator's own defaults, under which fewshot and linear_probe are "
        "off; e.g. --config.evaluators.fewshot.every=400. The test sets' are eval_sets and "
        'eval_every.',
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
  with exits.closed_output_ends_quietly():
    print(describe(), flush=True)
