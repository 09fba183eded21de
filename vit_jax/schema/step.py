"""What the training step reads of a run: its loss, mixing, augmentation, micro-batches, EMA and
DeiT distillation from a teacher."""

import dataclasses
from typing import Any

from vit_jax.schema import rules as config_rules
from vit_jax.schema import data as data_settings
from vit_jax.schema.setting import NOT_SAVED, Resume, passed, setting

LOSSES = ('softmax_xent', 'bce')  # Each the name of its loss in `vit_jax.training.steps.LOSSES`.
DISTILLATION_TYPES = ('none', 'hard', 'soft')


@dataclasses.dataclass(frozen=True)
class DistillationLoss:
  """`steps.distillation_loss`'s settings: 'hard' or 'soft' (`kind`), the weight `alpha` and
  temperature `tau`; off (None) for a run that does not distil."""

  kind: str = setting(
      'none',
      config_rules.choice(DISTILLATION_TYPES),
      'Distillation loss.',
      flag='distillation.type',
  )
  alpha: float = setting(
      0.5, config_rules.PROBABILITY, 'Weight of the distillation term.', flag='distillation.alpha'
  )
  tau: float = setting(
      1.0,
      config_rules.number(0.0, low_open=True),
      "Temperature of 'soft'.",
      flag='distillation.tau',
  )

  @staticmethod
  def off(config: Any) -> bool:
    return config.distillation.type == 'none'


@dataclasses.dataclass(frozen=True)
class TeacherSettings:
  """Which teacher a distilling run learns from (`teacher`: a work directory, 'hf-hub:ORG/NAME'
  or 'MODEL:FILE') and how it reads it (`teacher_normalization` '': the student's, a work
  directory's or Hub weights' own); off (None) for a run that does not distil."""

  teacher: str = setting(
      '',
      config_rules.text(empty=True),
      "The teacher: a run's --workdir, Hub weights (hf-hub:timm/regnety_160.deit_in1k), or "
      'MODEL:FILE (e.g. regnety_160:/path/regnety.pth).',
      flag='distillation.teacher',
  )
  teacher_normalization: str = setting(
      '',
      config_rules.normalization_rule(unset="the student's"),
      "Inputs the teacher was trained on; '' = the student's (a work directory's: its own).",
      flag='distillation.teacher_normalization',
  )
  image_size: int = passed('image_size')
  normalization: str = passed('normalization')
  dtype: str = passed('dtype')
  use_ema: bool = passed('use_ema')

  off = staticmethod(DistillationLoss.off)


@dataclasses.dataclass(frozen=True)
class StepSettings:
  """What the train step reads of a run: its loss (a key of `steps.LOSSES`), mixing (None: no
  mixup/CutMix), augmentation of the batch (None: the host's), micro-batches and EMA (0: none);
  `distillation` is None unless the run distils (then the step takes a `steps.Teacher`)."""

  label_smoothing: float = setting(
      0.0, config_rules.RATE_BELOW_ONE, 'Label smoothing (folded into mixed targets).'
  )
  loss: str = setting(
      'softmax_xent',
      config_rules.choice(LOSSES),
      "'softmax_xent', or 'bce': binary cross-entropy on targets > 0 (deit --bce-loss).",
  )
  grad_accum_steps: int = setting(
      1, config_rules.integer(1), 'Micro-batches per optimizer step (batch_size is per step).'
  )
  ema_decay: float = setting(
      0.0,
      config_rules.RATE_BELOW_ONE,
      'Per-step EMA of the variables, evaluated beside them; 0 = off.',
      resume=Resume(
          saved=False,
          started='the EMA starts from the current weights',
          stopped='the EMA is dropped',
      ),
  )
  mix: data_settings.MixSettings | None = dataclasses.field(default=None, kw_only=True)
  augment: data_settings.BatchAugment | None = dataclasses.field(default=None, kw_only=True)
  distillation: DistillationLoss | None = dataclasses.field(default=None, kw_only=True)
