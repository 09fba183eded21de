"""Theorem 1 (Cordonnier et al.): the constructed attention layer is the convolution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.analysis import theorem


@pytest.mark.parametrize(
    'size, dilation, in_features, out_features',
    [(3, 1, 4, 6), (3, 2, 5, 3), (5, 1, 3, 3), (5, 2, 6, 4), (4, 1, 2, 3)],
)
def test_attention_layer_equals_convolution(size, dilation, in_features, out_features):
  rng = np.random.default_rng(size * 10 + dilation)
  kernel = rng.normal(size=(size, size, in_features, out_features)) / (size * np.sqrt(in_features))
  bias = rng.normal(size=out_features)
  x = rng.normal(size=(2, 9, 7, in_features)).astype(np.float32)
  layer = theorem.conv_to_attention(kernel, bias, dilation=dilation)
  assert layer.module.num_heads == size * size
  expected = (
      jax.lax.conv_general_dilated(
          jnp.asarray(x),
          jnp.asarray(kernel, jnp.float32),
          (1, 1),
          'SAME',
          rhs_dilation=(dilation, dilation),
          dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
          precision=jax.lax.Precision.HIGHEST,
      )
      + bias
  )
  np.testing.assert_allclose(layer(jnp.asarray(x)), expected, atol=1e-5, rtol=0)


def test_soft_attention_is_not_the_convolution():
  """With a small alpha the heads spread over neighbours and the equality breaks."""
  rng = np.random.default_rng(0)
  kernel = rng.normal(size=(3, 3, 2, 2))
  x = rng.normal(size=(1, 6, 6, 2)).astype(np.float32)
  expected = jax.lax.conv_general_dilated(
      x, kernel.astype(np.float32), (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC')
  )
  soft = theorem.conv_to_attention(kernel, alpha=0.5)(jnp.asarray(x))
  assert np.abs(soft - expected).max() > 0.1


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match='square'):
    theorem.conv_to_attention(np.zeros((3, 2, 1, 1)))
  with pytest.raises(ValueError, match='dilation=0'):
    theorem.conv_to_attention(np.zeros((3, 3, 1, 1)), dilation=0)
  with pytest.raises(ValueError, match='bias'):
    theorem.conv_to_attention(np.zeros((3, 3, 1, 2)), np.zeros(3))
  with pytest.raises(ValueError, match='inputs'):
    theorem.conv_to_attention(np.zeros((3, 3, 2, 2)))(jnp.zeros((1, 4, 4, 3)))
