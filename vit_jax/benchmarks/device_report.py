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
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax.data import input_pipeline
from vit_jax.training import steps
from vit_jax.training import train

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


def compiled_flops(compiled) -> float | None:
  """XLA's FLOP count of a compiled computation, where the backend provides one."""
  analysis = compiled.cost_analysis()
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
  """`configs/FAMILY.py:ARG` of this checkout (the quick run without `arg`)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  if root not in sys.path:
    sys.path.insert(0, root)
  return importlib.import_module(f'configs.{family}').get_config(arg)


def _random_batch(config: ml_collections.ConfigDict, size: int, num_classes: int) -> dict:
  rng = np.random.default_rng(0)
  return {
      'image': jnp.asarray(
          rng.standard_normal((size, config.image_size, config.image_size, 3), np.float32)
      ),
      'label': jnp.asarray(rng.integers(0, num_classes, size), np.int32),
  }


def _compiled_train_step(
    config: ml_collections.ConfigDict, batch: dict, num_classes: int
) -> tuple[Callable, steps.TrainState]:
  settings = train.Settings.from_config(config)
  start = train.Start.build(settings, num_classes, lambda _: config.base_lr)
  state = jax.jit(start.init)()
  step = jax.jit(
      steps.make_train_step(start.model, start.tx, settings.step, num_classes), donate_argnums=0
  )
  return step.lower(state, batch).compile(), state


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


def family_rows(*, reduced: bool, num_steps: int) -> list[Row]:
  """Each family's quick model: `num_steps` bfloat16 training steps on one repeated batch."""
  rows = []
  for family in FAMILIES:
    if reduced:
      config = _reduced_config(family)
    else:
      config = family_config(family)
      config.dtype = 'bfloat16'
      config.batch_size = 64
    batch = _random_batch(config, config.batch_size, 10)
    step, state = _compiled_train_step(config, batch, 10)
    losses = []
    start = time.perf_counter()
    for _ in range(num_steps):
      state, metrics = step(state, batch)
      losses.append(float(metrics['loss']))
    seconds = (time.perf_counter() - start) / num_steps
    finite = bool(np.all(np.isfinite(losses)))
    falling = finite and losses[-1] < losses[0]
    rows.append(
        Row(
            f'{family} training ({config.model.name}, bf16)',
            f'loss {losses[0]:.3f} -> {losses[-1]:.3f} in {num_steps} steps, '
            f'{1e3 * seconds:.0f} ms/step',
            finite and falling,
            {'losses': losses, 'step_s': seconds},
        )
    )
  return rows


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

  def step(implementation):
    def loss(q, k, v):
      out = jax.nn.dot_product_attention(q, k, v, implementation=implementation)
      return jnp.sum(out.astype(jnp.float32) ** 2), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))

  xla = step('xla')
  xla_s = _time(lambda: xla(q, k, v), repeats)
  shape = f'{batch}x{tokens} tokens x {heads} heads x {head_dim}'
  numbers = {'shape': shape, 'xla_ms': 1e3 * xla_s}
  try:
    cudnn = step('cudnn')
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


def training_throughput_row(*, reduced: bool, repeats: int) -> Row:
  """ViT-B/16's bfloat16 training step on 1000 classes (reduced: the ViT row's step, which a
  persistent compilation cache holds already): images/s and MFU."""
  if reduced:
    config, num_classes = _reduced_config('vit'), 10
  else:
    config, num_classes = family_config('vit', 'variant=B/16'), 1000
    config.dtype = 'bfloat16'
    config.batch_size = 128 * jax.local_device_count()
  batch_size = config.batch_size
  batch = _random_batch(config, batch_size, num_classes)
  step, state = _compiled_train_step(config, batch, num_classes)
  holder = {'state': state}

  def one_step():
    holder['state'], metrics = step(holder['state'], batch)
    return metrics

  seconds = _time(one_step, repeats)
  images_per_s = batch_size / seconds
  flops = compiled_flops(step)
  kind = jax.devices()[0].device_kind
  peak = peak_tflops(kind)
  numbers = {
      'model': config.model.name,
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
  return Row(f'{config.model.name} training (bf16)', text, None, numbers)


def input_pipeline_row(*, reduced: bool, needed_images_per_s: float, num_batches: int) -> Row:
  """Images/s of the training input pipeline on every host core, against the step's need."""
  if reduced:
    config = family_config('vit')
    config.batch_size = 8
  else:  # DeiT's recipe (inception crop, RandAugment, random erasing) at 224 px.
    config = family_config('deit', 'variant=B')
    config.dataset = 'digits'
    config.batch_size = 128 * jax.local_device_count()
  batches = input_pipeline.train_iterator(
      input_pipeline.DataSettings.from_config(config), process_index=0, process_count=1
  )
  next(batches)
  for _ in range(2):  # What the prefetch buffer held.
    next(batches)
  start = time.perf_counter()
  for _ in range(num_batches):
    next(batches)
  images_per_s = num_batches * config.batch_size / (time.perf_counter() - start)
  cores = len(os.sched_getaffinity(0))
  ratio = images_per_s / needed_images_per_s
  return Row(
      f'input pipeline ({config.image_size} px, {cores} host cores)',
      f'{images_per_s:.0f} images/s, {ratio:.2f}x the {needed_images_per_s:.0f} images/s '
      'the training step needs',
      ratio >= 1.0,
      {'images_per_s': images_per_s, 'cores': cores, 'step_needs': needed_images_per_s},
  )


def run(*, reduced: bool | None = None, json_path: str | None = None) -> list[Row]:
  """Measures every row, prints the table and writes it as JSON to `json_path`."""
  device = jax.devices()[0]
  if reduced is None:
    reduced = device.platform == 'cpu'
  repeats = 2 if reduced else 20
  rows = family_rows(reduced=reduced, num_steps=4 if reduced else 10)
  rows.append(attention_row(reduced=reduced, repeats=repeats))
  throughput = training_throughput_row(reduced=reduced, repeats=repeats)
  rows.append(throughput)
  rows.append(
      input_pipeline_row(
          reduced=reduced,
          needed_images_per_s=throughput.numbers['images_per_s'],
          num_batches=4 if reduced else 50,
      )
  )
  header = (
      f'device report: {jax.device_count()} x {device.device_kind} ({device.platform}), '
      f'jax {jax.__version__}' + (', reduced sizes' if reduced else '')
  )
  width = max(len(r.check) for r in rows)
  status = {True: 'ok', False: 'FAIL', None: '--'}
  print(header)
  for row in rows:
    print(f'{row.check:<{width}}  {status[row.ok]:<4}  {row.result}')
  if json_path:
    with open(json_path, 'w') as f:
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
