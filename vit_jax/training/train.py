"""The training loop: from a config to a trained, checkpointed and evaluated model.

The loop asks the owners instead of restating them: `vit_jax.config` for the model,
`vit_jax.training.optim` for the schedule and the optimizer, `vit_jax.training.steps` for the state and the jitted
train and eval steps, `vit_jax.training.teacher` for distillation's teacher, `vit_jax.weights.pretrained` for
`init_from`'s weights, `vit_jax.data.input_pipeline` for batches and `vit_jax.training.workdir` for the run's
directory and saved state.

Every process runs the same program. A (data × fsdp) device mesh spans every device of every
process (`vit_jax.parallel.sharding`): batches are split over all of it, and the training state over its
`fsdp` axis (`config.mesh.fsdp`; 1 replicates it, as plain data parallelism does). Each process
feeds only its own share of the data. Process 0 alone logs and writes summaries.
"""

import contextlib
import dataclasses
import math
import signal
import time
from typing import Any, Callable, Iterator

from absl import logging
from clu import metric_writers
from clu import periodic_actions
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from vit_jax import config as config_lib
from vit_jax.evaluators import eval_sets as eval_sets_lib
from vit_jax import evaluators as evaluators_lib
from vit_jax.data import input_pipeline
from vit_jax.training import memory
from vit_jax.training import optim
from vit_jax.weights import pretrained as pretrained_lib
from vit_jax.training import resume as resume_lib
from vit_jax.parallel import sharding
from vit_jax.training import steps
from vit_jax.training import teacher as teacher_lib
from vit_jax.training import workdir as workdir_lib


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

  def should_stop(self, run_dir: workdir_lib.Workdir, step: int) -> bool:
    # On several processes, orbax agrees on one step across all of them.
    return self.requested or run_dir.reached_preemption(step)


def pretrained_variables(config: ml_collections.ConfigDict, model: nn.Module,
                         workdir: str) -> dict[str, Any] | None:
  """`config.init_from`'s variables for a run that starts afresh; None when unset or resuming.

  The position embedding is resized to `config.image_size`; a head for another class count is
  initialised exactly as `steps.init_state` would. The optimizer state starts fresh.
  """
  if not config.init_from:
    return None
  if workdir_lib.Workdir(workdir).has_checkpoint():
    logging.info('Resuming %s; init_from=%s is not read again.', workdir, config.init_from)
    return None
  params_rng = jax.random.split(jax.random.PRNGKey(config.seed))[0]  # As in steps.init_state.
  variables = pretrained_lib.load_for_run(config.init_from, model, config, reset_head=True,
                                          rng=params_rng)
  logging.info('Fine-tuning from %s.', config.init_from)
  return variables


@dataclasses.dataclass(frozen=True)
class RunResult:
  """How `train_and_evaluate` ended.

  `metrics`: on the eval split 'accuracy', 'loss', 'count' ('ema_accuracy', 'ema_loss' with an
  EMA), those of each of `config.eval_sets` ('imagenet_v2/accuracy', …) and the evaluators'
  metrics (`fewshot/…`); empty when `preempted` (SIGTERM or Ctrl-C), the
  run having saved `step` to resume from. `step` is None for `eval_only` of a weights file.
  """
  step: int | None
  metrics: dict[str, Any]
  preempted: bool = False


def evaluate_only(config: ml_collections.ConfigDict, workdir: str) -> RunResult:
  """Top-1 on the eval split (and `config.eval_sets`) of `config.init_from`, else of `workdir`'s
  newest checkpoint.

  Reads the EMA weights where the source kept them (`config.use_ema`). Trains nothing and writes
  nothing but `workdir/eval_report.json`; a class count that differs from the dataset's is an
  error (no head is re-initialised).
  """
  source = config.init_from or workdir
  run_dir = workdir_lib.Workdir(workdir)
  if not config.init_from and not run_dir.has_checkpoint():
    raise ValueError(f'eval_only needs --config.init_from=PATH or a --workdir with a training '
                     f'checkpoint; {workdir!r} has none.')
  info = input_pipeline.get_dataset_info(config)
  eval_sets = eval_sets_lib.from_config(config, num_classes=info.num_classes)
  model = config_lib.create_model(config, info.num_classes)
  variables = pretrained_lib.load_for_run(source, model, config)
  mesh = sharding.make_mesh(config.mesh.fsdp)
  variables = sharding.place(
      variables, sharding.fsdp_shardings(variables, mesh, config.mesh.fsdp_min_size))
  state = steps.TrainState(step=jnp.zeros((), jnp.int32), params=variables['params'],
                           opt_state=None, batch_stats=variables.get('batch_stats', {}), rng=None)
  eval_step = jax.jit(steps.make_eval_step(model, info.num_classes),
                      out_shardings=sharding.replicated(mesh))
  metrics = steps.evaluate(eval_step, state, input_pipeline.eval_iterator(config),
                           sharding.batch_sharding(mesh))
  set_metrics = eval_sets_lib.evaluate(
      eval_sets, eval_sets_lib.compile_steps(eval_sets, model, info.num_classes, mesh, eval_step),
      state, config, sharding.batch_sharding(mesh), known={_primary_set(config).reads: metrics})
  use_ema = config.use_ema
  report = {'source': source, 'use_ema': use_ema, 'model': config.model.name,
            'dataset': config.dataset, 'split': config.eval_split,
            'image_size': config.image_size, **metrics, **set_metrics}
  run_dir.write_json('eval_report.json', report)
  if jax.process_index() == 0:
    weights = f'{"EMA weights where kept" if use_ema else "raw weights"} of {source}'
    print(f'Top-1 on {config.dataset}/{config.eval_split}: {metrics["accuracy"]:.4f} '
          f'({metrics["count"]} examples; {weights}).')
    for eval_set in eval_sets:
      print(f'Top-1 on {eval_set.name}: {set_metrics[f"{eval_set.name}/accuracy"]:.4f} '
            f'({set_metrics[f"{eval_set.name}/count"]} examples scored; {weights}).')
  return RunResult(step=None, metrics={**metrics, **set_metrics})


def _primary_set(config: ml_collections.ConfigDict) -> eval_sets_lib.EvalSet:
  """The run's own eval split as a test set: a listed set that reads it is not read again."""
  return eval_sets_lib.EvalSet(config.eval_split, config.dataset, config.eval_split)


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



class Progress(periodic_actions.ReportProgress):
  """clu's ReportProgress on a clock that stops inside `timed` sections.

  clu divides the steps between two reports by the wall time between them, so an evaluation, a
  checkpoint or the first step's compilation in between would lower steps/s and raise the ETA;
  here their time is left out. `steps_per_s` is the rate of the latest report.
  """

  def __init__(self, *, num_train_steps: int, writer: metric_writers.MetricWriter,
               every_steps: int):
    super().__init__(num_train_steps=num_train_steps, writer=writer, every_steps=every_steps,
                     every_secs=None)
    self.steps_per_s = math.nan

  def __call__(self, step: int, t: float | None = None) -> bool:
    t = time.monotonic() if t is None else t
    return super().__call__(step, t - sum(self._time_per_part.values()))

  def _apply(self, step: int, t: float) -> None:
    self.steps_per_s = (step - self._previous_step) / max(t - self._previous_time, 1e-9)
    super()._apply(step, t)

  @contextlib.contextmanager
  def timed(self, name: str, after: Any = None) -> Iterator[None]:
    """Times the block as `name` once `after` (the training state) is computed: the steps
    dispatched before the block are training time, not the section's."""
    jax.block_until_ready(after)
    with super().timed(name, wait_jax_async_dispatch=False):
      yield


@dataclasses.dataclass
class _Run:
  """What the loop works with: built once by `_start`, before the first step."""
  model: nn.Module
  schedule: optax.Schedule
  total_steps: int
  state: steps.TrainState
  train_step: Callable[..., tuple[steps.TrainState, dict[str, jax.Array]]]
  eval_step: Callable[..., dict[str, jax.Array]]
  eval_sets: tuple[eval_sets_lib.EvalSet, ...]
  eval_set_steps: dict[str, Callable[..., dict[str, jax.Array]]]  # By scoring.
  data_sharding: NamedSharding
  teacher_variables: Any
  run_dir: workdir_lib.Workdir
  evaluators: dict[str, Any]
  watcher: PreemptionWatcher
  writer: metric_writers.MetricWriter


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> RunResult:
  """Trains `config`'s model in `workdir`, resuming from its newest checkpoint, and evaluates it.

  With `config.eval_only` it only evaluates (`evaluate_only`). The work directory's lock and the
  signal handlers are held until it returns.
  """
  config_lib.validate(config)
  workdir_lib.check_path(workdir)
  if config.eval_only:
    return evaluate_only(config, workdir)
  with contextlib.ExitStack() as run_scope:
    return _loop(_start(config, workdir, run_scope), config, workdir)


def _start(config: ml_collections.ConfigDict, workdir: str,
           run_scope: contextlib.ExitStack) -> _Run:
  """Checks everything that can be wrong before anything compiles or is written, then holds the
  work directory (in `run_scope`) and builds the state, on the mesh, and the steps."""
  info = input_pipeline.get_dataset_info(config)
  model = config_lib.create_model(config, info.num_classes)
  pretrained = pretrained_variables(config, model, workdir)
  total_steps, warmup_steps = optim.training_steps(config, info.num_train_examples)
  schedule = optim.learning_rate_schedule(config, total_steps, warmup_steps)
  tx = optim.create_optimizer(config, schedule, model)
  abstract_state = jax.eval_shape(lambda: steps.init_state(model, tx, config))
  resume_plan = resume_lib.plan(  # Refuses a checkpoint this config cannot take, touching nothing.
      workdir_lib.Workdir(workdir), config, abstract_state, lambda c: jax.eval_shape(
          lambda: steps.init_state(model, optim.create_optimizer(c, schedule, model), c)))
  teacher = teacher_lib.load(config, info.num_classes)
  evaluators = evaluators_lib.periodic(config)
  eval_sets = eval_sets_lib.from_config(config, num_classes=info.num_classes)
  if jax.process_count() > 1:  # Every process reads the work directory before any writes to it.
    multihost_utils.sync_global_devices('vit_jax.training.train:checked_workdir')

  mesh = sharding.make_mesh(config.mesh.fsdp)
  # One rule places the student's and the teacher's variables alike.
  layout = lambda tree: sharding.fsdp_shardings(tree, mesh, config.mesh.fsdp_min_size)
  state_sharding = layout(abstract_state)
  teacher_sharding = None if teacher is None else layout(teacher.variables)
  train_step = steps.sharded_train_step(model, tx, config, info.num_classes, mesh,
                                        state_sharding, teacher, teacher_sharding)
  # Memory (issue 29): a step that cannot fit is refused before the work directory is touched.
  memory.check_fits(train_step, sharding.abstract(abstract_state, state_sharding), config,
                    sharding.batch_sharding(mesh), teacher and sharding.abstract(
                        teacher.variables, teacher_sharding))

  run_dir = workdir_lib.Workdir.create(workdir, config, run_scope)  # Locked; config.json written.
  watcher = run_scope.enter_context(PreemptionWatcher())
  with workdir_lib.writing(workdir, workdir_lib.ROOM):
    writer = metric_writers.create_default_writer(workdir, just_logging=jax.process_index() > 0)
  run_scope.callback(writer.close)
  logging.debug('Model %s: %s parameters; %d classes; %d train / %d eval examples; %d steps.',
                config.model.name,
                f'{sum(np.prod(x.shape) for x in jax.tree.leaves(abstract_state.params)):,}',
                info.num_classes, info.num_train_examples, info.num_eval_examples, total_steps)

  saved_like = None
  if resume_plan is not None:  # The checkpoint's layout: this config's, or the saved config's.
    saved_tx = optim.create_optimizer(resume_plan.saved_config, schedule, model)
    saved_abstract = jax.eval_shape(
        lambda: steps.init_state(model, saved_tx, resume_plan.saved_config))
    saved_like = sharding.abstract(saved_abstract, layout(saved_abstract))
  state = _restore_or_init(run_dir, lambda: steps.init_state(model, tx, config),
                           state_sharding, pretrained, config, saved_like)
  teacher_variables = None
  if teacher is not None:
    teacher_variables = sharding.place(teacher.variables, teacher_sharding)
  logging.debug('Mesh %s; per device: %.1f MiB of parameters, %.1f MiB of training state.',
                dict(mesh.shape),
                sharding.bytes_per_device(abstract_state.params, state_sharding.params) / 2**20,
                sharding.bytes_per_device(abstract_state, state_sharding) / 2**20)
  eval_step = jax.jit(steps.make_eval_step(model, info.num_classes),
                      out_shardings=sharding.replicated(mesh))
  return _Run(
      model=model, schedule=schedule, total_steps=total_steps, state=state,
      train_step=train_step,
      eval_step=eval_step, eval_sets=eval_sets,
      eval_set_steps=eval_sets_lib.compile_steps(eval_sets, model, info.num_classes, mesh,
                                                 eval_step),
      data_sharding=sharding.batch_sharding(mesh), teacher_variables=teacher_variables,
      run_dir=run_dir, evaluators=evaluators, watcher=watcher, writer=writer)


def _restore_or_init(run_dir: workdir_lib.Workdir, init: Callable[[], steps.TrainState],
                     state_sharding: Any, pretrained: dict[str, Any] | None,
                     config: ml_collections.ConfigDict, saved_like: Any = None
                     ) -> steps.TrainState:
  """The newest readable checkpoint of `workdir` (saved on any mesh, read as the abstract state
  `saved_like` where its config differs in state that carries over) in `state_sharding`'s layout;
  else a fresh state, with `pretrained`'s variables when fine-tuning."""
  abstract = sharding.abstract(jax.eval_shape(init), state_sharding)
  state = run_dir.resume(abstract if saved_like is None else saved_like)
  if state is not None:
    if saved_like is not None and (workdir_lib.flat_shapes(saved_like)
                                   != workdir_lib.flat_shapes(abstract)):
      state = resume_lib.carry_over(state, config, abstract, state_sharding)
    logging.debug('Resumed from step %d of %s.', int(state.step), run_dir.path)
    return state
  state = jax.jit(init, out_shardings=state_sharding)()
  if pretrained is None:
    return state
  state = state.replace(
      params=sharding.place(pretrained['params'], state_sharding.params),
      batch_stats=sharding.place(pretrained.get('batch_stats', {}), state_sharding.batch_stats))
  return jax.jit(lambda s: steps.with_fresh_ema(s, config), out_shardings=state_sharding)(state)


def _loop(run: _Run, config: ml_collections.ConfigDict, workdir: str) -> RunResult:
  """Steps from the state's step to the last, logging, checkpointing and evaluating on the way;
  then evaluates the final state and writes `results.json`."""
  progress = Progress(num_train_steps=run.total_steps, writer=run.writer,
                      every_steps=config.log_every)
  state, start_step = run.state, int(run.state.step)
  train_batches = input_pipeline.train_iterator(config, start_step=start_step)
  pending, last_saved, frozen_metrics = [], start_step, {}
  for step in range(start_step + 1, run.total_steps + 1):
    batch = steps.global_batch(next(train_batches), run.data_sharding)
    if step == start_step + 1:  # Compiles the step: not training time.
      with progress.timed('compile', state):
        state, metrics = jax.block_until_ready(
            run.train_step(state, batch, run.teacher_variables))
    else:
      state, metrics = run.train_step(state, batch, run.teacher_variables)
    pending.append(metrics)
    at_log = step % config.log_every == 0 or step == run.total_steps
    at_ckpt = step % config.checkpoint_every == 0 or step == run.total_steps
    stop = run.watcher.should_stop(run.run_dir, step)
    if at_log or at_ckpt or stop:
      fetched, pending = _finite(jax.device_get(pending), step, last_saved, workdir), []
    progress(step)
    if at_log:
      _log_progress(run, progress, fetched, step, config.batch_size)
    if at_ckpt or stop:
      with progress.timed('checkpoint', state):
        run.run_dir.save(step, state, model_name=config.model.name)
      last_saved = step
      logging.info('step %d  saved checkpoint %s', step,
                   run.run_dir.file(workdir_lib.CHECKPOINT_DIR) / str(step))
    if stop:
      run.run_dir.wait_until_finished()
      logging.warning('Preemption requested: saved step %d to %s; exiting. Rerun the same '
                      'command to resume.', step, workdir)
      return RunResult(step=step, metrics={}, preempted=True)
    due = evaluators_lib.due(run.evaluators, step, run.total_steps)
    if due:
      with progress.timed('evaluators', state):
        latest = run_evaluators(due, run.model, state, config)
      frozen_metrics.update(latest)
      run.writer.write_scalars(step, latest)
    if step % config.eval_every == 0 and step != run.total_steps:
      with progress.timed('eval', state):
        _evaluate(run, state, config, step)

  run.run_dir.wait_until_finished()
  eval_metrics, set_metrics = _evaluate(run, state, config, run.total_steps, final=True)
  run.run_dir.write_results({'step': run.total_steps,
                             **{f'test_{k}': v for k, v in eval_metrics.items()},
                             **set_metrics, **frozen_metrics})
  run.writer.flush()
  return RunResult(step=run.total_steps,
                   metrics={**eval_metrics, **set_metrics, **frozen_metrics})


def _finite(fetched: list[dict[str, np.ndarray]], step: int, last_saved: int,
            workdir: str) -> list[dict[str, np.ndarray]]:
  """`fetched` (the steps' metrics since the last fetch); raises if a loss is not finite."""
  losses = np.array([m['loss'] for m in fetched])
  if not np.all(np.isfinite(losses)):
    raise FloatingPointError(
        f'The training loss became {losses[~np.isfinite(losses)][0]} at or before step {step}; '
        'stopping without saving. '
        + (f'The last good checkpoint (step {last_saved}) is kept in {workdir}. '
           if last_saved else 'No checkpoint had been saved yet. ')
        + 'Lower base_lr, enable grad_clip_norm, or check the data.')
  return fetched


def _log_progress(run: _Run, progress: Progress, fetched: list[dict[str, np.ndarray]],
                  step: int, batch_size: int) -> None:
  """Writes the training summaries of the steps in `fetched` and logs the progress line."""
  images_per_s = progress.steps_per_s * batch_size
  summary = {'train/loss': float(np.mean([m['loss'] for m in fetched])),
             'train/accuracy': float(np.mean([m['accuracy'] for m in fetched])),
             'train/grad_norm': float(fetched[-1]['grad_norm']),
             'train/lr': float(run.schedule(step - 1))}
  if math.isfinite(images_per_s):
    summary['train/images_per_s'] = images_per_s
  run.writer.write_scalars(step, summary)
  speed = ''
  if math.isfinite(images_per_s):
    eta = (run.total_steps - step) / progress.steps_per_s
    speed = f'  {images_per_s:.0f} img/s  ETA {time.strftime("%H:%M:%S", time.gmtime(eta))}'
  logging.info('step %d/%d  loss %.4f  acc %.3f  lr %.2e%s', step, run.total_steps,
               summary['train/loss'], summary['train/accuracy'], summary['train/lr'], speed)


def _evaluate(run: _Run, state: steps.TrainState, config: ml_collections.ConfigDict, step: int,
              final: bool = False) -> tuple[dict[str, float], dict[str, float]]:
  """Top-1 and loss on the eval split (and of the EMA), and those of each of `config.eval_sets`
  ('NAME/accuracy', ...), written and logged."""
  metrics = steps.evaluate_with_ema(run.eval_step, state,
                                    lambda: input_pipeline.eval_iterator(config),
                                    run.data_sharding)
  set_metrics = eval_sets_lib.evaluate(run.eval_sets, run.eval_set_steps, state, config,
                                       run.data_sharding,
                                       known={_primary_set(config).reads: metrics})
  run.writer.write_scalars(step, {f'eval/{k}': v for k, v in {**metrics, **set_metrics}.items()})
  ema_note = lambda m, prefix='': (f'; EMA accuracy {m[prefix + "ema_accuracy"]:.4f}'
                                   if prefix + 'ema_accuracy' in m else '')
  if final:
    logging.info('Final test accuracy: %.4f (%d examples, step %d)%s.', metrics['accuracy'],
                 metrics['count'], step, ema_note(metrics))
  else:
    logging.info('step %d  test accuracy %.4f  test loss %.4f%s', step, metrics['accuracy'],
                 metrics['loss'], ema_note(metrics))
  for eval_set in run.eval_sets:
    prefix = f'{eval_set.name}/'
    logging.info('step %d  %s accuracy %.4f (%d examples scored)%s', step, eval_set.name,
                 set_metrics[prefix + 'accuracy'], set_metrics[prefix + 'count'],
                 ema_note(set_metrics, prefix))
  return metrics, set_metrics
