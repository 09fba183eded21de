"""Scan-over-layers and remat: the unrolled model's outputs and gradients; layout converters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.tiny_runs import tiny_config
from vit_jax import config as config_lib
from vit_jax import models
from vit_jax.weights import pretrained
from vit_jax.training import train
from vit_jax.training import workdir as workdir_lib
from vit_jax.models import deepvit
from vit_jax.models import layouts
from vit_jax.models import sa_conv

SWITCHES = [dict(scan_layers=True), dict(remat=True), dict(scan_layers=True, remat=True)]

# Tiny members of every family with a deep block stack, at 16x16 inputs; timm init, so that the
# head is not zero.
TINY = {
    'vit': (
        'vit_ti4',
        dict(
            hidden_size=24, depth=3, num_heads=3, mlp_dim=48, init_scheme='timm', drop_path_rate=0.2
        ),
    ),
    # Constant drop path, then two unscanned class-attention blocks.
    'cait': (
        'cait_ti4',
        dict(hidden_size=24, depth=3, num_heads=3, layer_scale_init=0.5, drop_path_rate=0.2),
    ),
    # Two scanned groups (content blocks 0-1, Re-attention blocks 2-4) with BatchNorm statistics.
    'deepvit': (
        'deepvit_ti4',
        dict(hidden_size=24, depth=5, num_heads=3, re_attention_blocks=3, drop_path_rate=0.2),
    ),
    't2t': (
        't2t_vit_t_ti4',
        dict(
            hidden_size=24,
            depth=3,
            num_heads=3,
            mlp_dim=48,
            token_dim=8,
            soft_splits=((3, 1, 1), (3, 2, 1), (3, 2, 1)),
            drop_path_rate=0.2,
        ),
    ),
    # Positional attention with content on the 8x8 grid; no drop path in this family.
    'sa_conv': (
        'sa_conv_learned_content',
        dict(hidden_size=24, num_heads=4, num_layers=3, intermediate_size=32),
    ),
    # A head-pruned model: layers 0-1 (2 heads) scan together, layer 2 (3 heads) stays alone.
    'sa_conv_pruned': (
        'sa_conv_gaussian',
        dict(
            hidden_size=24, num_heads=4, num_layers=3, layer_heads=(2, 2, 3), intermediate_size=32
        ),
    ),
}


def _tiny(family: str, **overrides):
  name, fields = TINY[family]
  return models.create(name, **{'num_classes': 5, **fields, **overrides})


def _images(batch: int = 2):
  return jax.random.normal(jax.random.key(1), (batch, 16, 16, 3))


def _max_diff(a, b) -> float:
  assert jax.tree.structure(a) == jax.tree.structure(b)
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


CASES = [('vit', switches) for switches in SWITCHES] + [
    (family, SWITCHES[-1]) for family in sorted(TINY) if family != 'vit'
]


def _outputs_and_gradients(model, variables):
  """Logits, sown intermediates and the gradient of a scalar loss, in one compiled call."""

  def loss(params):
    logits, state = model.apply(
        {**variables, 'params': params}, _images(), mutable=['intermediates']
    )
    return jnp.sum(logits**2), (logits, state['intermediates'])

  (_, (logits, intermediates)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
      variables['params']
  )
  return logits, intermediates, grads


def _shapes(tree):
  return jax.tree.map(lambda x: (tuple(x.shape), x.dtype), tree)


def _in_layout_of(model, variables):
  """`variables` of the unrolled model converted to `model`'s layout, checked against its init."""
  like = jax.eval_shape(model.init, jax.random.key(0), _images())
  converted = layouts.stack_layers(variables, like)
  assert _shapes(converted) == _shapes(like)
  assert _max_diff(layouts.unstack_layers(converted), variables) == 0.0
  return converted


@pytest.mark.parametrize('family, switches', CASES, ids=str)
def test_same_outputs_and_gradients_as_unrolled(family, switches):
  plain, switched = _tiny(family), _tiny(family, **switches)
  variables = jax.jit(plain.init)(jax.random.key(0), _images())
  logits, intermediates, grads = _outputs_and_gradients(plain, variables)
  logits_s, intermediates_s, grads_s = _outputs_and_gradients(
      switched, _in_layout_of(switched, variables)
  )
  assert _max_diff(logits, logits_s) <= 1e-5
  # Sown attention maps and gradients, unstacked, match block by block.
  assert _max_diff(intermediates, layouts.unstack_layers(intermediates_s)) <= 1e-5
  assert _max_diff(grads, layouts.unstack_layers(grads_s)) <= 1e-5


def test_scanned_variables_are_stacked_and_convert_to_timm():
  model = _tiny('deepvit', scan_layers=True)
  variables = jax.jit(model.init)(jax.random.key(0), _images())
  # Two stacks: content blocks 0-1 and Re-attention blocks 2-4 (with BatchNorm statistics).
  assert variables['params']['blocks_0_to_1']['mlp']['fc1']['kernel'].shape == (2, 24, 72)
  assert variables['batch_stats']['blocks_2_to_4']['attn']['var_norm']['mean'].shape == (3, 3)
  unrolled = layouts.unstack_layers(variables)
  assert 'blocks_4' in unrolled['params'] and 'blocks_0_to_1' not in unrolled['params']
  ours, reference = deepvit.to_dvit_repo(variables), deepvit.to_dvit_repo(unrolled)
  assert ours.keys() == reference.keys()
  assert all(np.array_equal(ours[k], reference[k]) for k in ours)


def test_batch_statistics_update_like_unrolled():
  """Re-attention BatchNorm running averages: the same update through the scan."""
  plain, scanned = _tiny('deepvit', drop_path_rate=0.0), _tiny(
      'deepvit', drop_path_rate=0.0, scan_layers=True
  )
  variables = jax.jit(plain.init)(jax.random.key(0), _images())
  assert variables['batch_stats']
  _, updates = plain.apply(variables, _images(), train=True, mutable=['batch_stats'])
  _, updates_s = scanned.apply(
      _in_layout_of(scanned, variables), _images(), train=True, mutable=['batch_stats']
  )
  assert _max_diff(updates, layouts.unstack_layers(updates_s)) <= 1e-5
  assert _max_diff(updates, {'batch_stats': variables['batch_stats']}) > 0


def test_training_mode_draws_per_layer_stochastic_depth():
  model = _tiny('vit', scan_layers=True, remat=True)
  variables = model.init(jax.random.key(0), _images())
  images = _images(batch=32)
  apply = jax.jit(lambda rng: model.apply(variables, images, train=True, rngs={'dropout': rng}))
  outputs = [apply(jax.random.key(k)) for k in (0, 1)]
  assert outputs[0].shape == (32, 5)
  # Some of the 64 drop-path draws of rates 0.1 and 0.2 differ between the two rngs.
  assert _max_diff(outputs[0], outputs[1]) > 0


def test_scanned_run_checkpoint_loads_into_either_layout(data_dir, tmp_path):
  """A work directory trained with scan_layers reads as unrolled variables (init_from, export,
  analysis)."""
  config = tiny_config(
      data_dir,
      total_steps=2,
      **{'model.scan_layers': True, 'model.depth': 3, 'model.init_scheme': 'timm'},
  )
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(config, workdir)
  saved = workdir_lib.Workdir(workdir).read_state()['params']
  assert 'blocks_0_to_2' in saved
  variables = workdir_lib.Workdir.open(workdir).read_variables(unrolled=True).variables
  assert 'blocks_2' in variables['params'] and 'blocks_0_to_2' not in variables['params']

  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  scanned = config_lib.create_model(config, 10)
  config.model.scan_layers = False
  unrolled = config_lib.create_model(config, 10)
  expected = scanned.apply({'params': saved}, images)
  np.testing.assert_allclose(
      unrolled.apply(pretrained.load_for_run(workdir, unrolled, config), images),
      expected,
      atol=1e-5,
  )
  np.testing.assert_allclose(
      scanned.apply(pretrained.load_for_run(workdir, scanned, config), images), expected, atol=1e-5
  )

  from vit_jax.weights import inference  # pylint: disable=g-import-not-at-top

  run = inference.load_run(workdir, unroll=True)  # As analysis reads it: per-block maps.
  assert not run.model.scan_layers
  _, state = run.model.apply(run.variables, images, mutable=['intermediates'])
  assert {'blocks_0', 'blocks_2'} <= set(state['intermediates'])
  np.testing.assert_allclose(run.model.apply(run.variables, images), expected, atol=1e-5)


def test_sa_conv_scans_runs_of_equal_head_counts():
  model = _tiny('sa_conv_pruned', scan_layers=True)
  params = jax.jit(model.init)(jax.random.key(0), _images())['params']
  assert {k for k in params if k.startswith('layers')} == {'layers_0_to_1', 'layers_2'}
  assert params['layers_0_to_1']['attention']['attention_centers'].shape == (2, 2, 2)
  # The analyses read per-layer heads from either layout.
  heads = sa_conv.attention_heads(params)
  assert [h['attention_centers'].shape for h in heads] == [(2, 2), (2, 2), (3, 2)]
