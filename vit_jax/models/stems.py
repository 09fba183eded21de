"""Stems: how an image becomes the tokens of the first block, one per published kind.

'patch', ViT's patch embedding (`PatchEmbedding`); 'cnn', DeepViT's CNN stem (`CnnStem`); 't2t',
T2T-ViT's tokens-to-token module (`TokensToToken`, with Performer or transformer token attention);
'space_to_depth', SA-conv's 2x2 invertible downsampling followed by a linear map
(`SpaceToDepthEmbedding`). Every stem returns tokens laid out on a grid, (batch, rows, cols,
width), so positional attention and the analysis know where each token sits. Each is registered
(`register`), as a stem of your own is: the model finds it by name (`VisionTransformer.stem`).
"""

import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.process import extensions
from vit_jax.models import Dtype, Initializer, ModuleDef
from vit_jax.models import attention as attention_lib
from vit_jax.models import initializers
from vit_jax.models import numerics
from vit_jax.schema import parts

TOKENS_TYPES = ('performer', 'transformer')


def check_images(images: jax.Array, patch_size: int) -> tuple[int, int]:
  """Returns the patch grid (rows, cols), or raises for non-NHWC or non-divisible images."""
  if images.ndim != 4:
    raise ValueError(f'Expected NHWC images of rank 4; got shape {images.shape}.')
  height, width = images.shape[1:3]
  if patch_size < 1 or height % patch_size or width % patch_size:
    valid = sorted(
        set(d for d in range(1, min(height, width) + 1) if height % d == 0 and width % d == 0)
    )
    raise ValueError(
        f'patch_size={patch_size} must divide the image size {height}x{width}; '
        f'valid patch sizes: {valid}.'
    )
  return height // patch_size, width // patch_size


def space_to_depth(images: jax.Array, block: int) -> jax.Array:
  """Invertible downsampling (B, H, W, C) -> (B, H/b, W/b, b*b*C), channels in (dy, dx, c) order
  (einops `(h p1) (w p2) c -> h w (p1 p2 c)`, as SA-conv's official code writes it)."""
  batch, height, width, channels = images.shape
  if block < 1 or height % block or width % block:
    valid = [b for b in range(1, min(height, width) + 1) if height % b == 0 and width % b == 0]
    raise ValueError(
        f'downsample={block} must divide the image size {height}x{width}; ' f'valid: {valid}.'
    )
  x = images.reshape(batch, height // block, block, width // block, block, channels)
  x = x.transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(batch, height // block, width // block, block * block * channels)


def torch_dense(features: int, fan_in: int, **kwargs) -> nn.Dense:
  """A Linear with PyTorch's default init, which SA-conv's official `BertImage` keeps."""
  return numerics.Dense(
      features,
      kernel_init=initializers.torch_default_kernel_init,
      bias_init=initializers.torch_default_bias_init(fan_in),
      **kwargs,
  )


class PatchEmbedding(nn.Module):
  """Conv(kernel = stride = patch): (batch, rows, cols, hidden) patch tokens."""

  patch_size: int
  hidden_size: int
  kernel_init: Initializer = initializers.torch_default_kernel_init
  bias_init_from_fan_in: Callable[[int], Initializer] = initializers.torch_default_bias_init
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False) -> jax.Array:
    del train  # A linear map: the same in training and evaluation.
    check_images(images, self.patch_size)
    fan_in = images.shape[-1] * self.patch_size**2
    p = self.patch_size
    return nn.Conv(
        self.hidden_size,
        (p, p),
        strides=(p, p),
        padding='VALID',
        kernel_init=self.kernel_init,
        bias_init=self.bias_init_from_fan_in(fan_in),
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='proj',
    )(images)


class SpaceToDepthEmbedding(nn.Module):
  """SA-conv's stem: `space_to_depth(block)` then a Linear to `hidden_size` (`proj`).

  As a function of the image it is a patch embedding of patch `block`; it differs in the feature
  order of its kernel and in its initialisation (PyTorch's Linear default, as SA-conv keeps).
  """

  block: int
  hidden_size: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False) -> jax.Array:
    del train  # A linear map: the same in training and evaluation.
    x = space_to_depth(images, self.block)
    return torch_dense(
        self.hidden_size, x.shape[-1], dtype=self.dtype, param_dtype=self.param_dtype, name='proj'
    )(x)


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
      raise ValueError(
          f'patch_size={self.patch_size} must be even with the CNN stem '
          '(its first conv has stride 2).'
      )
    check_images(images, self.patch_size)
    conv = functools.partial(
        nn.Conv,
        kernel_init=initializers.torch_default_kernel_init,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )
    batch_norm = functools.partial(
        nn.BatchNorm,
        use_running_average=not train,
        momentum=0.9,
        epsilon=1e-5,
        dtype=jnp.float32,
        param_dtype=self.param_dtype,
    )
    x = conv(
        self.stem_width,
        (7, 7),
        strides=(2, 2),
        padding=((3, 3), (3, 3)),
        use_bias=False,
        name='conv1',
    )(images)
    x = nn.relu(batch_norm(name='bn1')(x)).astype(self.dtype)
    x = conv(self.stem_width, (3, 3), padding=((1, 1), (1, 1)), use_bias=False, name='conv2')(x)
    x = nn.relu(batch_norm(name='bn2')(x)).astype(self.dtype)
    p = self.patch_size // 2
    bias_init = initializers.torch_default_bias_init(self.stem_width * p * p)
    return conv(
        self.hidden_size, (p, p), strides=(p, p), padding='VALID', bias_init=bias_init, name='proj'
    )(x)


def soft_split(
    x: jax.Array, kernel_size: int, stride: int, padding: int
) -> tuple[jax.Array, tuple[int, int]]:
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
  patches = jnp.stack(
      [
          x[:, i : i + stride * (rows - 1) + 1 : stride, j : j + stride * (cols - 1) + 1 : stride]
          for i, j in offsets
      ],
      axis=-1,
  )
  return patches.reshape(batch, rows * cols, channels * kernel_size**2), (rows, cols)


def check_soft_splits(
    soft_splits: tuple[tuple[int, int, int], ...], image_size: Sequence[int] | None = None
) -> None:
  """Raises unless `soft_splits` are (kernel, stride, padding) triples that leave a non-empty
  grid of an image of `image_size` (when given)."""
  if len(soft_splits) < 1 or any(len(s) != 3 or min(s[:2]) < 1 or s[2] < 0 for s in soft_splits):
    raise ValueError(
        f'soft_splits={soft_splits} must be a non-empty tuple of '
        '(kernel >= 1, stride >= 1, padding >= 0) triples.'
    )
  if not image_size:
    return
  size = tuple(image_size)
  for kernel, stride, padding in soft_splits:
    size = tuple((s + 2 * padding - kernel) // stride + 1 for s in size)
    if min(size) < 1:
      raise ValueError(
          f'Images of size {image_size} are too small for ' f'soft_splits={soft_splits}.'
      )


def check_t2t_settings(settings: parts.T2TSettings) -> None:
  """Raises unless `settings` name a token block of TOKENS_TYPES, a positive token width and
  usable soft splits."""
  attention_lib.check_choice(settings.tokens_type, TOKENS_TYPES, 'tokens_type')
  if settings.token_dim < 1:
    raise ValueError(f'token_dim={settings.token_dim} must be >= 1.')
  check_soft_splits(settings.soft_splits)


class TokenPerformer(nn.Module):
  """T2T's `Token_performer`: one-head linear attention with positive random features.

  kqv = Linear(d_in -> 3 * dim) split as k, q, v; phi(x) = exp(w x - |x|^2 / 2) / sqrt(m) with
  frozen orthonormal rows w scaled by sqrt(m), m = dim * kernel_ratio;
  y = v + Drop(proj(phi(q) (phi(k)^T v) / (phi(q) . sum_t phi(k_t) + 1e-8))), then
  y + Drop(MLP(LN(y))). The implicit attention matrix is sown only when asked for.
  """

  activation: Callable[[jax.Array], jax.Array]
  dim: int = 64
  kernel_ratio: float = 0.5
  dropout_rate: float = 0.1
  layer_norm_eps: float = 1e-5
  kernel_init: Initializer = initializers.DEFAULT_KERNEL_INIT
  bias_init: Initializer = nn.initializers.zeros
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _features(self, x: jax.Array, w: jax.Array) -> jax.Array:
    """Positive random features of the softmax kernel, (batch, tokens, m), in float32.

    w x multiplies operands in `dtype`; |x|^2 and the exponential are float32.
    """
    projected = numerics.einsum_float32('bti,mi->btm', x.astype(self.dtype), w.astype(self.dtype))
    x = x.astype(jnp.float32)
    half_norm = 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
    return jnp.exp(projected - half_norm) / math.sqrt(w.shape[0])

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    num_features = int(self.dim * self.kernel_ratio)
    if num_features < 1:
      raise ValueError(
          f'kernel_ratio={self.kernel_ratio} leaves no random features for '
          f'dim={self.dim}; it must be >= {1 / self.dim}.'
      )
    dense = functools.partial(
        numerics.Dense,
        kernel_init=self.kernel_init,
        bias_init=self.bias_init,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )
    norm = functools.partial(
        nn.LayerNorm, epsilon=self.layer_norm_eps, dtype=self.dtype, param_dtype=self.param_dtype
    )
    dropout = nn.Dropout(rate=self.dropout_rate, deterministic=not train)

    def orthogonal_rows(key, shape, dtype=jnp.float32):
      return nn.initializers.orthogonal(scale=math.sqrt(shape[0]))(key, shape, dtype)

    # Frozen random features stay float32 whatever param_dtype is (official requires_grad=False).
    w = jax.lax.stop_gradient(
        self.param('random_features', orthogonal_rows, (num_features, self.dim), jnp.float32)
    )
    k, q, v = jnp.split(dense(3 * self.dim, name='kqv')(norm(name='norm1')(x)), 3, axis=-1)
    kp, qp = self._features(k, w), self._features(q, w)
    # The features' products take operands in `dtype` and accumulate in float32.
    product = lambda spec, a, b: numerics.einsum_float32(
        spec, a.astype(self.dtype), b.astype(self.dtype)
    )
    normaliser = product('btm,bm->bt', qp, kp.sum(axis=1))[..., None] + 1e-8
    if self.is_mutable_collection('intermediates'):
      probs = product('bqm,bkm->bqk', qp, kp) / normaliser
      self.sow('intermediates', 'attention_probs', probs[:, None])
    kv = product('btd,btm->bdm', v, kp)
    y = (product('btm,bdm->btd', qp, kv) / normaliser).astype(self.dtype)
    y = v + dropout(dense(self.dim, name='proj')(y))
    hidden = self.activation(dense(self.dim, name='mlp_0')(norm(name='norm2')(y)))
    return y + dropout(dense(self.dim, name='mlp_2')(hidden))


class TokensToToken(nn.Module):
  """T2T's module: soft split -> token block -> re-structurise, repeated; soft split + `project`.

  `token_block(name=...)` builds one token block (`TokenPerformer`, or a transformer block over
  `attention.TokenAttention`); `settings.soft_splits` lists (kernel, stride, padding) of each soft
  split.
  """

  hidden_size: int
  token_block: ModuleDef
  settings: parts.T2TSettings = parts.T2TSettings()
  kernel_init: Initializer = initializers.DEFAULT_KERNEL_INIT
  bias_init: Initializer = nn.initializers.zeros
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False) -> jax.Array:
    if images.ndim != 4:
      raise ValueError(f'Expected NHWC images of rank 4; got shape {images.shape}.')
    soft_splits = self.settings.soft_splits
    check_soft_splits(soft_splits, images.shape[1:3])
    x, grid = soft_split(images, *soft_splits[0])
    for i, split in enumerate(soft_splits[1:], start=1):
      x = self.token_block(name=f'attention{i}')(x, train=train)
      x, grid = soft_split(x.reshape((x.shape[0],) + grid + (x.shape[-1],)), *split)
    x = numerics.Dense(
        self.hidden_size,
        kernel_init=self.kernel_init,
        bias_init=self.bias_init,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='project',
    )(x)
    return x.reshape((x.shape[0],) + grid + (x.shape[-1],))


@dataclasses.dataclass(frozen=True)
class Stem:
  """A stem of the backbone (`VisionTransformer.stem`).

  build(model): the stem for `model`, a `VisionTransformer` whose fields it may read (a stem's own
  settings: `model.kind_settings(ItsSettings)`), as a `functools.partial` of a Flax module that the
  model names `module_name` and calls with (images, train=...); it returns (batch, rows, cols,
  `model.hidden_size`) tokens on a grid.
  module_name: the name of the stem's variables; layer-wise lr decay puts them in layer 0.
  check(model): raises ValueError for fields of `model` the stem cannot work with (None: none).
  settings: the stem's own settings dataclass, None if it has none.
  module: the module that registered the stem, which a run that uses it records
  (`vit_jax.process.extensions`).
  """

  build: Callable[[Any], ModuleDef]
  module_name: str = 'patch_embed'
  check: Callable[[Any], None] | None = None
  settings: type | None = None
  module: str = __name__


_STEMS: dict[str, Stem] = {}


def register(
    name: str,
    build: Callable[[Any], ModuleDef],
    *,
    module_name: str = 'patch_embed',
    check: Callable[[Any], None] | None = None,
    settings: type | None = None,
) -> None:
  """Makes `name` a stem of every transformer (`--config.model.stem=name`); its own `settings` (a
  frozen dataclass whose `part` is 'stem') become `--config.model.FIELD` of every config
  (`parts.register_settings`)."""
  if name in _STEMS:
    raise ValueError(f'Stem {name!r} is registered already; registered: {names()}.')
  if settings is not None:
    parts.register_settings(settings, part='stem')
  module = extensions.caller_module()
  _STEMS[name] = Stem(build, module_name, check, settings, module)
  extensions.note('stem', name, module, f'stem={name!r}')


def names() -> list[str]:
  """Every registered stem, in registration order."""
  return list(_STEMS)


def stem(name: str) -> Stem:
  """The registered stem `name`; ValueError naming the registered ones."""
  attention_lib.check_choice(name, _STEMS, 'stem')
  return _STEMS[name]


def _dtypes(model: Any) -> dict[str, Dtype]:
  return dict(dtype=model.dtype, param_dtype=model.param_dtype)


def _check_cnn(model: Any) -> None:
  if model.patch_size % 2:
    raise ValueError(
        f"patch_size={model.patch_size} must be even with stem='cnn' (its first "
        'conv has stride 2).'
    )


register(
    'patch',
    lambda model: functools.partial(
        PatchEmbedding,
        model.patch_size,
        model.hidden_size,
        kernel_init=model.scheme.patch_kernel,
        bias_init_from_fan_in=model.scheme.patch_bias_from_fan_in,
        **_dtypes(model),
    ),
)
register(
    'cnn',
    lambda model: functools.partial(CnnStem, model.patch_size, model.hidden_size, **_dtypes(model)),
    check=_check_cnn,
)
register(
    't2t',
    lambda model: functools.partial(
        TokensToToken,
        model.hidden_size,
        model.token_block(),
        model.kind_settings(parts.T2TSettings),
        kernel_init=model.scheme.dense_kernel,
        bias_init=model.scheme.dense_bias,
        **_dtypes(model),
    ),
    module_name='tokens_to_token',
    check=lambda model: check_t2t_settings(model.kind_settings(parts.T2TSettings)),
    settings=parts.T2TSettings,
)
register(
    'space_to_depth',
    lambda model: functools.partial(
        SpaceToDepthEmbedding, model.patch_size, model.hidden_size, **_dtypes(model)
    ),
)
