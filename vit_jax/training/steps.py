"""The training step, traced under `jax.jit`: state, losses, on-device mixing, micro-batching, EMA."""

import dataclasses
import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import numpy as np
import optax

from vit_jax.data import batch_augment
from vit_jax.data import mixing
from vit_jax.parallel import sharding
from vit_jax.schema import data as data_settings
from vit_jax.schema import step as step_settings


class TrainState(flax.struct.PyTreeNode):
  """Everything that determines the rest of a run: resuming from it equals never stopping.
  `ema`: the variables' moving average ({'params', 'batch_stats'}) when `ema_decay` > 0, else {}."""

  step: jax.Array
  params: Any
  opt_state: Any
  batch_stats: Any
  rng: jax.Array
  ema: Any = dataclasses.field(default_factory=dict)

  def ema_view(self) -> 'TrainState':
    """This state with the EMA variables in place of the raw ones (for evaluation)."""
    return self.replace(params=self.ema['params'], batch_stats=self.ema['batch_stats'])


def classifier_logits(outputs: Any) -> jax.Array:
  """The logits to score: distilled models in training mode return (cls, dist); average them."""
  if isinstance(outputs, tuple):
    return (outputs[0] + outputs[1]) / 2
  return outputs


def binary_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """DeiT III's loss (deit `--bce-loss`): every class a binary problem whose target is 1 where
  the (mixed) target weight is > 0 (engine.py `targets.gt(0.0)`), averaged over examples and
  classes as `torch.nn.BCEWithLogitsLoss`. Per example: (batch,)."""
  hits = (targets > 0).astype(jnp.float32)
  return jnp.mean(optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32), hits), axis=-1)


def softmax_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Cross-entropy of the softmax against (soft) targets, in float32. Per example: (batch,)."""
  return optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)


# Per-example loss of logits against (batch, classes) targets, by the config's `loss`: the names
# `step_settings.LOSSES` declares, in its order.
LOSSES = dict(zip(step_settings.LOSSES, (softmax_cross_entropy, binary_cross_entropy), strict=True))


def classification_loss(outputs: Any, targets: jax.Array, kind: str = 'softmax_xent') -> jax.Array:
  """Mean loss `kind` (`LOSSES`) against (soft) targets, averaged over both heads of a distilled
  model."""
  heads = outputs if isinstance(outputs, tuple) else (outputs,)
  losses = [LOSSES[kind](logits, targets) for logits in heads]
  return jnp.mean(sum(losses) / len(losses))


def distillation_loss(
    outputs: Any,
    targets: jax.Array,
    teacher_logits: jax.Array,
    *,
    kind: str,
    alpha: float,
    tau: float,
    loss: str = 'softmax_xent',
) -> jax.Array:
  """DeiT's loss (deit/losses.py): (1 - alpha) L(cls, targets) + alpha KD(dist, teacher), L the
  base criterion `loss` (`LOSSES`); 'hard' KD: CE against the teacher's argmax, 'soft': KL at
  temperature tau, summed, divided by the number of logits, times tau²."""
  cls_logits, dist_logits = outputs if isinstance(outputs, tuple) else (outputs, outputs)
  base = jnp.mean(LOSSES[loss](cls_logits, targets))
  teacher_logits = jax.lax.stop_gradient(teacher_logits.astype(jnp.float32))
  dist_logits = dist_logits.astype(jnp.float32)
  if kind == 'hard':
    kd = jnp.mean(
        optax.softmax_cross_entropy_with_integer_labels(dist_logits, jnp.argmax(teacher_logits, -1))
    )
  else:  # 'soft': the schema's rule (config.DISTILLATION_TYPES) admits no other kind.
    log_p_student = jax.nn.log_softmax(dist_logits / tau, -1)
    log_p_teacher = jax.nn.log_softmax(teacher_logits / tau, -1)
    kd = jnp.sum(jnp.exp(log_p_teacher) * (log_p_teacher - log_p_student))
    kd = kd * tau**2 / dist_logits.size
  return (1 - alpha) * base + alpha * kd


@dataclasses.dataclass(frozen=True)
class Teacher:
  """A frozen model whose predictions a student learns from (DeiT distillation); `input_scale`
  and `input_shift` (per channel) map the student's normalised images to the teacher's."""

  model: nn.Module
  variables: Any
  input_scale: np.ndarray | None = None
  input_shift: np.ndarray | None = None

  def logits(self, variables: Any, images: jax.Array) -> jax.Array:
    """The teacher's logits in inference mode (BatchNorm on running statistics, no dropout)."""
    if self.input_scale is not None and self.input_shift is not None:
      images = (images * self.input_scale + self.input_shift).astype(images.dtype)
    return classifier_logits(self.model.apply(variables, images, train=False))


def training_batch(
    rng: jax.Array,
    batch: dict[str, jax.Array],
    mix: data_settings.MixSettings | None,
    label_smoothing: float,
    num_classes: int,
    mix_groups: int = 1,
    augment: data_settings.BatchAugment | None = None,
) -> dict[str, jax.Array]:
  """The batch the model learns from: images (augmented on device with `augment`), soft `targets`
  and the `label` scored by accuracy (mixed: the class of largest weight). Mixing splits the batch
  into `mix_groups` groups (one per device, like timm's per-GPU Mixup), each with its own λ."""
  onehot = jax.nn.one_hot(batch['label'], num_classes)
  if augment is not None:  # The host sent uint8 crops and a key per image.
    batch = {**batch, 'image': batch_augment.augment(batch['image'], batch['augment_key'], augment)}
  if mix is None:
    return {
        'image': batch['image'],
        'label': batch['label'],
        'targets': optax.smooth_labels(onehot, label_smoothing),
    }
  group = lambda x: x.reshape((mix_groups, x.shape[0] // mix_groups) + x.shape[1:])
  images, targets = jax.vmap(functools.partial(mixing.mix, mix))(
      jax.random.split(rng, mix_groups), group(batch['image']), group(onehot)
  )
  targets = targets.reshape((-1, num_classes))
  return {
      'image': images.reshape(batch['image'].shape),
      'targets': targets,
      'label': jnp.argmax(targets, -1).astype(batch['label'].dtype),
  }


def micro_batches(batch: dict[str, jax.Array], count: int) -> dict[str, jax.Array]:
  """Splits every array (B, ...) into (count, B / count, ...); micro-batch j takes rows j::count,
  which keeps each device's share of every micro-batch on that device."""

  def split(x):
    x = x.reshape((x.shape[0] // count, count) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)

  return jax.tree.map(split, batch)


def update_ema(ema: Any, variables: Any, decay: float) -> Any:
  """ema <- decay * ema + (1 - decay) * variables, once per optimizer step, never debiased:
  timm's ModelEma, whose average starts from the model's variables (`with_fresh_ema`)."""
  return optax.incremental_update(variables, ema, step_size=1.0 - decay)


def accumulated(
    micro_step: Callable,
    params: Any,
    batch_stats: Any,
    batch: dict[str, jax.Array],
    dropout_rng: jax.Array,
    count: int,
    zeros: Any,
) -> tuple[Any, Any, jax.Array, jax.Array]:
  """`micro_step`'s mean (gradients, batch statistics, loss, accuracy) over `count` micro-batches,
  in a `lax.scan` from `zeros` that threads the batch statistics; j's dropout: rng folded with j."""

  def body(carry, micro):
    grad_sum, batch_stats = carry
    grads, batch_stats, loss, accuracy = micro_step(
        params, batch_stats, micro, jax.random.fold_in(dropout_rng, micro['index'])
    )
    grad_sum = jax.tree.map(lambda s, g: s + g.astype(s.dtype), grad_sum, grads)
    return (grad_sum, batch_stats), (loss, accuracy)

  micros = {**micro_batches(batch, count), 'index': jnp.arange(count)}
  (grad_sum, batch_stats), (losses, accuracies) = jax.lax.scan(body, (zeros, batch_stats), micros)
  grads = jax.tree.map(lambda g: g / count, grad_sum)
  return grads, batch_stats, jnp.mean(losses), jnp.mean(accuracies)


def make_train_step(
    model: nn.Module,
    tx: optax.GradientTransformation,
    settings: step_settings.StepSettings,
    num_classes: int,
    teacher: Teacher | None = None,
    mix_groups: int = 1,
    param_shardings: Any = None,
) -> Callable[..., tuple[TrainState, dict]]:
  """The (unjitted) train step `(state, batch[, teacher_variables, schedule])`; `schedule` (an
  `optim.Schedule`, None: `tx`'s own) is an argument so one compiled step serves runs of any length.

  `param_shardings` lays out the gradients like the parameters: each device reduces only its shard.
  `grad_accum_steps` > 1 averages micro-batches' gradients (`accumulated`): the update of the whole
  batch, except that BatchNorm's statistics and dropout masks are per micro-batch. Mixing is done
  on the whole batch first.
  """
  accumulate = settings.grad_accum_steps
  ema_decay = settings.ema_decay
  distillation = settings.distillation
  if (teacher is None) != (distillation is None):
    raise ValueError(
        'A train step distils exactly when it is given a teacher: '
        f'distillation={distillation}, teacher={teacher}.'
    )

  def like_params(tree):
    if param_shardings is None:
      return tree
    return jax.lax.with_sharding_constraint(tree, param_shardings)

  def micro_step(params, batch_stats, batch, dropout_rng, teacher_variables):
    """Gradients, new batch statistics, loss and accuracy of one (micro-)batch."""
    if teacher is not None:  # The teacher sees exactly the student's (augmented, mixed) batch.
      teacher_logits = teacher.logits(teacher_variables, batch['image'])

    def loss_fn(params):
      variables = {'params': params}
      mutable = []
      if batch_stats:
        variables['batch_stats'] = batch_stats
        mutable = ['batch_stats']
      outputs, updates = model.apply(
          variables, batch['image'], train=True, rngs={'dropout': dropout_rng}, mutable=mutable
      )
      if distillation is None:
        loss = classification_loss(outputs, batch['targets'], settings.loss)
      else:
        loss = distillation_loss(
            outputs,
            batch['targets'],
            teacher_logits,
            kind=distillation.kind,
            alpha=distillation.alpha,
            tau=distillation.tau,
            loss=settings.loss,
        )
      return loss, (outputs, updates.get('batch_stats', batch_stats))

    (loss, (outputs, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    grads = like_params(grads)
    accuracy = jnp.mean(jnp.argmax(classifier_logits(outputs), -1) == batch['label'])
    return grads, batch_stats, loss, accuracy

  def train_step(
      state: TrainState,
      batch: dict[str, jax.Array],
      teacher_variables: Any = None,
      schedule: Any = None,
  ):
    dropout_rng, mix_rng = jax.random.split(jax.random.fold_in(state.rng, state.step))
    batch = training_batch(
        mix_rng,
        batch,
        settings.mix,
        settings.label_smoothing,
        num_classes,
        mix_groups,
        settings.augment,
    )
    one_batch = functools.partial(micro_step, teacher_variables=teacher_variables)
    if accumulate == 1:
      grads, batch_stats, loss, accuracy = one_batch(
          state.params, state.batch_stats, batch, dropout_rng
      )
    else:
      zeros = like_params(jax.tree.map(jnp.zeros_like, state.params))
      grads, batch_stats, loss, accuracy = accumulated(
          one_batch, state.params, state.batch_stats, batch, dropout_rng, accumulate, zeros
      )
    extra = {} if schedule is None else {'schedule': schedule}
    updates, opt_state = tx.update(grads, state.opt_state, state.params, **extra)
    params = optax.apply_updates(state.params, updates)
    metrics = {'loss': loss, 'accuracy': accuracy, 'grad_norm': optax.tree.norm(grads)}
    ema = state.ema
    if ema_decay:
      ema = update_ema(ema, {'params': params, 'batch_stats': batch_stats}, ema_decay)
    new_state = state.replace(
        step=state.step + 1, params=params, opt_state=opt_state, batch_stats=batch_stats, ema=ema
    )
    return new_state, metrics

  return train_step


def sharded_train_step(
    model: nn.Module,
    tx: optax.GradientTransformation,
    settings: step_settings.StepSettings,
    num_classes: int,
    mesh: Mesh,
    state_sharding: Any,
    teacher: Teacher | None = None,
    teacher_sharding: Any = None,
) -> jax.stages.Wrapped:
  """`make_train_step` jitted for `mesh`: the state (donated) and the teacher's variables in
  their layouts, the batch over every device (mixed within each device's share), the rest
  replicated."""
  step = make_train_step(
      model,
      tx,
      settings,
      num_classes,
      teacher,
      mix_groups=mesh.size,
      param_shardings=state_sharding.params,
  )
  return jax.jit(
      step,
      in_shardings=(
          state_sharding,
          sharding.batch_sharding(mesh),
          teacher_sharding,
          sharding.replicated(mesh),
      ),
      out_shardings=(state_sharding, sharding.replicated(mesh)),
      donate_argnums=0,
  )


def init_rngs(seed: int) -> tuple[jax.Array, jax.Array]:
  """(parameters' rng, training rng) of a run seeded `seed`: a fresh state's, and a fine-tuned
  head's, parameters come from the first; dropout and mixing of every step from the second."""
  params_rng, train_rng = jax.random.split(jax.random.PRNGKey(seed))
  return params_rng, train_rng


def init_state(
    model: nn.Module,
    tx: optax.GradientTransformation,
    rngs: tuple[jax.Array, jax.Array],
    *,
    image_size: int,
    ema: bool,
) -> TrainState:
  """A fresh training state: parameters initialised from `rngs` (`init_rngs`), with an EMA if
  `ema`."""
  params_rng, train_rng = rngs
  images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
  variables = model.init({'params': params_rng}, images, train=False)
  params = variables['params']
  state = TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      batch_stats=variables.get('batch_stats', {}),
      rng=train_rng,
  )
  return with_fresh_ema(state, ema)


def with_fresh_ema(state: TrainState, ema: bool) -> TrainState:
  """The state with its EMA restarted from the current variables (none unless `ema`)."""
  if not ema:
    return state.replace(ema={})
  copy = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)
  return state.replace(ema={'params': copy(state.params), 'batch_stats': copy(state.batch_stats)})
