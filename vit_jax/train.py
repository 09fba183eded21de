"""The training loop: from a config to a trained, checkpointed and evaluated model.

The loop asks the owners instead of restating them: `vit_jax.optim` for the schedule and the
optimizer, `vit_jax.steps` for the state and the jitted train and eval steps,
`vit_jax.input_pipeline` for batches and `vit_jax.checkpoints` for the run's saved state.

Every process runs the same program. A (data × fsdp) device mesh spans every device of every
process (`vit_jax.sharding`): batches are split over all of it, and the training state over its
`fsdp` axis (`config.mesh.fsdp`; 1 replicates it, as plain data parallelism does). Each process
feeds only its own share of the data. Process 0 alone logs and writes summaries.
"""

import contextlib
import json
import os
import signal
import time
from typing import Any

from absl import logging
from etils import epath
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from vit_jax import checkpoints
from vit_jax import config as config_lib
from vit_jax import evaluators as evaluators_lib
from vit_jax import input_pipeline
from vit_jax import models
from vit_jax import optim
from vit_jax import sharding
from vit_jax import steps
from vit_jax import workdir as workdir_lib
from vit_jax.models import vit


def create_model(config: ml_collections.ConfigDict, num_classes: int) -> nn.Module:
  """The registered model `config.model.name` with the config's overrides.

  `config.dtype` is the compute dtype of every model ('bfloat16': mixed precision with float32
  parameters, softmax, norms and loss); a `model.dtype` override takes precedence.
  """
  overrides = {k: v for k, v in config.model.items() if k != 'name'}
  overrides.setdefault('dtype', config.get('dtype', 'float32'))
  return models.create(config.model.name, num_classes=num_classes, **overrides)


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


def load_teacher(config: ml_collections.ConfigDict, num_classes: int) -> steps.Teacher | None:
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
  return steps.Teacher(model, variables, *(change or (None, None)))


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
  initialised exactly as `steps.init_state` would. The optimizer state starts fresh.
  """
  if not config.get('init_from'):
    return None
  if checkpoints.has_checkpoint(workdir):
    logging.info('Resuming %s; init_from=%s is not read again.', workdir, config.init_from)
    return None
  params_rng = jax.random.split(jax.random.PRNGKey(config.seed))[0]  # As in steps.init_state.
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
  state = steps.TrainState(step=jnp.zeros((), jnp.int32), params=variables['params'], opt_state=None,
                     batch_stats=variables.get('batch_stats', {}), rng=None)
  eval_step = jax.jit(steps.make_eval_step(model, info.num_classes),
                      out_shardings=sharding.replicated(mesh))
  metrics = steps.evaluate(eval_step, state, input_pipeline.eval_iterator(config),
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


def run_evaluators(evaluators: dict[str, Any], model: nn.Module, state: steps.TrainState,
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
  total_steps, warmup_steps = optim.training_steps(config, info.num_train_examples)
  schedule = optim.learning_rate_schedule(config, total_steps, warmup_steps)
  tx = optim.create_optimizer(config, schedule)
  abstract_state = jax.eval_shape(lambda: steps.init_state(model, tx, config))
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
    state = jax.jit(lambda: steps.init_state(model, tx, config), out_shardings=state_sharding)()
    if pretrained is not None:
      state = state.replace(
          params=sharding.place(pretrained['params'], state_sharding.params),
          batch_stats=sharding.place(pretrained.get('batch_stats', {}),
                                     state_sharding.batch_stats))
      state = jax.jit(lambda s: steps.with_fresh_ema(s, config), out_shardings=state_sharding)(state)
  teacher_variables = teacher_sharding = None
  if teacher is not None:
    teacher_sharding = variable_sharding(teacher.variables)
    teacher_variables = sharding.place(teacher.variables, teacher_sharding)
  logging.info('Mesh %s; per device: %.1f MiB of parameters, %.1f MiB of training state.',
               dict(mesh.shape),
               sharding.bytes_per_device(abstract_state.params, state_sharding.params) / 2**20,
               sharding.bytes_per_device(abstract_state, state_sharding) / 2**20)

  train_step = steps.sharded_train_step(model, tx, config, info.num_classes, mesh, state_sharding,
                                  teacher, teacher_sharding)
  eval_step = jax.jit(steps.make_eval_step(model, info.num_classes),
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
    batch = steps.global_batch(next(train_batches), data_sharding)
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
      eval_metrics = steps.evaluate_with_ema(eval_step, state, eval_batches, data_sharding)
      writer.scalars(step, {f'eval/{k}': v for k, v in eval_metrics.items()})
      logging.info('step %d  test accuracy %.4f  test loss %.4f%s', step,
                   eval_metrics['accuracy'], eval_metrics['loss'], _ema_note(eval_metrics))

  manager.wait_until_finished()
  eval_metrics = steps.evaluate_with_ema(eval_step, state, eval_batches, data_sharding)
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
