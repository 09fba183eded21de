"""A run's settings: the root of the settings tree, whose fields are the whole config
(`vit_jax.schema.config.FIELDS`); the set-up resolves a validated config into it once
(`setting.build`) and the code below receives the piece it reads."""

import dataclasses
from typing import Any, Mapping

from vit_jax.schema import rules as config_rules
from vit_jax.schema import data as data_settings
from vit_jax.schema import mesh as mesh_settings
from vit_jax.schema import optim as optim_settings
from vit_jax.schema import step as step_settings
from vit_jax.schema.setting import NOT_SAVED, section, setting


@dataclasses.dataclass(frozen=True)
class Settings:
  """A validated config as settings. `model` is the `model` section (`name` and the fields it
  sets), `dtype` the model's compute dtype unless its section sets one, `evaluators` the
  `evaluators` section, `teacher` None without distillation."""

  seed: int = setting(
      0,
      config_rules.integer(-(2**31), 2**31 - 1),  # What every random generator takes.
      'Seeds parameters, data order and augmentation.',
      resume=NOT_SAVED,
  )
  eval_sets: tuple[str, ...] = setting(
      (),
      config_rules.EVAL_SETS,
      'Test sets scored beside eval_split, when it is, each under its own name: any TFDS '
      "'name:split', digits, 'folder:/path:split'; ImageNet-ReaL multi-label, ImageNet-A/-R "
      'on their 200 classes.',
      convert=tuple,
      resume=NOT_SAVED,
  )
  # Precision: parameters, softmax, norms and the loss stay float32.
  dtype: str = setting(
      'float32', config_rules.choice(optim_settings.DTYPES), 'Compute dtype of the model.'
  )
  log_every: int = setting(
      50, config_rules.integer(1), 'Steps between progress lines.', resume=NOT_SAVED
  )
  eval_every: int = setting(
      500, config_rules.integer(1), 'Steps between evaluations.', resume=NOT_SAVED
  )
  checkpoint_every: int = setting(
      500, config_rules.integer(1), 'Steps between checkpoints.', resume=NOT_SAVED
  )
  keep_checkpoints: int = setting(3, config_rules.integer(1), 'Checkpoints kept.', resume=NOT_SAVED)
  profile_steps: int = setting(
      0,
      config_rules.integer(0),
      'Training steps after the first traced by jax.profiler into WORKDIR/plugins/profile '
      "(TensorBoard's profile tab); 0 = off.",
      resume=NOT_SAVED,
  )
  init_from: str = setting(
      '',
      config_rules.text(empty=True),
      'Pretrained weights (timm/DeiT/CaiT/DeepViT/T2T .pth or .safetensors, Google ViT .npz, '
      'Hub weights hf-hub:ORG/NAME, or a work directory) to start from; a --workdir holding '
      'a checkpoint resumes instead.',
      resume=NOT_SAVED,
  )
  eval_only: bool = setting(
      False,
      config_rules.boolean(),
      "Only evaluate init_from (else --workdir's newest checkpoint), as a run's final evaluation "
      'does: the eval split, the test sets and the evaluators that are on.',
      resume=NOT_SAVED,
  )
  use_ema: bool = setting(
      True,
      config_rules.boolean(),
      "Read a run's EMA weights where it kept them (eval_only, init_from, the teacher).",
      resume=NOT_SAVED,
  )
  data: data_settings.DataSettings = dataclasses.field(kw_only=True)
  step: step_settings.StepSettings = dataclasses.field(kw_only=True)
  schedule: optim_settings.ScheduleSettings = dataclasses.field(kw_only=True)
  optimizer: optim_settings.OptimizerSettings = dataclasses.field(kw_only=True)
  mesh: mesh_settings.MeshSettings = dataclasses.field(kw_only=True)
  teacher: step_settings.TeacherSettings | None = dataclasses.field(kw_only=True)
  model: Mapping[str, Any] = section('model')
  evaluators: Mapping[str, Mapping[str, Any]] = section('evaluators')

  @property
  def model_name(self) -> str:
    return self.model['name']
