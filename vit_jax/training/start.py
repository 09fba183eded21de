"""What a run trains and its fresh state: the model, its optimizer, the run's random keys and the
initial training state. It needs neither TensorFlow nor the input pipeline, so that a machine
without them (`benchmarks.device_report`) builds runs as the training loop does."""

import dataclasses
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import optax

from vit_jax import models
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.schema import optim as optim_settings
from vit_jax.schema import run as run_settings


@dataclasses.dataclass(frozen=True)
class Start:
  """The model, its optimizer, the run's random keys (`steps.init_rngs`: the parameters', the
  steps') and `init`, a thunk of the fresh training state (parameters from those keys, an EMA if
  the run keeps one) for `jax.jit` or `jax.eval_shape`."""

  model: nn.Module
  tx: optax.GradientTransformation
  rngs: tuple[jax.Array, jax.Array]
  init: Callable[[], steps.TrainState]

  @classmethod
  def build(
      cls,
      model_section: Mapping[str, Any],
      num_classes: int,
      schedule: optax.ScalarOrSchedule,
      *,
      dtype: str,
      optimizer: optim_settings.OptimizerSettings,
      seed: int,
      image_size: int,
      ema: bool,
  ) -> 'Start':
    """`model_section`: a config's `model` section (`name` and the fields it sets); `dtype`: the
    model's compute dtype unless the section sets one."""
    model = models.model_from_section(model_section, num_classes, dtype)
    tx = optim.create_optimizer(optimizer, schedule, model)
    rngs = steps.init_rngs(seed)
    init = lambda: steps.init_state(model, tx, rngs, image_size=image_size, ema=ema)
    return cls(model, tx, rngs, init)


def for_run(
    settings: run_settings.Settings, num_classes: int, schedule: optax.ScalarOrSchedule
) -> Start:
  """The model, optimizer, random keys and fresh state that `settings` train."""
  return Start.build(
      settings.model,
      num_classes,
      schedule,
      dtype=settings.dtype,
      optimizer=settings.optimizer,
      seed=settings.seed,
      image_size=settings.data.image_size,
      ema=bool(settings.step.ema_decay),
  )
