"""SA-conv (Cordonnier et al.): downsampling order, sizes, attention centres, shapes, training."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.models import attention
from vit_jax.models import layouts
from vit_jax.models import sa_conv
from vit_jax.models import stems
from vit_jax.training import optim

TINY = dict(num_layers=2, hidden_size=16, intermediate_size=24, num_heads=4)


def _param_count(model, image_size: int = 32) -> int:
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)))
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes['params']))


def _space_to_depth_reference(x: np.ndarray, p: int) -> np.ndarray:
  """einops `b (h p1) (w p2) c -> b h w (p1 p2 c)`, written out element by element."""
  b, height, width, c = x.shape
  out = np.zeros((b, height // p, width // p, p * p * c), x.dtype)
  for i in range(height // p):
    for j in range(width // p):
      for p1 in range(p):
        for p2 in range(p):
          for ch in range(c):
            out[:, i, j, (p1 * p + p2) * c + ch] = x[:, i * p + p1, j * p + p2, ch]
  return out


@pytest.mark.parametrize('block, shape', [(2, (2, 8, 6, 3)), (4, (1, 8, 8, 2))])
def test_space_to_depth_matches_einops_pattern(block, shape):
  x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
  np.testing.assert_array_equal(
      stems.space_to_depth(jnp.asarray(x), block), _space_to_depth_reference(x, block)
  )


@pytest.mark.parametrize(
    'name, millions',
    [
        ('sa_conv_quadratic', 12.09),
        ('sa_conv_gaussian', 12.09),
        ('sa_conv_learned', 12.28),
        ('sa_conv_learned_content', 29.60),
    ],
)
def test_param_counts_match_spec(name, millions):
  assert abs(_param_count(models.create(name)) / 1e6 - millions) <= 0.01


def test_sixteen_head_versions_widen_only_the_attention():
  nine, sixteen = (_param_count(models.create(f'sa_conv_quadratic{s}')) for s in ('', '_16h'))
  # Per layer: value Dense gains 7 x 400 x 400 inputs, 7 more centres (2) and spreads (1).
  assert sixteen - nine == 6 * (7 * 400 * 400 + 7 * 3)


def test_known_centres_attend_to_their_shift():
  """Lemma 2: with alpha = s^2 / 2 large, head h of a layer attends to query + centre_h."""
  model = models.create('sa_conv_quadratic', **TINY)
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  variables = model.init(jax.random.key(0), images)
  shifts = np.array([[0, 0], [1, 0], [-2, 1], [1, -1]], np.float32)
  params = jax.tree_util.tree_map(lambda x: x, variables['params'])
  params['layers_1']['attention']['attention_centers'] = jnp.asarray(shifts)
  params['layers_1']['attention']['attention_spreads'] = jnp.full((4,), 10.0)  # alpha = 50.
  _, state = model.apply({'params': params}, images, mutable=['intermediates'])
  (probs,) = state['intermediates']['layers_1']['attention']['attention_probs']
  grid = 8
  assert probs.shape == (2, 4, grid * grid, grid * grid)
  for row, col in ((3, 3), (4, 2), (2, 5)):
    query = row * grid + col
    for head, (dy, dx) in enumerate(shifts.astype(int)):
      key = (row + dy) * grid + (col + dx)
      np.testing.assert_allclose(probs[:, head, query, key], 1.0, atol=1e-6)


@pytest.mark.parametrize('attention', attention.POSITIONAL_KINDS)
def test_forward_shapes_and_per_head_parameters(attention):
  model = models.create(f'sa_conv_{attention}', num_classes=7, **TINY)
  images = jax.random.normal(jax.random.key(1), (3, 12, 16, 3))
  variables = model.init(jax.random.key(0), images)
  logits, state = model.apply(variables, images, mutable=['intermediates'])
  assert logits.shape == (3, 7) and logits.dtype == jnp.float32
  (probs,) = state['intermediates']['layers_0']['attention']['attention_probs']
  assert probs.shape == (3, 4, 6 * 8, 6 * 8)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
  heads = sa_conv.attention_heads(variables['params'])
  assert len(heads) == 2
  if attention in ('quadratic', 'gaussian'):
    assert heads[0]['attention_centers'].shape == (4, 2)
    spreads = (4,) if attention == 'quadratic' else (4, 2, 2)
    assert heads[1]['attention_spreads'].shape == spreads
  else:
    assert heads[0]['row_embeddings'].shape == (2 * 8 - 1, 16)
    assert ('query' in heads[0]) == (attention == 'learned_content')


def test_layer_is_post_layer_norm_with_tiny_epsilon():
  model = models.create('sa_conv_learned', **TINY, num_classes=3)
  images = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
  variables = model.init(jax.random.key(0), images)
  _, state = model.apply(variables, images, capture_intermediates=True, mutable=['intermediates'])
  (out,) = state['intermediates']['layers_0']['__call__']
  out = np.asarray(out, np.float64)  # LN output with scale 1, bias 0: zero mean, unit variance.
  np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-5)
  np.testing.assert_allclose(out.var(-1), 1.0, atol=1e-4)


def test_pytorch_default_initialisation():
  model = models.create('sa_conv_gaussian', **TINY)
  params = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))['params']
  value = params['layers_0']['attention']['value']
  bound = 1 / np.sqrt(4 * 16)
  assert bound * 0.95 < np.abs(value['kernel']).max() <= bound
  assert bound * 0.5 < np.abs(value['bias']).max() <= bound
  upscale = params['features_upscale']['kernel']
  assert 0.95 / np.sqrt(12) < np.abs(upscale).max() <= 1 / np.sqrt(12)
  centres = np.asarray(params['layers_0']['attention']['attention_centers'])
  assert 1.0 < centres.std() < 3.5  # mu ~ N(0, 2^2).


def test_bad_downsample_raises_value_error():
  with pytest.raises(ValueError, match='downsample=3'):
    jax.eval_shape(
        models.create('sa_conv_quadratic', downsample=3).init,
        jax.random.key(0),
        jnp.zeros((1, 32, 32, 3)),
    )
  with pytest.raises(ValueError, match='learned'):
    models.create('sa_conv_quadratic', attention='sinusoid').init(
        jax.random.key(0), jnp.zeros((1, 8, 8, 3))
    )


def test_tiny_model_trains(fit_one_batch):
  model = models.create('sa_conv_gaussian', num_classes=4, **dict(TINY, num_layers=1))
  images = jax.random.normal(jax.random.key(1), (8, 8, 8, 3))
  labels = jnp.arange(8) % 4
  losses = fit_one_batch(model, images, labels)
  assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])


@pytest.mark.parametrize('scan_layers', [False, True])
def test_layer_ids_for_layer_decay(scan_layers):
  """The space-to-depth projection is layer 0, layer i is i + 1 (one factor per layer of a
  scanned run of equal head counts), the head is the top."""
  fields = dict(TINY, num_layers=3, layer_heads=(2, 2, 3), scan_layers=scan_layers)
  model = models.create('sa_conv_gaussian', **fields)
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8, 8, 3)))['params']
  scales = layouts.unstack_layers(optim.layer_decay_scales(model, params, 0.5))
  assert model.top_layer == 4
  expected = {'features_upscale': 0.5**4, 'layers_0': 0.5**3, 'layers_1': 0.5**2}
  expected.update(layers_2=0.5, head=1.0)
  assert set(scales) == set(expected)
  for name, factor in expected.items():
    for value in jax.tree.leaves(scales[name]):
      np.testing.assert_array_equal(np.ravel(value), [factor], err_msg=name)
