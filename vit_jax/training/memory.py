"""Whether a run's training step fits its devices, decided before the first step runs: XLA's
`memory_analysis()` of the compiled step against each device's free memory (on CPU hosts, the
host's available memory shared by its devices), instead of RESOURCE_EXHAUSTED or swapping. The
step is compiled for its real arguments, so the run's first call reuses this compilation.
"""

import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from vit_jax.schema import data as data_settings
from vit_jax.schema import run as run_settings


def compiled_bytes(compiled: Any) -> dict[str, int]:
  """XLA's memory account of a compiled computation, per device: its arguments, temporaries,
  and everything live at once (donated arguments are reused by the outputs)."""
  memory = compiled.memory_analysis()
  if memory is None:
    return {}
  total = (
      memory.temp_size_in_bytes
      + memory.argument_size_in_bytes
      + memory.output_size_in_bytes
      - memory.alias_size_in_bytes
  )
  return {
      'arguments': memory.argument_size_in_bytes,
      'temp': memory.temp_size_in_bytes,
      'total': total,
  }


def host_available_bytes() -> int | None:
  """The host memory that can be allocated without swapping (MemAvailable), None if unknown."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  try:
    return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  except (ValueError, OSError, AttributeError):
    return None


def available_bytes(devices: list[jax.Device]) -> tuple[int, str] | None:
  """The free bytes of the tightest of `devices` and a name for them ('cuda:0', 'this host',
  "each of this host's 8 cpu devices"); None where nothing reports it. Devices without memory
  statistics (CPU) share the host's: the bytes returned are the host's divided by their count."""
  free = []
  for device in devices:
    stats = device.memory_stats() or {}
    if 'bytes_limit' in stats:
      free.append((stats['bytes_limit'] - stats.get('bytes_in_use', 0), str(device)))
  if free:
    return min(free)
  host = host_available_bytes()
  if host is None:
    return None
  if len(devices) == 1:
    return host, 'this host'
  return host // len(devices), (
      f"each of this host's {len(devices)} {devices[0].platform} "
      f'devices (sharing its {_size(host)} available)'
  )


def _size(count: int) -> str:
  """'1.5 GiB', '20.0 MiB', '3.2 KiB'."""
  for unit, size in (('GiB', 2**30), ('MiB', 2**20)):
    if count >= size:
      return f'{count / size:,.1f} {unit}'
  return f'{count / 2**10:,.1f} KiB'


def train_batch(
    data: 'data_settings.DataSettings',
    data_sharding: NamedSharding,
    batch_size: int | None = None,
) -> dict[str, jax.ShapeDtypeStruct]:
  """The global training batch's shapes, dtypes and layout, as `input_pipeline.train_iterator`
  yields it (of `data.batch_size` unless `batch_size` is given): where the training step augments
  (`batch_augment`), uint8 images and a key per image."""
  size = data.image_size
  batch = data.batch_size if batch_size is None else batch_size
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=data_sharding)
  if not data.train_transform.on_device:
    return {'image': spec((batch, size, size, 3), jnp.float32), 'label': spec((batch,), jnp.int32)}
  return {
      'image': spec((batch, size, size, 3), jnp.uint8),
      'label': spec((batch,), jnp.int32),
      'augment_key': spec((batch, 2), jnp.uint32),
  }


def too_big_message(
    need: dict[str, int], free: int, where: str, settings: run_settings.Settings
) -> str:
  """The refusal: both numbers and the settings that shrink the step."""
  knobs = [
      f'a smaller batch_size (now {settings.data.batch_size})',
      f'grad_accum_steps above {settings.step.grad_accum_steps} (the same batch in '
      'micro-batches)',
  ]
  if not settings.model.get('remat', False):
    knobs.append('model.remat=True (recompute activations in the backward pass)')
  knobs.append(f'mesh.fsdp above {settings.mesh.fsdp} (split the training state over devices)')
  if settings.dtype == 'float32':
    knobs.append('dtype=bfloat16')
  return (
      f'The training step needs {_size(need["total"])} per device (XLA\'s account: '
      f'{_size(need["arguments"])} of arguments, {_size(need["temp"])} of temporaries) but '
      f'{where} has {_size(free)} free; nothing was trained and the work directory is as it '
      f'was. Shrink the step with --config.FIELD: {"; ".join(knobs)}.'
  )


def check_fits(
    train_step: jax.stages.Wrapped,
    abstract_state: Any,
    settings: run_settings.Settings,
    data_sharding: NamedSharding,
    teacher_variables: Any = None,
    schedule: Any = None,
    available: Callable[[list[jax.Device]], tuple[int, str] | None] | None = None,
) -> dict[str, int]:
  """Compiles the jitted `train_step` for the run's arguments (ShapeDtypeStructs with their
  shardings, and the learning-rate `schedule`) and raises ValueError if XLA's account of it
  exceeds the free memory of this process's devices; returns the account (empty where the
  backend gives none). `settings`: the run's (its batch and the fields that shrink the step)."""
  compiled = train_step.lower(
      abstract_state, train_batch(settings.data, data_sharding), teacher_variables, schedule
  ).compile()
  need = compiled_bytes(compiled)
  found = (available or available_bytes)(jax.local_devices()) if need else None
  if found is not None and need['total'] > found[0]:
    raise ValueError(too_big_message(need, found[0], found[1], settings))
  return need
