"""CaiT (Touvron et al., "Going deeper with Image Transformers"): LayerScale and class attention.

Patches + position embedding (no class slot) go through `depth` LayerScale blocks with
talking-heads attention and the same drop-path rate in every block; then the class token alone is
updated by `class_attention_depth` class-attention blocks (queries from the class token, keys and
values from [class; patches], patches frozen, no drop-path); the head reads LN([cls; x])[:, 0].

LayerScale starts at the official per-variant value (`layer_scale_init`); `paper_layer_scale=True`
uses the paper's depth rule instead (0.1 up to depth 18, 1e-5 up to 24, 1e-6 deeper).
"""

import functools
import re
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import attention as attention_lib
from vit_jax.models import vit

Initializer = Callable[..., jax.Array]
ModuleDef = Callable[..., nn.Module]
Dtype = Any


def paper_layer_scale_init(depth: int) -> float:
  """The paper's LayerScale init for a network of `depth` self-attention blocks."""
  if depth <= 18:
    return 0.1
  return 1e-5 if depth <= 24 else 1e-6


class ClassAttentionBlock(nn.Module):
  """cls + gamma_1 * CA(LN([cls; x])), then cls + gamma_2 * MLP(LN(cls)) (`LayerScale_Block_CA`)."""
  attention: ModuleDef
  mlp_dim: int
  layer_scale_init: float
  layer_norm_eps: float = 1e-6
  mlp_kernel_init: Initializer = attention_lib.DEFAULT_KERNEL_INIT
  mlp_bias_init: Initializer = nn.initializers.zeros
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _layer_scale(self, y: jax.Array, name: str) -> jax.Array:
    gamma = self.param(name, nn.initializers.constant(self.layer_scale_init), (y.shape[-1],),
                       self.param_dtype)
    return y * gamma.astype(y.dtype)

  @nn.compact
  def __call__(self, x: jax.Array, cls: jax.Array, *, train: bool = False) -> jax.Array:
    norm = functools.partial(nn.LayerNorm, epsilon=self.layer_norm_eps, dtype=self.dtype,
                             param_dtype=self.param_dtype)
    tokens = jnp.concatenate([cls, x], axis=1)
    y = self.attention(name='attn')(norm(name='norm1')(tokens), train=train)
    cls = cls + self._layer_scale(y, 'gamma_1')
    y = vit.Mlp(self.mlp_dim, kernel_init=self.mlp_kernel_init, bias_init=self.mlp_bias_init,
                dtype=self.dtype, param_dtype=self.param_dtype, name='mlp')(
                    norm(name='norm2')(cls), train=train)
    return cls + self._layer_scale(y, 'gamma_2')


class CaiT(vit.VisionTransformer):
  """CaiT: LayerScale talking-heads blocks, then class-attention blocks on the class token.

  `dropout_rate` acts after the position embedding, the attention projection and inside the MLP
  of the self-attention stage (timm 0.3.2's single rate); the class stage has no dropout.
  """
  num_classes: int = 1000
  hidden_size: int = 192
  depth: int = 24
  num_heads: int = 4
  init_scheme: str = 'timm'
  class_attention_depth: int = 2
  layer_scale_init: float = 1e-5
  paper_layer_scale: bool = False

  prefix_tokens = ()  # The position embedding has no class slot.

  def check_fields(self) -> None:
    super().check_fields()
    if self.class_attention_depth < 1:
      raise ValueError(f'class_attention_depth={self.class_attention_depth} must be >= 1.')

  @property
  def layer_scale(self) -> float:
    """The LayerScale init in use: the paper's depth rule or the configured value."""
    return paper_layer_scale_init(self.depth) if self.paper_layer_scale else self.layer_scale_init

  def encode(self, x: jax.Array, *, train: bool) -> jax.Array:
    """Self-attention stage, class-attention stage, then LN over [cls; patches]."""
    scheme = self.scheme
    mlp_dim = self.mlp_dim or 4 * self.hidden_size
    common = dict(kernel_init=scheme.dense_kernel, bias_init=scheme.dense_bias, dtype=self.dtype,
                  param_dtype=self.param_dtype)
    talking_heads = functools.partial(
        attention_lib.SelfAttention, num_heads=self.num_heads, qkv_bias=self.qkv_bias,
        attention_dropout_rate=self.attention_dropout_rate, dropout_rate=self.dropout_rate,
        head_mixing='talking_heads', **common)
    block = functools.partial(
        vit.EncoderBlock, talking_heads, mlp_dim, dropout_rate=self.dropout_rate,
        layer_scale_init=self.layer_scale, mlp_kernel_init=scheme.dense_kernel,
        mlp_bias_init=scheme.mlp_bias, dtype=self.dtype, param_dtype=self.param_dtype)
    x = self.blocks(block, x, first=0, train=train,
                    drop_path_rates=[self.drop_path_rate] * self.depth)
    batch, _, width = x.shape
    cls = self.param('cls_token', scheme.cls_token, (1, 1, width), self.param_dtype)
    cls = jnp.broadcast_to(cls.astype(x.dtype), (batch, 1, width))
    class_attention = functools.partial(
        attention_lib.ClassAttention, num_heads=self.num_heads, qkv_bias=self.qkv_bias, **common)
    for i in range(self.class_attention_depth):
      cls = ClassAttentionBlock(class_attention, mlp_dim, self.layer_scale,
                                mlp_kernel_init=scheme.dense_kernel, mlp_bias_init=scheme.mlp_bias,
                                dtype=self.dtype, param_dtype=self.param_dtype,
                                name=f'blocks_token_only_{i}')(x, cls, train=train)
    return nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, param_dtype=self.param_dtype,
                        name='norm')(jnp.concatenate([cls, x], axis=1))


# timm/deit CaiT keys (facebookresearch/deit cait_models.py); the talking-heads `proj_l`/`proj_w`
# (H, H) are Linears over heads.
_TIMM_KEY = re.compile(
    r'cls_token|pos_embed|(patch_embed\.proj|norm|head)\.(weight|bias)'
    r'|blocks\.\d+\.(gamma_[12]|(norm[12]|attn\.(qkv|proj|proj_l|proj_w)|mlp\.fc[12])'
    r'\.(weight|bias))'
    r'|blocks_token_only\.\d+\.(gamma_[12]|(norm[12]|attn\.[qkv]|attn\.proj|mlp\.fc[12])'
    r'\.(weight|bias))')


def from_timm(state_dict: Mapping[str, Any]) -> dict[str, dict]:
  """timm/deit `Cait` state dict (without the `module.` prefix) -> Flax variables {'params'}."""
  unknown = [key for key in state_dict if not _TIMM_KEY.fullmatch(key)]
  if unknown:
    raise ValueError(f'Keys outside the CaiT layout of timm/deit (cait_models.py): {unknown}.')
  return vit.variables_from_torch(state_dict)


def to_timm(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Flax variables -> timm/deit `Cait` state dict (inverse of `from_timm`)."""
  return vit.variables_to_torch(variables)


def _cait(hidden_size: int, depth: int, num_heads: int, layer_scale_init: float,
          patch_size: int = 16) -> functools.partial:
  return functools.partial(CaiT, patch_size=patch_size, hidden_size=hidden_size, depth=depth,
                           num_heads=num_heads, layer_scale_init=layer_scale_init)


# Official sizes and LayerScale inits (deit/cait_models.py); the image size is set by the input
# at init (224, 384 or 448 for the released weights). `cait_ti4` is for 32x32 inputs: XXS width,
# 12 self-attention blocks with patch 4 (64 tokens), LayerScale 0.1 (the paper's rule, depth 12).
MODELS = {
    'cait_xxs24': _cait(192, 24, 4, 1e-5),
    'cait_xxs36': _cait(192, 36, 4, 1e-5),
    'cait_xs24': _cait(288, 24, 6, 1e-5),
    'cait_s24': _cait(384, 24, 8, 1e-5),
    'cait_s36': _cait(384, 36, 8, 1e-6),
    'cait_m36': _cait(768, 36, 16, 1e-6),
    'cait_m48': _cait(768, 48, 16, 1e-6),
    'cait_ti4': _cait(192, 12, 4, 0.1, patch_size=4),
}
