"""Attention variants against direct NumPy evaluations of the SPEC equations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models import attention


def _softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _init_apply(module, x, **kwargs):
  variables = module.init(jax.random.key(0), x)
  out, state = module.apply(variables, x, mutable=['intermediates'], **kwargs)
  (probs,) = state['intermediates']['attention_probs']
  return variables, np.asarray(out), np.asarray(probs)


def _dense(params, x):
  return x @ np.asarray(params['kernel']) + np.asarray(params.get('bias', 0.0))


def test_content_attention_matches_numpy():
  b, n, d, h = 2, 5, 12, 3
  x = np.random.default_rng(0).normal(size=(b, n, d)).astype(np.float32)
  module = attention.SelfAttention(num_heads=h)
  variables, out, probs = _init_apply(module, x)
  p = variables['params']
  qkv = _dense(p['qkv'], x).reshape(b, n, 3, h, d // h).transpose(2, 0, 3, 1, 4)
  q, k, v = qkv[0] * (d // h) ** -0.5, qkv[1], qkv[2]
  expected_probs = _softmax(q @ k.transpose(0, 1, 3, 2))
  heads = (expected_probs @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
  np.testing.assert_allclose(probs, expected_probs, atol=1e-6)
  np.testing.assert_allclose(out, _dense(p['proj'], heads), atol=1e-5)
  assert probs.shape == (b, h, n, n)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)


def test_fast_path_equals_explicit_path():
  x = jax.random.normal(jax.random.key(1), (2, 17, 24))
  module = attention.SelfAttention(num_heads=4)
  variables = module.init(jax.random.key(0), x)
  fast = module.apply(variables, x)
  explicit, _ = module.apply(variables, x, mutable=['intermediates'])
  no_fast = attention.SelfAttention(num_heads=4, use_fast_path=False).apply(variables, x)
  np.testing.assert_allclose(fast, explicit, atol=1e-5)
  np.testing.assert_allclose(fast, no_fast, atol=1e-5)


@pytest.mark.parametrize('shape, heads, message', [
    ((2, 5, 12), 5, 'num_heads=5'), ((2, 12), 3, 'tokens of shape')])
def test_bad_shapes_raise_value_error(shape, heads, message):
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(attention.SelfAttention(num_heads=heads).init, jax.random.key(0),
                   jnp.zeros(shape))
