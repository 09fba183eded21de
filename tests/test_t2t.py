"""T2T-ViT: Unfold order, sinusoid table, sizes, official layout vs NumPy of the T2T-ViT paper's Eq. 1-4, training."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import special

from vit_jax import models
from vit_jax.schema import parts
from vit_jax.models import stems
from vit_jax.models import t2t

TOKEN_DIM, D, HEADS, CLASSES = 8, 16, 2, 5
SPLITS = ((3, 2, 1), (3, 2, 1), (3, 2, 1))  # 16x16 images: 8x8, 4x4, then 2x2 tokens.
TINY = dict(
    num_classes=CLASSES,
    hidden_size=D,
    depth=1,
    num_heads=HEADS,
    stem_settings=parts.T2TSettings(token_dim=TOKEN_DIM, soft_splits=SPLITS),
)


def _tiny(**stem_settings) -> dict:
  """TINY with these of its `stem_settings` replaced."""
  return dict(TINY, stem_settings=dataclasses.replace(TINY['stem_settings'], **stem_settings))


def _unfold(x_nhwc: np.ndarray, kernel: int, stride: int, padding: int) -> np.ndarray:
  torch = pytest.importorskip('torch')
  unfold = torch.nn.Unfold(kernel, stride=stride, padding=padding)
  return (
      unfold(torch.from_numpy(np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2))))
      .transpose(1, 2)
      .numpy()
  )


@pytest.mark.parametrize(
    'shape, split',
    [
        ((2, 20, 16, 3), (7, 4, 2)),
        ((1, 9, 9, 5), (3, 2, 1)),
        ((2, 8, 8, 4), (3, 1, 1)),
        ((1, 32, 32, 3), (7, 2, 3)),
    ],
)
def test_soft_split_matches_torch_unfold(shape, split):
  x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
  tokens, grid = stems.soft_split(jnp.asarray(x), *split)
  expected = _unfold(x, *split)
  assert tokens.shape == expected.shape and grid[0] * grid[1] == expected.shape[1]
  np.testing.assert_array_equal(tokens, expected)


def test_sinusoid_table_matches_the_official_formula():
  n, d = 7, 10
  table = t2t.sinusoid_table(n, d)
  for pos in range(n):
    for j in range(d):
      angle = pos / math.pow(10000, 2 * (j // 2) / d)
      assert table[0, pos, j] == pytest.approx(
          math.sin(angle) if j % 2 == 0 else math.cos(angle), abs=1e-6
      )


def _counts(name: str) -> tuple[int, int]:
  """(trainable, fixed) parameter counts at 224x224."""
  shapes = jax.eval_shape(models.create(name).init, jax.random.key(0), jnp.zeros((1, 224, 224, 3)))
  counts = [0, 0]
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes['params'])[0]:
    counts[path[-1].key in t2t.FIXED_PARAMS] += int(np.prod(leaf.shape))
  return tuple(counts)


@pytest.mark.parametrize(
    'name, fixed', [('t2t_vit_14', 197 * 384 + 2 * 32 * 64), ('t2t_vit_t_14', 197 * 384)]
)
def test_param_counts_match_spec(name, fixed):
  trainable, fixed_count = _counts(name)
  assert abs(trainable / 1e6 - 21.47) <= 0.01
  assert fixed_count == fixed


def _layer_norm(x, sd, name, eps=1e-5):
  mean = x.mean(-1, keepdims=True)
  normed = (x - mean) / np.sqrt(x.var(-1, keepdims=True) + eps)
  return normed * sd[f'{name}.weight'] + sd[f'{name}.bias']


def _linear(sd, name, x):
  return x @ sd[f'{name}.weight'].T + sd.get(f'{name}.bias', 0.0)


def _gelu(x):
  return 0.5 * x * (1 + special.erf(x / np.sqrt(2)))


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _token_transformer(sd, p, x):
  """T2T-ViT official token_transformer.py: y = LN1(x); A = softmax((q d_in^-1/2) k^T); x = v + proj(A v); x + MLP(LN2(x))."""
  q, k, v = np.split(_linear(sd, p + 'attn.qkv', _layer_norm(x, sd, p + 'norm1')), 3, axis=-1)
  attn = _softmax((q * x.shape[-1] ** -0.5) @ k.transpose(0, 2, 1))
  x = v + _linear(sd, p + 'attn.proj', attn @ v)
  return x + _linear(
      sd, p + 'mlp.fc2', _gelu(_linear(sd, p + 'mlp.fc1', _layer_norm(x, sd, p + 'norm2')))
  )


def _token_performer(sd, p, x):
  """Token_performer: k, q, v = kqv(LN1(x)); phi(z) = exp(w z - |z|^2 / 2) / sqrt(m)."""
  k, q, v = np.split(_linear(sd, p + 'kqv', _layer_norm(x, sd, p + 'norm1')), 3, axis=-1)
  w = sd[p + 'w']
  phi = lambda z: np.exp(z @ w.T - 0.5 * (z * z).sum(-1, keepdims=True)) / np.sqrt(w.shape[0])
  qp, kp = phi(q), phi(k)
  normaliser = (qp @ kp.sum(1)[:, :, None]) + 1e-8
  y = v + _linear(sd, p + 'proj', (qp @ (kp.transpose(0, 2, 1) @ v)) / normaliser)
  return y + _linear(
      sd, p + 'mlp.2', _gelu(_linear(sd, p + 'mlp.0', _layer_norm(y, sd, p + 'norm2')))
  )


def _backbone_block(sd, p, x):
  b, n, _ = x.shape
  qkv = _linear(sd, p + 'attn.qkv', _layer_norm(x, sd, p + 'norm1'))
  q, k, v = qkv.reshape(b, n, 3, HEADS, D // HEADS).transpose(2, 0, 3, 1, 4)
  attn = _softmax(q @ k.transpose(0, 1, 3, 2) * (D // HEADS) ** -0.5)
  x = x + _linear(sd, p + 'attn.proj', (attn @ v).transpose(0, 2, 1, 3).reshape(b, n, D))
  return x + _linear(
      sd, p + 'mlp.fc2', _gelu(_linear(sd, p + 'mlp.fc1', _layer_norm(x, sd, p + 'norm2')))
  )


def _official_state_dict(tokens_type: str, seed: int = 0) -> dict[str, np.ndarray]:
  """Random arrays under the official T2T-ViT key names and shapes for TINY."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape, scale=0.2: (scale * rng.normal(size=shape)).astype(np.float32)
  norm = lambda prefix, n: {f'{prefix}.weight': (1 + normal(n)), f'{prefix}.bias': normal(n)}
  linear = lambda prefix, n_out, n_in, bias=True: {
      f'{prefix}.weight': normal(n_out, n_in),
      **({f'{prefix}.bias': normal(n_out)} if bias else {}),
  }
  sd = {
      'cls_token': normal(1, 1, D),
      'pos_embed': t2t.sinusoid_table(5, D),
      **linear('tokens_to_token.project', D, TOKEN_DIM * 9),
      **norm('norm', D),
      **linear('head', CLASSES, D),
      **norm('blocks.0.norm1', D),
      **norm('blocks.0.norm2', D),
      **linear('blocks.0.attn.qkv', 3 * D, D, bias=False),
      **linear('blocks.0.attn.proj', D, D),
      **linear('blocks.0.mlp.fc1', 3 * D, D),
      **linear('blocks.0.mlp.fc2', D, 3 * D),
  }
  for i, d_in in ((1, 3 * 9), (2, TOKEN_DIM * 9)):
    p = f'tokens_to_token.attention{i}.'
    sd.update({**norm(p + 'norm1', d_in), **norm(p + 'norm2', TOKEN_DIM)})
    if tokens_type == 'transformer':
      sd.update(
          {
              **linear(p + 'attn.qkv', 3 * TOKEN_DIM, d_in, bias=False),
              **linear(p + 'attn.proj', TOKEN_DIM, TOKEN_DIM),
              **linear(p + 'mlp.fc1', TOKEN_DIM, TOKEN_DIM),
              **linear(p + 'mlp.fc2', TOKEN_DIM, TOKEN_DIM),
          }
      )
    else:
      sd.update(
          {
              **linear(p + 'kqv', 3 * TOKEN_DIM, d_in),
              **linear(p + 'proj', TOKEN_DIM, TOKEN_DIM),
              **linear(p + 'mlp.0', TOKEN_DIM, TOKEN_DIM),
              **linear(p + 'mlp.2', TOKEN_DIM, TOKEN_DIM),
              p
              + 'w': np.linalg.qr(rng.normal(size=(TOKEN_DIM, TOKEN_DIM // 2)))[0].T.astype(
                  np.float32
              )
              * np.float32(np.sqrt(TOKEN_DIM // 2)),
          }
      )
  return sd


@pytest.mark.parametrize('tokens_type', stems.TOKENS_TYPES)
def test_official_state_dict_loads_and_matches_numpy_reference(tokens_type):
  sd = _official_state_dict(tokens_type)
  variables = t2t.from_t2t_repo(sd)
  model = t2t.T2TViT(**_tiny(tokens_type=tokens_type))
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
  captured = state['intermediates']['tokens_to_token']
  sd64 = {k: np.asarray(v, np.float64) for k, v in sd.items()}
  token_block = _token_transformer if tokens_type == 'transformer' else _token_performer
  x, size = _unfold(images, *SPLITS[0]).astype(np.float64), 8
  for i in (1, 2):
    # One token block from the model's own input: float32 rounding only.
    x = token_block(sd64, f'tokens_to_token.attention{i}.', x)
    np.testing.assert_allclose(captured[f'attention{i}']['__call__'][0], x, atol=1e-5)
    x = _unfold(x.reshape(2, size, size, TOKEN_DIM), *SPLITS[i]).astype(np.float64)
    size //= 2
  x = _linear(sd64, 'tokens_to_token.project', x)
  x = np.concatenate([np.broadcast_to(sd64['cls_token'], (2, 1, D)), x], 1) + sd64['pos_embed']
  x = _backbone_block(sd64, 'blocks.0.', x)
  expected = _linear(sd64, 'head', _layer_norm(x[:, 0], sd64, 'norm'))
  assert np.abs(expected).max() > 0.1
  np.testing.assert_allclose(logits, expected, atol=1e-4)


@pytest.mark.parametrize('tokens_type', stems.TOKENS_TYPES)
def test_from_timm_and_to_timm_are_inverses(tokens_type):
  sd = _official_state_dict(tokens_type)
  restored = t2t.to_t2t_repo(t2t.from_t2t_repo(sd))
  assert set(restored) == set(sd)
  for key, value in sd.items():
    np.testing.assert_array_equal(restored[key], value, err_msg=key)
  with pytest.raises(ValueError, match='tokens_to_token.attention1.v'):
    t2t.from_t2t_repo({**sd, 'tokens_to_token.attention1.v': sd['cls_token']})


def test_init_pos_embed_is_the_sinusoid_table_and_features_are_orthogonal():
  model = t2t.T2TViT(**_tiny(token_dim=64, tokens_type='performer'))
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))['params']
  np.testing.assert_array_equal(params['pos_embed'], t2t.sinusoid_table(5, D))
  w = np.asarray(params['tokens_to_token']['attention1']['random_features'])
  assert w.shape == (32, 64)
  np.testing.assert_allclose(w @ w.T, 32 * np.eye(32), atol=1e-4)


def test_fixed_parameters_get_zero_gradient_and_the_model_trains():
  model = t2t.T2TViT(**_tiny(soft_splits=SPLITS[:2], tokens_type='performer'), drop_path_rate=0.1)
  images = jax.random.normal(jax.random.key(1), (8, 16, 16, 3))
  labels = jnp.arange(8) % CLASSES
  params = jax.jit(model.init)(jax.random.key(0), images)['params']
  optimizer = optax.adam(1e-2)
  opt_state = optimizer.init(params)

  def loss_fn(p, rng):
    logits = model.apply({'params': p}, images, train=True, rngs={'dropout': rng})
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  @jax.jit
  def step(params, opt_state, rng):
    loss, grads = jax.value_and_grad(loss_fn)(params, rng)
    updates, opt_state = optimizer.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss, grads

  losses = []
  for i in range(20):
    params, opt_state, loss, grads = step(params, opt_state, jax.random.key(i))
    losses.append(float(loss))
  assert np.mean(losses[-3:]) < 0.75 * np.mean(losses[:3])
  for path, grad in jax.tree_util.tree_flatten_with_path(grads)[0]:
    fixed = path[-1].key in t2t.FIXED_PARAMS
    assert (not np.any(grad)) == fixed, jax.tree_util.keystr(path)


@pytest.mark.parametrize(
    'overrides, image_size, message',
    [
        (dict(stem_settings=parts.T2TSettings(tokens_type='convolution')), 16, 'convolution'),
        (dict(stem_settings=parts.T2TSettings(token_dim=0)), 16, 'token_dim=0 must be >= 1'),
        (dict(stem_settings=parts.T2TSettings(soft_splits=((3, 0, 1),))), 16, 'soft_splits'),
        (dict(stem_settings=parts.T2TSettings(soft_splits=((7, 4, 0),))), 4, 'too small'),
    ],
)
def test_bad_configuration_raises_value_error(overrides, image_size, message):
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(
        t2t.T2TViT(**dict(TINY, **overrides)).init,
        jax.random.key(0),
        jnp.zeros((1, image_size, image_size, 3)),
    )


# Published parameter counts (official README), every parameter counted as the official code's
# `model.parameters()` does, the fixed sinusoid table and Performer features included.
PUBLISHED_MILLIONS = {
    't2t_vit_7': 4.3,
    't2t_vit_10': 5.9,
    't2t_vit_12': 6.9,
    't2t_vit_14': 21.5,
    't2t_vit_19': 39.2,
    't2t_vit_24': 64.1,
    't2t_vit_t_14': 21.5,
    't2t_vit_t_19': 39.2,
    't2t_vit_t_24': 64.1,
}


@pytest.mark.parametrize('name', sorted(PUBLISHED_MILLIONS))
def test_every_published_size_has_its_parameter_count(name):
  assert round(sum(_counts(name)) / 1e6, 1) == PUBLISHED_MILLIONS[name]


@pytest.mark.parametrize('name', ['t2t_vit_7', 't2t_vit_t_14'])
def test_official_model_code_and_released_checkpoint_layout(name, tmp_path):
  """The official T2T_ViT of the same size, randomised, saved as the released .pth.tar files are
  (`state_dict_ema` beside `state_dict`), loads with the same logits (64 px: 16 tokens)."""
  torch = pytest.importorskip('torch')
  from vit_jax.weights import pretrained  # pylint: disable=g-import-not-at-top
  from vit_jax.benchmarks import timm_reference  # pylint: disable=g-import-not-at-top

  timm_reference.import_timm()
  from tests.reference import t2t_vit as official  # pylint: disable=g-import-not-at-top

  width, depth, heads, mlp_ratio = t2t.SIZES[name.rsplit('_', 1)[-1]]
  torch.manual_seed(0)
  reference = official.T2T_ViT(
      img_size=64,
      tokens_type='transformer' if '_t_' in name else 'performer',
      num_classes=7,
      embed_dim=width,
      depth=depth,
      num_heads=heads,
      mlp_ratio=mlp_ratio,
  ).eval()
  with torch.no_grad():
    for key, value in reference.state_dict().items():
      if key != 'pos_embed' and not key.endswith('.w'):
        value.add_(0.05 * torch.randn_like(value))
  ema = reference.state_dict()
  raw = {key: torch.zeros_like(value) for key, value in ema.items()}
  path = str(tmp_path / 'released.pth.tar')
  torch.save({'state_dict': raw, 'state_dict_ema': ema, 'epoch': 309}, path)
  model = models.create(name, num_classes=7)
  images = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype(np.float32)
  logits = jax.jit(model.apply)(pretrained.load(path, model, image_size=64), images)
  with torch.no_grad():
    expected = reference(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
  assert np.abs(expected).max() > 0.1
  np.testing.assert_allclose(logits, expected, atol=2e-4, rtol=1e-4)
