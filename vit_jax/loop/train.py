"""The training loop: from a config to a trained, checkpointed and evaluated model.

Every process runs the same program on a (data × fsdp) mesh of every device
(`vit_jax.parallel.sharding`), feeding only its own share of the data; process 0 alone logs and
writes summaries.
"""

import contextlib
import dataclasses
import math
import os
import time
from typing import Any, Callable, Iterator, Mapping

from absl import logging
from clu import metric_writers
from clu import periodic_actions
import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

from vit_jax.schema import config as config_lib
from vit_jax import evaluators as evaluators_lib
from vit_jax.data import input_pipeline
from vit_jax.evaluators import evaluator
from vit_jax.evaluators import standalone
from vit_jax.models import attention as attention_lib
from vit_jax.parallel import sharding
from vit_jax.training import interruption
from vit_jax.training import memory
from vit_jax.training import optim
from vit_jax.training import resume as resume_lib
from vit_jax.training import run_writer
from vit_jax.loop import setup
from vit_jax.training import start as start_lib
from vit_jax.training import steps
from vit_jax.training import teacher as teacher_lib
from vit_jax.weights import pretrained as pretrained_lib
from vit_jax.schema import setting
from vit_jax.schema import mesh as mesh_settings
from vit_jax.schema import step as step_settings
from vit_jax.schema import optim as optim_settings
from vit_jax.schema import run as run_settings
from vit_jax.workdir import disk_writes
from vit_jax.workdir import run_files
from vit_jax.workdir import shape_diff


def _with_state(settings: run_settings.Settings, clip: bool, ema: bool) -> run_settings.Settings:
  """`settings` with gradient clipping and the EMA on or off (a saved run's layout, `resume`)."""
  optimizer, step = settings.optimizer, settings.step
  if bool(optimizer.grad_clip_norm) != clip:
    optimizer = dataclasses.replace(optimizer, grad_clip_norm=1.0 if clip else 0.0)
  if bool(step.ema_decay) != ema:
    step = dataclasses.replace(step, ema_decay=0.999 if ema else 0.0)
  return dataclasses.replace(settings, optimizer=optimizer, step=step)


@dataclasses.dataclass(frozen=True)
class RunResult:
  """How `train_and_evaluate` ended: the evaluators' `metrics` at `step`, empty when `preempted`
  (`step` then the one saved to resume from; None: nothing new saved, or `eval_only`)."""

  step: int | None
  metrics: dict[str, Any]
  preempted: bool = False


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> RunResult:
  """Trains `config`'s model in `workdir`, resuming from its newest checkpoint, and evaluates it
  (with `config.eval_only`, only evaluates `config.init_from`, else `workdir`'s newest)."""
  # Set-up: everything that can be wrong is found before anything compiles or is written.
  setup.validate(config)
  config = setup.resolved(config)
  workdir = os.path.expanduser(workdir) if workdir else workdir  # The shell leaves '=~/run'.
  run_writer.check_path(workdir)
  settings = setting.build(run_settings.Settings, config)
  run_dir = run_writer.RunWriter(workdir)  # Read-only until `start` takes the lock.
  mesh = sharding.make_mesh(settings.mesh.fsdp)
  if settings.eval_only and not settings.init_from and not run_dir.has_checkpoint():
    raise ValueError(
        f'eval_only needs --config.init_from=PATH or a --workdir with a training '
        f'checkpoint; {workdir!r} has none.'
    )

  # Data.
  info = input_pipeline.get_dataset_info(settings.data)
  # The evaluators the run's evaluations run, in the order they log; what they read is checked
  # now, before anything compiles.
  evaluators = tuple(evaluators_lib.periodic(settings.evaluators, settings).values())
  evaluators_lib.check(
      evaluators, settings.data, num_classes=info.num_classes, class_names=info.class_names
  )

  # Model and optimizer.
  total_steps, warmup_steps = optim.training_steps(settings.schedule, info.num_train_examples)
  schedule = optim.learning_rate_schedule(settings.schedule, total_steps, warmup_steps)
  start = start_lib.for_run(settings, info.num_classes, schedule)
  model, tx = start.model, start.tx
  if settings.eval_only:
    metrics = standalone.evaluate_only(
        evaluators,
        model,
        mesh,
        settings.data,
        source=settings.init_from or run_dir.path,
        use_ema=settings.use_ema,
        model_name=settings.model_name,
        fsdp_min_size=settings.mesh.fsdp_min_size,
        out=run_dir,
    )
    return RunResult(step=None, metrics=metrics)
  abstract_state = jax.eval_shape(start.init)
  planned_attention = attention_lib.plan(model, settings.data.image_size)
  if planned_attention:
    logging.info('%s', attention_lib.describe(planned_attention))
  teacher = (
      None if settings.teacher is None else teacher_lib.load(settings.teacher, info.num_classes)
  )
  logging.debug(
      'Model %s: %s parameters; %d classes; %d train / %d eval examples; %d steps.',
      settings.model_name,
      f'{sum(np.prod(x.shape) for x in jax.tree.leaves(abstract_state.params)):,}',
      info.num_classes,
      info.num_train_examples,
      info.num_eval_examples,
      total_steps,
  )

  # Sharding: the state's and the teacher's layouts on the mesh, and the train step for them.
  programs = Programs.build(
      model,
      tx,
      settings.step,
      info.num_classes,
      mesh,
      abstract_state,
      settings.mesh.fsdp_min_size,
      teacher,
  )
  state_sharding = programs.state_sharding
  teacher_variables = (
      None if teacher is None else sharding.place(teacher.variables, programs.teacher_sharding)
  )
  logging.debug(
      'Mesh %s; per device: %.1f MiB of parameters, %.1f MiB of training state.',
      dict(mesh.shape),
      sharding.bytes_per_device(abstract_state.params, state_sharding.params) / 2**20,
      sharding.bytes_per_device(abstract_state, state_sharding) / 2**20,
  )
  # The state: resumed from the newest checkpoint, else fine-tuned from init_from, else fresh.
  # `plan` refuses, touching nothing and compiling nothing, a work directory in use or a
  # checkpoint this config cannot take.
  resuming = run_dir.has_checkpoint()
  if resuming and run_dir.steps()[-1] > total_steps:
    raise ValueError(
        f'{workdir!r} holds a checkpoint of step {run_dir.steps()[-1]}, past the '
        f'{total_steps} steps this config trains (total_steps, or num_epochs): give at least '
        f'{run_dir.steps()[-1]} to resume it (exactly that to evaluate it), or a new --workdir.'
    )
  abstract_for = lambda clip, ema: jax.eval_shape(
      start_lib.for_run(_with_state(settings, clip, ema), info.num_classes, schedule).init
  )
  plan = resume_lib.plan(run_dir, config_lib.json_fields(config), abstract_state, abstract_for)
  pretrained = None
  if settings.init_from and not resuming:
    pretrained = pretrained_lib.load(
        settings.init_from,
        model,
        image_size=settings.data.image_size,
        use_ema=settings.use_ema,
        reset_head=True,
        rng=start.rngs[0],
    )
    logging.info('Fine-tuning from %s.', settings.init_from)
  elif settings.init_from:
    logging.info('Resuming %s; init_from=%s is not read again.', workdir, settings.init_from)
  # Last, as it compiles the step: a step that cannot fit the devices' memory is refused before
  # the work directory is touched.
  memory.check_fits(
      programs.train_step,
      sharding.abstract(abstract_state, state_sharding),
      settings,
      programs.data_sharding,
      teacher and sharding.abstract(teacher.variables, programs.teacher_sharding),
      schedule,
  )
  if jax.process_count() > 1:  # Every process reads the work directory before any writes to it.
    multihost_utils.sync_global_devices('vit_jax.loop.train:checked_workdir')
  with contextlib.ExitStack() as run_scope:
    run_dir.start(config, run_scope)  # Locked, config.json written, checkpoints kept.
    run_dir.write_dataset(
        dataclasses.asdict(info),
        input_pipeline.eval_images_to_record(settings.data, run_files.RECORDED_EVAL_IMAGES),
    )
    watcher = run_scope.enter_context(PreemptionWatcher())
    if watcher.requested:  # Came while this run set up, inside a sequence that watches.
      logging.debug(
          '%s: stopped before training %s; nothing new to save. Rerun the same command to '
          'resume.',
          interruption.requested(),
          workdir,
      )
      return RunResult(step=None, metrics={}, preempted=True)
    with disk_writes.writing(workdir, run_files.ROOM):
      writer = metric_writers.create_default_writer(workdir, just_logging=jax.process_index() > 0)
    run_scope.callback(writer.close)
    run_scope.callback(_stop_profiling)
    saved = None
    if resuming:  # The saved run's layout (this config's, or the saved config's).
      saved = abstract_state if plan is None else abstract_for(plan.clip, plan.ema)
      saved = sharding.abstract(
          saved, sharding.fsdp_shardings(saved, mesh, settings.mesh.fsdp_min_size)
      )
    state = _restore_or_init(
        run_dir,
        saved,
        start.init,
        abstract_state,
        state_sharding,
        pretrained,
        ema=bool(settings.step.ema_decay),
    )

    # The loop.
    start_step = int(state.step)
    train_batches = input_pipeline.train_iterator(settings.data, start_step=start_step)
    progress = Progress(num_train_steps=total_steps, writer=writer, every_steps=settings.log_every)
    profile = _profiler(workdir, settings.profile_steps, start_step, total_steps)
    pending = []
    for step in range(start_step + 1, total_steps + 1):
      batch = sharding.global_batch(next(train_batches), programs.data_sharding)
      if step == start_step + 1:  # Compiles the step: not training time.
        with progress.timed('compile', state):
          state, metrics = jax.block_until_ready(
              programs.train_step(state, batch, teacher_variables, schedule)
          )
      else:
        state, metrics = programs.train_step(state, batch, teacher_variables, schedule)
      if profile is not None:
        profile(step)
      pending.append(metrics)
      at_log = step % settings.log_every == 0 or step == total_steps
      at_ckpt = step % settings.checkpoint_every == 0 or step == total_steps
      stop = watcher.should_stop(run_dir, step)
      if at_log or at_ckpt or stop:
        fetched, pending = _finite(jax.device_get(pending), step, run_dir), []
      progress(step)
      if at_log:
        _log_progress(
            writer, progress, fetched, step, total_steps, schedule, settings.data.batch_size
        )
      if at_ckpt or stop:
        with progress.timed('checkpoint', state):
          run_dir.save(step, state, model_name=settings.model_name)
        logging.info(
            'step %d  saving checkpoint %s',
            step,
            run_dir.file(run_files.CHECKPOINT_DIR) / str(step),
        )
      if stop:
        run_dir.wait_until_finished()
        logging.warning(
            'Preemption requested: saved step %d to %s; exiting. Rerun the same '
            'command to resume.',
            step,
            workdir,
        )
        return RunResult(step=step, metrics={}, preempted=True)
      due = evaluators_lib.due(evaluators, step)
      if due and step != total_steps:
        with progress.timed('eval', state):
          subject = evaluator.Subject(model, settings.data, state=state, mesh=mesh)
          scores = evaluators_lib.run(due, subject, step)
        writer.write_scalars(step, scores.summaries())

    # The final evaluation: every evaluator; a signal now stops it, the last step being saved.
    run_dir.wait_until_finished()
    try:
      with _final_evaluation_stops_at_once(total_steps):
        subject = evaluator.Subject(model, settings.data, state=state, mesh=mesh)
        scores = evaluators_lib.run(evaluators, subject, total_steps, final=True)
    except interruption.Stopped:
      return RunResult(step=total_steps, metrics={}, preempted=True)
    writer.write_scalars(total_steps, scores.summaries())
    run_dir.write_results(scores.results(), step=total_steps)
    writer.flush()
    return RunResult(step=total_steps, metrics=scores.metrics)


# The pieces the loop is made of, in the order it uses them.


@dataclasses.dataclass(frozen=True)
class Programs:
  """A run's train step jitted for its mesh, with the layouts it takes: the training state's and
  the teacher's (one rule places both), and the batch's."""

  train_step: jax.stages.Wrapped
  state_sharding: Any
  teacher_sharding: Any  # None without a teacher.
  data_sharding: NamedSharding

  @classmethod
  def build(
      cls,
      model: nn.Module,
      tx: optax.GradientTransformation,
      step_settings: step_settings.StepSettings,
      num_classes: int,
      mesh: Mesh,
      abstract_state: steps.TrainState,
      fsdp_min_size: int,
      teacher: steps.Teacher | None = None,
  ) -> 'Programs':
    layout = lambda tree: sharding.fsdp_shardings(tree, mesh, fsdp_min_size)
    state_sharding = layout(abstract_state)
    teacher_sharding = None if teacher is None else layout(teacher.variables)
    train_step = steps.sharded_train_step(
        model, tx, step_settings, num_classes, mesh, state_sharding, teacher, teacher_sharding
    )
    return cls(train_step, state_sharding, teacher_sharding, sharding.batch_sharding(mesh))


class PreemptionWatcher:
  """Turns SIGTERM, Ctrl-C and SIGHUP into a request to checkpoint and exit at the next step, in
  `interruption`'s process-wide flag (so an enclosing `run_sequence.Stopper`'s counts too); on
  several processes only SIGTERM, through orbax, which agrees on one step across all of them."""

  def __init__(self):
    self._scope = contextlib.ExitStack()

  def __enter__(self) -> 'PreemptionWatcher':
    if jax.process_count() == 1:
      self._scope.enter_context(
          interruption.watching('saving a checkpoint after this step, then exiting')
      )
    return self

  def __exit__(self, *exc_info) -> None:
    self._scope.close()

  @property
  def requested(self) -> bool:
    return interruption.requested() is not None

  def should_stop(self, run_dir: run_writer.RunWriter, step: int) -> bool:
    return self.requested or run_dir.reached_preemption(step)


def _final_evaluation_stops_at_once(step: int) -> contextlib.AbstractContextManager[None]:
  """Where a signal during the final evaluation stops it at once (`interruption.Stopped`): step
  `step` is saved and a rerun evaluates it. Not on several processes, whose evaluation one
  process must not leave alone (their signals are orbax's, agreed at a step)."""
  if jax.process_count() > 1:
    return contextlib.nullcontext()
  return interruption.stopping_at_once(
      f'step {step} is saved; the final evaluation stops (rerun the same command to evaluate it)'
  )


def _stop_profiling() -> None:
  """Ends a profile a run left running (stopped or failed within its steps)."""
  try:
    jax.profiler.stop_trace()
  except RuntimeError:  # None running.
    pass


def _restore_or_init(
    run_dir: run_writer.RunWriter,
    saved: Any,
    init: Callable[[], steps.TrainState],
    abstract_state: steps.TrainState,
    state_sharding: Any,
    pretrained: dict[str, Any] | None,
    *,
    ema: bool,
) -> steps.TrainState:
  """The state the loop starts from, in `state_sharding`'s layout: resuming (`saved`: the saved
  run's abstract state), the newest readable checkpoint carried over to this run's layout; else a
  fresh state (`init`), with `pretrained`'s variables when fine-tuning."""
  state = None if saved is None else run_dir.resume(saved)
  if state is not None:
    if shape_diff.flat_shapes(saved) != shape_diff.flat_shapes(abstract_state):
      state = resume_lib.carry_over(
          state, ema, sharding.abstract(abstract_state, state_sharding), state_sharding
      )
    logging.debug('Resumed from step %d of %s.', int(state.step), run_dir.path)
    return state
  state = jax.jit(init, out_shardings=state_sharding)()
  if pretrained is None:
    return state
  state = state.replace(
      params=sharding.place(pretrained['params'], state_sharding.params),
      batch_stats=sharding.place(pretrained.get('batch_stats', {}), state_sharding.batch_stats),
  )
  return jax.jit(lambda s: steps.with_fresh_ema(s, ema), out_shardings=state_sharding)(state)


class Progress:
  """Training steps per second (`steps_per_s`: at the latest report, through clu's
  `ReportProgress`) on a clock that stops inside `timed` sections: evaluations, checkpoints and
  the first step's compilation would otherwise lower it and raise the ETA."""

  def __init__(
      self, *, num_train_steps: int, writer: metric_writers.MetricWriter, every_steps: int
  ):
    self._report = periodic_actions.ReportProgress(
        num_train_steps=num_train_steps, writer=writer, every_steps=every_steps, every_secs=None
    )
    self._paused = 0.0  # Seconds spent in `timed` sections.
    self._last: tuple[int, float] | None = None  # (step, clock) of the latest report.
    self.steps_per_s = math.nan

  def __call__(self, step: int) -> None:
    """Called after each step."""
    t = time.monotonic() - self._paused
    if self._last is None:
      self._last = (step, t)
    if self._report(step, t):
      self.steps_per_s = (step - self._last[0]) / max(t - self._last[1], 1e-9)
      self._last = (step, t)

  @contextlib.contextmanager
  def timed(self, name: str, after: Any = None) -> Iterator[None]:
    """Leaves the block (`name`, for the reader) out of the clock once `after` (the training
    state) is computed: the steps dispatched before the block are training time."""
    del name
    jax.block_until_ready(after)
    start = time.monotonic()
    try:
      yield
    finally:
      self._paused += time.monotonic() - start


def _profiler(
    workdir: str, profile_steps: int, start_step: int, total_steps: int
) -> periodic_actions.Profile | None:
  """clu's `Profile`, tracing (`jax.profiler`) the `profile_steps` steps after the first into
  WORKDIR/plugins/profile, where TensorBoard's profile tab finds them; None when off."""
  count = min(profile_steps, total_steps - start_step - 1)
  if count <= 0:
    return None
  return periodic_actions.Profile(
      logdir=workdir,
      num_profile_steps=count,
      profile_duration_ms=None,
      first_profile=start_step + 1,
      every_steps=None,
      every_secs=None,
  )


def _finite(
    fetched: list[dict[str, np.ndarray]], step: int, run_dir: run_writer.RunWriter
) -> list[dict[str, np.ndarray]]:
  """`fetched` (the steps' metrics since the last fetch); raises if a loss is not finite, naming
  the checkpoint a rerun resumes from once the save in flight is finished."""
  losses = np.array([m['loss'] for m in fetched])
  if not np.all(np.isfinite(losses)):
    run_dir.wait_until_finished()
    kept = run_dir.steps()
    raise FloatingPointError(
        f'The training loss became {losses[~np.isfinite(losses)][0]} at or before step {step}; '
        'stopping without saving. '
        + (
            f'The last good checkpoint (step {kept[-1]}) is kept in '
            f'{run_dir.file(run_files.CHECKPOINT_DIR) / str(kept[-1])}; a rerun resumes '
            'from it. '
            if kept
            else 'No checkpoint had been saved yet; a rerun starts from step 0. '
        )
        + 'Lower base_lr, enable grad_clip_norm, or check the data.'
    )
  return fetched


def _log_progress(
    writer: metric_writers.MetricWriter,
    progress: Progress,
    fetched: list[dict[str, np.ndarray]],
    step: int,
    total_steps: int,
    schedule: optax.Schedule,
    batch_size: int,
) -> None:
  """Writes the training summaries of the steps in `fetched` and logs the progress line."""
  images_per_s = progress.steps_per_s * batch_size
  summary = {
      'train/loss': float(np.mean([m['loss'] for m in fetched])),
      'train/accuracy': float(np.mean([m['accuracy'] for m in fetched])),
      'train/grad_norm': float(fetched[-1]['grad_norm']),
      'train/lr': float(schedule(step - 1)),
  }
  speed = ''
  if math.isfinite(images_per_s):
    summary['train/images_per_s'] = images_per_s
    eta = (total_steps - step) / progress.steps_per_s
    speed = f'  {images_per_s:.0f} img/s  ETA {time.strftime("%H:%M:%S", time.gmtime(eta))}'
  writer.write_scalars(step, summary)
  logging.info(
      'step %d/%d  loss %.4f  acc %.3f  lr %.2e%s',
      step,
      total_steps,
      summary['train/loss'],
      summary['train/accuracy'],
      summary['train/lr'],
      speed,
  )
