"""ViT: shapes, errors, parameter counts, init schemes and logit parity with timm."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.models import attention
from vit_jax.models import layers
from vit_jax.models import layouts
from vit_jax.models import vit


def _param_count(model, image_size: int) -> int:
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)))
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes['params']))


def _tiny(**overrides):
  fields = dict(num_classes=10, patch_size=4, hidden_size=24, depth=2, num_heads=3)
  fields.update(overrides)
  return vit.VisionTransformer(**fields)


def test_vit_b16_has_exactly_86567656_params():
  assert _param_count(models.create('vit_b16'), 224) == 86_567_656


# timm's vit_large_patch32_224 defaults to its headless in21k config: the ViT paper's L/32 is compared headless.
@pytest.mark.parametrize(
    'name, millions, with_head',
    [
        ('vit_ti16', 5.72, True),
        ('vit_ti32', 6.14, True),
        ('vit_s16', 22.05, True),
        ('vit_s32', 22.88, True),
        ('vit_b16', 86.57, True),
        ('vit_b32', 88.22, True),
        ('vit_l16', 304.33, True),
        ('vit_l32', 305.51, False),
    ],
)
def test_param_counts_match_spec_table(name, millions, with_head):
  model = models.create(name)
  head = 0 if with_head else (model.hidden_size + 1) * model.num_classes
  assert abs((_param_count(model, 224) - head) / 1e6 - millions) <= 0.01


def test_param_count_matches_paper_formula():
  # (P^2 C + N + 5) D + L (12 D^2 + 13 D) + head (ViT paper, Eq. 1-4 and Table 1), for ViT-H/14.
  p, c, n, d, layers, classes = 14, 3, 256, 1280, 32, 1000
  expected = (p * p * c + n + 5) * d + layers * (12 * d * d + 13 * d) + (d + 1) * classes
  assert _param_count(models.create('vit_h14'), 224) == expected


def test_logits_and_sown_probabilities_shapes():
  model = _tiny(init_scheme='timm')
  images = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
  variables = model.init(jax.random.key(0), images)
  assert variables['params']['pos_embed'].shape == (1, 65, 24)
  logits, state = model.apply(variables, images, mutable=['intermediates'])
  assert logits.shape == (2, 10) and logits.dtype == jnp.float32
  (probs,) = state['intermediates']['blocks_1']['attn']['attention_probs']
  assert probs.shape == (2, 3, 65, 65)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(model.apply(variables, images), logits, atol=1e-5)


def test_train_mode_uses_dropout_and_drop_path_rngs():
  model = _tiny(
      dropout_rate=0.1, attention_dropout_rate=0.1, drop_path_rate=0.2, init_scheme='timm'
  )
  images = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
  variables = model.init(jax.random.key(0), images)
  a = model.apply(variables, images, train=True, rngs={'dropout': jax.random.key(1)})
  b = model.apply(variables, images, train=True, rngs={'dropout': jax.random.key(2)})
  assert not np.allclose(a, b)
  np.testing.assert_allclose(model.apply(variables, images), model.apply(variables, images))


@pytest.mark.parametrize(
    'overrides, images_shape, message',
    [
        (dict(patch_size=5), (1, 32, 32, 3), 'patch_size=5'),
        (dict(num_heads=5), (1, 32, 32, 3), 'num_heads=5'),
        (dict(init_scheme='xavier'), (1, 32, 32, 3), 'xavier'),
        (dict(drop_path_rate=1.0), (1, 32, 32, 3), 'drop_path_rate'),
        ({}, (32, 32, 3), 'rank 4'),
    ],
)
def test_bad_configuration_raises_value_error_before_compiling(overrides, images_shape, message):
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(_tiny(**overrides).init, jax.random.key(0), jnp.zeros(images_shape))


def test_other_image_size_than_init_raises_value_error():
  model = _tiny()
  variables = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  with pytest.raises(ValueError, match='pos_embed'):
    model.apply(variables, jnp.zeros((1, 16, 16, 3)))


def test_registry_errors_name_the_valid_choices():
  with pytest.raises(ValueError, match='vit_ti16'):
    models.create('vit_tiny')
  with pytest.raises(ValueError, match="'widht'.*hidden_size"):
    models.create('vit_ti4', widht=3)
  assert models.create('vit_ti4', num_classes=7).num_classes == 7
  assert {
      'vit_ti16',
      'vit_s16',
      'vit_b16',
      'vit_l16',
      'vit_h14',
      'vit_ti32',
      'vit_s32',
      'vit_b32',
      'vit_l32',
      'vit_ti4',
      'vit_s4',
      'vit_b4',
  } <= set(models.names())


def test_init_schemes():
  images = jnp.zeros((1, 32, 32, 3))
  google = jax.jit(_tiny(hidden_size=48).init)(jax.random.key(0), images)['params']
  timm = jax.jit(_tiny(hidden_size=48, init_scheme='timm').init)(jax.random.key(0), images)[
      'params'
  ]
  assert not np.any(google['head']['kernel']) and not np.any(google['cls_token'])
  # Google: xavier per q/k/v projection, U(+-sqrt(6 / (D + D))); MLP biases N(0, 1e-6).
  qkv = google['blocks_0']['attn']['qkv']['kernel']
  assert np.abs(qkv).max() <= np.sqrt(6 / 96) and np.abs(qkv).max() > 0.9 * np.sqrt(6 / 96)
  assert 0 < np.abs(google['blocks_0']['mlp']['fc1']['bias']).max() < 1e-5
  # timm: N(0, 0.02) Linears and tokens, zero biases, PyTorch default conv U(+-1/sqrt(fan_in)).
  for kernel in (
      timm['blocks_0']['attn']['qkv']['kernel'],
      timm['head']['kernel'],
      timm['pos_embed'],
  ):
    assert abs(np.std(kernel) - 0.02) < 0.002
  assert not np.any(timm['blocks_0']['mlp']['fc1']['bias'])
  bound = 1 / np.sqrt(4 * 4 * 3)
  for leaf in timm['patch_embed']['proj'].values():
    assert np.abs(leaf).max() <= bound and np.abs(leaf).max() > 0.8 * bound


def test_logit_parity_with_timm_vit_tiny(timm_model):
  import torch  # pylint: disable=g-import-not-at-top

  model, state_dict = timm_model('vit_tiny_patch16_224')
  images = np.random.default_rng(0).normal(size=(2, 224, 224, 3)).astype(np.float32)
  with torch.no_grad():
    expected = model(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
  ours = models.create('vit_ti16').apply(vit.from_timm(state_dict), images)
  assert np.abs(np.asarray(ours) - expected).max() <= 1e-5
  round_trip = vit.to_timm(vit.from_timm(state_dict))
  assert round_trip.keys() == state_dict.keys()
  for key, value in state_dict.items():
    np.testing.assert_array_equal(round_trip[key], value, err_msg=key)


def test_from_timm_rejects_unknown_keys():
  with pytest.raises(ValueError, match='fc_norm.weight'):
    vit.from_timm({'fc_norm.weight': np.ones(3), 'cls_token': np.zeros((1, 1, 3))})


def test_torch_conversion_rules():
  state_dict = {
      'a.0.lin.weight': np.arange(6.0).reshape(2, 3),
      'a.0.conv.weight': np.arange(24.0).reshape(2, 3, 2, 2),
      'bn.weight': np.ones(2),
      'bn.running_mean': np.zeros(2),
      'bn.running_var': np.ones(2),
      'bn.num_batches_tracked': np.array(3),
      'gamma_1': np.ones(4),
  }
  variables = layouts.variables_from_torch(state_dict)
  np.testing.assert_array_equal(
      variables['params']['a_0']['lin']['kernel'], state_dict['a.0.lin.weight'].T
  )
  assert variables['params']['a_0']['conv']['kernel'].shape == (2, 2, 3, 2)
  assert (
      variables['params']['a_0']['conv']['kernel'][1, 0, 2, 1]
      == state_dict['a.0.conv.weight'][1, 2, 1, 0]
  )
  assert set(variables['batch_stats']['bn']) == {'mean', 'var'}
  back = layouts.variables_to_torch(variables)
  del state_dict['bn.num_batches_tracked']
  assert back.keys() == state_dict.keys()
  for key, value in state_dict.items():
    np.testing.assert_array_equal(back[key], value, err_msg=key)


def test_drop_path_drops_whole_samples_and_rescales():
  x = jnp.ones((1000, 3, 2))
  out = np.asarray(
      layers.DropPath(0.25).apply({}, x, train=True, rngs={'dropout': jax.random.key(0)})
  )
  per_sample = out.reshape(1000, -1)
  kept = per_sample[:, 0] != 0
  np.testing.assert_allclose(per_sample[kept], 1 / 0.75, rtol=1e-6)
  assert np.all(per_sample.min(1) == per_sample.max(1))
  assert abs((per_sample[:, 0] == 0).mean() - 0.25) < 0.05
  np.testing.assert_array_equal(layers.DropPath(0.25).apply({}, x), x)


def test_encoder_block_with_v_skip_attention_and_layer_scale():
  x = jax.random.normal(jax.random.key(1), (2, 5, 12))
  block = layers.EncoderBlock(
      functools.partial(attention.TokenAttention, features=8),
      mlp_dim=8,
      attention_residual=False,
      layer_scale_init=0.5,
  )
  variables = block.init(jax.random.key(0), x)
  p = variables['params']
  np.testing.assert_array_equal(p['gamma_1'], np.full(8, 0.5))
  norm = lambda params, t: nn.LayerNorm(epsilon=1e-6).apply({'params': params}, t)
  y = 0.5 * attention.TokenAttention(features=8).apply({'params': p['attn']}, norm(p['norm1'], x))
  expected = y + 0.5 * layers.Mlp(8).apply({'params': p['mlp']}, norm(p['norm2'], y))
  np.testing.assert_allclose(block.apply(variables, x), expected, atol=1e-5)
  zero_scale = layers.EncoderBlock(
      functools.partial(attention.SelfAttention, num_heads=3), mlp_dim=8, layer_scale_init=0.0
  )
  np.testing.assert_array_equal(zero_scale.apply(zero_scale.init(jax.random.key(0), x), x), x)


def test_bfloat16_computation_keeps_float32_params_and_probabilities():
  model = _tiny(init_scheme='timm', dtype=jnp.bfloat16)
  images = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
  variables = model.init(jax.random.key(0), images)
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(variables))
  logits, state = model.apply(variables, images, mutable=['intermediates'])
  (probs,) = state['intermediates']['blocks_0']['attn']['attention_probs']
  assert logits.dtype == jnp.float32 and probs.dtype == jnp.float32
  reference = _tiny(init_scheme='timm').apply(variables, images)
  np.testing.assert_allclose(model.apply(variables, images), reference, atol=0.05)
  np.testing.assert_allclose(logits, reference, atol=0.05)
