"""DeepViT: sizes, official checkpoint layout, NumPy reference of the DeepViT paper's Eq. 3, training with BN."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import special

from vit_jax import models
from vit_jax.models import deepvit
from vit_jax.schema import parts

D, H, CLASSES = 24, 4, 5
# Block 0 plain attention, blocks 1-2 Re-attention; CNN stem; 16x16 images -> 4x4 tokens.
TINY = dict(
    num_classes=CLASSES,
    patch_size=4,
    hidden_size=D,
    depth=3,
    num_heads=H,
    re_attention_blocks=2,
    transform_scale=True,
    scale_adjustment=0.5,
    stem='cnn',
)


def _param_count(model, image_size: int = 224) -> int:
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)))
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes['params']))


@pytest.mark.parametrize(
    'name, millions',
    [
        ('deepvit_16b', 24.43),
        ('deepvit_24b', 36.26),
        ('deepvit_32b', 48.10),
        ('deepvit_s', 27.31),
        ('deepvit_l', 58.88),
        ('deepvit_vit_16b', 24.42),
        ('deepvit_vit_32b', 48.09),
    ],
)
def test_param_counts_match_spec(name, millions):
  assert abs(_param_count(models.create(name)) / 1e6 - millions) <= 0.01


def test_re_attention_sits_in_the_last_blocks():
  shapes = jax.eval_shape(
      models.create('deepvit_s').init, jax.random.key(0), jnp.zeros((1, 224, 224, 3))
  )
  with_theta = [i for i in range(16) if 'reatten_matrix' in shapes['params'][f'blocks_{i}']['attn']]
  assert with_theta == list(range(11, 16))
  assert shapes['batch_stats']['blocks_15']['attn']['var_norm']['mean'].shape == (12,)
  assert shapes['params']['patch_embed']['conv1']['kernel'].shape == (7, 7, 3, 64)
  baseline = jax.eval_shape(
      models.create('deepvit_vit_16b').init, jax.random.key(0), jnp.zeros((1, 224, 224, 3))
  )
  assert 'batch_stats' not in baseline


def _official_state_dict(seed: int = 0) -> dict[str, np.ndarray]:
  """Random arrays under the official key names and shapes for TINY (dvit_repo layout)."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape, scale=0.1: (scale * rng.normal(size=shape)).astype(np.float32)
  positive = lambda *shape: rng.uniform(0.5, 1.5, size=shape).astype(np.float32)

  def batch_norm(prefix, channels):
    return {
        f'{prefix}.weight': positive(channels),
        f'{prefix}.bias': normal(channels),
        f'{prefix}.running_mean': normal(channels),
        f'{prefix}.running_var': positive(channels),
        f'{prefix}.num_batches_tracked': np.array(0, np.int64),
    }

  sd = {
      'patch_embed.conv1.weight': normal(64, 3, 7, 7),
      **batch_norm('patch_embed.bn1', 64),
      'patch_embed.conv2.weight': normal(64, 64, 3, 3, scale=0.05),
      **batch_norm('patch_embed.bn2', 64),
      'patch_embed.proj.weight': normal(D, 64, 2, 2),
      'patch_embed.proj.bias': normal(D),
      'cls_token': normal(1, 1, D),
      'pos_embed': normal(1, 17, D),
      'norm.weight': positive(D),
      'norm.bias': normal(D),
      'head.weight': normal(CLASSES, D),
      'head.bias': normal(CLASSES),
  }
  for i in range(3):
    p = f'blocks.{i}.'
    sd.update(
        {
            p + 'norm1.weight': positive(D),
            p + 'norm1.bias': normal(D),
            p + 'attn.qkv.weight': normal(3 * D, D, scale=0.3),
            p + 'attn.qkv.bias': normal(3 * D),
            p + 'attn.proj.weight': normal(D, D),
            p + 'attn.proj.bias': normal(D),
            p + 'norm2.weight': positive(D),
            p + 'norm2.bias': normal(D),
            p + 'mlp.fc1.weight': normal(3 * D, D),
            p + 'mlp.fc1.bias': normal(3 * D),
            p + 'mlp.fc2.weight': normal(D, 3 * D),
            p + 'mlp.fc2.bias': normal(D),
        }
    )
    if i >= 1:
      sd.update(
          {
              p + 'attn.reatten_matrix.weight': normal(H, H, 1, 1, scale=0.5),
              p + 'attn.reatten_matrix.bias': normal(H),
              **batch_norm(p + 'attn.var_norm', H),
          }
      )
  return sd


def _layer_norm(x, weight, bias, eps):
  mean = x.mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + eps) * weight + bias


def _linear(sd, name, x):
  return x @ sd[f'{name}.weight'].T + sd[f'{name}.bias']


def _block(sd, i, x, s, re_attention, transform_scale):
  """DeepViT, Eq. 3 and dvit_repo: x + Attn(LN1(s x)) / s, x + MLP(LN2(s x)) / s; A' = BN(Theta A) c, BN in eval."""
  p = f'blocks.{i}.'
  b, n, _ = x.shape
  hd = D // H
  y = _layer_norm(s * x, sd[p + 'norm1.weight'], sd[p + 'norm1.bias'], 1e-6)
  q, k, v = _linear(sd, p + 'attn.qkv', y).reshape(b, n, 3, H, hd).transpose(2, 0, 3, 1, 4)
  scores = q @ k.transpose(0, 1, 3, 2) * hd**-0.5
  attn = np.exp(scores - scores.max(-1, keepdims=True))
  attn /= attn.sum(-1, keepdims=True)
  if re_attention:
    theta = sd[p + 'attn.reatten_matrix.weight'][:, :, 0, 0]
    attn = (
        np.einsum('gh,bhqk->bgqk', theta, attn)
        + sd[p + 'attn.reatten_matrix.bias'][None, :, None, None]
    )
    bn = {
        name: sd[f'{p}attn.var_norm.{name}'][None, :, None, None]
        for name in ('weight', 'bias', 'running_mean', 'running_var')
    }
    attn = (attn - bn['running_mean']) / np.sqrt(bn['running_var'] + 1e-5) * bn['weight'] + bn[
        'bias'
    ]
    attn = attn * (hd**-0.5 if transform_scale else 1.0)
  heads = (attn @ v).transpose(0, 2, 1, 3).reshape(b, n, D)
  x = x + _linear(sd, p + 'attn.proj', heads) / s
  y = _layer_norm(s * x, sd[p + 'norm2.weight'], sd[p + 'norm2.bias'], 1e-6)
  hidden = _linear(sd, p + 'mlp.fc1', y)
  hidden = 0.5 * hidden * (1 + special.erf(hidden / np.sqrt(2)))
  return x + _linear(sd, p + 'mlp.fc2', hidden) / s


def _stem(sd, images):
  """The CNN stem in eval mode, evaluated with torch's own conv and batch norm."""
  import torch  # pylint: disable=g-import-not-at-top

  f = torch.nn.functional
  t = {k: torch.from_numpy(np.asarray(v)) for k, v in sd.items() if k.startswith('patch_embed')}
  x = torch.from_numpy(images.transpose(0, 3, 1, 2))
  for i, padding, stride in ((1, 3, 2), (2, 1, 1)):
    x = f.conv2d(x, t[f'patch_embed.conv{i}.weight'], stride=stride, padding=padding)
    x = f.relu(
        f.batch_norm(
            x,
            t[f'patch_embed.bn{i}.running_mean'],
            t[f'patch_embed.bn{i}.running_var'],
            t[f'patch_embed.bn{i}.weight'],
            t[f'patch_embed.bn{i}.bias'],
            training=False,
            eps=1e-5,
        )
    )
  x = f.conv2d(x, t['patch_embed.proj.weight'], t['patch_embed.proj.bias'], stride=2)
  return x.flatten(2).transpose(1, 2).numpy().astype(np.float64)


def test_official_state_dict_loads_and_matches_numpy_reference():
  pytest.importorskip('torch')
  sd = _official_state_dict()
  variables = deepvit.from_dvit_repo(sd)
  model = deepvit.DeepViT(**TINY)
  images = np.random.default_rng(1).normal(size=(2, 16, 16, 3)).astype(np.float32)
  template = jax.eval_shape(model.init, jax.random.key(0), jnp.asarray(images))
  assert jax.tree_util.tree_structure(template) == jax.tree_util.tree_structure(
      jax.tree_util.tree_map(jnp.asarray, variables)
  )
  jax.tree_util.tree_map(
      lambda t, v: np.testing.assert_equal(t.shape, v.shape), template, variables
  )
  apply = jax.jit(
      functools.partial(model.apply, capture_intermediates=True, mutable=['intermediates'])
  )
  logits, state = apply(variables, jnp.asarray(images))
  captured = state['intermediates']
  sd64 = {k: np.asarray(v, np.float64) for k, v in sd.items()}
  tokens = _stem(sd, images)
  stem_tokens = captured['patch_embed']['__call__'][0]  # (batch, rows, cols, width)
  np.testing.assert_allclose(stem_tokens.reshape(tokens.shape), tokens, atol=1e-4)
  x = np.concatenate([np.broadcast_to(sd64['cls_token'], (2, 1, D)), tokens], 1) + sd64['pos_embed']
  for i in range(3):
    x = _block(sd64, i, x, 0.5, re_attention=i >= 1, transform_scale=True)
    np.testing.assert_allclose(captured[f'blocks_{i}']['__call__'][0], x, atol=2e-4)
  expected = _linear(
      sd64, 'head', _layer_norm(x[:, 0], sd64['norm.weight'], sd64['norm.bias'], 1e-6)
  )
  np.testing.assert_allclose(logits, expected, atol=2e-4)
  assert np.abs(expected).max() > 0.1
  # Block 1 alone, from the reference block 0 output: the per-block error stays at float32 level.
  x0 = np.asarray(captured['blocks_0']['__call__'][0], np.float64)
  np.testing.assert_allclose(
      captured['blocks_1']['__call__'][0],
      _block(sd64, 1, x0, 0.5, re_attention=True, transform_scale=True),
      atol=2e-5,
  )


def test_from_timm_and_to_timm_are_inverses():
  sd = _official_state_dict()
  restored = deepvit.to_dvit_repo(deepvit.from_dvit_repo(sd))
  assert set(restored) == set(sd)
  for key, value in sd.items():
    np.testing.assert_array_equal(restored[key], value, err_msg=key)
  with pytest.raises(ValueError, match='blocks.0.attn.qkv.kernel'):
    deepvit.from_dvit_repo({**sd, 'blocks.0.attn.qkv.kernel': sd['blocks.0.attn.qkv.weight']})


def test_layer_norm_re_attention_runs_but_has_no_official_layout():
  model = deepvit.DeepViT(
      **dict(TINY, stem='patch'),
      attention_settings=parts.ReAttentionSettings(re_attention_norm='layer'),
  )
  variables = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))
  assert 'batch_stats' not in variables
  assert variables['params']['blocks_2']['attn']['reattn_weights'].shape == (H, H)
  with pytest.raises(ValueError, match="re_attention_norm='batch'"):
    deepvit.to_dvit_repo(variables)


@pytest.mark.parametrize(
    'overrides, message',
    [
        (dict(re_attention_blocks=4), 're_attention_blocks=4'),
        (dict(attention_settings=parts.ReAttentionSettings(re_attention_norm='group')), 'group'),
        (dict(patch_size=5), 'patch_size=5'),
        (dict(scale_adjustment=0.0), 'scale_adjustment=0.0'),
    ],
)
def test_bad_configuration_raises_value_error(overrides, message):
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(
        deepvit.DeepViT(**dict(TINY, **overrides)).init,
        jax.random.key(0),
        jnp.zeros((1, 20, 20, 3)),
    )


def test_tiny_model_trains_and_updates_batch_stats():
  model = deepvit.DeepViT(
      **dict(TINY, depth=2, re_attention_blocks=1), drop_path_rate=0.1, dropout_rate=0.1
  )
  images = jax.random.normal(jax.random.key(1), (8, 8, 8, 3))
  labels = jnp.arange(8) % CLASSES
  variables = jax.jit(model.init)(jax.random.key(0), images)
  params, batch_stats = variables['params'], variables['batch_stats']
  optimizer = optax.adam(3e-3)
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, batch_stats, opt_state, rng):
    def loss_fn(p):
      logits, state = model.apply(
          {'params': p, 'batch_stats': batch_stats},
          images,
          train=True,
          rngs={'dropout': rng},
          mutable=['batch_stats'],
      )
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
      return loss, state['batch_stats']

    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state)
    return optax.apply_updates(params, updates), batch_stats, opt_state, loss

  losses = []
  for i in range(15):
    params, batch_stats, opt_state, loss = step(params, batch_stats, opt_state, jax.random.key(i))
    losses.append(float(loss))
  assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])
  moved = batch_stats['blocks_1']['attn']['var_norm']['mean']
  assert not np.allclose(moved, variables['batch_stats']['blocks_1']['attn']['var_norm']['mean'])
  assert not np.allclose(batch_stats['patch_embed']['bn1']['var'], 1.0)
