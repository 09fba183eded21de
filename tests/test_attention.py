"""Attention variants against direct NumPy evaluations of the papers' equations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.models import attention
from vit_jax.models import numerics
from vit_jax.schema import parts

B, N, D, H = 2, 6, 12, 3
HD = D // H
RNG = np.random.default_rng(0)
X = RNG.normal(size=(B, N, D)).astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _np(tree):
  return jax.tree_util.tree_map(np.asarray, tree)


def _run(module, x, *, train=False, rng=0, mutable=('intermediates',)):
  """Initialises with random non-zero biases, applies; returns params, output, probs, state."""
  variables = module.init(jax.random.key(rng), x)
  variables = jax.tree_util.tree_map_with_path(
      lambda path, v: v + 0.1 * jax.random.normal(jax.random.key(len(path)), v.shape)
      if path[-1].key == 'bias'
      else v,
      variables,
  )
  out, state = module.apply(variables, x, train=train, mutable=list(mutable))
  (probs,) = state['intermediates']['attention_probs']
  return _np(variables), np.asarray(out), np.asarray(probs), state


def _dense(params, x):
  return x @ params['kernel'] + params.get('bias', 0.0)


def _heads(x, heads):
  """(B, N, heads * hd) -> (B, heads, N, hd)."""
  return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3)


def _merge(x):
  return x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)


def _qkv(params, x, heads):
  qkv = _dense(params['qkv'], x).reshape(x.shape[0], x.shape[1], 3, heads, -1)
  return [qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]


def _mix(t, dense):
  """Head mixing: out[g] = sum_h t[h] W[g, h] + b[g], with the Flax kernel K[h, g] = W[g, h]."""
  return np.einsum('bhqk,hg->bgqk', t, dense['kernel']) + dense['bias'][None, :, None, None]


def test_content_attention():
  v, out, probs, _ = _run(attention.SelfAttention(num_heads=H), X)
  p = v['params']
  q, k, val = _qkv(p, X, H)
  expected = _softmax((q * HD**-0.5) @ k.transpose(0, 1, 3, 2))
  np.testing.assert_allclose(probs, expected, atol=1e-6)
  np.testing.assert_allclose(out, _dense(p['proj'], _merge(expected @ val)), atol=1e-5)
  assert probs.shape == (B, H, N, N)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)


def test_talking_heads_attention():
  v, out, probs, _ = _run(attention.SelfAttention(num_heads=H, head_mixing='talking_heads'), X)
  p = v['params']
  q, k, val = _qkv(p, X, H)
  scores = _mix((q * HD**-0.5) @ k.transpose(0, 1, 3, 2), p['proj_l'])
  expected = _mix(_softmax(scores), p['proj_w'])
  np.testing.assert_allclose(probs, expected, atol=1e-5)
  np.testing.assert_allclose(out, _dense(p['proj'], _merge(expected @ val)), atol=1e-5)


@pytest.mark.parametrize('train', [True, False])
@pytest.mark.parametrize('scale', [True, False])
def test_re_attention_batch_norm(train, scale):
  module = attention.SelfAttention(
      num_heads=H, head_mixing='re_attention', re_attention_scale=scale
  )
  v, out, probs, state = _run(module, X, train=train, mutable=('intermediates', 'batch_stats'))
  p = v['params']
  q, k, val = _qkv(p, X, H)
  mixed = _mix(_softmax((q * HD**-0.5) @ k.transpose(0, 1, 3, 2)), p['reatten_matrix'])
  if train:  # Statistics over (batch, queries, keys) per head; running stats with momentum 0.9.
    mean, var = mixed.mean((0, 2, 3)), mixed.var((0, 2, 3))
    np.testing.assert_allclose(state['batch_stats']['var_norm']['mean'], 0.1 * mean, atol=1e-6)
    np.testing.assert_allclose(state['batch_stats']['var_norm']['var'], 0.9 + 0.1 * var, atol=1e-6)
  else:
    mean, var = np.zeros(H), np.ones(H)
  bn = p['var_norm']
  normed = (mixed - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * bn['scale'][
      :, None, None
  ] + bn['bias'][:, None, None]
  expected = normed * (HD**-0.5 if scale else 1.0)
  np.testing.assert_allclose(probs, expected, atol=1e-4)
  np.testing.assert_allclose(out, _dense(p['proj'], _merge(expected @ val)), atol=1e-4)
  bound = 1 / np.sqrt(H)  # Theta and its bias keep PyTorch's default Conv2d init.
  assert np.abs(p['reatten_matrix']['kernel']).max() <= bound


def test_re_attention_layer_norm():
  module = attention.SelfAttention(
      num_heads=H, head_mixing='re_attention', re_attention_norm='layer'
  )
  v, out, probs, _ = _run(module, X)
  p = v['params']
  q, k, val = _qkv(p, X, H)
  mixed = np.einsum(
      'bhqk,hg->bgqk', _softmax((q * HD**-0.5) @ k.transpose(0, 1, 3, 2)), p['reattn_weights']
  )
  mean, var = mixed.mean(1, keepdims=True), mixed.var(1, keepdims=True)
  ln = p['reattn_norm']
  expected = (mixed - mean) / np.sqrt(var + 1e-5) * ln['scale'][None, :, None, None] + ln['bias'][
      None, :, None, None
  ]
  np.testing.assert_allclose(probs, expected, atol=1e-4)
  np.testing.assert_allclose(out, _dense(p['proj'], _merge(expected @ val)), atol=1e-4)
  assert 'reatten_matrix' not in p and p['reattn_weights'].shape == (H, H)


def test_class_attention():
  v, out, probs, _ = _run(attention.ClassAttention(num_heads=H), X)
  p = v['params']
  q = _heads(_dense(p['q'], X[:, :1]), H) * HD**-0.5
  k, val = _heads(_dense(p['k'], X), H), _heads(_dense(p['v'], X), H)
  expected = _softmax(q @ k.transpose(0, 1, 3, 2))
  assert probs.shape == (B, H, 1, N) and out.shape == (B, 1, D)
  np.testing.assert_allclose(probs, expected, atol=1e-6)
  np.testing.assert_allclose(out, _dense(p['proj'], _merge(expected @ val)), atol=1e-5)


@pytest.mark.parametrize('heads', [1, 2])
def test_token_attention(heads):
  features = 8
  v, out, probs, _ = _run(attention.TokenAttention(features=features, num_heads=heads), X)
  p = v['params']
  assert 'bias' not in p['qkv'] and p['qkv']['kernel'].shape == (D, 3 * features)
  q, k, val = _qkv(p, X, heads)
  expected = _softmax((q * (D // heads) ** -0.5) @ k.transpose(0, 1, 3, 2))
  np.testing.assert_allclose(probs, expected, atol=1e-6)
  np.testing.assert_allclose(
      out, _merge(val) + _dense(p['proj'], _merge(expected @ val)), atol=1e-5
  )
  assert out.shape == (B, N, features)


def _grid_offsets(rows, cols):
  pos = np.array([(r, c) for r in range(rows) for c in range(cols)])
  return pos[None, :, :] - pos[:, None, :]  # key - query.


@pytest.mark.parametrize('scores', ['quadratic', 'gaussian'])
def test_gaussian_scores(scores):
  rows, cols, width = 3, 4, 5
  x = RNG.normal(size=(B, rows, cols, width)).astype(np.float32)
  v, out, probs, _ = _run(attention.PositionalAttention(num_heads=4, scores=scores), x)
  p = v['params']
  spreads = p['attention_spreads']
  if scores == 'quadratic':
    assert spreads.shape == (4,) and np.abs(spreads - 1).max() < 0.05
    inverse_cov = spreads[:, None, None] ** 2 * np.eye(2)
  else:
    assert spreads.shape == (4, 2, 2) and np.abs(spreads - np.eye(2)).max() < 0.05
    inverse_cov = spreads @ spreads.transpose(0, 2, 1)
  # -1/2 (delta - mu)^T Sigma^-1 (delta - mu): equals v_h . r_delta up to a per-head constant.
  diff = _grid_offsets(rows, cols)[None] - p['attention_centers'][:, None, None, :]
  expected = _softmax(-0.5 * np.einsum('hqki,hij,hqkj->hqk', diff, inverse_cov, diff))
  np.testing.assert_allclose(probs, np.broadcast_to(expected, (B,) + expected.shape), atol=1e-5)
  tokens = x.reshape(B, rows * cols, width)
  heads = np.einsum('hqk,bkd->bqhd', expected, tokens).reshape(B, rows * cols, -1)
  np.testing.assert_allclose(
      out.reshape(B, rows * cols, width), _dense(p['value'], heads), atol=1e-5
  )


def test_quadratic_attention_with_large_alpha_is_a_shift():
  # Lemma 2: as alpha = s^2 / 2 grows, each head attends to exactly query + Delta.
  rows = cols = 5
  module = attention.PositionalAttention(num_heads=2, scores='quadratic')
  x = jnp.zeros((1, rows, cols, 4))
  variables = module.init(jax.random.key(0), x)
  params = dict(variables['params'])
  params['attention_centers'] = jnp.array([[1.0, 0.0], [-1.0, 1.0]])
  params['attention_spreads'] = jnp.full((2,), np.sqrt(2 * 46.0))
  _, state = module.apply({'params': params}, x, mutable=['intermediates'])
  (probs,) = state['intermediates']['attention_probs']
  query = 2 * cols + 2  # The centre pixel (2, 2).
  np.testing.assert_allclose(probs[0, 0, query, 3 * cols + 2], 1.0, atol=1e-6)
  np.testing.assert_allclose(probs[0, 1, query, 1 * cols + 3], 1.0, atol=1e-6)


@pytest.mark.parametrize('use_content', [False, True])
def test_learned_relative_scores(use_content):
  rows, cols, width, heads, max_grid, dim_p = 3, 4, 5, 3, 6, 7
  x = RNG.normal(size=(B, rows, cols, width)).astype(np.float32)
  module = attention.PositionalAttention(
      num_heads=heads,
      scores='learned',
      use_content=use_content,
      max_grid_size=max_grid,
      settings=parts.PositionalSettings(position_encoding_size=dim_p),
  )
  v, out, probs, _ = _run(module, x)
  p = v['params']
  assert p['row_embeddings'].shape == (2 * max_grid - 1, dim_p)
  delta = _grid_offsets(rows, cols) + max_grid - 1
  scores = (
      p['row_embeddings'][delta[..., 0]] @ p['head_keys_row']['kernel']
      + p['col_embeddings'][delta[..., 1]] @ p['head_keys_col']['kernel']
  )
  scores = np.broadcast_to(scores.transpose(2, 0, 1), (B, heads, rows * cols, rows * cols))
  tokens = x.reshape(B, rows * cols, width)
  if use_content:
    q = _heads(_dense(p['query'], tokens), heads)
    k = _heads(_dense(p['key'], tokens), heads)
    scores = scores + q @ k.transpose(0, 1, 3, 2) / np.sqrt(width)
  else:
    assert 'query' not in p
  expected = _softmax(scores)
  np.testing.assert_allclose(probs, expected, atol=1e-5)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
  heads_out = np.einsum('bhqk,bkd->bqhd', expected, tokens).reshape(B, rows * cols, -1)
  np.testing.assert_allclose(
      out.reshape(B, rows * cols, width), _dense(p['value'], heads_out), atol=1e-5
  )


@pytest.mark.parametrize(
    'module',
    [
        attention.SelfAttention(num_heads=4),
        attention.ClassAttention(num_heads=4),
        attention.TokenAttention(features=8, num_heads=2),
    ],
)
def test_fast_path_equals_explicit_path(module):
  x = jax.random.normal(jax.random.key(1), (2, 17, 24))
  variables = module.init(jax.random.key(0), x)
  fast = module.apply(variables, x)
  explicit, _ = module.apply(variables, x, mutable=['intermediates'])
  np.testing.assert_allclose(fast, explicit, atol=1e-5)


@pytest.mark.parametrize('queries, chunk_size', [(10, 4), (12, 4), (7, 16)])
def test_chunked_attention_equals_full_attention(queries, chunk_size):
  q, k, v = (
      jax.random.normal(key, (2, n, 3, 8))
      for key, n in zip(jax.random.split(jax.random.key(0), 3), (queries, 9, 9))
  )
  weights = jax.random.normal(jax.random.key(1), (2, queries, 3, 8))

  def loss(attend, q, k, v):
    return jnp.sum(attend(q, k, v) * weights)

  chunked = lambda q, k, v: numerics.chunked_attention(q, k, v, chunk_size=chunk_size)
  full = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, scale=1.0)
  np.testing.assert_allclose(chunked(q, k, v), full(q, k, v), atol=1e-5)
  for a, b in zip(
      jax.grad(loss, argnums=(1, 2, 3))(chunked, q, k, v),
      jax.grad(loss, argnums=(1, 2, 3))(full, q, k, v),
  ):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_long_sequences_take_chunked_attention_on_cpu(monkeypatch):
  module = attention.TokenAttention(features=8, num_heads=2)
  x = jax.random.normal(jax.random.key(1), (2, 40, 24))
  variables = module.init(jax.random.key(0), x)
  full = module.apply(variables, x)
  calls, chunked = [], numerics.chunked_attention

  def spy(q, k, v):
    calls.append(q.shape)
    return chunked(q, k, v, chunk_size=7)

  monkeypatch.setattr(numerics, 'chunked_attention', spy)
  monkeypatch.setattr(numerics, 'CHUNKED_ATTENTION_MIN_PAIRS', 40 * 40)
  np.testing.assert_allclose(module.apply(variables, x), full, atol=1e-5)
  assert calls == [(2, 40, 2, 4)]
  module.clone(fast_path_implementation='xla').apply(variables, x)
  assert len(calls) == 1  # An explicit implementation is left to dot_product_attention.


@pytest.mark.parametrize('tokens, padded', [(17, 128), (50, 128), (64, 64), (192, 192)])
def test_cudnn_attention_pads_masks_and_equals_unpadded_attention(tokens, padded, monkeypatch):
  """The 'cudnn' fast path runs a multiple of 64 tokens as it is and pads any other count, with
  the padded keys masked, to a multiple of 128: output and gradients equal the unpadded
  attention's. cuDNN's own kernel runs on a GPU only (`--mode=device_report`); here its call
  goes to the XLA implementation."""
  module = attention.SelfAttention(num_heads=2)
  x = jax.random.normal(jax.random.key(1), (2, tokens, 24))
  variables = module.init(jax.random.key(0), x)
  weights = jax.random.normal(jax.random.key(2), x.shape)
  calls, dot_product_attention = [], jax.nn.dot_product_attention

  def spy(q, k, v, *args, implementation=None, **kwargs):
    if implementation == 'cudnn':
      lengths = kwargs.get('key_value_seq_lengths')
      calls.append((q.shape[1], k.shape[1], None if lengths is None else np.asarray(lengths)))
    return dot_product_attention(q, k, v, *args, implementation='xla', **kwargs)

  monkeypatch.setattr(jax.nn, 'dot_product_attention', spy)

  def loss(variables, x, implementation):
    out = module.clone(fast_path_implementation=implementation).apply(variables, x)
    return jnp.sum(out * weights)

  cudnn = jax.value_and_grad(loss, argnums=(0, 1))(variables, x, 'cudnn')
  unpadded = jax.value_and_grad(loss, argnums=(0, 1))(variables, x, 'xla')
  for a, b in zip(jax.tree.leaves(cudnn), jax.tree.leaves(unpadded)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  (queries, keys, lengths), *_ = calls
  assert (queries, keys) == (padded, padded)
  if padded == tokens:
    assert lengths is None
  else:
    np.testing.assert_array_equal(lengths, [tokens, tokens])


# Every family's token counts at its published sizes: ViT-B/32, ViT-B/16, DeiT distilled, 384 px,
# T2T-ViT's token stages.
PUBLISHED_TOKENS = (50, 197, 198, 577, 784, 3136)


@pytest.mark.parametrize('tokens', PUBLISHED_TOKENS)
def test_cudnn_padding_never_builds_a_masked_length_of_64_mod_128(tokens):
  """Masked lengths ≡ 64 (mod 128) get NaN query gradients from cuDNN on Hopper: a length that
  is padded is padded to a multiple of 128; only unmasked lengths are multiples of 64 alone."""
  padded = numerics.cudnn_sequence_length(tokens)
  assert padded >= tokens and padded - tokens < numerics.CUDNN_MASKED_MULTIPLE
  if padded == tokens:
    assert tokens % numerics.CUDNN_UNMASKED_MULTIPLE == 0
  else:
    assert padded % numerics.CUDNN_MASKED_MULTIPLE == 0
  assert {50: 128, 197: 256, 198: 256, 577: 640, 784: 896, 3136: 3136}[tokens] == padded


def test_auto_chooses_cudnn_only_where_it_is_known_correct(monkeypatch):
  choose = numerics.choose_attention
  assert choose('auto', 197, 197, 64, jnp.bfloat16) == (
      'xla',
      'cpu: no faster kernel known correct',
  )
  assert choose(None, 197, 197, 64, jnp.bfloat16).implementation == 'xla'
  assert choose('xla', 197, 197, 64, jnp.bfloat16).implementation == 'xla'
  monkeypatch.setattr(numerics, 'accelerator', lambda: 'cuda')
  assert choose('auto', 197, 197, 64, jnp.bfloat16).implementation == 'cudnn'
  assert choose(None, 3136, 3136, 64, jnp.float16).implementation == 'cudnn'
  assert 'float32' in choose('auto', 197, 197, 64, jnp.float32).reason
  assert 'head dim 12' in choose('auto', 197, 197, 12, jnp.bfloat16).reason
  for requested in ('auto', 'cudnn'):  # A single query (CaiT's class attention) never.
    one_query = choose(requested, 1, 197, 48, jnp.bfloat16)
    assert one_query.implementation == 'xla' and 'one query' in one_query.reason
  assert choose('cudnn', 197, 197, 64, jnp.float32).implementation == 'cudnn'  # Asked for.


def test_plan_names_what_each_attention_runs_and_why(monkeypatch):
  """CaiT's talking heads and DeepViT's Re-attention change the logits around the softmax and
  stay in XLA, saying so; so does a single query; the rest takes cuDNN on an NVIDIA GPU (traced
  here with cuDNN's call handed to XLA)."""
  monkeypatch.setattr(numerics, 'accelerator', lambda: 'cuda')
  xla = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, 'dot_product_attention', lambda *a, implementation, **k: xla(*a, **k))
  cait = models.create('cait_ti4', num_classes=10, dtype=jnp.bfloat16)
  planned = attention.plan(cait, 32)
  assert [(p.queries, p.keys, p.implementation) for p in planned] == [
      (64, 64, 'xla'),
      (1, 65, 'xla'),
  ]
  line = attention.describe(planned)
  assert 'logits mixed between the product and the softmax' in line and 'one query' in line
  deepvit = attention.describe(attention.plan(models.create('deepvit_ti4', num_classes=10), 32))
  assert 'probabilities mixed after the softmax' in deepvit
  vit_b16 = attention.plan(models.create('vit_b16', num_classes=10, dtype=jnp.bfloat16), 224)
  assert [(p.queries, p.implementation) for p in vit_b16] == [(197, 'cudnn')]
  assert 'padded to 256 with the padding masked' in attention.describe(vit_b16)
  dropout = models.create('vit_ti4', num_classes=10, attention_dropout_rate=0.1)
  assert attention.plan(dropout, 32)[0].reason == 'attention dropout'
  assert attention.plan(dropout, 32, train=False)[0].implementation == 'xla'


@pytest.mark.parametrize('scores', ['quadratic', 'learned'])
def test_separable_positional_attention_equals_full_scores(scores, monkeypatch):
  module = attention.PositionalAttention(
      num_heads=3, scores=scores, settings=parts.PositionalSettings(centre_init_std=1.0)
  )
  x = jax.random.normal(jax.random.key(1), (2, 4, 5, 6))
  variables = module.init(jax.random.key(0), x)
  calls = []
  separable_attend = attention.separable_attend
  monkeypatch.setattr(
      attention, 'separable_attend', lambda *args: calls.append(1) or separable_attend(*args)
  )
  fast = module.apply(variables, x)
  explicit, _ = module.apply(variables, x, mutable=['intermediates'])
  np.testing.assert_allclose(fast, explicit, atol=1e-5)
  assert len(calls) == 1  # Collecting probabilities takes the full (heads, N, N) scores.
  module.clone(attention_dropout_rate=0.1).apply(
      variables, x, train=True, rngs={'dropout': jax.random.key(2)}
  )
  assert len(calls) == 1  # Dropout acts on the full probabilities too.


def test_attention_dropout_is_active_in_training_only():
  module = attention.SelfAttention(num_heads=H, attention_dropout_rate=0.5)
  variables = module.init(jax.random.key(0), X)
  a = module.apply(variables, X, train=True, rngs={'dropout': jax.random.key(1)})
  b = module.apply(variables, X, train=True, rngs={'dropout': jax.random.key(2)})
  assert not np.allclose(a, b)
  np.testing.assert_allclose(module.apply(variables, X), module.apply(variables, X))


@pytest.mark.parametrize(
    'module, shape, message',
    [
        (attention.SelfAttention(num_heads=5), (2, 5, 12), 'num_heads=5'),
        (attention.SelfAttention(num_heads=3), (2, 12), r'\(batch, tokens, features\)'),
        (attention.SelfAttention(num_heads=3, head_mixing='talking'), (2, 5, 12), 'talking_heads'),
        (
            attention.SelfAttention(
                num_heads=3, head_mixing='re_attention', re_attention_norm='group'
            ),
            (2, 5, 12),
            'batch',
        ),
        (attention.ClassAttention(num_heads=5), (2, 5, 12), 'num_heads=5'),
        (attention.TokenAttention(features=8, num_heads=3), (2, 5, 12), 'num_heads=3'),
        (attention.PositionalAttention(), (2, 16, 12), r'\(batch, rows, cols, features\)'),
        (attention.PositionalAttention(scores='sinusoid'), (2, 4, 4, 12), 'quadratic'),
        (
            attention.PositionalAttention(scores='learned', max_grid_size=3),
            (2, 4, 4, 12),
            'max_grid_size',
        ),
    ],
)
def test_bad_inputs_raise_value_error(module, shape, message):
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(module.init, jax.random.key(0), jnp.zeros(shape))
