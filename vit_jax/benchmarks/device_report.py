r"""What the accelerator at hand runs, in one table:
`python -m vit_jax.benchmark --mode=device_report`.

For the day a GPU or TPU is lent, one command checks and measures what matters there:
- every family's quick model (`configs/FAMILY.py`) trains a few bfloat16 steps on one repeated
  batch: the loss is finite and falls;
- `jax.nn.dot_product_attention` with cuDNN against XLA on ViT-B-shaped heads in bfloat16:
  outputs equal within bfloat16 tolerance, and the time of each (forward and backward);
- ViT-B/16's bfloat16 training step: images/s, XLA's FLOP count and, for a device kind of
  `PEAK_TFLOPS`, the model FLOPs utilisation;
- the training input pipeline (DeiT's ImageNet recipe on the embedded digits) on every host core,
  beside the images/s that the ViT-B/16 step needs on every local device.
It prints the table and writes it as JSON. `reduced=True` (the default on CPU) shrinks every
measurement to tiny sizes: the test suite runs it.
"""

import dataclasses
import importlib
import json
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import runtime
from vit_jax.models import numerics
from vit_jax.training import optim
from vit_jax.training import start as start_lib
from vit_jax.training import steps
from vit_jax import workdir as workdir_lib

FAMILIES = ('vit', 'deit', 'cait', 'deepvit', 't2t', 'sa_conv', 'regnet')

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
  """XLA's FLOP count of `function(*args)` lowered for the host CPU, before any backend compiles
  it: the same whichever device runs it (a GPU plugin counts nothing before compiling, and a
  compiled GPU program's count leaves out the cuBLAS calls its matrix products become). None
  where no CPU backend is at hand or the function does not lower for it."""
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
      optimizer=optim.OptimizerSettings.from_config(config),
      seed=config.seed,
      image_size=config.image_size,
      ema=bool(config.ema_decay),
  )
  step = steps.make_train_step(
      start.model, start.tx, steps.StepSettings.from_config(config), num_classes
  )
  return step, start.init


def _compiled_train_step(
    config: ml_collections.ConfigDict, batch: dict, num_classes: int
) -> tuple[Callable, steps.TrainState, float | None]:
  """The config's training step, compiled, its fresh state and its FLOPs. cuDNN's attention is
  counted as the XLA attention that computes the same (cuDNN's kernel is no CPU operation)."""
  step, init = _train_step(config, num_classes)
  state = jax.jit(init)()
  compiled = jax.jit(step, donate_argnums=0).lower(state, batch).compile()
  if config.model.get('attention_implementation') == 'cudnn':
    config = config.copy_and_resolve_references()
    config.model.attention_implementation = 'xla'
    step, _ = _train_step(config, num_classes)
  return compiled, state, step_flops(step, state, batch)


def _reduced_config(family: str) -> ml_collections.ConfigDict:
  """The family's quick model with one block, a batch of 8, in bfloat16: the reduced sizes."""
  config = family_config(family)
  config.dtype = 'bfloat16'
  config.batch_size = 8
  if family != 'regnet':  # RegNetY's depth counts its stages' blocks.
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


def attention_row(*, reduced: bool, repeats: int) -> Row:
  """cuDNN against XLA `jax.nn.dot_product_attention`, forward and backward, bfloat16."""
  batch, tokens, heads, head_dim = (2, 17, 2, 16) if reduced else (64, 197, 12, 64)
  q, k, v = (
      jax.random.normal(key, (batch, tokens, heads, head_dim), jnp.bfloat16)
      for key in jax.random.split(jax.random.key(0), 3)
  )
  q = q / np.sqrt(head_dim).astype(q.dtype)  # Pre-scaled, as the models' attention takes it.

  def step(attend):
    def loss(q, k, v):
      out = attend(q, k, v)
      return jnp.sum(out.astype(jnp.float32) ** 2), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))

  xla = step(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, scale=1.0, implementation='xla'))
  xla_s = _time(lambda: xla(q, k, v), repeats)
  shape = (
      f'{batch}x{tokens} tokens (cuDNN padded to {numerics.cudnn_sequence_length(tokens)}) x '
      f'{heads} heads x {head_dim}'
  )
  numbers = {'shape': shape, 'xla_ms': 1e3 * xla_s}
  try:
    cudnn = step(numerics.cudnn_attention)
    (_, cudnn_out), cudnn_grads = cudnn(q, k, v)
  except Exception as e:  # pylint: disable=broad-except
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    return Row(
        'attention cuDNN vs XLA (bf16)',
        f'cuDNN unavailable on {jax.devices()[0].platform} ({reason}); XLA '
        f'{1e3 * xla_s:.2f} ms fwd+bwd, {shape}',
        None,
        numbers,
    )
  (_, xla_out), xla_grads = xla(q, k, v)
  as32 = lambda x: np.asarray(x, np.float32)
  out_diff = float(np.max(np.abs(as32(cudnn_out) - as32(xla_out))))
  grad_diff = max(
      float(np.max(np.abs(as32(a) - as32(b))) / (np.max(np.abs(as32(b))) + 1e-6))
      for a, b in zip(cudnn_grads, xla_grads)
  )
  cudnn_s = _time(lambda: cudnn(q, k, v), repeats)
  ok = out_diff < 2e-2 and grad_diff < 2e-2
  numbers.update(cudnn_ms=1e3 * cudnn_s, max_abs_diff=out_diff, max_rel_grad_diff=grad_diff)
  return Row(
      'attention cuDNN vs XLA (bf16)',
      f'max |diff| {out_diff:.2g} (grads {grad_diff:.2g} rel); cuDNN {1e3 * cudnn_s:.2f} '
      f'ms, XLA {1e3 * xla_s:.2f} ms fwd+bwd, {shape}',
      ok,
      numbers,
  )


def throughput_configs(*, reduced: bool) -> list[tuple[ml_collections.ConfigDict, int]]:
  """(config, classes) of each ViT-B/16 bfloat16 training step the report times, at two batch
  sizes per device: with XLA's attention and, where it runs, cuDNN's (reduced: the ViT row's
  step, which a persistent compilation cache holds already)."""
  if reduced:
    return [(_reduced_config('vit'), 10)]
  tokens = (224 // 16) ** 2 + 1
  variants = [('xla', 128), ('xla', 256)]
  variants += [('cudnn', 128), ('cudnn', 256)] if _cudnn_runs(tokens) else []
  configs = []
  for implementation, per_device in variants:
    config = family_config('vit', 'variant=B/16')
    config.dtype = 'bfloat16'
    config.model.attention_implementation = implementation
    config.batch_size = per_device * jax.local_device_count()
    configs.append((config, 1000))
  return configs


def _cudnn_runs(tokens: int) -> bool:
  """Whether the models' cuDNN attention (`numerics.cudnn_attention`) runs on this machine for
  sequences of `tokens`."""
  q = jnp.zeros((1, tokens, 1, 64), jnp.bfloat16)
  try:
    jax.block_until_ready(numerics.cudnn_attention(q, q, q))
  except Exception:  # pylint: disable=broad-except
    return False
  return True


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
  attention = config.model.get('attention_implementation') or 'default'
  numbers = {
      'model': config.model.name,
      'attention': attention,
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
  """Images/s of the training input pipeline on every host core, against the step's need."""
  if not runtime.tensorflow_installed():
    return Row(
        'input pipeline', 'not measured: TensorFlow is not installed (pip install -e .)', None
    )
  from vit_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from vit_jax.data import settings as data_settings

  if reduced:
    config = family_config('vit')
    config.batch_size = 8
  else:  # DeiT's recipe (inception crop, RandAugment, random erasing) at 224 px.
    config = family_config('deit', 'variant=B')
    config.dataset = 'digits'
    config.batch_size = 128 * jax.local_device_count()
  batches = input_pipeline.train_iterator(
      data_settings.DataSettings.from_config(config), process_index=0, process_count=1
  )
  next(batches)
  for _ in range(2):  # What the prefetch buffer held.
    next(batches)
  start = time.perf_counter()
  for _ in range(num_batches):
    next(batches)
  images_per_s = num_batches * config.batch_size / (time.perf_counter() - start)
  cores = len(os.sched_getaffinity(0))
  check = f'input pipeline ({config.image_size} px, {cores} host cores)'
  numbers = {'images_per_s': images_per_s, 'cores': cores, 'step_needs': needed_images_per_s}
  if not needed_images_per_s:  # No training step was timed.
    return Row(check, f'{images_per_s:.0f} images/s', None, numbers)
  ratio = images_per_s / needed_images_per_s
  return Row(
      check,
      f'{images_per_s:.0f} images/s, {ratio:.2f}x the {needed_images_per_s:.0f} images/s '
      'the training step needs',
      ratio >= 1.0,
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


def run(*, reduced: bool | None = None, json_path: str | None = None) -> list[Row]:
  """Measures every row, printing each as it comes, and writes the table as JSON to
  `json_path` (checked first: minutes of measurements are not lost to a bad path)."""
  if json_path:
    workdir_lib.check_writable(json_path, REPORT_ROOM, directory=False)
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

  for family in FAMILIES:
    add(
        f'{family} training (bf16)',
        lambda: family_row(family, reduced=reduced, num_steps=4 if reduced else 10),
    )
  add('attention cuDNN vs XLA (bf16)', lambda: attention_row(reduced=reduced, repeats=repeats))
  needed = 0.0
  for config, num_classes in throughput_configs(reduced=reduced):
    row = add(
        f'{config.model.name} training (bf16)',
        lambda: throughput_row(config, num_classes, repeats),
    )
    needed = max(needed, row.numbers.get('images_per_s', 0.0))
  add(
      'input pipeline',
      lambda: input_pipeline_row(
          reduced=reduced, needed_images_per_s=needed, num_batches=4 if reduced else 50
      ),
  )
  if json_path:
    with workdir_lib.writing(json_path, REPORT_ROOM), open(json_path, 'w') as f:
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
