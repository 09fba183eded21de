r"""Runs an ablation grid (configs/ablations.py) and prints one table.

  python -m vit_jax.ablate --config=configs/ablations.py:grid=cait_layerscale --workdir=/tmp/abl

Each variant (the config's `variants`: name -> model fields) trains in WORKDIR/NAME with the
config's recipe, then the table gives per variant: test accuracy, parameters, XLA's FLOPs of one
training step, the training step's time (median over `--timing_steps`, after warm-up), and how
many blocks of the main self-attention stage are "similar" to the one before (DeepViT's
collapse metric, `vit_jax.analysis.collapse`, on `--collapse_images` test images).
"""

import json
import os
import time
from typing import Any

from absl import app
from absl import flags
import numpy as np

from vit_jax import analyze
from vit_jax import benchmark
from vit_jax import input_pipeline
from vit_jax import train

# --config (a grid config) and --workdir (one run per variant below it) are the flags that
# vit_jax.main and vit_jax.analyze define, imported above.
_TIMING_STEPS = flags.DEFINE_integer('timing_steps', 5, 'Timed training steps per variant.')
_COLLAPSE_IMAGES = flags.DEFINE_integer('collapse_images', 64, 'Test images for the collapse '
                                        'metric.')

COLUMNS = ('variant', 'accuracy', 'params', 'GFLOPs/step', 'step ms', 'similar blocks')


def variant_config(config, fields: dict[str, Any]):
  """The training config of one variant: `config` without `variants`, its model with `fields`."""
  config = config.copy_and_resolve_references()
  del config['variants']
  for key, value in fields.items():
    config.model[key] = tuple(map(tuple, value)) if key == 'soft_splits' else value
  return config


def step_cost(config, num_classes: int, steps: int) -> dict[str, float]:
  """Parameters, FLOPs and median time of one training step of `config`'s model."""
  contender = benchmark.jax_contender(config, num_classes, inference=False)
  contender.train_steps(2)  # Warm-up.
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    contender.train_steps(1)
    times.append(time.perf_counter() - start)
  return {'params': contender.num_params, 'GFLOPs/step': (contender.train_flops or 0.0) / 1e9,
          'step ms': 1e3 * float(np.median(times))}


def run_grid(config, workdir: str, *, timing_steps: int = 5,
             collapse_images: int = 64) -> list[dict[str, Any]]:
  """Trains and measures every variant of `config.variants`; returns one row per variant."""
  num_classes = input_pipeline.get_dataset_info(config).num_classes
  rows = []
  for name, fields in config.variants.items():
    run_config = variant_config(config, dict(fields))
    run_dir = os.path.join(workdir, name)
    metrics = train.train_and_evaluate(run_config, run_dir)
    report = analyze.analyze(run_dir, ['collapse'], num_images=collapse_images)
    main = report['collapse'].get('main', {})
    rows.append({'variant': name, 'accuracy': float(metrics['accuracy']),
                 **step_cost(run_config, num_classes, timing_steps),
                 'similar blocks': main.get('similar_block_count', 0)})
  with open(os.path.join(workdir, 'ablation.json'), 'w') as f:
    json.dump(rows, f, indent=1)
  return rows


def table(rows: list[dict[str, Any]]) -> str:
  """The rows as a Markdown table."""
  def cell(value: Any) -> str:
    return f'{value:,.4g}' if isinstance(value, float) else f'{value:,}' if isinstance(
        value, int) else str(value)
  lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
  lines += ['| ' + ' | '.join(cell(row[c]) for c in COLUMNS) + ' |' for row in rows]
  return '\n'.join(lines)


def main(argv) -> None:
  del argv
  rows = run_grid(flags.FLAGS.config, flags.FLAGS.workdir, timing_steps=_TIMING_STEPS.value,
                  collapse_images=_COLLAPSE_IMAGES.value)
  print(table(rows))


if __name__ == '__main__':
  app.run(main)
