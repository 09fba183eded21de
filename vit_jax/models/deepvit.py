"""DeepViT (Zhou et al., "DeepViT: Towards Deeper Vision Transformer"): Re-attention.

Re-attention mixes the softmax maps of the heads with a learned H x H matrix Theta followed by a
norm over heads (BatchNorm in the official code, `re_attention_norm='batch'`; the LayerNorm form
of lucidrains/vit-pytorch with `'layer'`), in the last `re_attention_blocks` blocks (all blocks
when None, none for the ViT baselines). Every block applies the official `scale_adjustment` s:
x + Attn(LN(s x)) / s, then x + MLP(LN(s x)) / s. `cnn_stem` replaces the patch embedding by
conv7x7/2 + BN + ReLU, conv3x3 + BN + ReLU and a (patch/2)-strided conv (DeepViT-S/L).
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

class CnnStem(nn.Module):
  """DeepViT's `PatchEmbed_CNN`: two BN-ReLU convs (stride 2 overall), then a strided conv.

  Convolutions keep PyTorch's default init (the official `_init_weights` skips them); BatchNorm
  uses eps 1e-5 and PyTorch's momentum 0.1 (Flax momentum 0.9), running stats when not training.
  """
  patch_size: int
  hidden_size: int
  stem_width: int = 64
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False) -> jax.Array:
    if self.patch_size % 2:
      raise ValueError(f'patch_size={self.patch_size} must be even with the CNN stem '
                       '(its first conv has stride 2).')
    vit.check_images(images, self.patch_size)
    conv = functools.partial(nn.Conv, kernel_init=attention_lib.torch_default_kernel_init,
                             dtype=self.dtype, param_dtype=self.param_dtype)
    batch_norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                                   epsilon=1e-5, dtype=jnp.float32, param_dtype=self.param_dtype)
    x = conv(self.stem_width, (7, 7), strides=(2, 2), padding=((3, 3), (3, 3)), use_bias=False,
             name='conv1')(images)
    x = nn.relu(batch_norm(name='bn1')(x)).astype(self.dtype)
    x = conv(self.stem_width, (3, 3), padding=((1, 1), (1, 1)), use_bias=False, name='conv2')(x)
    x = nn.relu(batch_norm(name='bn2')(x)).astype(self.dtype)
    p = self.patch_size // 2
    bias_init = attention_lib.torch_default_bias_init(self.stem_width * p * p)
    x = conv(self.hidden_size, (p, p), strides=(p, p), padding='VALID', bias_init=bias_init,
             name='proj')(x)
    return x.reshape(x.shape[0], -1, x.shape[-1])


class DeepViTBlock(nn.Module):
  """Pre-norm block with the official scale adjustment s: x + DP(Attn(LN(s x))) / s, and MLP."""
  attention: ModuleDef
  mlp_dim: int
  scale_adjustment: float = 1.0
  dropout_rate: float = 0.0
  drop_path_rate: float = 0.0
  mlp_kernel_init: Initializer = attention_lib.DEFAULT_KERNEL_INIT
  mlp_bias_init: Initializer = nn.initializers.zeros
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    norm = functools.partial(nn.LayerNorm, epsilon=1e-6, dtype=self.dtype,
                             param_dtype=self.param_dtype)
    drop_path = vit.DropPath(self.drop_path_rate)
    s = jnp.asarray(self.scale_adjustment, x.dtype)
    y = self.attention(name='attn')(norm(name='norm1')(x * s), train=train)
    x = x + drop_path(y, train=train) / s
    y = vit.Mlp(self.mlp_dim, dropout_rate=self.dropout_rate, kernel_init=self.mlp_kernel_init,
                bias_init=self.mlp_bias_init, dtype=self.dtype, param_dtype=self.param_dtype,
                name='mlp')(norm(name='norm2')(x * s), train=train)
    x = x + drop_path(y, train=train) / s
    vit.sow_feature(self, 'tokens', x)
    return x


class DeepViT(vit.VisionTransformer):
  """DeepViT: ViT whose last `re_attention_blocks` blocks use Re-attention (all when None).

  `mlp_dim` defaults to 3 x hidden; `transform_scale` multiplies the re-attended map by hd^-1/2.
  """
  num_classes: int = 1000
  hidden_size: int = 384
  depth: int = 16
  num_heads: int = 12
  init_scheme: str = 'timm'
  re_attention_blocks: int | None = None
  re_attention_norm: str = 'batch'
  transform_scale: bool = False
  scale_adjustment: float = 1.0
  cnn_stem: bool = False

  def check_fields(self) -> None:
    super().check_fields()
    if self.re_attention_blocks is not None and not 0 <= self.re_attention_blocks <= self.depth:
      raise ValueError(f're_attention_blocks={self.re_attention_blocks} must be None (all) or '
                       f'in [0, depth={self.depth}].')
    if self.re_attention_norm not in attention_lib.RE_ATTENTION_NORMS:
      raise ValueError(f'Unknown re_attention_norm {self.re_attention_norm!r}; '
                       f'valid: {list(attention_lib.RE_ATTENTION_NORMS)}.')
    if self.scale_adjustment <= 0:
      raise ValueError(f'scale_adjustment={self.scale_adjustment} must be > 0.')

  @property
  def first_re_attention_block(self) -> int:
    """Index of the first block with Re-attention (`depth` when there is none)."""
    if self.re_attention_blocks is None:
      return 0
    return self.depth - self.re_attention_blocks

  def patch_tokens(self, images: jax.Array, *, train: bool) -> jax.Array:
    """Patch tokens from the CNN stem or from the ViT patch embedding."""
    if not self.cnn_stem:
      return super().patch_tokens(images, train=train)
    return CnnStem(self.patch_size, self.hidden_size, dtype=self.dtype,
                   param_dtype=self.param_dtype, name='patch_embed')(images, train=train)

  def encode(self, x: jax.Array, *, train: bool) -> jax.Array:
    """ViT blocks, then Re-attention blocks, all scale-adjusted, and the final LayerNorm."""
    scheme = self.scheme
    common = dict(num_heads=self.num_heads, qkv_bias=self.qkv_bias,
                  attention_dropout_rate=self.attention_dropout_rate,
                  dropout_rate=self.dropout_rate, kernel_init=scheme.dense_kernel,
                  bias_init=scheme.dense_bias, dtype=self.dtype, param_dtype=self.param_dtype)
    content = functools.partial(attention_lib.SelfAttention, **common)
    re_attention = functools.partial(
        attention_lib.SelfAttention, head_mixing='re_attention',
        re_attention_norm=self.re_attention_norm, re_attention_scale=self.transform_scale, **common)
    drop_path_rates = np.linspace(0.0, self.drop_path_rate, self.depth)
    first = self.first_re_attention_block
    for attention, start, stop in ((content, 0, first), (re_attention, first, self.depth)):
      if start == stop:
        continue
      block = functools.partial(
          DeepViTBlock, attention, self.mlp_dim or 3 * self.hidden_size,
          scale_adjustment=self.scale_adjustment, dropout_rate=self.dropout_rate,
          mlp_kernel_init=scheme.dense_kernel, mlp_bias_init=scheme.mlp_bias, dtype=self.dtype,
          param_dtype=self.param_dtype)
      x = self.blocks(block, x, first=start, drop_path_rates=drop_path_rates[start:stop],
                      train=train)
    return nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, param_dtype=self.param_dtype,
                        name='norm')(x)


# zhoudaquan/dvit_repo keys (models/deep_vision_transformer.py): the ViT layout, the CNN stem, and
# per Re-attention block the 1x1 conv `reatten_matrix` (H, H, 1, 1) and BatchNorm2d `var_norm`
# over heads.
_TIMM_KEY = re.compile(
    r'cls_token|pos_embed|(norm|head|patch_embed\.proj)\.(weight|bias)'
    r'|patch_embed\.(conv[12]\.weight|bn[12]\.(weight|bias|running_mean|running_var'
    r'|num_batches_tracked))'
    r'|blocks\.\d+\.((norm[12]|attn\.(qkv|proj|reatten_matrix)|mlp\.fc[12])\.(weight|bias)'
    r'|attn\.var_norm\.(weight|bias|running_mean|running_var|num_batches_tracked))')
_THETA = '.attn.reatten_matrix.weight'


def from_timm(state_dict: Mapping[str, Any]) -> dict[str, dict]:
  """Official DeepViT state dict -> Flax variables {'params', 'batch_stats'}.

  Theta (H, H, 1, 1) becomes the Dense kernel over heads W[:, :, 0, 0]^T; BatchNorm running
  statistics go to `batch_stats`.
  """
  unknown = [key for key in state_dict if not _TIMM_KEY.fullmatch(key)]
  if unknown:
    raise ValueError(f'Keys outside the DeepViT layout of zhoudaquan/dvit_repo: {unknown}.')
  return vit.variables_from_torch(
      {key: np.asarray(value)[:, :, 0, 0] if key.endswith(_THETA) else value
       for key, value in state_dict.items()})


def to_timm(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Flax variables -> official DeepViT state dict, loadable with `strict=True`.

  Only the official BatchNorm form of Re-attention has a released layout.
  """
  state_dict = vit.variables_to_torch(variables)
  lucidrains = [key for key in state_dict if '.reattn_' in key]
  if lucidrains:
    raise ValueError(f'{lucidrains[0]} belongs to re_attention_norm=\'layer\', which has no '
                     'official checkpoint layout; only re_attention_norm=\'batch\' converts.')
  for key in list(state_dict):
    if key.endswith(_THETA):
      state_dict[key] = state_dict[key][:, :, None, None]
    elif key.endswith('.running_mean'):
      state_dict[key.replace('running_mean', 'num_batches_tracked')] = np.array(0, np.int64)
  return state_dict


def _deepvit(depth: int, hidden_size: int = 384, **fields) -> functools.partial:
  return functools.partial(DeepViT, depth=depth, hidden_size=hidden_size, **fields)


# Official configurations (dvit_repo deep_vision_transformer.py): 12 heads, MLP 3x, qkv bias.
# `deepvit_vit_*` are the matching ViT baselines (same blocks, no Re-attention).
# `deepvit_ti4`/`deepvit_vit_ti4` are for 32x32 inputs: width 192, 12 blocks, 12 heads, patch 4.
MODELS = {
    **{f'deepvit_{d}b': _deepvit(d) for d in (16, 24, 32)},
    **{f'deepvit_vit_{d}b': _deepvit(d, re_attention_blocks=0) for d in (16, 24, 32)},
    'deepvit_s': _deepvit(16, 396, re_attention_blocks=5, transform_scale=True,
                          scale_adjustment=0.5, cnn_stem=True),
    'deepvit_l': _deepvit(32, 420, re_attention_blocks=12, scale_adjustment=0.5, cnn_stem=True),
    'deepvit_ti4': _deepvit(12, 192, patch_size=4),
    'deepvit_vit_ti4': _deepvit(12, 192, patch_size=4, re_attention_blocks=0),
}
