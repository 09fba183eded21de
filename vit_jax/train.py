"""Training and evaluation: one linear function from a config to a trained, checkpointed model.

Every process runs the same program. A (data × fsdp) device mesh spans every device of every
process (`vit_jax.sharding`): batches are split over all of it, and the training state over its
`fsdp` axis (`config.mesh.fsdp`; 1 replicates it, as plain data parallelism does). Each process
feeds only its own share of the data. Process 0 alone logs and writes summaries.
"""

import contextlib
import dataclasses
import functools
import json
import math
import os
import signal
import time
from typing import Any, Callable, Iterator

from absl import logging
from etils import epath
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

from vit_jax import augment
from vit_jax import checkpoints
from vit_jax import config as config_lib
from vit_jax import evaluators as evaluators_lib
from vit_jax import input_pipeline
from vit_jax import models
from vit_jax import sharding
from vit_jax import workdir as workdir_lib
from vit_jax.models import vit


@flax.struct.dataclass
class TrainState:
  """Everything that determines the rest of a run: resuming from it equals never stopping.

  `ema` holds the exponential moving average of the variables ({'params', 'batch_stats'}) when
  `config.ema_decay > 0`, else {}.
  """
  step: jax.Array
  params: Any
  opt_state: Any
  batch_stats: Any
  rng: jax.Array
  ema: Any = dataclasses.field(default_factory=dict)

  def ema_view(self) -> 'TrainState':
    """This state with the EMA variables in place of the raw ones (for evaluation)."""
    return self.replace(params=self.ema['params'], batch_stats=self.ema['batch_stats'])


def create_model(config: ml_collections.ConfigDict, num_classes: int) -> nn.Module:
  """The registered model `config.model.name` with the config's overrides.

  `config.dtype` is the compute dtype of every model ('bfloat16': mixed precision with float32
  parameters, softmax, norms and loss); a `model.dtype` override takes precedence.
  """
  overrides = {k: v for k, v in config.model.items() if k != 'name'}
  overrides.setdefault('dtype', config.get('dtype', 'float32'))
  return models.create(config.model.name, num_classes=num_classes, **overrides)


def training_steps(config: ml_collections.ConfigDict, num_train_examples: int) -> tuple[int, int]:
  """Total and warm-up steps, from epochs when the config gives epochs."""
  steps_per_epoch = num_train_examples / config.batch_size
  total = config.total_steps
  if config.get('num_epochs') is not None:
    total = math.ceil(config.num_epochs * steps_per_epoch)
  warmup = config.warmup_steps
  if config.get('warmup_epochs') is not None:
    warmup = math.ceil(config.warmup_epochs * steps_per_epoch)
  return int(total), int(min(warmup, total))


def peak_learning_rate(config: ml_collections.ConfigDict) -> float:
  """base_lr, scaled linearly with the global batch when `lr_scaling_batch` is set (DeiT rule)."""
  if config.get('lr_scaling_batch', 0):
    return config.base_lr * config.batch_size / config.lr_scaling_batch
  return config.base_lr


def learning_rate_schedule(config: ml_collections.ConfigDict, total_steps: int,
                           warmup_steps: int) -> optax.Schedule:
  """Linear warm-up from `warmup_lr` to the peak, then cosine decay to `min_lr`, per step."""
  peak = peak_learning_rate(config)
  return optax.warmup_cosine_decay_schedule(
      init_value=config.get('warmup_lr', 0.0), peak_value=peak, warmup_steps=warmup_steps,
      decay_steps=max(total_steps, warmup_steps + 1), end_value=config.min_lr)


def weight_decay_mask(params: Any, no_decay_names: tuple[str, ...]) -> Any:
  """True where weight decay applies: not on 1-D parameters nor on names in `no_decay_names`."""
  def decays(path, leaf):
    names = [str(getattr(k, 'key', k)) for k in path]
    return np.ndim(leaf) > 1 and not any(n in no_decay_names for n in names)
  return jax.tree_util.tree_map_with_path(decays, params)


def create_optimizer(config: ml_collections.ConfigDict,
                     schedule: optax.Schedule) -> optax.GradientTransformation:
  """AdamW, or SGD with momentum and L2 weight decay, under the mask; optional clipping.

  `mu_dtype` ('bfloat16') stores Adam's first moment or SGD's momentum in that dtype.
  """
  mask = lambda params: weight_decay_mask(params, tuple(config.no_decay_names))
  mu_dtype = jnp.dtype(config.mu_dtype) if config.get('mu_dtype') else None
  if config.optimizer == 'adamw':
    tx = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps, mu_dtype=mu_dtype,
                     weight_decay=config.weight_decay, mask=mask)
  elif config.optimizer == 'sgd':
    tx = optax.chain(optax.add_decayed_weights(config.weight_decay, mask),
                     optax.sgd(schedule, momentum=config.momentum, accumulator_dtype=mu_dtype))
  else:
    raise ValueError(f"Unknown optimizer {config.optimizer!r}; valid: 'adamw', 'sgd'.")
  if config.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx


def classifier_logits(outputs: Any) -> jax.Array:
  """The logits to score: distilled models in training mode return (cls, dist); average them."""
  if isinstance(outputs, tuple):
    return (outputs[0] + outputs[1]) / 2
  return outputs


def classification_loss(outputs: Any, targets: jax.Array) -> jax.Array:
  """Mean cross-entropy against (soft) targets, averaged over both heads of a distilled model."""
  heads = outputs if isinstance(outputs, tuple) else (outputs,)
  losses = [optax.softmax_cross_entropy(logits.astype(jnp.float32), targets) for logits in heads]
  return jnp.mean(sum(losses) / len(losses))


def distillation_loss(outputs: Any, targets: jax.Array, teacher_logits: jax.Array, *, kind: str,
                      alpha: float, tau: float) -> jax.Array:
  """DeiT's loss (deit/losses.py): (1 - alpha) CE(cls, targets) + alpha KD(dist, teacher).

  'hard': CE against the teacher's argmax. 'soft': KL(teacher || student) at temperature tau,
  summed and divided by the number of logits, times tau². A model without a distillation token
  distils through its only head.
  """
  cls_logits, dist_logits = outputs if isinstance(outputs, tuple) else (outputs, outputs)
  base = jnp.mean(optax.softmax_cross_entropy(cls_logits.astype(jnp.float32), targets))
  teacher_logits = jax.lax.stop_gradient(teacher_logits.astype(jnp.float32))
  dist_logits = dist_logits.astype(jnp.float32)
  if kind == 'hard':
    kd = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
        dist_logits, jnp.argmax(teacher_logits, -1)))
  elif kind == 'soft':
    log_p_student = jax.nn.log_softmax(dist_logits / tau, -1)
    log_p_teacher = jax.nn.log_softmax(teacher_logits / tau, -1)
    kd = jnp.sum(jnp.exp(log_p_teacher) * (log_p_teacher - log_p_student))
    kd = kd * tau ** 2 / dist_logits.size
  else:
    raise ValueError(f"Unknown distillation type {kind!r}; valid: 'none', 'hard', 'soft'.")
  return (1 - alpha) * base + alpha * kd


@dataclasses.dataclass(frozen=True)
class Teacher:
  """A frozen model whose predictions a student learns from (DeiT distillation).

  `input_scale`/`input_shift` (per channel, or None) map the student's normalised images to the
  teacher's normalisation when the two were trained with different ones.
  """
  model: nn.Module
  variables: Any
  input_scale: np.ndarray | None = None
  input_shift: np.ndarray | None = None

  def logits(self, variables: Any, images: jax.Array) -> jax.Array:
    """The teacher's logits in inference mode (BatchNorm on running statistics, no dropout)."""
    if self.input_scale is not None:
      images = (images * self.input_scale + self.input_shift).astype(images.dtype)
    return classifier_logits(self.model.apply(variables, images, train=False))


def teacher_source(teacher: str) -> tuple[str | None, str]:
  """(registry name, weights file) for 'MODEL:FILE'; (None, teacher) for a work directory."""
  name, separator, path = teacher.partition(':')
  if separator and name in models.names():
    return name, path
  return None, teacher


def normalization_change(student: str, teacher: str) -> tuple[np.ndarray, np.ndarray] | None:
  """(scale, shift) with teacher-normalised = scale * student-normalised + shift; None if equal."""
  if student == teacher:
    return None
  for name in (student, teacher):
    if name not in input_pipeline.NORMALIZATIONS:
      raise ValueError(f'Unknown normalization {name!r}; valid: '
                       f'{list(input_pipeline.NORMALIZATIONS)}.')
  (mean_s, std_s), (mean_t, std_t) = (np.asarray(input_pipeline.NORMALIZATIONS[n], np.float32)
                                      for n in (student, teacher))
  return std_s / std_t, (mean_s - mean_t) / std_t


def load_teacher(config: ml_collections.ConfigDict, num_classes: int) -> Teacher | None:
  """The teacher of `config.distillation`; None if unused.

  `distillation.teacher` is a work directory of vit_jax.main (its model, fields and
  normalisation are read from its config.json) or 'MODEL:FILE', a registered model and a weights
  file that `checkpoints.load` reads (timm .pth/.safetensors, .npz); such a teacher expects
  `distillation.teacher_normalization` ('' = the student's). The teacher computes in the run's
  `dtype`.
  """
  spec = config.distillation
  if spec.type == 'none':
    return None
  if spec.type not in ('hard', 'soft'):
    raise ValueError(f"distillation.type={spec.type!r} is not valid; choose from "
                     "['none', 'hard', 'soft'].")
  model_name, source = teacher_source(spec.teacher)
  normalization = spec.get('teacher_normalization') or config.normalization
  if model_name is None:
    saved = checkpoints.read_config(source) if source else None
    if saved is None or not checkpoints.has_checkpoint(source):
      raise ValueError(
          f'distillation.teacher={spec.teacher!r} must be a work directory with a config.json and '
          'a checkpoint written by vit_jax.main, or MODEL:FILE with MODEL a registered model '
          'name and FILE its weights (e.g. regnety_160:/path/regnety_160.pth).')
    model_name = saved['model']['name']
    overrides = {k: v for k, v in saved['model'].items() if k != 'name'}
    normalization = spec.get('teacher_normalization') or saved.get('normalization', normalization)
  elif not os.path.isfile(source):
    raise ValueError(f'distillation.teacher={spec.teacher!r}: no weights file at {source!r}.')
  else:
    overrides = {}
  overrides.setdefault('dtype', config.get('dtype', 'float32'))
  model = models.create(model_name, num_classes=num_classes, **overrides)
  variables = load_variables(source, model, config)
  change = normalization_change(config.normalization, normalization)
  logging.info('Distilling (%s, alpha=%s, tau=%s) from %s in %s (%s); the teacher sees the '
               'student\'s batch in %s normalisation%s.', spec.type, spec.alpha, spec.tau,
               model_name, source,
               'EMA weights where kept' if config.get('use_ema', True) else 'raw weights',
               normalization, '' if change is None else f' (converted from {config.normalization})')
  return Teacher(model, variables, *(change or (None, None)))


def training_batch(rng: jax.Array, batch: dict[str, jax.Array], config: ml_collections.ConfigDict,
                   num_classes: int, mix_groups: int = 1) -> dict[str, jax.Array]:
  """The batch the model learns from: images, soft `targets` and the `label` scored by accuracy.

  With mixup/CutMix on (`mixup_alpha` or `cutmix_alpha` > 0) the batch is split into
  `mix_groups` consecutive groups (one per device, like timm's per-GPU Mixup), each mixed with
  its own λ and mirror pairing; label smoothing is folded into the mixed targets, and `label` is
  the class with the largest target weight. Without mixing, targets are the smoothed one-hot
  labels.
  """
  onehot = jax.nn.one_hot(batch['label'], num_classes)
  settings = augment.mix_settings(config)
  if settings is None:
    return {'image': batch['image'], 'label': batch['label'],
            'targets': optax.smooth_labels(onehot, config.label_smoothing)}
  group = lambda x: x.reshape((mix_groups, x.shape[0] // mix_groups) + x.shape[1:])
  mix = functools.partial(augment.mix_batch, **settings)
  images, targets = jax.vmap(mix)(jax.random.split(rng, mix_groups), group(batch['image']),
                                  group(onehot))
  targets = targets.reshape((-1, num_classes))
  return {'image': images.reshape(batch['image'].shape), 'targets': targets,
          'label': jnp.argmax(targets, -1).astype(batch['label'].dtype)}


def micro_batches(batch: dict[str, jax.Array], count: int) -> dict[str, jax.Array]:
  """Splits every array (B, ...) into (count, B / count, ...); micro-batch j takes rows j::count.

  Strided rows keep each device's share of every micro-batch on that device.
  """
  def split(x):
    x = x.reshape((x.shape[0] // count, count) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def update_ema(ema: Any, variables: Any, decay: float) -> Any:
  """ema <- decay * ema + (1 - decay) * variables (timm ModelEma, once per optimizer step)."""
  return jax.tree.map(lambda e, v: decay * e + (1.0 - decay) * v.astype(e.dtype), ema, variables)


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    config: ml_collections.ConfigDict, num_classes: int,
                    teacher: Teacher | None = None, mix_groups: int = 1,
                    param_shardings: Any = None) -> Callable[..., tuple[TrainState, dict]]:
  """The (unjitted) train step `(state, batch[, teacher_variables])`: forward, loss, update.

  `param_shardings` (the parameters' `NamedSharding`s, under `jax.jit`) lays out the gradients,
  and their sum over micro-batches, like the parameters: each device reduces only its shard.

  With `grad_accum_steps` = k > 1 the batch is cut into k micro-batches (rows j::k) whose
  gradients are averaged by a `lax.scan` before one optimizer update: the same update as one
  step on the whole batch, except that (i) BatchNorm normalises each micro-batch by its own
  statistics and updates its running averages once per micro-batch, in turn, and (ii) dropout
  and drop-path masks are drawn per micro-batch (from the step's rng folded with j). Mixing is
  done on the whole batch before the split, so it does not depend on k.
  """
  accumulate = config.get('grad_accum_steps', 1)
  ema_decay = config.get('ema_decay', 0.0)

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
      outputs, updates = model.apply(variables, batch['image'], train=True,
                                     rngs={'dropout': dropout_rng}, mutable=mutable)
      if teacher is None:
        loss = classification_loss(outputs, batch['targets'])
      else:
        loss = distillation_loss(outputs, batch['targets'], teacher_logits,
                                 kind=config.distillation.type, alpha=config.distillation.alpha,
                                 tau=config.distillation.tau)
      return loss, (outputs, updates.get('batch_stats', batch_stats))

    (loss, (outputs, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    grads = like_params(grads)
    accuracy = jnp.mean(jnp.argmax(classifier_logits(outputs), -1) == batch['label'])
    return grads, batch_stats, loss, accuracy

  def train_step(state: TrainState, batch: dict[str, jax.Array], teacher_variables: Any = None):
    dropout_rng, mix_rng = jax.random.split(jax.random.fold_in(state.rng, state.step))
    batch = training_batch(mix_rng, batch, config, num_classes, mix_groups)
    if accumulate == 1:
      grads, batch_stats, loss, accuracy = micro_step(state.params, state.batch_stats, batch,
                                                      dropout_rng, teacher_variables)
    else:
      def body(carry, micro):
        grad_sum, batch_stats = carry
        grads, batch_stats, loss, accuracy = micro_step(
            state.params, batch_stats, micro, jax.random.fold_in(dropout_rng, micro['index']),
            teacher_variables)
        grad_sum = jax.tree.map(lambda s, g: s + g.astype(s.dtype), grad_sum, grads)
        return (grad_sum, batch_stats), (loss, accuracy)

      micros = {**micro_batches(batch, accumulate), 'index': jnp.arange(accumulate)}
      zeros = like_params(jax.tree.map(jnp.zeros_like, state.params))
      (grad_sum, batch_stats), (losses, accuracies) = jax.lax.scan(
          body, (zeros, state.batch_stats), micros)
      grads = jax.tree.map(lambda g: g / accumulate, grad_sum)
      loss, accuracy = jnp.mean(losses), jnp.mean(accuracies)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {'loss': loss, 'accuracy': accuracy, 'grad_norm': optax.global_norm(grads)}
    ema = state.ema
    if ema_decay:
      ema = update_ema(ema, {'params': params, 'batch_stats': batch_stats}, ema_decay)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                              batch_stats=batch_stats, ema=ema)
    return new_state, metrics

  return train_step


def sharded_train_step(model: nn.Module, tx: optax.GradientTransformation,
                       config: ml_collections.ConfigDict, num_classes: int, mesh: Mesh,
                       state_sharding: Any, teacher: Teacher | None = None,
                       teacher_sharding: Any = None) -> Callable[..., tuple[TrainState, dict]]:
  """`make_train_step` jitted for `mesh`: the state (donated) and the teacher's variables in
  their layouts, the batch over every device, metrics replicated.

  Mixup/CutMix pairs and draws λ within each device's share of the batch.
  """
  step = make_train_step(model, tx, config, num_classes, teacher, mix_groups=mesh.size,
                         param_shardings=state_sharding.params)
  return jax.jit(step, in_shardings=(state_sharding, sharding.batch_sharding(mesh),
                                     teacher_sharding),
                 out_shardings=(state_sharding, sharding.replicated(mesh)), donate_argnums=0)


def make_eval_step(model: nn.Module, num_classes: int
                   ) -> Callable[[TrainState, dict[str, jax.Array]], dict[str, jax.Array]]:
  """The (unjitted) eval step: sums of correct predictions, loss and real examples."""
  def eval_step(state: TrainState, batch: dict[str, jax.Array]):
    variables = {'params': state.params}
    if state.batch_stats:
      variables['batch_stats'] = state.batch_stats
    logits = model.apply(variables, batch['image'], train=False).astype(jnp.float32)
    mask = batch['mask']
    loss = optax.softmax_cross_entropy(logits, jax.nn.one_hot(batch['label'], num_classes))
    return {'correct': jnp.sum((jnp.argmax(logits, -1) == batch['label']) * mask),
            'loss': jnp.sum(loss * mask), 'count': jnp.sum(mask)}

  return eval_step


def init_state(model: nn.Module, tx: optax.GradientTransformation,
               config: ml_collections.ConfigDict) -> TrainState:
  """A fresh training state: parameters initialised from `config.seed`."""
  params_rng, train_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  images = jnp.zeros((1, config.image_size, config.image_size, 3), jnp.float32)
  variables = model.init({'params': params_rng}, images, train=False)
  params = variables['params']
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                     batch_stats=variables.get('batch_stats', {}), rng=train_rng)
  return with_fresh_ema(state, config)


def with_fresh_ema(state: TrainState, config: ml_collections.ConfigDict) -> TrainState:
  """The state with its EMA restarted from the current variables (none if `ema_decay` is 0)."""
  if not config.get('ema_decay', 0.0):
    return state.replace(ema={})
  copy = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)
  return state.replace(ema={'params': copy(state.params), 'batch_stats': copy(state.batch_stats)})


def global_batch(batch: dict[str, np.ndarray],
                 data_sharding: NamedSharding) -> dict[str, jax.Array]:
  """Assembles one global array per key from this process's share of the batch."""
  return {k: jax.make_array_from_process_local_data(data_sharding, v) for k, v in batch.items()}


def evaluate(eval_step: Callable, state: TrainState, batches: Iterator[dict[str, np.ndarray]],
             data_sharding: NamedSharding) -> dict[str, float]:
  """Top-1 accuracy and mean loss over every real example of the eval split."""
  totals = {'correct': 0.0, 'loss': 0.0, 'count': 0.0}
  for batch in batches:
    sums = jax.device_get(eval_step(state, global_batch(batch, data_sharding)))
    for k in totals:
      totals[k] += float(sums[k])
  count = max(totals['count'], 1.0)
  return {'accuracy': totals['correct'] / count, 'loss': totals['loss'] / count,
          'count': int(totals['count'])}


def evaluate_with_ema(eval_step: Callable, state: TrainState,
                      batches: Callable[[], Iterator[dict[str, np.ndarray]]],
                      data_sharding: NamedSharding) -> dict[str, float]:
  """`evaluate` of the raw variables, plus `ema_accuracy` and `ema_loss` when there is an EMA."""
  metrics = evaluate(eval_step, state, batches(), data_sharding)
  if state.ema:
    ema = evaluate(eval_step, state.ema_view(), batches(), data_sharding)
    metrics.update({'ema_accuracy': ema['accuracy'], 'ema_loss': ema['loss']})
  return metrics


class SummaryWriter:
  """TensorBoard event files in the work directory; a no-op on every process but 0."""

  def __init__(self, logdir: str, active: bool):
    self._writer = None
    if active:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      self._tf = tf
      self._writer = tf.summary.create_file_writer(logdir)

  def scalars(self, step: int, values: dict[str, float]) -> None:
    if self._writer is None:
      return
    with self._writer.as_default():
      for name, value in values.items():
        self._tf.summary.scalar(name, value, step=step)
    self._writer.flush()


class PreemptionWatcher:
  """Turns SIGTERM and Ctrl-C (SIGINT) into a request to checkpoint and exit at the next step.

  A second Ctrl-C stops at once (KeyboardInterrupt, nothing saved). On several processes only
  SIGTERM is watched, through orbax, which agrees on one step across all of them. A context
  manager: the previous signal handlers come back when the run ends.
  """

  def __init__(self):
    self.requested = False
    self._previous = {}

  def __enter__(self) -> 'PreemptionWatcher':
    if jax.process_count() == 1:
      try:
        for signum in (signal.SIGTERM, signal.SIGINT):
          self._previous[signum] = signal.signal(signum, self._on_signal)
      except ValueError:  # Not the main thread (e.g. in a notebook worker); rely on orbax.
        pass
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def _on_signal(self, signum, frame):
    del frame
    if signum == signal.SIGINT and self.requested:
      raise KeyboardInterrupt
    self.requested = True
    logging.warning('%s: saving a checkpoint after this step, then exiting%s.',
                    signal.Signals(signum).name,
                    ' (Ctrl-C again stops at once)' if signum == signal.SIGINT else '')

  def should_stop(self, manager, step: int) -> bool:
    # On several processes, orbax agrees on one step across all of them.
    return self.requested or manager.reached_preemption(step)


def load_variables(source: str, model: nn.Module, config: ml_collections.ConfigDict,
                   **kwargs) -> dict[str, Any]:
  """`checkpoints.load` of `source` for `model`, stacked into its layout if it scans its layers.

  EMA weights first, unless `config.use_ema` is False.
  """
  kwargs.setdefault('use_ema', config.get('use_ema', True))
  if not getattr(model, 'scan_layers', False):
    return checkpoints.load(source, model, image_size=config.image_size, **kwargs)
  variables = checkpoints.load(source, model.clone(scan_layers=False),
                               image_size=config.image_size, **kwargs)
  images = jnp.zeros((1, config.image_size, config.image_size, 3), jnp.float32)
  return vit.stack_layers(variables, jax.eval_shape(model.init, jax.random.PRNGKey(0), images))


def pretrained_variables(config: ml_collections.ConfigDict, model: nn.Module,
                         workdir: str) -> dict[str, Any] | None:
  """`config.init_from`'s variables for a run that starts afresh; None when unset or resuming.

  The position embedding is resized to `config.image_size`; a head for another class count is
  initialised exactly as `init_state` would. The optimizer state starts fresh.
  """
  if not config.get('init_from'):
    return None
  if checkpoints.has_checkpoint(workdir):
    logging.info('Resuming %s; init_from=%s is not read again.', workdir, config.init_from)
    return None
  params_rng = jax.random.split(jax.random.PRNGKey(config.seed))[0]  # As in init_state.
  variables = load_variables(config.init_from, model, config, reset_head=True, rng=params_rng)
  logging.info('Fine-tuning from %s.', config.init_from)
  return variables


def evaluate_only(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Top-1 on the eval split of `config.init_from`, else of `workdir`'s newest checkpoint.

  Reads the EMA weights where the source kept them (`config.use_ema`). Trains nothing and writes
  nothing but `workdir/eval_report.json`; a class count that differs from the dataset's is an
  error (no head is re-initialised).
  """
  source = config.get('init_from') or workdir
  if not config.get('init_from') and not checkpoints.has_checkpoint(workdir):
    raise ValueError(f'eval_only needs --config.init_from=PATH or a --workdir with a training '
                     f'checkpoint; {workdir!r} has none.')
  info = input_pipeline.get_dataset_info(config)
  model = create_model(config, info.num_classes)
  variables = load_variables(source, model, config)
  mesh = sharding.make_mesh(config.mesh.fsdp)
  variables = sharding.place(
      variables, sharding.fsdp_shardings(variables, mesh, config.mesh.fsdp_min_size))
  state = TrainState(step=jnp.zeros((), jnp.int32), params=variables['params'], opt_state=None,
                     batch_stats=variables.get('batch_stats', {}), rng=None)
  eval_step = jax.jit(make_eval_step(model, info.num_classes),
                      out_shardings=sharding.replicated(mesh))
  metrics = evaluate(eval_step, state, input_pipeline.eval_iterator(config),
                     sharding.batch_sharding(mesh))
  use_ema = config.get('use_ema', True)
  report = {'source': source, 'use_ema': use_ema, 'model': config.model.name,
            'dataset': config.dataset, 'split': config.eval_split,
            'image_size': config.image_size, **metrics}
  if jax.process_index() == 0:
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    (epath.Path(workdir) / 'eval_report.json').write_text(json.dumps(report, indent=2))
    print(f'Top-1 on {config.dataset}/{config.eval_split}: {metrics["accuracy"]:.4f} '
          f'({metrics["count"]} examples; {"EMA weights where kept" if use_ema else "raw weights"} '
          f'of {source}).')
  return report


def run_evaluators(evaluators: dict[str, Any], model: nn.Module, state: TrainState,
                   config: ml_collections.ConfigDict) -> dict[str, float]:
  """The metrics of `evaluators` (`vit_jax.evaluators`) on the state's frozen variables."""
  variables = {'params': state.params}
  if state.batch_stats:
    variables['batch_stats'] = state.batch_stats
  variables = multihost_utils.process_allgather(variables, tiled=True)  # Host arrays, any mesh.
  metrics = {}
  for name, evaluator in evaluators.items():
    metrics.update(evaluator.run(model, variables, config))
    logging.info('step %d  %s: %s', int(state.step), name,
                 ', '.join(f'{k} {v:.4g}' for k, v in metrics.items() if k.startswith(name)))
  return metrics


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains `config`'s model in `workdir`, resuming from its newest checkpoint; returns metrics.

  Returns {'preempted_at_step': step} instead when SIGTERM or Ctrl-C stopped it after saving.
  The work directory's lock and the signal handlers are held until it returns.
  """
  with contextlib.ExitStack() as run_scope:
    return _train_and_evaluate(config, workdir, run_scope)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                        run_scope: contextlib.ExitStack) -> dict[str, float]:
  """`train_and_evaluate`; what the run holds (lock, signal handlers) enters `run_scope`."""
  # 1. Everything that can be wrong is checked before anything compiles or is written.
  config_lib.validate(config)
  if config.get('eval_only'):
    return evaluate_only(config, workdir)
  info = input_pipeline.get_dataset_info(config)
  model = create_model(config, info.num_classes)
  pretrained = pretrained_variables(config, model, workdir)
  total_steps, warmup_steps = training_steps(config, info.num_train_examples)
  schedule = learning_rate_schedule(config, total_steps, warmup_steps)
  tx = create_optimizer(config, schedule)
  abstract_state = jax.eval_shape(lambda: init_state(model, tx, config))
  checkpoints.check_compatible(workdir, config.model.name, abstract_state.params)
  teacher = load_teacher(config, info.num_classes)
  evaluators = evaluators_lib.periodic(config)
  if jax.process_count() > 1:  # Every process reads the work directory before any writes to it.
    multihost_utils.sync_global_devices('vit_jax.train:checked_workdir')

  is_main = jax.process_index() == 0
  workdir_lib.hold(workdir, run_scope)  # Before the first write; creates the directory.
  watcher = run_scope.enter_context(PreemptionWatcher())
  if is_main:
    (epath.Path(workdir) / 'config.json').write_text(config.to_json_best_effort(indent=2))
  logging.info('Model %s: %s parameters; %d classes; %d train / %d eval examples; %d steps.',
               config.model.name,
               f'{sum(np.prod(x.shape) for x in jax.tree.leaves(abstract_state.params)):,}',
               info.num_classes, info.num_train_examples, info.num_eval_examples, total_steps)

  # 2. Devices, state and steps.
  mesh = sharding.make_mesh(config.mesh.fsdp)
  data_sharding = sharding.batch_sharding(mesh)
  # One rule places the student's and the teacher's variables alike.
  variable_sharding = lambda tree: sharding.fsdp_shardings(tree, mesh, config.mesh.fsdp_min_size)
  state_sharding = variable_sharding(abstract_state)
  manager = checkpoints.checkpoint_manager(workdir, keep=config.keep_checkpoints)
  # Saved on any mesh; restored onto this one's layout.
  state = checkpoints.restore_newest_readable(workdir, manager,
                                              sharding.abstract(abstract_state, state_sharding))
  if state is not None:
    logging.info('Resumed from step %d of %s.', int(state.step), workdir)
  else:
    state = jax.jit(lambda: init_state(model, tx, config), out_shardings=state_sharding)()
    if pretrained is not None:
      state = state.replace(
          params=sharding.place(pretrained['params'], state_sharding.params),
          batch_stats=sharding.place(pretrained.get('batch_stats', {}),
                                     state_sharding.batch_stats))
      state = jax.jit(lambda s: with_fresh_ema(s, config), out_shardings=state_sharding)(state)
  teacher_variables = teacher_sharding = None
  if teacher is not None:
    teacher_sharding = variable_sharding(teacher.variables)
    teacher_variables = sharding.place(teacher.variables, teacher_sharding)
  logging.info('Mesh %s; per device: %.1f MiB of parameters, %.1f MiB of training state.',
               dict(mesh.shape),
               sharding.bytes_per_device(abstract_state.params, state_sharding.params) / 2**20,
               sharding.bytes_per_device(abstract_state, state_sharding) / 2**20)

  train_step = sharded_train_step(model, tx, config, info.num_classes, mesh, state_sharding,
                                  teacher, teacher_sharding)
  eval_step = jax.jit(make_eval_step(model, info.num_classes),
                      out_shardings=sharding.replicated(mesh))
  eval_batches = lambda: input_pipeline.eval_iterator(config)

  # 3. The loop.
  writer = SummaryWriter(workdir, active=is_main)
  start_step = int(state.step)
  train_batches = input_pipeline.train_iterator(config, start_step=start_step)
  pending, last_saved = [], start_step
  window_start, window_step = time.time(), start_step
  eval_metrics, frozen_metrics = {}, {}
  for step in range(start_step + 1, total_steps + 1):
    batch = global_batch(next(train_batches), data_sharding)
    state, metrics = train_step(state, batch, teacher_variables)
    pending.append(metrics)

    at_log = step % config.log_every == 0 or step == total_steps
    at_ckpt = step % config.checkpoint_every == 0 or step == total_steps
    stop = watcher.should_stop(manager, step)
    if at_log or at_ckpt or stop:
      fetched = jax.device_get(pending)
      pending = []
      losses = np.array([m['loss'] for m in fetched])
      if not np.all(np.isfinite(losses)):
        raise FloatingPointError(
            f'The training loss became {losses[~np.isfinite(losses)][0]} at or before step {step}; '
            'stopping without saving. '
            + (f'The last good checkpoint (step {last_saved}) is kept in {workdir}. '
               if last_saved else 'No checkpoint had been saved yet. ')
            + 'Lower base_lr, enable grad_clip_norm, or check the data.')
      if at_log:
        elapsed = time.time() - window_start
        images_per_s = (step - window_step) * config.batch_size / max(elapsed, 1e-9)
        eta = (total_steps - step) * elapsed / max(step - window_step, 1)
        summary = {'train/loss': float(np.mean(losses)),
                   'train/accuracy': float(np.mean([m['accuracy'] for m in fetched])),
                   'train/grad_norm': float(fetched[-1]['grad_norm']),
                   'train/lr': float(schedule(step - 1)), 'train/images_per_s': images_per_s}
        writer.scalars(step, summary)
        logging.info('step %d/%d  loss %.4f  acc %.3f  lr %.2e  %.0f img/s  ETA %s', step,
                     total_steps, summary['train/loss'], summary['train/accuracy'],
                     summary['train/lr'], images_per_s, time.strftime('%H:%M:%S', time.gmtime(eta)))
        window_start, window_step = time.time(), step

    if at_ckpt or stop:
      checkpoints.save(manager, step, state, model_name=config.model.name, force=True)
      last_saved = step
    if stop:
      manager.wait_until_finished()
      logging.warning('Preemption requested: saved step %d to %s; exiting. Rerun the same '
                      'command to resume.', step, workdir)
      return {'preempted_at_step': step}
    due = evaluators_lib.due(evaluators, step, total_steps)
    if due:
      latest = run_evaluators(due, model, state, config)
      frozen_metrics.update(latest)
      writer.scalars(step, latest)
    if step % config.eval_every == 0 and step != total_steps:
      eval_metrics = evaluate_with_ema(eval_step, state, eval_batches, data_sharding)
      writer.scalars(step, {f'eval/{k}': v for k, v in eval_metrics.items()})
      logging.info('step %d  test accuracy %.4f  test loss %.4f%s', step,
                   eval_metrics['accuracy'], eval_metrics['loss'], _ema_note(eval_metrics))

  manager.wait_until_finished()
  eval_metrics = evaluate_with_ema(eval_step, state, eval_batches, data_sharding)
  writer.scalars(total_steps, {f'eval/{k}': v for k, v in eval_metrics.items()})
  if is_main:
    results = {'step': total_steps, **{f'test_{k}': v for k, v in eval_metrics.items()},
               **frozen_metrics}
    (epath.Path(workdir) / 'results.json').write_text(json.dumps(results))
  logging.info('Final test accuracy: %.4f (%d examples, step %d)%s.', eval_metrics['accuracy'],
               eval_metrics['count'], total_steps, _ema_note(eval_metrics))
  return eval_metrics


def _ema_note(metrics: dict[str, float]) -> str:
  return f'; EMA accuracy {metrics["ema_accuracy"]:.4f}' if 'ema_accuracy' in metrics else ''
