"""Evaluation outside training: a run's or published weights scored once by the evaluators.

`evaluate_only` is `config.eval_only` (the run's test sets on `init_from` or the work directory's
newest checkpoint, reported in eval_report.json); `evaluate_weights` is `python -m
vit_jax.evaluate` (any test sets and frozen-feature evaluators, merged into results.json).
"""

from typing import Sequence

from clu import metric_writers
import flax.linen as nn
import jax
from jax.sharding import Mesh

from vit_jax import evaluators as evaluators_lib
from vit_jax.data import settings as data_settings
from vit_jax.evaluators import eval_sets as eval_sets_lib
from vit_jax.evaluators import evaluator
from vit_jax.evaluators import frozen
from vit_jax.parallel import sharding
from vit_jax.weights import inference
from vit_jax.weights import pretrained
from vit_jax.workdir import reader


def evaluate_only(
    test_sets: eval_sets_lib.TestSets,
    model: nn.Module,
    mesh: Mesh,
    *,
    source: str,
    use_ema: bool,
    model_name: str,
    fsdp_min_size: int,
    out: reader.Workdir,
) -> dict[str, float]:
  """`test_sets`' metrics of the weights in `source` (a run or a weights file), written to
  `out`'s eval_report.json and printed.

  Reads the EMA weights where the source kept them (`use_ema`). Trains nothing and writes
  nothing else; a class count that differs from the dataset's is an error (no head is
  re-initialised).
  """
  data = test_sets.data
  variables = pretrained.load(source, model, image_size=data.image_size, use_ema=use_ema)
  subject = evaluator.Subject(
      model, data, variables=variables, mesh=mesh, fsdp_min_size=fsdp_min_size
  )
  metrics = evaluators_lib.run([test_sets], subject).metrics
  report = {
      'source': source,
      'use_ema': use_ema,
      'model': model_name,
      'dataset': data.dataset,
      'split': data.eval_split,
      'image_size': data.image_size,
      **metrics,
  }
  out.write_json('eval_report.json', report)
  if jax.process_index() == 0:
    weights = f'{"EMA weights where kept" if use_ema else "raw weights"} of {source}'
    print(
        f'Top-1 on {data.dataset}/{data.eval_split}: {metrics["accuracy"]:.4f} '
        f'({metrics["count"]} examples; {weights}).'
    )
    for eval_set in test_sets.sets:
      print(
          f'Top-1 on {eval_set.name}: {metrics[f"{eval_set.name}/accuracy"]:.4f} '
          f'({metrics[f"{eval_set.name}/count"]} examples scored; {weights}).'
      )
  return metrics


def evaluate_weights(
    run: inference.Run,
    eval_set_names: Sequence[str],
    frozen_evaluators: Sequence[frozen.Evaluator],
    out_dir: str,
) -> dict[str, float]:
  """The metrics of `run` (a run's or published weights) on the test sets `eval_set_names` and
  by `frozen_evaluators`: printed, merged into OUT_DIR/results.json and written as TensorBoard
  summaries in `out_dir` at the run's step."""
  num_classes = len(run.class_names)
  if eval_set_names and not num_classes:
    raise ValueError(
        f'--eval_sets scores predictions, and {run.source} has no classifier head (headless '
        'weights); --evaluators=fewshot,linear_probe read its features.'
    )
  data = data_settings.DataSettings.from_config(run.config)
  # A run's classes are its dataset's; weights' (Hub label names) may be words for the same ones.
  names = run.class_names if run.step is not None else None
  sets = eval_sets_lib.checked(eval_set_names, data, num_classes=num_classes, class_names=names)
  mesh_settings = sharding.MeshSettings.from_config(run.config)
  mesh = sharding.make_mesh(mesh_settings.fsdp) if sets else None
  evaluators = list(frozen_evaluators)
  if sets:
    evaluators.insert(
        0, eval_sets_lib.TestSets.build(run.model, num_classes, mesh, data, sets, own_split=False)
    )
  subject = evaluator.Subject(
      run.model,
      data,
      variables=run.variables,
      mesh=mesh,
      fsdp_min_size=mesh_settings.fsdp_min_size,
  )
  metrics = evaluators_lib.run(evaluators, subject).metrics
  for key, value in metrics.items():
    print(f'{key:40s} {value:.4g}')
  out = reader.Workdir(out_dir)
  results_file = out.write_results(metrics, step=run.step)  # Merged: the run's own are kept.
  writer = metric_writers.SummaryWriter(out_dir)  # TensorBoard; the lines above are printed.
  writer.write_scalars(run.step or 0, metrics)
  writer.close()
  print(f'Wrote {len(metrics)} metrics of {run.source} (step {run.step}) to {results_file}.')
  return metrics
