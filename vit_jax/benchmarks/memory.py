"""What one device of a mesh holds for a training step, from abstract shapes and compilation alone.

Nothing is allocated or run: the state's bytes come from its shapes and `vit_jax.parallel.sharding`
layouts (exact on every backend), the step's temporaries from XLA's account of the compiled step
(the CPU compiler's, where the process forces as many CPU devices as the mesh has).
"""

import jax

from vit_jax import models
from vit_jax.benchmarks import stopwatch
from vit_jax.benchmarks import training_step
from vit_jax.parallel import sharding
from vit_jax.training import memory as training_memory
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.loop import train
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings
from vit_jax.training import start as start_lib


def byte_size(count: int) -> str:
  """'1.5 GiB', '20.0 MiB', '3.2 KiB'."""
  for unit, size in (('GiB', 2**30), ('MiB', 2**20)):
    if count >= size:
      return f'{count / size:,.1f} {unit}'
  return f'{count / 2**10:,.1f} KiB'


def memory_per_device(config, num_classes: int) -> dict[str, int]:
  """Bytes that one device of a (data × fsdp) mesh over every device holds for a training step:
  the state's parts, and XLA's arguments, temporaries and total live at once (the state is
  donated, so outputs reuse it)."""
  settings = setting.build(run_settings.Settings, config)
  schedule = optim.learning_rate_schedule(settings.schedule, 2, 1)
  start = start_lib.for_run(settings, num_classes, schedule)
  mesh = sharding.make_mesh(config.mesh.fsdp)
  state = jax.eval_shape(start.init)
  layout = sharding.fsdp_shardings(state, mesh, config.mesh.fsdp_min_size)
  batch = training_memory.train_batch(settings.data, sharding.batch_sharding(mesh))
  step = steps.sharded_train_step(start.model, start.tx, settings.step, num_classes, mesh, layout)
  memory = training_step.compiled_memory_bytes(
      step.lower(sharding.abstract(state, layout), batch, None, schedule).compile()
  )
  parts = {
      name: sharding.bytes_per_device(getattr(state, name), getattr(layout, name))
      for name in ('params', 'opt_state', 'ema', 'batch_stats')
  }
  return {
      **parts,
      'state': sharding.bytes_per_device(state, layout),
      'all_params': sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params)),
      'num_params': sum(x.size for x in jax.tree.leaves(state.params)),
      **memory,
  }


def run_memory(config, *, num_classes: int) -> dict[str, int]:
  """Prints `memory_per_device` of the config's model on this process's mesh."""
  devices, fsdp = jax.device_count(), config.mesh.fsdp
  sharding.check_mesh(fsdp, devices)
  stopwatch.report('model', f'{config.model.name} {models.model_overrides(config.model)}')
  stopwatch.report(
      'mesh',
      f'data {devices // fsdp} x fsdp {fsdp} = {devices} devices '
      f"({jax.devices()[0].platform}; XLA's account on this backend)",
  )
  stopwatch.report(
      'batch',
      f'{config.batch_size} x {config.image_size}x{config.image_size}x3 '
      f'({config.batch_size // devices} per device), dtype {config.dtype}, '
      f'optimizer {config.optimizer}, mu_dtype {config.mu_dtype or "as parameters"}',
  )
  sizes = memory_per_device(config, num_classes)
  per_device = lambda key: f'{byte_size(sizes[key])} per device'
  stopwatch.report(
      'parameters',
      f'{per_device("params")}, of {byte_size(sizes["all_params"])} '
      f'({sizes["num_params"]:,} parameters)',
  )
  stopwatch.report('optimizer state', per_device('opt_state'))
  if sizes['ema'] or sizes['batch_stats']:
    stopwatch.report('EMA', per_device('ema'))
    stopwatch.report('batch statistics', per_device('batch_stats'))
  stopwatch.report('training state', per_device('state'))
  stopwatch.report(
      'XLA step memory',
      f'{per_device("total")} live at once: arguments '
      f'{byte_size(sizes["arguments"])} (state and batch), temporaries '
      f'{byte_size(sizes["temp"])}',
  )
  return sizes
