"""Evaluation outside training, of a run's or published weights: `evaluate_only` is
`config.eval_only` (eval_report.json), `evaluate_weights` is `python -m vit_jax.evaluate`."""

from typing import Sequence

from clu import metric_writers
import flax.linen as nn
import jax
from jax.sharding import Mesh

from vit_jax import evaluators as evaluators_lib
from vit_jax.evaluators import evaluator
from vit_jax.parallel import sharding
from vit_jax.schema import data as data_settings
from vit_jax.schema import mesh as mesh_settings
from vit_jax.schema import setting
from vit_jax.weights import inference
from vit_jax.weights import pretrained
from vit_jax.workdir import reader


def evaluate_only(
    evaluators: Sequence[evaluator.Evaluator],
    model: nn.Module,
    mesh: Mesh,
    data: data_settings.DataSettings,
    *,
    source: str,
    use_ema: bool,
    model_name: str,
    fsdp_min_size: int,
    out: reader.Workdir,
) -> dict[str, float]:
  """The `evaluators`' metrics of the weights in `source` (a run or a weights file; its EMA where
  kept, with `use_ema`), written to `out`'s eval_report.json and printed; no head is
  re-initialised."""
  variables = pretrained.load(source, model, image_size=data.image_size, use_ema=use_ema)
  subject = evaluator.Subject(
      model, data, variables=variables, mesh=mesh, fsdp_min_size=fsdp_min_size
  )
  metrics = evaluators_lib.run(evaluators, subject).metrics
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
    for key, value in metrics.items():
      if key not in ('accuracy', 'loss', 'count'):
        print(f'{key:40s} {value:.4g}')
  return metrics


def evaluate_weights(
    run: inference.Run, evaluators: Sequence[evaluator.Evaluator], out_dir: str
) -> dict[str, float]:
  """The metrics of `run` by `evaluators`, each checked first: printed, merged into
  OUT_DIR/results.json and written as TensorBoard summaries in `out_dir` at the run's step."""
  data = setting.build(data_settings.DataSettings, run.config)
  # A run's classes are its dataset's; weights' (Hub label names) may be words for the same ones.
  names = run.class_names if run.step is not None else None
  num_classes = len(run.class_names)
  evaluators_lib.check(evaluators, data, num_classes=num_classes, class_names=names)
  mesh_config = setting.build(mesh_settings.MeshSettings, run.config)
  subject = evaluator.Subject(
      run.model,
      data,
      variables=run.variables,
      mesh=sharding.make_mesh(mesh_config.fsdp),
      fsdp_min_size=mesh_config.fsdp_min_size,
      num_classes=num_classes,
  )
  scores = evaluators_lib.run(evaluators, subject)
  metrics = scores.metrics
  for key, value in metrics.items():
    print(f'{key:40s} {value:.4g}')
  out = reader.Workdir(out_dir)
  results_file = out.write_results(scores.results(), step=run.step)  # The run's own are kept.
  writer = metric_writers.SummaryWriter(out_dir)  # TensorBoard; the lines above are printed.
  writer.write_scalars(run.step or 0, metrics)
  writer.close()
  print(f'Wrote {len(metrics)} metrics of {run.source} (step {run.step}) to {results_file}.')
  return metrics
