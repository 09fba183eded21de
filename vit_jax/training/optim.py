"""The optimizer of a run: learning-rate schedule, weight-decay mask, layer-wise lr decay.

With `layer_decay` < 1 each parameter's update is scaled by layer_decay^(top - layer) after the
optimizer (timm's `param_groups_layer_decay`): its lr and decoupled weight decay both scaled.
"""

import math
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax.schema import config as config_lib
from vit_jax.models import layouts
from vit_jax.schema import optim as optim_settings


def training_steps(
    schedule: optim_settings.ScheduleSettings, num_train_examples: int
) -> tuple[int, int]:
  """Total and warm-up steps, from epochs when the settings give epochs; epochs that make less
  than one step are refused (one step would train at the warm-up's first learning rate)."""
  steps_per_epoch = num_train_examples / schedule.batch_size
  total = schedule.total_steps
  if schedule.num_epochs is not None:
    if schedule.num_epochs * steps_per_epoch < 1:
      raise ValueError(
          f'{config_lib.FLAG}num_epochs={schedule.num_epochs:g} is less than one step: an '
          f'epoch is {steps_per_epoch:g} steps ({num_train_examples} training examples in '
          f'batches of {schedule.batch_size}); give at least {1 / steps_per_epoch:.3g}.'
      )
    total = math.ceil(schedule.num_epochs * steps_per_epoch)
  warmup = schedule.warmup_steps
  if schedule.warmup_epochs is not None:
    warmup = math.ceil(schedule.warmup_epochs * steps_per_epoch)
  return int(total), int(min(warmup, total))


def peak_learning_rate(schedule: optim_settings.ScheduleSettings) -> float:
  """base_lr, scaled linearly with the global batch when `lr_scaling_batch` is set (DeiT rule)."""
  if schedule.lr_scaling_batch:
    return schedule.base_lr * schedule.batch_size / schedule.lr_scaling_batch
  return schedule.base_lr


@flax.struct.dataclass
class Schedule:
  """Linear warm-up from `warmup_lr` to `peak`, then cosine decay to `min_lr`, per step: optax's
  `warmup_cosine_decay_schedule` (to float rounding), with its numbers held as arrays so that the
  train step takes them as an argument and one compiled step serves every schedule."""

  warmup_lr: jax.typing.ArrayLike
  warmup_rise: jax.typing.ArrayLike  # warmup_lr - peak.
  warmup_steps: jax.typing.ArrayLike
  peak: jax.typing.ArrayLike
  decay_steps: jax.typing.ArrayLike  # After the warm-up.
  alpha: jax.typing.ArrayLike  # min_lr / peak.
  one_minus_alpha: jax.typing.ArrayLike

  def __call__(self, count: jax.Array) -> jax.Array:
    rising = jnp.clip(count, 0, self.warmup_steps)
    warmup = self.warmup_rise * (1 - rising / jnp.maximum(self.warmup_steps, 1)) + self.peak
    decaying = jnp.minimum(count - self.warmup_steps, self.decay_steps)
    cosine = 0.5 * (1 + jnp.cos(jnp.pi * decaying / self.decay_steps))
    decay = self.peak * (self.one_minus_alpha * cosine + self.alpha)
    return jnp.where(count < self.warmup_steps, warmup, decay)


def learning_rate_schedule(
    schedule: optim_settings.ScheduleSettings, total_steps: int, warmup_steps: int
) -> Schedule:
  """Linear warm-up from `warmup_lr` to the peak, then cosine decay to `min_lr`, per step."""
  peak = peak_learning_rate(schedule)
  alpha = 0.0 if peak == 0.0 else schedule.min_lr / peak
  numbers = {
      'warmup_lr': schedule.warmup_lr,
      'warmup_rise': schedule.warmup_lr - peak,
      'warmup_steps': warmup_steps,
      'peak': peak,
      'decay_steps': max(total_steps, warmup_steps + 1) - warmup_steps,
      'alpha': alpha,
      'one_minus_alpha': 1 - alpha,
  }
  return Schedule(**{name: np.float32(value) for name, value in numbers.items()})


def scale_by_learning_rate(
    learning_rate: optax.ScalarOrSchedule,
) -> optax.GradientTransformationExtraArgs:
  """`optax.scale_by_learning_rate` (updates times -lr(count), the same state), with the schedule
  read from the update's `schedule` argument where the step passes one (`steps.make_train_step`)."""

  def init(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update(updates, state, params=None, *, schedule: Schedule | None = None, **extra_args):
    del params, extra_args
    rate = learning_rate if schedule is None else schedule
    step_size = -(rate(state.count) if callable(rate) else rate)
    updates = jax.tree.map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
    return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

  return optax.GradientTransformationExtraArgs(init, update)


def _names(path: Any) -> tuple[str, ...]:
  """The names along a pytree key path (dict keys, attribute names)."""
  return tuple(str(getattr(k, 'key', getattr(k, 'name', k))) for k in path)


def weight_decay_mask(params: Any, no_decay_names: tuple[str, ...]) -> Any:
  """True where weight decay applies: timm's `param_groups_weight_decay` rule (not at rank <= 1,
  a scanned stack's layer axis not counted), nor on names in `no_decay_names`."""

  def decays(path, leaf):
    names = _names(path)
    block_rank = np.ndim(leaf) - layouts.layer_axes(names)
    return block_rank > 1 and not any(n in no_decay_names for n in names)

  return jax.tree_util.tree_map_with_path(decays, params)


def _check_layer_decay(model: nn.Module, decay: float) -> None:
  """Raises ValueError unless `decay` is in (0, 1] and `model` assigns layers (`layer_ids`)."""
  if not 0.0 < decay <= 1.0:
    raise ValueError(f'layer_decay={decay} must be in (0, 1] (1: off).')
  if not hasattr(model, 'layer_ids'):
    raise ValueError(
        f'{type(model).__name__} assigns no layers (layer_ids) for layer-wise lr '
        'decay; use layer_decay=1.'
    )


def layer_decay_scales(model: nn.Module, params: Any, decay: float) -> Any:
  """Each parameter's learning-rate factor decay^(top - layer) (BEiT's layer-wise lr decay, timm's
  `param_groups_layer_decay`), with the layers of `model.layer_ids`; a scanned stack of blocks
  gets one factor per block, shaped to broadcast over its leading axis."""
  _check_layer_decay(model, decay)

  def scale(path, leaf):
    ids = model.layer_ids(_names(path))
    factors = np.power(decay, model.top_layer - ids, dtype=np.float64).astype(np.float32)
    if factors.size == 1:
      return factors.reshape(())
    return factors.reshape(factors.shape + (1,) * (np.ndim(leaf) - 1))

  return jax.tree_util.tree_map_with_path(scale, params)


def scale_by_layer_decay(model: nn.Module, decay: float) -> optax.GradientTransformation:
  """Multiplies each update by its `layer_decay_scales` factor; a model without layers or a
  decay outside (0, 1] is refused here, before anything compiles."""
  _check_layer_decay(model, decay)

  def update(updates, params=None):
    del params
    scales = layer_decay_scales(model, updates, decay)
    return jax.tree.map(lambda u, s: (u * s).astype(u.dtype), updates, scales)

  return optax.stateless(update)


def scale_by_block_trust_ratio() -> optax.GradientTransformation:
  """LAMB's trust ratio ||w|| / ||update|| (1 where either norm is 0, as
  `optax.scale_by_trust_ratio`) per parameter tensor of the unrolled model: a scanned stack gets
  one ratio per block, as apex FusedLAMB and timm's `Lamb` take one per tensor."""

  def update(updates, params=None):
    if params is None:
      raise ValueError('scale_by_block_trust_ratio needs the parameters.')

    def scale(path, u, w):
      block_axes = tuple(range(layouts.layer_axes(_names(path)), np.ndim(u)))
      norm = lambda x: jnp.sqrt(jnp.sum(jnp.square(x), axis=block_axes, keepdims=True))
      w_norm, u_norm = norm(w), norm(u)
      ratio = jnp.where((w_norm == 0.0) | (u_norm == 0.0), jnp.ones_like(w_norm), w_norm / u_norm)
      return (u * ratio).astype(u.dtype)

    return jax.tree_util.tree_map_with_path(scale, updates, params)

  return optax.stateless(update)


# apex FusedLAMB's `max_grad_norm`: gradients are clipped to this global norm before the moments.
LAMB_MAX_GRAD_NORM = 1.0


def lamb(
    learning_rate: optax.ScalarOrSchedule,
    *,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
    mask: Any,
    mu_dtype: Any = None,
) -> optax.GradientTransformation:
  """LAMB (You et al. 2020) as DeiT III runs it (apex `FusedLAMB`, timm's `--opt fusedlamb`):
  `optax.lamb`'s steps, but with the gradients first clipped to `LAMB_MAX_GRAD_NORM` and the trust
  ratio only where weight decay applies (apex `use_nvlamb=False`)."""
  return optax.chain(
      optax.clip_by_global_norm(LAMB_MAX_GRAD_NORM),
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype),
      optax.add_decayed_weights(weight_decay, mask),
      optax.masked(scale_by_block_trust_ratio(), mask),
      scale_by_learning_rate(learning_rate),
  )


def create_optimizer(
    settings: optim_settings.OptimizerSettings, schedule: optax.ScalarOrSchedule, model: nn.Module
) -> optax.GradientTransformation:
  """AdamW, SGD with momentum and L2 weight decay, or LAMB, under the mask; optional clipping;
  with `layer_decay` < 1 each update scaled per layer of `model` (`scale_by_layer_decay`).

  `mu_dtype` ('bfloat16') stores Adam's or LAMB's first moment or SGD's momentum in that dtype.
  """
  mask = lambda params: weight_decay_mask(params, tuple(settings.no_decay_names))
  mu_dtype = jnp.dtype(settings.mu_dtype) if settings.mu_dtype else None
  if settings.optimizer == 'adamw':
    tx = optax.chain(  # optax.adamw's stages.
        optax.scale_by_adam(b1=settings.b1, b2=settings.b2, eps=settings.eps, mu_dtype=mu_dtype),
        optax.add_decayed_weights(settings.weight_decay, mask),
        scale_by_learning_rate(schedule),
    )
  elif settings.optimizer == 'sgd':
    tx = optax.chain(
        optax.add_decayed_weights(settings.weight_decay, mask),
        optax.chain(  # optax.sgd's stages.
            optax.trace(decay=settings.momentum, accumulator_dtype=mu_dtype),
            scale_by_learning_rate(schedule),
        ),
    )
  elif settings.optimizer == 'lamb':
    tx = lamb(
        schedule,
        b1=settings.b1,
        b2=settings.b2,
        eps=settings.eps,
        weight_decay=settings.weight_decay,
        mask=mask,
        mu_dtype=mu_dtype,
    )
  else:
    raise ValueError(f"Unknown optimizer {settings.optimizer!r}; valid: 'adamw', 'sgd', 'lamb'.")
  if settings.layer_decay != 1.0:
    tx = optax.chain(tx, scale_by_layer_decay(model, settings.layer_decay))
  if settings.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(settings.grad_clip_norm), tx)
  return tx
