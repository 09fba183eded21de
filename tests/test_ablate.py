"""The parts of the shared backbone combine, and the grid command runs end to end."""

import itertools
import os

import jax
import jax.numpy as jnp
import optax
import pytest

from vit_jax.configs import ablations
from tests import pairwise
from vit_jax import models
from vit_jax.analysis import ablation
from vit_jax.analysis import collapse
from vit_jax.analysis import maps
from vit_jax.analysis import report as report_lib
from vit_jax.analysis import rollout
from vit_jax.models import attention as attention_lib
from vit_jax.models import sa_conv
from vit_jax.models import vit

_PARTS = (attention_lib.kinds(), (None, 0.1), vit.CLASS_STAGES, ('patch', 't2t'))
_PAIRWISE = pairwise.all_pairs(*_PARTS)


def test_part_combinations_cover_every_pair_of_parts():
  for (i, values_i), (j, values_j) in itertools.combinations(enumerate(_PARTS), 2):
    assert {(c[i], c[j]) for c in _PAIRWISE} == set(itertools.product(values_i, values_j))
  assert len(_PAIRWISE) < len(list(itertools.product(*_PARTS)))


@pytest.mark.parametrize('attention,layer_scale,class_stage,stem', _PAIRWISE)
def test_every_part_combination_trains_one_step_with_scan(
    attention, layer_scale, class_stage, stem
):
  # Positional attention reads the patch grid only: with the class token from the start, the
  # head averages the tokens instead.
  positional = attention_lib.kind(attention).patch_tokens_only
  pool = 'avg' if positional and class_stage == 'token' else 'token'
  model = models.create(
      'vit_ti4',
      num_classes=3,
      hidden_size=8,
      num_heads=2,
      depth=2,
      mlp_dim=16,
      attention=attention,
      layer_scale_init=layer_scale,
      class_stage=class_stage,
      stem=stem,
      token_dim=8,
      global_pool=pool,
      soft_splits=((3, 2, 1), (3, 2, 1)),
      class_attention_depth=1,
      scan_layers=True,
      init_scheme='timm',
  )
  images = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
  labels = jnp.array([0, 2])
  variables = model.init(jax.random.key(1), images)
  assert any('_to_' in key for key in variables['params'])
  tx = optax.adamw(1e-3)
  opt_state = tx.init(variables['params'])

  def loss(params):
    logits, _ = model.apply(
        {**variables, 'params': params},
        images,
        train=True,
        mutable=['batch_stats'],
        rngs={'dropout': jax.random.key(2)},
    )
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  value, grads = jax.value_and_grad(loss)(variables['params'])
  updates, _ = tx.update(grads, opt_state, variables['params'])
  params = optax.apply_updates(variables['params'], updates)
  assert jnp.isfinite(value)
  assert all(bool(jnp.all(jnp.isfinite(p))) for p in jax.tree.leaves(params))
  paths = [
      jax.tree_util.keystr(path)
      for path, _ in jax.tree_util.tree_leaves_with_path(variables['params'])
  ]
  assert any('gamma_1' in path for path in paths) == (layer_scale is not None)
  assert any('blocks_token_only' in path for path in paths) == (class_stage == 'class_attention')


@pytest.mark.parametrize(
    'fields,message',
    [
        (dict(attention='quadratic'), 'patch grid only'),
        (dict(class_stage='class_attention', global_pool='avg'), "must be 'token'"),
        (dict(distilled=True, class_stage='class_attention'), 'distilled=True'),
        (dict(stem='cnn', patch_size=3), 'must be even'),
        (dict(attention='sparse'), "attention='sparse' is not valid"),
    ],
)
def test_combinations_that_cannot_work_are_refused_before_compiling(fields, message):
  with pytest.raises(ValueError, match=message):
    models.create('vit_ti4', **fields).check_fields()


@pytest.mark.e2e  # The grid command, end to end.
def test_grid_command_runs_a_two_variant_grid(tmp_path):
  """Trains, analyses (from each run's saved config.json, where the T2T stem's `soft_splits`
  come back as JSON lists) and times two variants."""
  config = ablations.get_config('grid=t2t_stem')
  config.variants = {name: config.variants[name] for name in ('patch', 't2t_transformer')}
  config.total_steps, config.warmup_steps, config.eval_every = 2, 1, 2
  config.batch_size, config.eval_batch_size = 16, 64
  config.model.hidden_size, config.model.depth, config.model.mlp_dim = 16, 2, 32
  rows = ablation.run_grid(config, str(tmp_path), timing_steps=1, collapse_images=4, seeds=2)
  assert sorted(row['variant'] for row in rows) == ['patch', 't2t_transformer']
  for row in rows:
    assert 0.0 <= row['accuracy'] <= 1.0 and row['params'] > 0 and row['step ms'] > 0
    assert 0 <= row['similar blocks'] <= 1
    assert row['accuracy'] == pytest.approx(sum(row['accuracies']) / 2)
    assert row['accuracy_std'] >= 0
    assert sorted(os.listdir(tmp_path / row['variant'])) == ['seed_0', 'seed_1']
  assert rows[0]['params'] != rows[1]['params']  # The stems differ.
  table = ablation.table(rows)
  assert table.splitlines()[0].startswith('| variant | accuracy | params')
  assert len(table.splitlines()) == 4
  assert ' ± ' in table.splitlines()[2]


def test_one_seed_trains_in_the_variant_directory_and_more_in_one_each(tmp_path):
  config = ablations.get_config('grid=cait_talking_heads')
  config.seed = 7
  [(same, run_dir)] = ablation.seed_runs(config, str(tmp_path / 'standard'), 1)
  assert same is config and run_dir == str(tmp_path / 'standard')
  runs = ablation.seed_runs(config, str(tmp_path / 'standard'), 3)
  assert [c.seed for c, _ in runs] == [7, 8, 9]
  assert [d for _, d in runs] == [str(tmp_path / 'standard' / f'seed_{k}') for k in range(3)]


@pytest.mark.parametrize(
    'fields',
    [
        dict(attention='talking_heads', class_stage='class_attention', stem='t2t'),
        dict(attention='re_attention', layer_scale_init=0.1, stem='cnn'),
        dict(attention='gaussian', class_stage='class_attention'),
        dict(attention='learned_content', global_pool='avg', stem='space_to_depth'),
        dict(attention='quadratic', global_pool='map', distilled=False),
        dict(distilled=True, attention='talking_heads'),
    ],
)
def test_analysis_runs_on_combinations_of_parts(fields):
  # Unrolled, as the analysis reads every run (`inference.load_run(unroll=True)`).
  model = models.create(
      'vit_ti4',
      num_classes=3,
      hidden_size=8,
      num_heads=2,
      depth=3,
      mlp_dim=16,
      patch_size=2,
      token_dim=8,
      soft_splits=((3, 2, 1), (3, 1, 1)),
      class_attention_depth=1,
      **fields,
  )
  images = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
  variables = model.init(jax.random.key(1), images)
  image_shape = images.shape[1:3]
  layers = maps.attention_maps(model, variables, images)
  main = maps.main_stage(layers)
  assert len(main) == 3, [layer.name for layer in layers]
  result = collapse.measure([layers[i].probs for i in main], [layers[i].name for i in main])
  assert result.similarity.shape == (3, 3) and 0 <= len(result.similar) <= 2
  assert maps.query_maps(layers, image_shape, 3)
  prefix = [p.removesuffix('_token') for p in model.prefix_tokens]
  assert rollout.token_relevance(layers, image_shape, prefix)
  assert rollout.attention_distances(layers, image_shape)
  if 'centres' in report_lib.model_analyses(model):
    heads = sa_conv.attention_heads(variables['params'])
    assert len(heads) == 3
    assert ('attention_centers' in heads[0]) == (model.attention in ('gaussian', 'quadratic'))


@pytest.mark.parametrize('grid', list(ablations.GRIDS))
def test_every_grid_variant_builds(grid):
  config = ablations.get_config(f'grid={grid}')
  config.lock()  # As `python -m vit_jax.ablate` reads it.
  assert len(config.variants) >= 2
  for name in config.variants:
    model = models.create_model(ablation.variant_config(config, dict(config.variants[name])), 10)
    model.check_fields()
    images = jnp.zeros((1, config.image_size, config.image_size, 3))
    assert jax.eval_shape(model.init, jax.random.key(0), images)['params']
