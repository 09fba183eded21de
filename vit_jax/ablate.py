r"""Runs an ablation grid (configs/ablations.py) and prints one table.

  python -m vit_jax.ablate --config=configs/ablations.py:grid=cait_layerscale --workdir=/tmp/abl

Each variant (the config's `variants`: name -> model fields) trains in WORKDIR/NAME with the
config's recipe, then the table gives per variant: test accuracy, parameters, XLA's FLOPs of one
training step, the training step's time (median of 3 blocks of `--timing_steps` steps, the
variants' blocks alternating in one process after every training) and how many blocks of the
main self-attention stage are "similar" to the one before (DeepViT's collapse metric,
`vit_jax.analysis.collapse`, on `--collapse_images` test images).

With `--seeds=N` every variant trains N times (seeds config.seed … config.seed + N - 1, in
WORKDIR/NAME/seed_K): the table gives the mean test accuracy ± its standard deviation over the
seeds and the mean similar-block count, so a difference can be told from seed noise. A rerun
resumes: finished runs are evaluated again, not retrained.
"""

import statistics

import json
import os
from typing import Any

from vit_jax import runtime  # pylint: disable=g-bad-import-order
runtime.quiet_library_logs()  # First: TensorFlow (loaded by the imports below) starts quietly.

from absl import app
from absl import flags
import ml_collections

from vit_jax import analyze
from vit_jax import benchmark
from vit_jax.data import input_pipeline
from vit_jax.training import train

# --config (a grid config) and --workdir (one run per variant below it) are the flags that
# vit_jax.main and vit_jax.analyze define, imported above.
_TIMING_STEPS = flags.DEFINE_integer('timing_steps', 5, 'Training steps per timed block; each '
                                     'variant runs 3 blocks, alternating with the others.')
_COLLAPSE_IMAGES = flags.DEFINE_integer('collapse_images', 64, 'Test images for the collapse '
                                        'metric.')
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Trainings per variant, each with its own seed.',
                              lower_bound=1)

COLUMNS = ('variant', 'accuracy', 'params', 'GFLOPs/step', 'step ms', 'similar blocks')


def variant_config(config: ml_collections.ConfigDict,
                   fields: dict[str, Any]) -> ml_collections.ConfigDict:
  """The training config of one variant: `config` without `variants`, its model with `fields`."""
  config = config.copy_and_resolve_references()
  del config['variants']
  for key, value in fields.items():
    config.model[key] = value
  return config


def step_costs(configs: list[ml_collections.ConfigDict], num_classes: int,
               steps: int) -> list[dict[str, float]]:
  """Parameters, FLOPs and time of one training step of each config's model; the variants'
  timed blocks of `steps` steps alternate (`benchmark.time_interleaved`), so drift in the
  machine's speed falls on all alike."""
  contenders = [benchmark.jax_contender(c, num_classes, inference=False) for c in configs]
  timings = benchmark.time_interleaved(contenders, kind='train', steps=steps, warmup=1,
                                       repeats=3)
  return [{'params': c.num_params, 'GFLOPs/step': (c.train_flops or 0.0) / 1e9,
           'step ms': 1e3 * timing.wall_s} for c, timing in zip(contenders, timings)]


def train_and_measure(config: ml_collections.ConfigDict, run_dir: str,
                      collapse_images: int) -> tuple[float, int]:
  """Test accuracy and similar-block count of `config` trained in `run_dir`."""
  result = train.train_and_evaluate(config, run_dir)
  if result.preempted:
    raise KeyboardInterrupt(f'Interrupted at step {result.step} of {run_dir}; rerun to resume.')
  report = analyze.analyze(run_dir, ['collapse'], num_images=collapse_images)
  main = report['collapse'].get('main', {})
  return float(result.metrics['accuracy']), main.get('similar_block_count', 0)


def seed_runs(config: ml_collections.ConfigDict, run_dir: str,
              seeds: int) -> list[tuple[ml_collections.ConfigDict, str]]:
  """(config, work directory) of each training of one variant: `run_dir` itself for one seed,
  else `run_dir`/seed_K with seed `config.seed` + K."""
  if seeds == 1:
    return [(config, run_dir)]
  runs = []
  for k in range(seeds):
    seed_config = config.copy_and_resolve_references()
    seed_config.seed = config.seed + k
    runs.append((seed_config, os.path.join(run_dir, f'seed_{k}')))
  return runs


def run_grid(config: ml_collections.ConfigDict, workdir: str, *, timing_steps: int = 5,
             collapse_images: int = 64, seeds: int = 1) -> list[dict[str, Any]]:
  """Trains and measures every variant of `config.variants` (`seeds` times each); returns one
  row per variant."""
  num_classes = input_pipeline.get_dataset_info(input_pipeline.DataSettings.from_config(config)).num_classes
  names = list(config.variants)
  configs = [variant_config(config, dict(config.variants[name])) for name in names]
  rows = []
  for name, run_config in zip(names, configs):
    accuracies, similar = zip(*(
        train_and_measure(seed_config, run_dir, collapse_images)
        for seed_config, run_dir in seed_runs(run_config, os.path.join(workdir, name), seeds)))
    row = {'variant': name, 'accuracy': statistics.fmean(accuracies),
           'similar blocks': similar[0] if seeds == 1 else statistics.fmean(similar)}
    if seeds > 1:
      row.update(accuracies=list(accuracies), accuracy_std=statistics.stdev(accuracies))
    rows.append(row)
  for row, cost in zip(rows, step_costs(configs, num_classes, timing_steps)):
    row.update(cost)
  with open(os.path.join(workdir, 'ablation.json'), 'w') as f:
    json.dump(rows, f, indent=1)
  return rows


def table(rows: list[dict[str, Any]]) -> str:
  """The rows as a Markdown table (accuracy as mean ± standard deviation over several seeds)."""
  def cell(row: dict[str, Any], column: str) -> str:
    value = row[column]
    if column == 'accuracy' and 'accuracy_std' in row:
      return f'{value:.4f} ± {row["accuracy_std"]:.4f}'
    return f'{value:,.4g}' if isinstance(value, float) else f'{value:,}' if isinstance(
        value, int) else str(value)
  lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
  lines += ['| ' + ' | '.join(cell(row, c) for c in COLUMNS) + ' |' for row in rows]
  return '\n'.join(lines)


def main(argv) -> None:
  del argv
  rows = run_grid(flags.FLAGS.config, flags.FLAGS.workdir, timing_steps=_TIMING_STEPS.value,
                  collapse_images=_COLLAPSE_IMAGES.value, seeds=_SEEDS.value)
  print(table(rows))


if __name__ == '__main__':
  app.run(main)
