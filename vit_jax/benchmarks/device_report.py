r"""What the accelerator at hand runs, in one table:
`python -m vit_jax.benchmark --mode=device_report`.

Each family's quick model trains a few bfloat16 steps (the loss falls); cuDNN attention is checked
against XLA at every family's token counts (`ATTENTION_SHAPES`); ViT-B/16's training step is timed
(images/s, MFU); the input pipeline is timed against what that step consumes. `reduced=True` (the
default on CPU) shrinks every measurement to tiny sizes: the test suite runs it.
"""

import dataclasses
import importlib
import json
import os
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import configs as configs_lib
from vit_jax import models
from vit_jax.process import runtime
from vit_jax.models import attention as attention_lib
from vit_jax.models import numerics
from vit_jax.training import optim
from vit_jax.training import start as start_lib
from vit_jax.training import steps
from vit_jax.schema import setting
from vit_jax.schema import step as step_settings
from vit_jax.schema import optim as optim_settings
from vit_jax.workdir import disk_writes

FAMILIES = configs_lib.family_configs()

# Dense peak bfloat16 TFLOP/s per chip, by the start of `device_kind` (vendor data sheets).
PEAK_TFLOPS = {
    'NVIDIA H100': 989.0,
    'NVIDIA H200': 989.0,
    'NVIDIA A100': 312.0,
    'TPU v4': 275.0,
    'TPU v5 lite': 197.0,
    'TPU v5e': 197.0,
    'TPU v5p': 459.0,
    'TPU v6 lite': 918.0,
    'TPU v6e': 918.0,
}


def peak_tflops(device_kind: str) -> float | None:
  """The table's bfloat16 peak of a device kind; None when unknown (CPUs among them)."""
  return next((v for k, v in PEAK_TFLOPS.items() if device_kind.startswith(k)), None)


def step_flops(function: Callable, *args: Any) -> float | None:
  """XLA's FLOP count of `function(*args)` lowered for the host CPU, whichever device runs it (a GPU
  program's count leaves out its cuBLAS calls); None where it does not lower for a CPU."""
  try:
    cpu = jax.sharding.SingleDeviceSharding(jax.devices('cpu')[0])
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=cpu), args)
    analysis = jax.jit(function).lower(*shapes).cost_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if isinstance(analysis, (list, tuple)):  # Older jax: one dict per partition.
    analysis = analysis[0] if analysis else None
  flops = (analysis or {}).get('flops')
  return float(flops) if flops and flops > 0 else None


@dataclasses.dataclass
class Row:
  """One line of the table: what was checked, its outcome (None: measured, nothing to pass)."""

  check: str
  result: str
  ok: bool | None
  numbers: dict[str, Any] = dataclasses.field(default_factory=dict)


def family_config(family: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """`configs/FAMILY.py:ARG` (the quick run without `arg`), from the installed package."""
  return importlib.import_module(f'vit_jax.configs.{family}').get_config(arg)


def _random_batch(config: ml_collections.ConfigDict, size: int, num_classes: int) -> dict:
  rng = np.random.default_rng(0)
  return {
      'image': jnp.asarray(
          rng.standard_normal((size, config.image_size, config.image_size, 3), np.float32)
      ),
      'label': jnp.asarray(rng.integers(0, num_classes, size), np.int32),
  }


def _train_step(
    config: ml_collections.ConfigDict, num_classes: int
) -> tuple[Callable, Callable[[], steps.TrainState]]:
  """The config's (unjitted) training step at a constant learning rate and its state's init: the
  model, optimizer and step alone, so that a machine without TensorFlow runs it."""
  start = start_lib.Start.build(
      config.model.to_dict(),
      num_classes,
      lambda _: config.base_lr,
      dtype=config.dtype,
      optimizer=setting.build(optim_settings.OptimizerSettings, config),
      seed=config.seed,
      image_size=config.image_size,
      ema=bool(config.ema_decay),
  )
  step = steps.make_train_step(
      start.model, start.tx, setting.build(step_settings.StepSettings, config), num_classes
  )
  return step, start.init


def _compiled_train_step(
    config: ml_collections.ConfigDict, batch: dict, num_classes: int
) -> tuple[Callable, steps.TrainState, float | None]:
  """The config's training step, compiled, its fresh state and its FLOPs. Attention is counted
  as the XLA attention that computes the same (cuDNN's kernel is no CPU operation)."""
  step, init = _train_step(config, num_classes)
  state = jax.jit(init)()
  compiled = jax.jit(step, donate_argnums=0).lower(state, batch).compile()
  model = models.model_from_section(config.model.to_dict(), num_classes, config.dtype)
  if getattr(model, 'attention_implementation', 'xla') != 'xla':
    config = config.copy_and_resolve_references()
    config.model.attention_implementation = 'xla'
    step, _ = _train_step(config, num_classes)
  return compiled, state, step_flops(step, state, batch)


def _reduced_config(family: str) -> ml_collections.ConfigDict:
  """The family's quick model with one block, a batch of 8, in bfloat16: the reduced sizes."""
  config = family_config(family)
  config.dtype = 'bfloat16'
  config.batch_size = 8
  # A stack of like blocks (those that scan) keeps one; RegNetY's depth counts its stages' blocks.
  if 'scan_layers' in models.fields(config.model.name):
    for field in ('depth', 'num_layers'):
      if field in config.model:
        config.model[field] = 1
  return config


def family_row(family: str, *, reduced: bool, num_steps: int) -> Row:
  """A family's quick model: `num_steps` bfloat16 training steps on one repeated batch."""
  if reduced:
    config = _reduced_config(family)
  else:
    config = family_config(family)
    config.dtype = 'bfloat16'
    config.batch_size = 64
  batch = _random_batch(config, config.batch_size, 10)
  step, state, _ = _compiled_train_step(config, batch, 10)
  losses = []
  start = time.perf_counter()
  for _ in range(num_steps):
    state, metrics = step(state, batch)
    losses.append(float(metrics['loss']))
  seconds = (time.perf_counter() - start) / num_steps
  finite = bool(np.all(np.isfinite(losses)))
  falling = finite and losses[-1] < losses[0]
  return Row(
      f'{family} training ({config.model.name}, bf16)',
      f'loss {losses[0]:.3f} -> {losses[-1]:.3f} in {num_steps} steps, '
      f'{1e3 * seconds:.0f} ms/step',
      finite and falling,
      {'losses': losses, 'step_s': seconds},
  )


def _time(function: Callable[[], Any], repeats: int) -> float:
  jax.block_until_ready(function())
  start = time.perf_counter()
  for _ in range(repeats):
    jax.block_until_ready(function())
  return (time.perf_counter() - start) / repeats


class AttentionShape(NamedTuple):
  """One attention shape of a family at its published size: (batch, queries, keys, heads,
  head_dim), and the reduced sizes that keep its token counts."""

  name: str
  batch: int
  queries: int
  keys: int
  heads: int
  head_dim: int

  def reduced(self) -> 'AttentionShape':
    return self._replace(batch=1, heads=1, head_dim=8)


# Every family's token counts at its published sizes.
ATTENTION_SHAPES = (
    AttentionShape('ViT-B/32', 256, 50, 50, 12, 64),
    AttentionShape('ViT-B/16', 64, 197, 197, 12, 64),
    AttentionShape('DeiT-B distilled', 64, 198, 198, 12, 64),
    AttentionShape('ViT-B/16 at 384', 16, 577, 577, 12, 64),
    AttentionShape('CaiT-S24 class attention', 64, 1, 197, 8, 48),
    AttentionShape('T2T-ViT-14 token stage 1', 8, 3136, 3136, 1, 64),
    AttentionShape('T2T-ViT-14 token stage 2', 32, 784, 784, 1, 64),
)
# Rows of very large negative scores: the logits that break some kernels' backward passes.
ADVERSARIAL_SCORE = -2000.0


def _attention_inputs(shape: AttentionShape) -> tuple[jax.Array, jax.Array, jax.Array]:
  """bfloat16 q (pre-scaled), k, v of `shape`; the first queries of each sequence score every key
  near `ADVERSARIAL_SCORE`."""
  q, k, v = (
      jax.random.normal(key, (shape.batch, n, shape.heads, shape.head_dim), jnp.float32)
      for key, n in zip(
          jax.random.split(jax.random.key(0), 3), (shape.queries, shape.keys, shape.keys)
      )
  )
  q = q / np.sqrt(shape.head_dim)
  k = k.at[..., 0].set(5.0 + jnp.abs(k[..., 0]))
  adversarial = max(1, shape.queries // 8)
  q = q.at[:, :adversarial].set(0.0).at[:, :adversarial, :, 0].set(ADVERSARIAL_SCORE / 7.5)
  return q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)


def _padded_cudnn(multiple: int | None) -> Callable:
  """The models' cuDNN attention with queries and keys each padded to a multiple of `multiple`
  tokens (None: unpadded and unmasked)."""
  pad = lambda n: n if multiple is None else numerics.round_up(n, multiple)
  return lambda q, k, v: numerics.cudnn_attention(
      q, k, v, lengths=(pad(q.shape[1]), pad(k.shape[1]))
  )


def cudnn_candidates(queries: int, keys: int) -> dict[str, int | None]:
  """The paddings the report times for cuDNN, each distinct one once: none, and to multiples of
  64 and of 128 with the padded keys masked."""
  candidates: dict[str, int | None] = {'unpadded': None}
  seen = {(queries, keys)}
  for multiple in (numerics.CUDNN_MASKED_MULTIPLE, numerics.CUDNN_UNMASKED_MULTIPLE):
    padded = (numerics.round_up(queries, multiple), numerics.round_up(keys, multiple))
    if padded not in seen:
      seen.add(padded)
      candidates[f'x{multiple}'] = multiple
  return candidates


def chosen_padding(queries: int, keys: int) -> str:
  """The candidate of `cudnn_candidates` that the models' cuDNN attention runs."""
  lengths = (numerics.cudnn_sequence_length(queries), numerics.cudnn_sequence_length(keys))
  return 'unpadded' if lengths == (queries, keys) else f'x{numerics.CUDNN_MASKED_MULTIPLE}'


def attention_row(shape: AttentionShape, *, reduced: bool, repeats: int) -> Row:
  """cuDNN against XLA at one shape in bfloat16: outputs and gradients, NaNs under adversarial
  logits, and the forward and backward time of XLA and of each cuDNN padding."""
  if reduced:
    shape = shape.reduced()
  q, k, v = _attention_inputs(shape)

  def step(attend):
    def loss(q, k, v):
      out = attend(q, k, v)
      return jnp.sum(out.astype(jnp.float32) ** 2), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))

  as32 = lambda x: np.asarray(x, np.float32)
  xla = step(numerics.softmax_attention)  # The models' XLA attention.
  (_, xla_out), xla_grads = xla(q, k, v)
  numbers: dict[str, Any] = {
      'shape': shape._asdict(),
      'xla_ms': 1e3 * _time(lambda: xla(q, k, v), repeats),
      'chosen': numerics.choose_attention(
          'auto', shape.queries, shape.keys, shape.head_dim, jnp.bfloat16
      ).implementation,
      'chosen_padding': chosen_padding(shape.queries, shape.keys),
      'cudnn': {},
  }
  check = f'attention {shape.name} ({shape.queries}x{shape.keys}, bf16)'
  for label, multiple in cudnn_candidates(shape.queries, shape.keys).items():
    try:
      cudnn = step(_padded_cudnn(multiple))
      (_, out), grads = cudnn(q, k, v)
    except Exception as e:  # pylint: disable=broad-except
      reason = str(e).splitlines()[0] if str(e) else type(e).__name__
      numbers['cudnn'][label] = {'error': reason[:200]}
      continue
    nan = not all(np.all(np.isfinite(as32(x))) for x in (out, *grads))
    scale = lambda b: float(np.max(np.abs(as32(b)))) + 1e-6
    diff = max(
        float(np.max(np.abs(as32(a) - as32(b)))) / scale(b)
        for a, b in zip((out, *grads), (xla_out, *xla_grads))
    )
    numbers['cudnn'][label] = {
        'nan': nan,
        'max_rel_diff': diff,
        'ms': 1e3 * _time(lambda: cudnn(q, k, v), repeats),
    }
  measured = {label: m for label, m in numbers['cudnn'].items() if 'error' not in m}
  if not measured:
    first = next(iter(numbers['cudnn'].values()))['error']
    return Row(
        check,
        f'cuDNN unavailable on {jax.devices()[0].platform} ({first}); XLA '
        f'{numbers["xla_ms"]:.2f} ms fwd+bwd',
        None,
        numbers,
    )
  chosen = numbers['chosen_padding']
  text = ', '.join(
      f'{label} {m["ms"]:.2f} ms{" NaN" if m["nan"] else ""} (rel {m["max_rel_diff"]:.1g})'
      for label, m in measured.items()
  )
  # What the models run must be correct; the other candidates are reported beside it.
  ok = numbers['chosen'] != 'cudnn' or (
      chosen in measured
      and not measured[chosen]['nan']
      and measured[chosen]['max_rel_diff'] <= 2e-2
  )
  return Row(
      check,
      f'XLA {numbers["xla_ms"]:.2f} ms; cuDNN {text}; chosen: {numbers["chosen"]}'
      + (f' {chosen}' if numbers['chosen'] == 'cudnn' else ''),
      ok,
      numbers,
  )


def throughput_configs(*, reduced: bool) -> list[tuple[ml_collections.ConfigDict, int]]:
  """(config, classes) of each ViT-B/16 bfloat16 training step the report times: the default
  attention ('auto') at 256 and 512 images per device, XLA's at 256 (reduced: the ViT row's step,
  which a persistent compilation cache holds already)."""
  if reduced:
    return [(_reduced_config('vit'), 10)]
  configs = []
  for implementation, per_device in (('auto', 256), ('auto', 512), ('xla', 256)):
    config = family_config('vit', 'variant=B/16')
    config.dtype = 'bfloat16'
    config.model.attention_implementation = implementation
    config.batch_size = per_device * jax.local_device_count()
    configs.append((config, 1000))
  return configs


def throughput_row(config: ml_collections.ConfigDict, num_classes: int, repeats: int) -> Row:
  """Images/s, TFLOP/s and MFU of the config's training step."""
  batch_size = config.batch_size
  batch = _random_batch(config, batch_size, num_classes)
  step, state, flops = _compiled_train_step(config, batch, num_classes)
  holder = {'state': state}

  def one_step():
    holder['state'], metrics = step(holder['state'], batch)
    return metrics

  seconds = _time(one_step, repeats)
  images_per_s = batch_size / seconds
  kind = jax.devices()[0].device_kind
  peak = peak_tflops(kind)
  planned = attention_lib.plan(
      models.model_from_section(config.model.to_dict(), num_classes, config.dtype),
      config.image_size,
  )
  attention = ', '.join(sorted({p.implementation for p in planned})) or 'no'
  numbers = {
      'model': config.model.name,
      'attention': attention,
      'attention_plan': attention_lib.describe(planned),
      'batch': batch_size,
      'image_size': config.image_size,
      'images_per_s': images_per_s,
      'step_s': seconds,
      'flops': flops,
  }
  text = f'{images_per_s:.1f} images/s (batch {batch_size} at {config.image_size} px)'
  if flops:
    achieved = flops / seconds / 1e12 / jax.local_device_count()
    numbers['tflops_per_device'] = achieved
    text += f', {achieved:.3g} TFLOP/s per device'
    if peak:
      numbers['mfu'] = achieved / peak
      text += f', MFU {100 * achieved / peak:.1f} % of {peak:.0f}'
  if not peak:
    text += f'; MFU not reported (no peak for {kind!r})'
  return Row(f'{config.model.name} training (bf16, {attention} attention)', text, None, numbers)


def input_pipeline_row(*, reduced: bool, needed_images_per_s: float, num_batches: int) -> Row:
  """Images/s of the training input pipeline on every host core, and per core against what the
  timed step consumes per device: how many host cores each device needs."""
  if not runtime.tensorflow_installed():
    return Row(
        'input pipeline', 'not measured: TensorFlow is not installed (pip install -e .)', None
    )
  from vit_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from vit_jax.schema import data as data_settings
  from vit_jax.loop import setup

  if reduced:
    config = family_config('vit')
    config.batch_size = 8
  else:  # DeiT's recipe (inception crop, RandAugment, random erasing) at 224 px.
    config = family_config('deit', 'variant=B')
    config.dataset = 'digits'
    config.batch_size = 128 * jax.local_device_count()
  config = setup.resolved(config)  # As a run on this backend augments.
  data = setting.build(data_settings.DataSettings, config)
  batches = input_pipeline.train_iterator(data, process_index=0, process_count=1)
  for _ in range(3):  # The first batch and what the prefetch buffer held.
    next(batches)
  start = time.perf_counter()
  for _ in range(num_batches):
    next(batches)
  images_per_s = num_batches * config.batch_size / (time.perf_counter() - start)
  cores = len(os.sched_getaffinity(0))
  per_core = images_per_s / cores
  check = f'input pipeline ({config.image_size} px, {cores} host cores)'
  numbers = {
      'images_per_s': images_per_s,
      'cores': cores,
      'images_per_s_per_core': per_core,
      'step_needs': needed_images_per_s,
  }
  text = f'{images_per_s:.0f} images/s, {per_core:.0f} per host core'
  if data.train_transform.on_device:
    from vit_jax.benchmarks import input_speed  # pylint: disable=g-import-not-at-top

    device_s = input_speed.device_augment_seconds(config, 5)
    numbers['device_augment_ms_per_batch'] = 1e3 * device_s
    text += (
        f' (RandAugment and erasing in the step: {1e3 * device_s:.1f} ms a batch of '
        f'{config.batch_size})'
    )
  if not needed_images_per_s:  # No training step was timed.
    return Row(check, text, None, numbers)
  devices = jax.local_device_count()
  per_device = needed_images_per_s / devices
  cores_per_device = per_device / per_core
  numbers['cores_per_device'] = cores_per_device
  return Row(
      check,
      f'{text}; the step consumes {per_device:.0f} images/s per device: '
      f'{cores_per_device:.1f} host cores per device ({cores / devices:.1f} here)',
      cores_per_device <= cores / devices,
      numbers,
  )


def _measured(check: str, measure: Callable[[], Row]) -> Row:
  """`measure()`, or a failed row naming the error: one check that breaks leaves the others."""
  try:
    return measure()
  except Exception as e:  # pylint: disable=broad-except
    lines = str(e).strip().splitlines()
    return Row(check, f'{type(e).__name__}: {lines[0] if lines else ""}', False)


REPORT_ROOM = 'write access and room for the report (--report_json)'  # What `run` writes.
# The groups of rows, in the order they are measured (`--report_rows`).
GROUPS = ('families', 'attention', 'throughput', 'input')
# Where compiled programs are kept between reports when JAX was given no cache directory: a
# second report on the same machine compiles nothing again.
DEFAULT_COMPILATION_CACHE = os.path.join(os.path.expanduser('~'), '.cache', 'vit_jax', 'xla')


def run(
    *,
    reduced: bool | None = None,
    json_path: str | None = None,
    groups: tuple[str, ...] = GROUPS,
) -> list[Row]:
  """Measures the rows of `groups`, printing each as it comes, and writes the table as JSON to
  `json_path` (checked first: minutes of measurements are not lost to a bad path)."""
  unknown = sorted(set(groups) - set(GROUPS))
  if unknown:
    raise ValueError(f'Unknown device report rows {unknown}; choose from {list(GROUPS)}.')
  if json_path:
    disk_writes.check_writable(json_path, REPORT_ROOM, directory=False)
  if not jax.config.jax_compilation_cache_dir:
    jax.config.update('jax_compilation_cache_dir', DEFAULT_COMPILATION_CACHE)
  device = jax.devices()[0]
  if reduced is None:
    reduced = device.platform == 'cpu'
  repeats = 2 if reduced else 20
  print(
      f'device report: {jax.device_count()} x {device.device_kind} ({device.platform}), '
      f'jax {jax.__version__}' + (', reduced sizes' if reduced else ''),
      flush=True,
  )
  rows = []

  def add(check: str, measure: Callable[[], Row]) -> Row:
    row = _measured(check, measure)
    status = {True: 'ok', False: 'FAIL', None: '--'}[row.ok]
    print(f'{row.check:<44}  {status:<4}  {row.result}', flush=True)
    rows.append(row)
    return row

  for family in FAMILIES if 'families' in groups else ():
    add(
        f'{family} training (bf16)',
        lambda: family_row(family, reduced=reduced, num_steps=4 if reduced else 10),
    )
  for shape in ATTENTION_SHAPES if 'attention' in groups else ():
    add(
        f'attention {shape.name}',
        lambda: attention_row(shape, reduced=reduced, repeats=repeats),
    )
  needed = 0.0
  for config, num_classes in throughput_configs(reduced=reduced) if 'throughput' in groups else ():
    row = add(
        f'{config.model.name} training (bf16)',
        lambda: throughput_row(config, num_classes, repeats),
    )
    needed = max(needed, row.numbers.get('images_per_s', 0.0))
  if 'input' in groups:
    add(
        'input pipeline',
        lambda: input_pipeline_row(
            reduced=reduced, needed_images_per_s=needed, num_batches=4 if reduced else 50
        ),
    )
  if json_path:
    with disk_writes.writing(json_path, REPORT_ROOM), open(json_path, 'w') as f:
      json.dump(
          {
              'device': device.device_kind,
              'platform': device.platform,
              'devices': jax.device_count(),
              'jax': jax.__version__,
              'reduced': reduced,
              'rows': [dataclasses.asdict(r) for r in rows],
          },
          f,
          indent=1,
      )
  return rows
