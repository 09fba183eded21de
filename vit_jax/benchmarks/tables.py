"""Tables of training steps: each family beside a plain ViT twin, and deep models with and without
scan-over-layers and remat."""

import json
import os
import re
import subprocess
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.benchmarks import stopwatch
from vit_jax.benchmarks import training_step
from vit_jax.models import vit

# One model per family at its native resolution (the /4 and SA-conv models are CIFAR-sized).
FAMILY_MODELS = {
    'deit_ti16': 224,
    'cait_ti4': 32,
    'deepvit_ti4': 32,
    't2t_vit_t_14': 224,
    't2t_vit_14': 224,
    'sa_conv_quadratic': 32,
    'sa_conv_gaussian': 32,
    'sa_conv_learned': 32,
    'sa_conv_learned_content': 32,
}


def plain_vit_twin(model, image_size: int) -> tuple[dict[str, Any], int, int]:
  """Overrides of `vit_ti4` for a plain ViT with the model's width, depth, heads and MLP, and
  the patch size whose token count is nearest the model's; also both token counts."""
  width = model.hidden_size
  depth = getattr(model, 'depth', None) or model.num_layers
  heads = model.num_heads if width % model.num_heads == 0 else 1
  mlp_dim = getattr(model, 'mlp_width', None) or getattr(model, 'intermediate_size', None)
  if isinstance(model, vit.VisionTransformer):  # Tokens entering the first main block.
    shapes = []

    def record(next_fun, args, kwargs, context):
      if context.method_name == '__call__' and re.fullmatch(
          r'blocks_\d+', context.module.name or ''
      ):
        shapes.append(args[0].shape)
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
      jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, image_size, image_size, 3)))
    tokens = shapes[0][1]
  else:  # SA-conv attends over the downsampled pixel grid.
    tokens = (image_size // getattr(model, 'downsample', 1)) ** 2
  patches = [p for p in range(1, image_size + 1) if image_size % p == 0]
  patch = min(patches, key=lambda p: abs((image_size // p) ** 2 + 1 - tokens))
  overrides = {
      'hidden_size': width,
      'depth': depth,
      'num_heads': heads,
      'patch_size': patch,
      'mlp_dim': mlp_dim or 4 * width,
  }
  return overrides, tokens, (image_size // patch) ** 2 + 1


def run_family_table(
    config, *, sizes: dict[str, int], num_classes: int, steps: int, warmup: int, repeats: int
) -> list[dict[str, Any]]:
  """Each model (at its image size) next to a plain ViT of equal width, depth and heads.

  The FLOP ratio (XLA's counts of the two training steps) tells architecture from overhead: a
  time ratio near the FLOP ratio is the family's extra arithmetic, not slower code; "per FLOP"
  is their quotient, the family's time per FLOP relative to ViT's.
  """
  stopwatch.report('batch', f'{config.batch_size} images, dtype {config.dtype}')
  stopwatch.report('threads', training_step.threads_description())
  stopwatch.report('load average', f'{stopwatch.load_average()} (start)')
  print(
      f'{"model":<25}{"size":>5}{"width":>6}{"depth":>6}{"heads":>6}{"tokens":>7}{"ms/step":>9}'
      f'{"ViT tokens":>11}{"ViT ms":>8}{"ratio":>7}{"FLOP ratio":>11}{"per FLOP":>9}'
      '  load average',
      flush=True,
  )
  rows = []
  for name, size in sizes.items():
    family_config = config.copy_and_resolve_references()
    family_config.image_size = size
    family_config.model = ml_collections.ConfigDict({'name': name})
    family = training_step.jax_contender(family_config, num_classes, inference=False)
    overrides, tokens, vit_tokens = plain_vit_twin(family.model, size)
    vit_config = family_config.copy_and_resolve_references()
    vit_config.model = ml_collections.ConfigDict({'name': 'vit_ti4', **overrides})
    plain = training_step.jax_contender(vit_config, num_classes, name='vit', inference=False)
    family_time, vit_time = training_step.time_interleaved(
        [family, plain], kind='train', steps=steps, warmup=warmup, repeats=repeats
    )
    row = {
        'model': name,
        'image_size': size,
        'width': overrides['hidden_size'],
        'depth': overrides['depth'],
        'heads': family.model.num_heads,
        'tokens': tokens,
        'step_s': family_time.wall_s,
        'vit_tokens': vit_tokens,
        'vit_step_s': vit_time.wall_s,
        'ratio': family_time.wall_s / vit_time.wall_s,
        'flop_ratio': (
            family.train_flops / plain.train_flops
            if family.train_flops and plain.train_flops
            else float('nan')
        ),
    }
    rows.append(row)
    print(
        f'{name:<25}{size:>5}{row["width"]:>6}{row["depth"]:>6}{row["heads"]:>6}{tokens:>7}'
        f'{1e3 * row["step_s"]:>9.0f}{vit_tokens:>11}{1e3 * row["vit_step_s"]:>8.0f}'
        f'{row["ratio"]:>7.2f}{row["flop_ratio"]:>11.2f}'
        f'{row["ratio"] / row["flop_ratio"]:>9.2f}  {stopwatch.load_average()}',
        flush=True,
    )
  return rows


def layers_row(
    config, name: str, scan: bool, remat: bool, *, num_classes: int, steps: int, warmup: int
) -> dict[str, Any]:
  """`name` with scan_layers/remat as given: init, trace and compile time, step time, memory."""
  config = config.copy_and_resolve_references()
  config.model = ml_collections.ConfigDict({'name': name, 'scan_layers': scan, 'remat': remat})
  cpu = time.process_time()
  contender = training_step.jax_contender(config, num_classes, inference=False)
  compile_cpu_s = time.process_time() - cpu
  timing = training_step.time_interleaved(
      [contender], kind='train', steps=steps, warmup=warmup, repeats=1
  )[0]
  return {
      'model': name,
      'scan': int(scan),
      'remat': int(remat),
      'init_s': contender.compile_s['init'],
      'trace_s': contender.compile_s['lower'],
      'compile_s': contender.compile_s['train'],
      'compile_cpu_s': compile_cpu_s,
      'step_s': timing.wall_s,
      'xla_total_mib': contender.train_memory_mib.get('total', 0.0),
      'xla_temp_mib': contender.train_memory_mib.get('temp', 0.0),
      'peak_rss_mib': training_step.peak_host_memory_mib(),
      'load': os.getloadavg()[0],
  }


def run_layers_table(
    config, *, names: list[str], row_command: Callable[[str], list[str]]
) -> list[dict[str, Any]]:
  """Each model with scan_layers and remat off and on, one fresh process per combination:
  `row_command('MODEL:SCAN:REMAT')`, which prints `layers_row`'s JSON as its last line."""
  stopwatch.report(
      'batch',
      f'{config.batch_size} x {config.image_size}x{config.image_size}x3, ' f'dtype {config.dtype}',
  )
  stopwatch.report('threads', training_step.threads_description())
  print(
      f'{"model":<16}{"scan":>5}{"remat":>6}{"init s":>8}{"trace s":>8}{"compile s":>10}'
      f'{"(CPU s)":>9}{"s/step":>8}{"XLA MiB":>9}{"(temp)":>8}{"RSS MiB":>9}  load',
      flush=True,
  )
  rows = []
  for name in names:
    for scan in (0, 1):
      for remat in (0, 1):
        result = subprocess.run(
            row_command(f'{name}:{scan}:{remat}'), capture_output=True, text=True, check=False
        )
        if result.returncode:
          print(
              f'{name:<16}{scan:>5}{remat:>6}  failed: '
              f'{result.stderr.strip().splitlines()[-1:]}',
              flush=True,
          )
          continue
        row = json.loads(result.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(
            f'{name:<16}{scan:>5}{remat:>6}{row["init_s"]:>8.1f}{row["trace_s"]:>8.1f}'
            f'{row["compile_s"]:>10.1f}{row["compile_cpu_s"]:>9.1f}{row["step_s"]:>8.2f}'
            f'{row["xla_total_mib"]:>9.0f}{row["xla_temp_mib"]:>8.0f}'
            f'{row["peak_rss_mib"]:>9.0f}  {row["load"]:.1f}',
            flush=True,
        )
  return rows
