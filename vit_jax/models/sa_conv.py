"""SA-conv (Cordonnier et al., "On the Relationship between Self-Attention and Convolutional
Layers"): post-LN BERT layers of positional self-attention on a 2x2 space-to-depth image grid.

The image is cut into 2x2 blocks stacked as channels in (dy, dx, c) order (einops
`(h p1) (w p2) c -> h w (p1 p2 c)`), projected to `hidden_size`; there is no class token and no
position embedding. Each layer: h = LN(x + Drop(Dense(SA(x)))), out = LN(h + Drop(Dense(GELU(
Dense(h))))), LayerNorm eps 1e-12; logits = head(mean over the grid). Linears keep PyTorch's
default init, as the official `BertImage` never re-initialises them.

Attention kinds (`attention`): 'quadratic' (isotropic Gaussian, the paper's quadratic encoding),
'gaussian' (non-isotropic), 'learned' (learned relative row/column embeddings) and
'learned_content' (learned + content q.k). The per-head parameters sit at
`params['layers_{i}']['attention']`: `attention_centers` (heads, 2) = (row, col) centre mu_h;
`attention_spreads` (heads,) = s_h (alpha_h = s_h^2 / 2) for 'quadratic' or (heads, 2, 2) =
Sigma_h^-1/2 for 'gaussian'; `row_embeddings`, `col_embeddings`, `head_keys_row`, `head_keys_col`
(and `query`, `key` with content) for the learned kinds. `attention_heads(params)` collects them.
"""

import functools
import itertools
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.models import Dtype
from vit_jax.models import attention as attention_lib
from vit_jax.models import layers
from vit_jax.models import layouts
from vit_jax.schema import parts
from vit_jax.models import stems


class BertLayer(nn.Module):
  """Post-LN layer: LN(x + Drop(Dense(SA(x)))), then LN(h + Drop(Dense(GELU(Dense(h)))))."""

  attention: functools.partial
  intermediate_size: int
  dropout_rate: float = 0.1
  layer_norm_eps: float = 1e-12
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _dense(self, features: int, fan_in: int, name: str) -> nn.Dense:
    return stems.torch_dense(
        features, fan_in, dtype=self.dtype, param_dtype=self.param_dtype, name=name
    )

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    width = x.shape[-1]
    dropout = nn.Dropout(rate=self.dropout_rate, deterministic=not train)
    norm = functools.partial(
        nn.LayerNorm,
        epsilon=self.layer_norm_eps,
        use_fast_variance=False,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )
    y = self.attention(name='attention')(x, train=train)
    y = dropout(self._dense(width, width, 'attention_output')(y))
    h = norm(name='attention_norm')(x + y)
    y = layers.gelu(self._dense(self.intermediate_size, width, 'intermediate')(h))
    y = dropout(self._dense(width, self.intermediate_size, 'output')(y))
    x = norm(name='output_norm')(h + y)
    layers.sow_feature(self, 'tokens', x)
    return x


class SAConv(nn.Module):
  """Cordonnier et al.'s fully attentional CIFAR model (BertImage with positional attention).

  `layer_heads` gives every layer its own head count (a head-pruned model); None uses
  `num_heads` everywhere. `attention_settings` are the positional attention's own
  (`parts.PositionalSettings`: the initial centres' and spreads' deviations). `scan_layers` and `remat` act as in every other family
  (`layers.apply_blocks`); scanning stacks each run of consecutive layers with equal head counts
  under `layers_{first}_to_{last}`.
  """

  num_classes: int = 10
  attention: str = 'quadratic'
  num_heads: int = 9
  num_layers: int = 6
  layer_heads: tuple[int, ...] | None = None  # Per-layer head counts (pruned models).
  hidden_size: int = 400
  intermediate_size: int = 512
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  downsample: int = 2
  layer_norm_eps: float = 1e-12
  attention_settings: parts.PositionalSettings = parts.PositionalSettings()
  scan_layers: bool = False
  remat: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def check_fields(self) -> None:
    """Raises ValueError for an inconsistent configuration."""
    if self.attention not in attention_lib.POSITIONAL_KINDS:
      raise ValueError(
          f'Unknown attention {self.attention!r}; valid: '
          f'{list(attention_lib.POSITIONAL_KINDS)}.'
      )
    for name in ('num_classes', 'num_heads', 'num_layers', 'hidden_size', 'intermediate_size'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name}={getattr(self, name)} must be >= 1.')
    if self.layer_heads is not None and (
        len(self.layer_heads) != self.num_layers or min(self.layer_heads) < 1
    ):
      raise ValueError(
          f'layer_heads={self.layer_heads} must be None or {self.num_layers} '
          'head counts (one per layer), each >= 1.'
      )
    for name in ('dropout_rate', 'attention_dropout_rate'):
      rate = getattr(self, name)
      if not 0.0 <= rate < 1.0:
        raise ValueError(f'{name}={rate} must be in [0, 1).')

  @property
  def top_layer(self) -> int:
    """The last layer id of layer-wise lr decay (`layer_ids`), the head's: num_layers + 1."""
    return self.num_layers + 1

  def layer_ids(self, path: Sequence[str]) -> np.ndarray:
    """Layer-wise lr decay's layer of parameter `path`, one id per stacked layer: the
    space-to-depth projection 0, layer i i + 1, the head `top_layer`."""
    if path[0] == 'features_upscale':
      return np.array([0])
    indices = layouts.block_indices(path[0], 'layers')
    return np.array([self.top_layer]) if indices is None else indices + 1

  def _dense(self, features: int, fan_in: int, name: str) -> nn.Dense:
    return stems.torch_dense(
        features, fan_in, dtype=self.dtype, param_dtype=self.param_dtype, name=name
    )

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False) -> jax.Array:
    self.check_fields()
    if images.ndim != 4:
      raise ValueError(f'Expected NHWC images of rank 4; got shape {images.shape}.')
    x = stems.space_to_depth(images, self.downsample)
    x = self._dense(self.hidden_size, x.shape[-1], 'features_upscale')(x)
    attention = attention_lib.positional(
        self.attention,
        num_heads=self.num_heads,
        settings=self.attention_settings,
        attention_dropout_rate=self.attention_dropout_rate,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )
    heads = self.layer_heads or (self.num_heads,) * self.num_layers
    first = 0
    for group_heads, group in itertools.groupby(heads):
      count = len(list(group))
      layer = functools.partial(
          BertLayer,
          functools.partial(attention, num_heads=int(group_heads)),
          self.intermediate_size,
          dropout_rate=self.dropout_rate,
          layer_norm_eps=self.layer_norm_eps,
          dtype=self.dtype,
          param_dtype=self.param_dtype,
      )
      x = layers.apply_blocks(
          layer,
          x,
          count=count,
          first=first,
          train=train,
          scan_layers=self.scan_layers,
          remat=self.remat,
          prefix='layers',
      )
      first += count
    pooled = jnp.mean(x.astype(jnp.float32), axis=(1, 2)).astype(self.dtype)
    layers.sow_feature(self, 'encoded', x)
    layers.sow_feature(self, 'head_input', pooled)
    return self._dense(self.num_classes, self.hidden_size, 'head')(pooled).astype(jnp.float32)


def attention_heads(params: dict) -> list[dict[str, jax.Array]]:
  """The per-head positional parameters of every layer, in layer order (see the module doc):
  SA-conv's `layers_{i}/attention`, or `blocks_{i}/attn` of a transformer whose main blocks have
  positional attention (`vit.VisionTransformer.attention`); stacked (`scan_layers`) or not."""
  params = layouts.unstack_layers(params)
  for prefix, module in (('layers_', 'attention'), ('blocks_', 'attn')):
    layers = sorted(
        (k for k in params if k.startswith(prefix) and k[len(prefix) :].isdigit()),
        key=lambda k: int(k[len(prefix) :]),
    )
    if layers:
      return [dict(params[k][module]) for k in layers]
  return []


def _sa_conv(attention: str, num_heads: int = 9) -> functools.partial:
  return functools.partial(SAConv, attention=attention, num_heads=num_heads)


# The paper's CIFAR-10 models (Table 1/4): 6 layers, hidden 400, intermediate 512, 9 heads; the
# `_16h` versions have 16 heads (a 4x4 kernel, Appendix F).
MODELS = {
    **{f'sa_conv_{kind}': _sa_conv(kind) for kind in attention_lib.POSITIONAL_KINDS},
    **{f'sa_conv_{kind}_16h': _sa_conv(kind, 16) for kind in attention_lib.POSITIONAL_KINDS},
}
FAMILY = models.Family('sa_conv', SAConv, MODELS)  # No PyTorch checkpoint layout to convert.
