"""T2T-ViT (Yuan et al., "Tokens-to-Token ViT"): soft splits and token transformers, then a ViT.

The Tokens-to-Token module re-structurises the image progressively: a soft split (overlapping
patches, `torch.nn.Unfold`'s (C, kh, kw) feature order) makes tokens, a one-head token transformer
reduces each to `token_dim` features, the tokens are laid back on their grid and split again; a
final soft split and a Linear (`project`) give the backbone tokens.

`tokens_type='performer'` is T2T-ViT-n (7, 10, 12, 14, 19, 24): `Token_performer` with a frozen
orthogonal random-feature kernel. `'transformer'` is T2T-ViT_t-n (14, 19, 24): token attention
with a V skip. Every published size is registered (`SIZES`, `MODELS`).

Fixed, untrained parameters live in `params` and are read through `stop_gradient`, so they reach
checkpoints and `to_timm` like the official `requires_grad=False` Parameters but get zero gradient:
`pos_embed` (the sinusoid table) and, per Performer, `random_features` (the official `w`).
`FIXED_PARAMS` names them; an optimizer that decays weights must exclude them.
"""

import functools
import math
import re
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import attention as attention_lib
from vit_jax.models import vit

Dtype = Any

TOKENS_TYPES = ('performer', 'transformer')
FIXED_PARAMS = ('pos_embed', 'random_features')


def soft_split(x: jax.Array, kernel_size: int, stride: int,
               padding: int) -> tuple[jax.Array, tuple[int, int]]:
  """Overlapping patches of an NHWC map as tokens, features in `nn.Unfold`'s (C, kh, kw) order.

  Returns (batch, rows * cols, C * k * k) tokens in row-major order and the grid (rows, cols).
  Built from k * k strided slices, whose gradient is a few strided additions; the one-hot
  convolution of `lax.conv_general_dilated_patches` back-propagates as a dense convolution that
  cost T2T-ViT a tenth of its CPU training step.
  """
  batch, height, width, channels = x.shape
  rows = (height + 2 * padding - kernel_size) // stride + 1
  cols = (width + 2 * padding - kernel_size) // stride + 1
  x = jnp.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  offsets = [(i, j) for i in range(kernel_size) for j in range(kernel_size)]
  patches = jnp.stack([x[:, i:i + stride * (rows - 1) + 1:stride,
                         j:j + stride * (cols - 1) + 1:stride] for i, j in offsets], axis=-1)
  return patches.reshape(batch, rows * cols, channels * kernel_size ** 2), (rows, cols)


def sinusoid_table(num_positions: int, width: int) -> np.ndarray:
  """The fixed Transformer position table: sin on even features, cos on odd, (1, N, width)."""
  positions = np.arange(num_positions, dtype=np.float64)[:, None]
  rates = np.power(10000.0, 2 * (np.arange(width) // 2) / width)
  angles = positions / rates
  angles[:, 0::2] = np.sin(angles[:, 0::2])
  angles[:, 1::2] = np.cos(angles[:, 1::2])
  return angles[None].astype(np.float32)


class TokenPerformer(nn.Module):
  """T2T's `Token_performer`: one-head linear attention with positive random features.

  kqv = Linear(d_in -> 3 * dim) split as k, q, v; phi(x) = exp(w x - |x|^2 / 2) / sqrt(m) with
  frozen orthonormal rows w scaled by sqrt(m), m = dim * kernel_ratio;
  y = v + Drop(proj(phi(q) (phi(k)^T v) / (phi(q) . sum_t phi(k_t) + 1e-8))), then
  y + Drop(MLP(LN(y))). The implicit attention matrix is sown only when asked for.
  """
  dim: int = 64
  kernel_ratio: float = 0.5
  dropout_rate: float = 0.1
  layer_norm_eps: float = 1e-5
  kernel_init: Callable[..., jax.Array] = attention_lib.DEFAULT_KERNEL_INIT
  bias_init: Callable[..., jax.Array] = nn.initializers.zeros
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _features(self, x: jax.Array, w: jax.Array) -> jax.Array:
    """Positive random features of the softmax kernel, (batch, tokens, m), in float32."""
    x = x.astype(jnp.float32)
    half_norm = 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
    return jnp.exp(jnp.einsum('bti,mi->btm', x, w) - half_norm) / math.sqrt(w.shape[0])

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    num_features = int(self.dim * self.kernel_ratio)
    if num_features < 1:
      raise ValueError(f'kernel_ratio={self.kernel_ratio} leaves no random features for '
                       f'dim={self.dim}; it must be >= {1 / self.dim}.')
    dense = functools.partial(attention_lib.Dense, kernel_init=self.kernel_init,
                              bias_init=self.bias_init, dtype=self.dtype,
                              param_dtype=self.param_dtype)
    norm = functools.partial(nn.LayerNorm, epsilon=self.layer_norm_eps, dtype=self.dtype,
                             param_dtype=self.param_dtype)
    dropout = nn.Dropout(rate=self.dropout_rate, deterministic=not train)

    def orthogonal_rows(key, shape, dtype=jnp.float32):
      return nn.initializers.orthogonal(scale=math.sqrt(shape[0]))(key, shape, dtype)

    w = jax.lax.stop_gradient(self.param(
        'random_features', orthogonal_rows, (num_features, self.dim), jnp.float32))
    k, q, v = jnp.split(dense(3 * self.dim, name='kqv')(norm(name='norm1')(x)), 3, axis=-1)
    kp, qp = self._features(k, w), self._features(q, w)
    normaliser = jnp.einsum('btm,bm->bt', qp, kp.sum(axis=1))[..., None] + 1e-8
    if self.is_mutable_collection('intermediates'):
      probs = jnp.einsum('bqm,bkm->bqk', qp, kp) / normaliser
      self.sow('intermediates', 'attention_probs', probs[:, None])
    kv = jnp.einsum('btd,btm->bdm', v.astype(jnp.float32), kp)
    y = (jnp.einsum('btm,bdm->btd', qp, kv) / normaliser).astype(self.dtype)
    y = v + dropout(dense(self.dim, name='proj')(y))
    hidden = vit.gelu(dense(self.dim, name='mlp_0')(norm(name='norm2')(y)))
    return y + dropout(dense(self.dim, name='mlp_2')(hidden))


class TokensToToken(nn.Module):
  """Soft split -> token transformer -> re-structurise, repeated, then soft split + `project`."""
  hidden_size: int
  soft_splits: tuple[tuple[int, int, int], ...]
  tokens_type: str = 'performer'
  token_dim: int = 64
  kernel_init: Callable[..., jax.Array] = attention_lib.DEFAULT_KERNEL_INIT
  bias_init: Callable[..., jax.Array] = nn.initializers.zeros
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _token_block(self, index: int) -> nn.Module:
    name = f'attention{index}'
    if self.tokens_type == 'performer':
      return TokenPerformer(self.token_dim, kernel_init=self.kernel_init,
                            bias_init=self.bias_init, dtype=self.dtype,
                            param_dtype=self.param_dtype, name=name)
    attention = functools.partial(
        attention_lib.TokenAttention, features=self.token_dim, kernel_init=self.kernel_init,
        bias_init=self.bias_init, dtype=self.dtype, param_dtype=self.param_dtype)
    return vit.EncoderBlock(attention, self.token_dim, layer_norm_eps=1e-5,
                            attention_residual=False, mlp_kernel_init=self.kernel_init,
                            mlp_bias_init=self.bias_init, dtype=self.dtype,
                            param_dtype=self.param_dtype, name=name)

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False) -> jax.Array:
    x, grid = soft_split(images, *self.soft_splits[0])
    for i, split in enumerate(self.soft_splits[1:], start=1):
      x = self._token_block(i)(x, train=train)
      x, grid = soft_split(x.reshape((x.shape[0],) + grid + (x.shape[-1],)), *split)
    return attention_lib.Dense(self.hidden_size, kernel_init=self.kernel_init,
                               bias_init=self.bias_init, dtype=self.dtype,
                               param_dtype=self.param_dtype, name='project')(x)


class T2TViT(vit.VisionTransformer):
  """T2T-ViT: Tokens-to-Token module, [cls] + fixed sinusoid positions, pre-norm ViT blocks.

  Backbone blocks have no qkv bias and LayerNorm eps 1e-5 (official `nn.LayerNorm`); `mlp_dim`
  defaults to 3 x hidden. `soft_splits` lists (kernel, stride, padding) of each soft split.
  """
  num_classes: int = 1000
  hidden_size: int = 384
  depth: int = 14
  num_heads: int = 6
  qkv_bias: bool = False
  init_scheme: str = 'timm'
  tokens_type: str = 'performer'
  token_dim: int = 64
  soft_splits: tuple[tuple[int, int, int], ...] = ((7, 4, 2), (3, 2, 1), (3, 2, 1))

  def check_fields(self) -> None:
    super().check_fields()
    if self.tokens_type not in TOKENS_TYPES:
      raise ValueError(f'Unknown tokens_type {self.tokens_type!r}; valid: {list(TOKENS_TYPES)}.')
    if len(self.soft_splits) < 1 or any(len(s) != 3 or min(s[:2]) < 1 or s[2] < 0
                                        for s in self.soft_splits):
      raise ValueError(f'soft_splits={self.soft_splits} must be a non-empty tuple of '
                       '(kernel >= 1, stride >= 1, padding >= 0) triples.')

  def check_image_size(self, images: jax.Array) -> None:
    """Raises unless every soft split of the images leaves a non-empty grid."""
    if images.ndim != 4:
      raise ValueError(f'Expected NHWC images of rank 4; got shape {images.shape}.')
    size = images.shape[1:3]
    for kernel, stride, padding in self.soft_splits:
      size = tuple((s + 2 * padding - kernel) // stride + 1 for s in size)
      if min(size) < 1:
        raise ValueError(f'Images of size {images.shape[1:3]} are too small for '
                         f'soft_splits={self.soft_splits}.')

  def embed(self, images: jax.Array, *, train: bool) -> jax.Array:
    """T2T tokens with [cls] prepended, plus the fixed sinusoid table, then dropout."""
    self.check_image_size(images)
    scheme = self.scheme
    x = TokensToToken(self.hidden_size, self.soft_splits, self.tokens_type, self.token_dim,
                      kernel_init=scheme.dense_kernel, bias_init=scheme.dense_bias,
                      dtype=self.dtype, param_dtype=self.param_dtype,
                      name='tokens_to_token')(images, train=train)
    batch, tokens, width = x.shape
    cls = self.param('cls_token', scheme.cls_token, (1, 1, width), self.param_dtype)
    x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (batch, 1, width)), x], axis=1)
    if self.has_variable('params', 'pos_embed'):
      stored = self.get_variable('params', 'pos_embed').shape
      if stored != (1,) + x.shape[1:]:
        raise ValueError(f'pos_embed has shape {stored} but images of size {images.shape[1:3]} '
                         f'give {tokens + 1} tokens; rebuild the table for the new size.')
    table = sinusoid_table(tokens + 1, width)
    pos_embed = self.param('pos_embed', lambda *_: jnp.asarray(table, self.param_dtype))
    x = x + jax.lax.stop_gradient(pos_embed).astype(x.dtype)
    return nn.Dropout(rate=self.dropout_rate, deterministic=not train)(x)

  def encode(self, x: jax.Array, *, train: bool) -> jax.Array:
    """Pre-norm blocks with LayerNorm eps 1e-5 and a linear stochastic-depth schedule."""
    scheme = self.scheme
    attention = functools.partial(
        attention_lib.SelfAttention, num_heads=self.num_heads, qkv_bias=self.qkv_bias,
        attention_dropout_rate=self.attention_dropout_rate, dropout_rate=self.dropout_rate,
        kernel_init=scheme.dense_kernel, bias_init=scheme.dense_bias, dtype=self.dtype,
        param_dtype=self.param_dtype)
    block = functools.partial(
        vit.EncoderBlock, attention, self.mlp_dim or 3 * self.hidden_size,
        dropout_rate=self.dropout_rate, layer_norm_eps=1e-5, mlp_kernel_init=scheme.dense_kernel,
        mlp_bias_init=scheme.mlp_bias, dtype=self.dtype, param_dtype=self.param_dtype)
    x = self.blocks(block, x, first=0, train=train,
                    drop_path_rates=np.linspace(0.0, self.drop_path_rate, self.depth))
    return nn.LayerNorm(epsilon=1e-5, dtype=self.dtype, param_dtype=self.param_dtype,
                        name='norm')(x)


# Official T2T-ViT keys (models/t2t_vit.py): ViT backbone without qkv bias, Transformer-T2T
# `attention{i}.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}`, Performer-T2T
# `attention{i}.{kqv,proj,norm1,norm2,mlp.0,mlp.2,w}`, `project`, fixed `pos_embed`.
_TIMM_KEY = re.compile(
    r'cls_token|pos_embed|(norm|head)\.(weight|bias)'
    r'|blocks\.\d+\.(norm[12]|attn\.(qkv|proj)|mlp\.fc[12])\.(weight|bias)'
    r'|tokens_to_token\.(project\.(weight|bias)|attention\d+\.(w|(norm[12]|attn\.(qkv|proj)'
    r'|mlp\.fc[12]|kqv|proj|mlp\.[02])\.(weight|bias)))')
_PERFORMER_FEATURES = re.compile(r'(tokens_to_token\.attention\d+)\.(w|random_features)$')


def from_timm(state_dict: Mapping[str, Any]) -> dict[str, dict]:
  """Official T2T-ViT state dict (`state_dict_ema`, no `module.` prefix) -> Flax variables."""
  unknown = [key for key in state_dict if not _TIMM_KEY.fullmatch(key)]
  if unknown:
    raise ValueError('Keys outside the official T2T-ViT layout (yitu-opensource/T2T-ViT, '
                     f'models/t2t_vit.py): {unknown}.')
  return vit.variables_from_torch(
      {_PERFORMER_FEATURES.sub(r'\1.random_features', key): value
       for key, value in state_dict.items()})


def to_timm(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Flax variables -> official T2T-ViT state dict (inverse of `from_timm`)."""
  return {_PERFORMER_FEATURES.sub(r'\1.w', key): value
          for key, value in vit.variables_to_torch(variables).items()}


# The published sizes for 224x224 inputs (official `models/t2t_vit.py`): (width, depth, heads,
# MLP ratio) of the backbone; all take token_dim 64 and soft splits (7, 4, 2), (3, 2, 1), (3, 2, 1).
# T2T-ViT-n uses the Performer T2T module, T2T-ViT_t-n the Transformer one. The released weights
# were trained and evaluated with the default qk scale, head_dim^-0.5 (their `pretrained=True`
# branch, which sets width^-0.5, loads timm-hosted weights that were never published).
SIZES = {
    '7': (256, 7, 4, 2), '10': (256, 10, 4, 2), '12': (256, 12, 4, 2),
    '14': (384, 14, 6, 3), '19': (448, 19, 7, 3), '24': (512, 24, 8, 3),
}
TRANSFORMER_T2T_SIZES = ('14', '19', '24')


def _t2t(size: str, tokens_type: str) -> functools.partial:
  width, depth, heads, mlp_ratio = SIZES[size]
  return functools.partial(T2TViT, tokens_type=tokens_type, hidden_size=width, depth=depth,
                           num_heads=heads, mlp_dim=mlp_ratio * width)


# The `_ti4` pair is for 32x32 inputs: soft splits (7, 2, 3), (3, 2, 1), (3, 1, 1) take
# 32 -> 16 -> 8 -> 8 (64 tokens, stride 4) into the T2T-ViT-7 backbone.
_SPLITS_32 = ((7, 2, 3), (3, 2, 1), (3, 1, 1))
MODELS = {
    **{f't2t_vit_{size}': _t2t(size, 'performer') for size in SIZES},
    **{f't2t_vit_t_{size}': _t2t(size, 'transformer') for size in TRANSFORMER_T2T_SIZES},
    **{name: functools.partial(_t2t('7', tokens_type), soft_splits=_SPLITS_32)
       for name, tokens_type in (('t2t_vit_ti4', 'performer'), ('t2t_vit_t_ti4', 'transformer'))},
}
