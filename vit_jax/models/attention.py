"""Attention modules of every family, sharing one scores -> probabilities -> values pipeline.

Every module sows its final attention probabilities (after any head mixing) as
`intermediates/attention_probs` with shape (batch, heads, queries, keys).
"""

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

Initializer = Callable[..., jax.Array]
Dtype = Any

DEFAULT_KERNEL_INIT = nn.initializers.normal(stddev=0.02)


def split_heads_init(kernel_init: Initializer, parts: int) -> Initializer:
  """Initialises a fused (in, parts * out) kernel as `parts` independent (in, out) kernels.

  Keeps fan-dependent schemes (xavier) identical to separate q/k/v projections.
  """

  def init(key: jax.Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> jax.Array:
    fan_in, fan_out = shape[0], shape[-1]
    keys = jax.random.split(key, parts)
    return jnp.concatenate(
        [kernel_init(k, (fan_in, fan_out // parts), dtype) for k in keys], axis=-1)

  return init


def check_heads(width: int, num_heads: int, what: str) -> int:
  """Returns the head dimension, or raises when `num_heads` does not divide `width`."""
  if num_heads < 1 or width % num_heads:
    divisors = [h for h in range(1, width + 1) if width % h == 0]
    raise ValueError(f'num_heads={num_heads} must divide the {what} width {width}; '
                     f'valid num_heads: {divisors}.')
  return width // num_heads


def _check_tokens(x: jax.Array, name: str) -> None:
  if x.ndim != 3:
    raise ValueError(f'{name} expects tokens of shape (batch, tokens, features); '
                     f'got shape {x.shape}.')


def attend(module: nn.Module, scores: jax.Array, values: jax.Array, *,
           dropout_rate: float, train: bool,
           pre_softmax: Callable[[jax.Array], jax.Array] | None = None,
           post_softmax: Callable[[jax.Array], jax.Array] | None = None,
           dropout_before_post_softmax: bool = False) -> jax.Array:
  """The shared pipeline: scores -> mix -> softmax -> mix -> sow -> dropout -> weighted values.

  scores: (batch, heads, queries, keys); values: (batch, keys, heads, value_dim).
  Returns (batch, queries, heads, value_dim) in the dtype of `values`.
  """
  scores = scores.astype(jnp.float32)
  if pre_softmax is not None:
    scores = pre_softmax(scores).astype(jnp.float32)
  probs = jax.nn.softmax(scores, axis=-1)
  dropout = nn.Dropout(rate=dropout_rate, deterministic=not train)
  if dropout_before_post_softmax:
    probs = dropout(probs)
  if post_softmax is not None:
    probs = post_softmax(probs).astype(jnp.float32)
  module.sow('intermediates', 'attention_probs', probs)
  if not dropout_before_post_softmax:
    probs = dropout(probs)
  return jnp.einsum('bhqk,bkhd->bqhd', probs.astype(values.dtype), values)


class SelfAttention(nn.Module):
  """Multi-head content self-attention (timm `Attention`): one fused qkv Dense, then proj."""
  num_heads: int
  qkv_bias: bool = True
  attention_dropout_rate: float = 0.0
  dropout_rate: float = 0.0
  kernel_init: Initializer = DEFAULT_KERNEL_INIT
  bias_init: Initializer = nn.initializers.zeros
  use_fast_path: bool = True
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _dense(self, features: int, name: str, use_bias: bool = True,
             kernel_init: Initializer | None = None) -> nn.Dense:
    return nn.Dense(features, use_bias=use_bias, kernel_init=kernel_init or self.kernel_init,
                    bias_init=self.bias_init, dtype=self.dtype, param_dtype=self.param_dtype,
                    name=name)

  def _qkv(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Projects x to q (pre-scaled by hd^-1/2), k, v of shape (batch, tokens, heads, hd)."""
    width = x.shape[-1]
    head_dim = check_heads(width, self.num_heads, 'token')
    qkv = self._dense(3 * width, 'qkv', self.qkv_bias, split_heads_init(self.kernel_init, 3))(x)
    qkv = qkv.reshape(x.shape[:2] + (3, self.num_heads, head_dim))  # [3, H, hd] layout.
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    return q * jnp.asarray(head_dim ** -0.5, q.dtype), k, v

  def _uses_fast_path(self, train: bool) -> bool:
    return (self.use_fast_path and not self.is_mutable_collection('intermediates')
            and (not train or self.attention_dropout_rate == 0.0))

  def _output(self, heads: jax.Array, train: bool) -> jax.Array:
    """Merges heads and applies the output projection and its dropout."""
    merged = heads.reshape(heads.shape[:2] + (-1,))
    out = self._dense(merged.shape[-1], 'proj')(merged)
    return nn.Dropout(rate=self.dropout_rate, deterministic=not train)(out)

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    _check_tokens(x, type(self).__name__)
    q, k, v = self._qkv(x)
    if self._uses_fast_path(train):
      heads = jax.nn.dot_product_attention(q, k, v, scale=1.0)
    else:
      scores = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
      heads = attend(self, scores, v, dropout_rate=self.attention_dropout_rate, train=train)
    return self._output(heads, train)
