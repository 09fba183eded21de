"""The analyses of a trained run's attention (`ANALYSES`), written as PNGs and analysis.json under
W/analysis/ by `analyze`, the command line `python -m vit_jax.analyze`.
"""

import dataclasses
import os
from typing import Any, Sequence

from absl import logging
import flax.linen as nn
import jax
import ml_collections
import numpy as np

from vit_jax import models
from vit_jax.analysis import centres
from vit_jax.analysis import collapse
from vit_jax.analysis import maps
from vit_jax.analysis import pruning
from vit_jax.analysis import rollout
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.models import attention
from vit_jax.models import sa_conv
from vit_jax.models import vit
from vit_jax.training import steps
from vit_jax.loop import train
from vit_jax.weights import inference
from vit_jax.schema import setting
from vit_jax.workdir import disk_writes
from vit_jax.workdir import reader
from vit_jax.workdir import run_files

ANALYSES = ('collapse', 'maps', 'rollout', 'distance', 'centres', 'pruning')
ANALYSIS_ROOM = "write access and room for the analysis' figures and report (WORKDIR/analysis)"


def eval_images(run: inference.Run, count: int) -> np.ndarray:
  """The first `count` real images of `run`'s eval split, (count, S, S, 3): those the run
  recorded (`reader.Workdir.eval_images`, its data need not stay) where they are enough."""
  run_dir = reader.Workdir(run.source)
  recorded = run_dir.eval_images()
  if recorded is not None:
    whole_split = (run_dir.dataset() or {}).get('num_eval_examples', count)
    if len(recorded) >= min(count, whole_split):
      return recorded[:count]
  return input_pipeline.first_eval_images(
      setting.build(data_settings.DataSettings, run.config), count
  )


def accuracy(
    model: nn.Module, variables: dict[str, Any], config: ml_collections.ConfigDict
) -> float:
  """Top-1 accuracy over the whole eval split."""
  predict = jax.jit(
      lambda v, x: jax.numpy.argmax(steps.classifier_logits(model.apply(v, x, train=False)), -1)
  )
  data = setting.build(data_settings.DataSettings, config)
  correct = total = 0.0
  for batch in input_pipeline.eval_iterator(data, process_index=0, process_count=1):
    hits = np.asarray(predict(variables, batch['image'])) == batch['label']
    correct += float((hits * batch['mask']).sum())
    total += float(batch['mask'].sum())
  return correct / max(total, 1.0)


def _has_attention(model_class: type) -> bool:
  return issubclass(model_class, (vit.VisionTransformer, sa_conv.SAConv))


def model_analyses(model: nn.Module) -> list[str]:
  """The analyses that apply to `model` (centres to positional attention, pruning to SA-conv)."""
  if not _has_attention(type(model)):
    return []  # A CNN (RegNetY): nothing sows attention.
  names = ['collapse', 'maps', 'rollout', 'distance']
  if getattr(model, 'attention', None) in attention.POSITIONAL_KINDS:
    names.append('centres')
    if isinstance(model, sa_conv.SAConv) and model.attention in pruning.PRUNABLE:
      names.append('pruning')
  return names


def _resolve(what: Sequence[str] | str, model: nn.Module) -> tuple[list[str], bool]:
  """The analyses to run and whether they were named explicitly."""
  what = [what] if isinstance(what, str) else list(what)
  supported = model_analyses(model)
  if not supported:
    with_attention = [f.name for f in models.families() if _has_attention(f.model_class)]
    raise ValueError(
        f'{type(model).__name__} has no attention layers, so there is nothing to '
        f'analyse; the analyses apply to the families {", ".join(with_attention)}.'
    )
  if what == ['all']:
    return supported, False
  unknown = [w for w in what if w not in ANALYSES]
  if unknown:
    raise ValueError(f'Unknown analyses {unknown}; valid: all, {", ".join(ANALYSES)}.')
  invalid = [w for w in what if w not in supported]
  if invalid:
    raise ValueError(f'{invalid} do not apply to {type(model).__name__}; it supports {supported}.')
  return what, True


def _batch_means(layers, what: Sequence[str], image_shape, window: int) -> dict[str, Any]:
  """Every per-image average of one batch that the requested analyses need."""
  means: dict[str, Any] = {}
  if 'collapse' in what:
    for index, stage in enumerate(maps.stages(layers)):
      if len(stage) > 1 and maps.is_square(layers[stage[0]]):
        means[f'collapse/{index}/similarity'] = collapse.cross_layer_similarity(
            [layers[i].probs for i in stage]
        )
        means[f'collapse/{index}/inter_head'] = [
            collapse.inter_head_similarity(layers[i].probs) for i in stage
        ]
  if 'maps' in what:
    for query in maps.query_maps(layers, image_shape, window):
      means[f'maps/{query.layer}'] = query.maps
  if 'centres' in what:
    for query in maps.query_maps(layers, image_shape):
      means[f'centres/{query.layer}'] = query.maps
  if 'distance' in what:
    distances = rollout.attention_distances(layers, image_shape)
    means.update({f'distance/{name}': values for name, values in distances.items()})
  return means


@dataclasses.dataclass
class _Outputs:
  """The PNGs and numbers of one analysis run, written under `directory`."""

  directory: str
  explicit: bool  # The analyses were named: one that does not apply is an error.
  files: list[str] = dataclasses.field(default_factory=list)

  def path(self, filename: str) -> str:
    self.files.append(filename)
    return os.path.join(self.directory, filename)

  def skip(self, name: str, reason: str) -> None:
    """Raises when the analysis was asked for by name; otherwise logs that it does not apply."""
    if self.explicit:
      raise ValueError(f'--what={name}: {reason}')
    logging.info('Skipping %s: %s', name, reason)


def analyze(
    workdir: str,
    what: Sequence[str] | str = 'all',
    *,
    step: int | None = None,
    num_images: int | None = None,
    batch_size: int = 16,
    window: int = 11,
    threshold: float = 0.9,
    neighbours: int = 3,
    pruning_rule: str = 'official',
    finetune_steps: int = 0,
    finetune_lr_factor: float = 0.1,
    use_ema: bool = True,
    data_dir: str | None = None,
) -> dict[str, Any]:
  """Runs the analyses on `workdir`'s checkpoint (its EMA where kept, with `use_ema`) over
  `num_images` eval images (default: as many as a run records), writes PNGs and analysis.json and
  returns it."""
  num_images = run_files.RECORDED_EVAL_IMAGES if num_images is None else num_images
  if num_images < 1 or batch_size < 1 or window < 1:
    raise ValueError(
        f'num_images={num_images}, batch_size={batch_size} and window={window} ' 'must be >= 1.'
    )
  disk_writes.check_writable(
      os.path.join(workdir, run_files.ANALYSIS_DIR), ANALYSIS_ROOM, directory=True
  )
  run = inference.load_run(workdir, step, use_ema=use_ema, unroll=True, data_dir=data_dir)
  what, explicit = _resolve(what, run.model)
  run_dir = reader.Workdir(workdir)
  out = _Outputs(run_dir.analysis_dir(), explicit)
  images = eval_images(run, num_images)
  image_shape = images.shape[1:3]
  name = run.config.model.name

  # Every average over images is accumulated batch by batch, so memory stays at one batch of maps.
  sums: dict[str, np.ndarray] = {}
  relevance_parts, attention_parts = [], []
  prefix_names = [p.removesuffix('_token') for p in getattr(run.model, 'prefix_tokens', ())]
  for start in range(0, len(images), batch_size):
    batch = images[start : start + batch_size]
    layers = maps.attention_maps(run.model, run.variables, batch)
    for key, value in _batch_means(layers, what, image_shape, window).items():
      sums[key] = sums.get(key, 0.0) + len(batch) * np.asarray(value, np.float64)
    if 'rollout' in what:
      relevance_parts.append(rollout.token_relevance(layers, image_shape, prefix_names))
      attention_parts.append(rollout.final_attention(layers, image_shape, prefix_names))
  means = {key: value / len(images) for key, value in sums.items()}

  report: dict[str, Any] = {
      'model': name,
      'step': run.step,
      'weights': 'ema' if run.ema else 'raw',
      'num_images': len(images),
      'layers': [
          {'name': layer.name, **dict(zip(('heads', 'queries', 'keys'), layer.shape))}
          for layer in layers
      ],
  }
  if 'collapse' in what:
    title = f'{name}: attention collapse, {len(images)} images'
    report['collapse'] = _collapse(layers, means, threshold, neighbours, out, title)
  if 'maps' in what:
    title = (
        f'{name}: attention of the centre token (class token for class attention) per layer x '
        f'head, mean over {len(images)} images'
    )
    report['maps'] = _maps(layers, means, image_shape, window, out, title)
  if 'rollout' in what:
    relevance = rollout.concatenate(relevance_parts)
    rollout.plot_relevance(
        relevance, images, out.path('rollout.png'), attention=rollout.concatenate(attention_parts)
    )
    report['rollout'] = rollout.relevance_json(relevance)
  if 'distance' in what:
    report['distance'] = _distance(layers, means, image_shape, out)
  if 'centres' in what:
    report['centres'] = _centres(run.variables, layers, means, image_shape, window, out)
  if 'pruning' in what:
    report['pruning'] = _pruning(
        run, out.directory, pruning_rule, finetune_steps, finetune_lr_factor
    )
  report['files'] = out.files
  run_dir.write_json(os.path.join(run_files.ANALYSIS_DIR, 'analysis.json'), report)
  logging.info('Wrote %s to %s.', ', '.join(out.files + ['analysis.json']), out.directory)
  return report


def _collapse(layers, means, threshold, neighbours, out, title) -> dict[str, Any]:
  """collapse.png for the main self-attention stage (collapse_stage_I.png for others)."""
  report = {}
  main = maps.main_stage(layers)
  for index, stage in enumerate(maps.stages(layers)):
    if f'collapse/{index}/similarity' not in means:
      continue
    result = collapse.Collapse(
        [layers[i].name for i in stage],
        means[f'collapse/{index}/similarity'],
        means[f'collapse/{index}/inter_head'],
        threshold,
    )
    report['main' if stage == main else f'stage_{index}'] = result.to_json(neighbours)
    heads, queries, keys = layers[stage[0]].shape
    filename = 'collapse.png' if stage == main else f'collapse_stage_{index}.png'
    collapse.plot(
        result,
        out.path(filename),
        neighbours,
        f'{title}; {len(stage)} blocks of {heads} heads, {queries}x{keys} maps',
    )
  if not report:
    out.skip('collapse', 'no two consecutive self-attention layers have maps of one shape.')
  return report


def _maps(layers, means, image_shape, window, out, title) -> dict[str, Any]:
  """maps.png: the centre (or class) query's attention per layer x head."""
  queries = [
      dataclasses.replace(q, maps=means[f'maps/{q.layer}'])
      for q in maps.query_maps(layers, image_shape, window)
  ]
  if not queries:
    out.skip('maps', 'no layer has keys on an image grid.')
    return {}
  maps.plot_query_maps(queries, out.path('maps.png'), title)
  return {
      q.layer: {
          'query': q.query,
          'grid': [q.grid.rows, q.grid.cols],
          'peak_per_head': np.nanmax(q.maps.reshape(len(q.maps), -1), -1).round(6).tolist(),
      }
      for q in queries
  }


def _distance(layers, means, image_shape, out) -> dict[str, Any]:
  """distance.png: mean attention distance per head and layer, against uniform attention."""
  distances = {
      layer.name: means[f'distance/{layer.name}']
      for layer in layers
      if f'distance/{layer.name}' in means
  }
  if not distances:
    out.skip('distance', 'no square attention layer has tokens on an image grid.')
    return {}
  uniform = {
      layer.name: rollout.uniform_distance(grid)
      for layer in layers
      if layer.name in distances
      and (grid := maps.key_grid(layer.shape[2], image_shape)) is not None
  }
  rollout.plot_distances(distances, uniform, out.path('distance.png'), image_shape[0])
  return {
      name: {'heads': np.round(v, 4).tolist(), 'uniform': round(uniform[name], 4)}
      for name, v in distances.items()
  }


def _centres(variables, layers, means, image_shape, window, out) -> dict[str, Any]:
  """centres.png: mass contours of every positional head for the centre query pixel."""
  heads = sa_conv.attention_heads(variables['params'])
  queries = [q for q in maps.query_maps(layers, image_shape) if q.query == 'centre']
  panels, mus = [], []
  for index, query in enumerate(queries):
    averaged = dataclasses.replace(query, maps=means[f'centres/{query.layer}'])
    panels.append((f'layer {index}', centres.layer_contours(averaged)))
    mu = heads[index].get('attention_centers')
    mus.append(None if mu is None else np.asarray(mu))
  centres.plot(panels, out.path('centres.png'), window, mus)
  report = centres.contours_json(panels)
  for (name, _), layer_mus in zip(panels, mus):
    if layer_mus is not None:
      report[name] = [
          dict(entry, mu=np.round(m, 4).tolist()) for entry, m in zip(report[name], layer_mus)
      ]
  return report


def _pruning(
    run: inference.Run, out_dir: str, rule: str, finetune_steps: int, lr_factor: float
) -> dict[str, Any]:
  """Prunes degenerate heads, compares size, FLOPs and accuracy, writes the pruned run."""
  config, model, variables = run.config, run.model, run.variables
  num_classes = len(run.class_names)
  params = variables['params']
  heads = pruning.degenerate_heads(params, model.attention, rule=rule)
  pruned_params, layer_heads = pruning.prune(params, heads)
  pruned_config = pruning.pruned_config(
      config, layer_heads, steps=finetune_steps, lr_factor=lr_factor
  )
  pruned_model = models.create_model(pruned_config, num_classes)
  before = pruning.forward_cost(model, params, config.image_size)
  after = pruning.forward_cost(pruned_model, pruned_params, config.image_size)
  report = {
      'rule': rule,
      'max_condition': pruning.PRUNING_RULES[rule],
      'min_eigenvalue': pruning.MIN_EIGENVALUE,
      'eigenvalues': [e.tolist() for e in pruning.head_spectra(params, model.attention)],
      'pruned_heads': heads,
      'pruned_per_layer': [len(h) for h in heads],
      'layer_heads': list(layer_heads),
      'parameters': [before['parameters'], after['parameters']],
      'flops': [before['flops'], after['flops']],
      'accuracy': [
          accuracy(model, variables, config),
          accuracy(pruned_model, {'params': pruned_params}, config),
      ],
  }
  run_dir = os.path.join(out_dir, f'pruned_{rule}')
  pruned = reader.Workdir(run_dir)
  if pruned.has_checkpoint():  # Pruned before: fine-tune on from where it stands.
    saved = pruned.required_config().model.get('layer_heads')
    if list(saved or ()) != list(layer_heads):
      raise ValueError(
          f'{run_dir!r} holds a model pruned to {saved} heads per layer, not '
          f'{list(layer_heads)}; remove it to prune again.'
      )
  else:
    pruning.write_run(pruned_config, pruned_params, run_dir, num_classes)
  report['pruned_workdir'] = run_dir
  if finetune_steps > 0:
    metrics = train.train_and_evaluate(pruned_config, run_dir).metrics
    report['finetuned_accuracy'] = metrics['accuracy']
  return report
