"""Theorem 1 of Cordonnier et al. as code: any convolution is a multi-head self-attention layer.

`conv_to_attention(kernel, bias)` builds the quadratic-attention layer SA-conv models stack
(`PositionalAttention(scores='quadratic')`) whose output equals a K x K convolution:

  layer = conv_to_attention(kernel, bias, dilation=2)        # kernel (K, K, D_in, D_out), HWIO
  y = layer(x)                                              # x (batch, H, W, D_in)
  # y == jax.lax.conv_general_dilated(x, kernel, (1, 1), 'SAME', rhs_dilation=(2, 2),
  #                                   dimension_numbers=('NHWC', 'HWIO', 'NHWC')) + bias

Construction (Lemmas 1 and 2): one head per kernel tap, K^2 heads. Head h = (u, v) attends, with
the quadratic encoding A_{q,k} = -alpha (|delta - Delta_h|^2 - |Delta_h|^2), to the shift
Delta_h = (u d - p, v d - p), p = ((K - 1) d) // 2, so that for alpha large its attention is one-hot
on the key q + Delta_h (centre mu_h = Delta_h, spread s_h = sqrt(2 alpha), since the layer's score
is -s^2/2 |delta - mu|^2 + const). The value projection of head h is the tap W[u, v] (Lemma 1:
MHSA(X)_q = sum_h X_{q + Delta_h} W^(h) + b = Conv(X)_q). In float32, alpha = 46 makes every other
key weigh less than e^-46 relative to the attended one.

Zero padding is `margin` zero tokens on every side of the grid (out-of-range shifts land on
them), cropped from the output; the layer's width is max(D_in, D_out), inputs zero-padded to it.
Stride s is the stride-1 result subsampled [::s, ::s].
"""

import dataclasses
import math
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import attention as attention_lib

HARD_ATTENTION_ALPHA = 46.0


@dataclasses.dataclass(frozen=True)
class AttentionConv:
  """An SA-conv quadratic-attention layer and its parameters that compute a convolution."""

  module: attention_lib.PositionalAttention
  params: dict
  margin: int  # Zero tokens added on each side of the grid.
  in_features: int
  out_features: int

  def __call__(self, x: jax.Array) -> jax.Array:
    """(batch, H, W, in_features) -> (batch, H, W, out_features), the convolution of x."""
    if x.ndim != 4 or x.shape[-1] != self.in_features:
      raise ValueError(f'Expected inputs (batch, H, W, {self.in_features}); got {x.shape}.')
    m = self.margin
    padded = jnp.pad(x, ((0, 0), (m, m), (m, m), (0, self.module_width - self.in_features)))
    # `apply` returns the output alone where no collection is mutable.
    y = cast(jax.Array, self.module.apply({'params': self.params}, padded))
    return y[:, m : m + x.shape[1], m : m + x.shape[2], : self.out_features]

  @property
  def module_width(self) -> int:
    return max(self.in_features, self.out_features)


def conv_to_attention(
    kernel: np.ndarray | jax.Array,
    bias: np.ndarray | jax.Array | None = None,
    *,
    dilation: int = 1,
    alpha: float = HARD_ATTENTION_ALPHA,
) -> AttentionConv:
  """The quadratic-attention layer with K^2 heads that equals a stride-1, zero-padded ('SAME')
  K x K convolution with `kernel` (K, K, D_in, D_out) in HWIO layout, `bias` (D_out,) and
  `dilation` (Cordonnier et al., Theorem 1 via Lemmas 1 and 2; see the module doc)."""
  kernel = np.asarray(kernel, np.float32)
  if kernel.ndim != 4 or kernel.shape[0] != kernel.shape[1] or kernel.shape[0] < 1:
    raise ValueError(
        f'kernel must be (K, K, D_in, D_out) with a square K x K window; got shape '
        f'{kernel.shape}.'
    )
  size, _, in_features, out_features = kernel.shape
  if dilation < 1:
    raise ValueError(f'dilation={dilation} must be >= 1.')
  if alpha <= 0:
    raise ValueError(
        f'alpha={alpha} must be > 0 (larger is harder attention; '
        f'{HARD_ATTENTION_ALPHA} is one-hot in float32).'
    )
  bias = np.zeros(out_features, np.float32) if bias is None else np.asarray(bias, np.float32)
  if bias.shape != (out_features,):
    raise ValueError(f'bias must have shape ({out_features},); got {bias.shape}.')

  low = (size - 1) * dilation // 2  # 'SAME': the window starts `low` cells before the query.
  taps = [(u, v) for u in range(size) for v in range(size)]
  centres = np.array([(u * dilation - low, v * dilation - low) for u, v in taps], np.float32)
  width = max(in_features, out_features)
  value = np.zeros((len(taps), width, width), np.float32)
  for head, (u, v) in enumerate(taps):
    value[head, :in_features, :out_features] = kernel[u, v]
  value_bias = np.pad(bias, (0, width - out_features))
  params = {
      'attention_centers': jnp.asarray(centres),
      'attention_spreads': jnp.full((len(taps),), math.sqrt(2 * alpha), jnp.float32),
      'value': {
          'kernel': jnp.asarray(value.reshape(len(taps) * width, width)),
          'bias': jnp.asarray(value_bias),
      },
  }
  module = attention_lib.PositionalAttention(num_heads=len(taps), scores='quadratic')
  return AttentionConv(
      module,
      params,
      margin=(size - 1) * dilation - low,
      in_features=in_features,
      out_features=out_features,
  )
