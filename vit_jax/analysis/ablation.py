"""An ablation grid (configs/ablations.py, `python -m vit_jax.ablate`): every variant trained and
tabulated (`COLUMNS`): test accuracy (mean ± std over seeds), parameters, FLOPs and time of a
training step, and DeepViT's similar-block count (`vit_jax.analysis.collapse`).
"""

import json
import os
import statistics
from typing import Any

import ml_collections

from vit_jax.analysis import report as report_lib
from vit_jax.benchmarks import training_step
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.training import run_sequence
from vit_jax.loop import train
from vit_jax.schema import setting

COLUMNS = ('variant', 'accuracy', 'params', 'GFLOPs/step', 'step ms', 'similar blocks')


def variant_config(
    config: ml_collections.ConfigDict, fields: dict[str, Any]
) -> ml_collections.ConfigDict:
  """The training config of one variant: `config` without `variants`, its model with `fields`."""
  config = config.copy_and_resolve_references()
  with config.unlocked():  # The command's config is locked, as every command's.
    del config['variants']
    for key, value in fields.items():
      config.model[key] = value
  return config


def step_costs(
    configs: list[ml_collections.ConfigDict], num_classes: int, steps: int
) -> list[dict[str, float]]:
  """Parameters, FLOPs and time (median of 3 blocks of `steps` steps, the variants' alternating so
  that drift in the machine's speed falls on all alike) of one training step of each config."""
  contenders = [training_step.jax_contender(c, num_classes, inference=False) for c in configs]
  timings = training_step.time_interleaved(
      contenders, kind='train', steps=steps, warmup=1, repeats=3
  )
  return [
      {
          'params': c.num_params,
          'GFLOPs/step': (c.train_flops or 0.0) / 1e9,
          'step ms': 1e3 * timing.wall_s,
      }
      for c, timing in zip(contenders, timings)
  ]


def train_and_measure(
    config: ml_collections.ConfigDict,
    run_dir: str,
    collapse_images: int,
    stopper: run_sequence.Stopper | None = None,
) -> tuple[float, int]:
  """Test accuracy and similar-block count of `config` trained in `run_dir`: those recorded by
  an earlier run of the grid, else measured now (and recorded). With a `stopper`, an
  interruption stops before the training or inside it, checkpointed (`run_sequence`)."""
  measured = run_sequence.recorded(run_dir, config)
  if measured is not None:
    return measured['accuracy'], measured['similar_blocks']
  if stopper is not None:
    stopper.check(run_dir)
  result = train.train_and_evaluate(config, run_dir)
  if result.preempted:
    where = (
        f'before training {run_dir}'
        if result.step is None
        else f'at step {result.step} of {run_dir} (saved)'
    )
    raise run_sequence.Interrupted(
        f'Interrupted {where}; rerun the same command to resume where it stopped.'
    )
  report = report_lib.analyze(run_dir, ['collapse'], num_images=collapse_images)
  main = report['collapse'].get('main', {})
  measured = {
      'accuracy': float(result.metrics['accuracy']),
      'similar_blocks': main.get('similar_block_count', 0),
  }
  run_sequence.record(run_dir, config, measured)
  return measured['accuracy'], measured['similar_blocks']


def seed_runs(
    config: ml_collections.ConfigDict, run_dir: str, seeds: int
) -> list[tuple[ml_collections.ConfigDict, str]]:
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


def run_grid(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    timing_steps: int = 5,
    collapse_images: int = 64,
    seeds: int = 1,
    stopper: run_sequence.Stopper | None = None,
) -> list[dict[str, Any]]:
  """Trains and measures every variant of `config.variants` (`seeds` times each), skipping the
  trainings an earlier, interrupted run finished; returns one row per variant."""
  num_classes = input_pipeline.get_dataset_info(
      setting.build(data_settings.DataSettings, config)
  ).num_classes
  names = list(config.variants)
  configs = [variant_config(config, dict(config.variants[name])) for name in names]
  rows = []
  for name, run_config in zip(names, configs):
    accuracies, similar = zip(
        *(
            train_and_measure(seed_config, run_dir, collapse_images, stopper)
            for seed_config, run_dir in seed_runs(run_config, os.path.join(workdir, name), seeds)
        )
    )
    row = {
        'variant': name,
        'accuracy': statistics.fmean(accuracies),
        'similar blocks': similar[0] if seeds == 1 else statistics.fmean(similar),
    }
    if seeds > 1:
      row.update(accuracies=list(accuracies), accuracy_std=statistics.stdev(accuracies))
    rows.append(row)
  if stopper is not None:
    stopper.check('timing the variants')
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
    if isinstance(value, float):
      return f'{value:,.4g}'
    return f'{value:,}' if isinstance(value, int) else str(value)

  lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
  lines += ['| ' + ' | '.join(cell(row, c) for c in COLUMNS) + ' |' for row in rows]
  return '\n'.join(lines)
