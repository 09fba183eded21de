"""The optimizer of a run and its learning-rate schedule."""

import dataclasses

from vit_jax.schema import rules as config_rules
from vit_jax.schema.setting import SCHEDULE, Resume, passed, setting

DTYPES = ('float32', 'bfloat16', 'float16')
OPTIMIZERS = ('adamw', 'sgd', 'lamb')


@dataclasses.dataclass(frozen=True)
class ScheduleSettings:
  """How long a run trains (`num_epochs`, `warmup_epochs` when set override the steps) and its
  learning rate per step; `batch_size` is global."""

  base_lr: float = setting(
      1e-3, config_rules.number(0.0, low_open=True), 'Peak learning rate.', resume=SCHEDULE
  )
  lr_scaling_batch: int = setting(
      0,
      config_rules.integer(0),
      'If > 0, lr = base_lr * batch_size / lr_scaling_batch.',
      resume=SCHEDULE,
  )
  min_lr: float = setting(
      0.0, config_rules.number(0.0), 'Learning rate at the end of the cosine.', resume=SCHEDULE
  )
  warmup_lr: float = setting(
      0.0,
      config_rules.number(0.0),
      'Learning rate at the first warm-up step (DeiT: 1e-6).',
      resume=SCHEDULE,
  )
  warmup_steps: int = setting(
      100, config_rules.integer(0), 'Linear warm-up steps.', resume=SCHEDULE
  )
  total_steps: int = setting(1000, config_rules.integer(1), 'Optimizer steps.', resume=SCHEDULE)
  num_epochs: float | None = setting(
      None,
      config_rules.number(0.0, low_open=True, optional=True),
      'Epochs; when set, overrides total_steps.',
      resume=SCHEDULE,
  )
  warmup_epochs: float | None = setting(
      None,
      config_rules.number(0.0, optional=True),
      'Warm-up epochs; when set, overrides warmup_steps.',
      resume=SCHEDULE,
  )
  batch_size: int = passed('batch_size')


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
  """The optimizer of a run."""

  optimizer: str = setting(
      'adamw',
      config_rules.choice(OPTIMIZERS),
      "'adamw', 'sgd' with momentum, or 'lamb' (DeiT III; apex FusedLAMB's semantics).",
  )
  weight_decay: float = setting(0.05, config_rules.number(0.0), 'Decoupled weight decay.')
  momentum: float = setting(0.9, config_rules.RATE_BELOW_ONE, 'SGD momentum.')
  b1: float = setting(0.9, config_rules.RATE_BELOW_ONE, 'Adam beta1.')
  b2: float = setting(0.999, config_rules.RATE_BELOW_ONE, 'Adam beta2.')
  eps: float = setting(1e-8, config_rules.number(0.0, low_open=True), 'Adam epsilon.')
  layer_decay: float = setting(
      1.0,
      config_rules.number(0.0, 1.0, low_open=True),
      'Layer-wise lr decay: the lr of layer l (0 = embeddings, depth + 1 = head) is scaled '
      "by layer_decay^(depth + 1 - l), as timm's --layer-decay (BEiT, MAE: 0.65-0.75); "
      '1 = off.',
  )
  grad_clip_norm: float = setting(
      0.0,
      config_rules.number(0.0),
      "Global gradient-norm clipping; 0 = off ('lamb' always clips at 1, as apex's).",
      resume=Resume(
          saved=False,
          started='gradient clipping starts now',
          stopped='gradient clipping stops now',
      ),
  )
  mu_dtype: str = setting(
      '',
      config_rules.choice(DTYPES, unset="the parameters' dtype"),
      "Adam first moment / SGD momentum dtype; '' = the parameters'.",
      resume=Resume(note="the optimizer's first moment is cast to {new}"),
  )
  no_decay_names: tuple[str, ...] = setting(
      ('bias', 'scale', 'pos_embed', 'cls_token'),
      config_rules.NAMES,
      'Parameters never decayed (besides every 1-D one). DeiT does decay dist_token.',
      convert=tuple,
  )
