"""The building blocks every family shares: initialisation schemes, activations, MLP, stochastic
depth, the pre-norm encoder and class-attention blocks, feature sowing and the block stack.

`EncoderBlock` is parameterised by the attention module it builds, so any module mapping tokens
(batch, tokens, width) to the same shape and taking `train=` fits (`vit_jax.models.attention`
holds the published kinds). `apply_blocks` is the one place where a stack of blocks is scanned
(`nn.scan`) or rematerialised; `vit_jax.models.layouts` names and converts the stacked variables.
"""

import dataclasses
import functools
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import Dtype, Initializer, ModuleDef
from vit_jax.models import initializers
from vit_jax.models import layouts
from vit_jax.models import numerics

INIT_SCHEMES = ('google', 'timm')
# The collection every family sows its features to (`vit_jax.models.features` reads it): each
# block's output tokens as `<block>/tokens`, the final normalised tokens as `encoded` and what the
# head reads as `head_input` (`sow_feature`).
FEATURES = 'features'


def sow_feature(module: nn.Module, name: str, value: jax.Array) -> None:
  """Sows `value` to FEATURES when an apply asked for that collection; never at init, whose
  variables would otherwise carry activations."""
  if module.is_mutable_collection(FEATURES) and not module.is_initializing():
    module.sow(FEATURES, name, value)


@dataclasses.dataclass(frozen=True)
class InitScheme:
  """The initialisers of one published scheme, shared by every module of a model."""

  dense_kernel: Initializer
  dense_bias: Initializer
  mlp_bias: Initializer
  head_kernel: Initializer
  cls_token: Initializer
  pos_embed: Initializer
  patch_kernel: Initializer
  patch_bias_from_fan_in: Callable[[int], Initializer]

  @classmethod
  def named(cls, name: str) -> 'InitScheme':
    """'timm': DeiT/timm `_init_weights`; 'google': google-research/vision_transformer."""
    if name == 'timm':
      # timm's trunc_normal_(std=.02) truncates at +-2 absolute (100 sigma): a plain normal.
      normal = nn.initializers.normal(stddev=0.02)
      return cls(
          dense_kernel=normal,
          dense_bias=nn.initializers.zeros,
          mlp_bias=nn.initializers.zeros,
          head_kernel=normal,
          cls_token=normal,
          pos_embed=normal,
          patch_kernel=initializers.torch_default_kernel_init,
          patch_bias_from_fan_in=initializers.torch_default_bias_init,
      )
    if name == 'google':
      return cls(
          dense_kernel=nn.initializers.xavier_uniform(),
          dense_bias=nn.initializers.zeros,
          mlp_bias=nn.initializers.normal(stddev=1e-6),
          head_kernel=nn.initializers.zeros,
          cls_token=nn.initializers.zeros,
          pos_embed=nn.initializers.normal(stddev=0.02),
          patch_kernel=nn.initializers.lecun_normal(),
          patch_bias_from_fan_in=lambda _: nn.initializers.zeros,
      )
    raise ValueError(f'Unknown init_scheme {name!r}; valid: {list(INIT_SCHEMES)}.')


class DropPath(nn.Module):
  """Stochastic depth: drops whole residual branches per sample, rescaling by 1/keep.

  `rate` may be a traced scalar (a per-layer rate scanned over by `VisionTransformer.blocks`).
  """

  rate: float | jax.Array = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    if not train or (isinstance(self.rate, (int, float)) and self.rate == 0.0):
      return x
    keep = 1.0 - self.rate
    mask = jax.random.bernoulli(self.make_rng('dropout'), keep, (x.shape[0],) + (1,) * (x.ndim - 1))
    return jnp.where(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros_like(x))


def gelu(x: jax.Array) -> jax.Array:
  """Exact GELU, x * Phi(x), as PyTorch writes it: 0.5 x (1 + erf(x / sqrt(2))).

  Same function as `nn.gelu(x, approximate=False)`, whose erfc form costs an exponential and
  branch selects per element on CPU where XLA's erf is one rational polynomial.
  """
  return 0.5 * x * (1 + jax.lax.erf(x * np.asarray(np.sqrt(0.5), x.dtype)))


# timm's `act_layer` names: exact GELU (PyTorch, timm) and its tanh approximation (flax's
# `nn.gelu` default, which big_vision's and google-research/vision_transformer's models use).
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    'gelu': gelu,
    'gelu_tanh': functools.partial(nn.gelu, approximate=True),
}


class Mlp(nn.Module):
  """fc1 -> GELU (`activation`, exact by default) -> dropout -> fc2 -> dropout (timm `Mlp`)."""

  hidden_dim: int
  out_dim: int | None = None
  dropout_rate: float = 0.0
  activation: str = 'gelu'
  kernel_init: Initializer = initializers.DEFAULT_KERNEL_INIT
  bias_init: Initializer = nn.initializers.zeros
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    out_dim = self.out_dim or x.shape[-1]
    dense = functools.partial(
        numerics.Dense,
        kernel_init=self.kernel_init,
        bias_init=self.bias_init,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )
    dropout = nn.Dropout(rate=self.dropout_rate, deterministic=not train)
    x = dropout(ACTIVATIONS[self.activation](dense(self.hidden_dim, name='fc1')(x)))
    return dropout(dense(out_dim, name='fc2')(x))


def paper_layer_scale_init(depth: int) -> float:
  """CaiT's LayerScale init for a network of `depth` blocks (CaiT Section 3): 0.1 up to depth
  18, 1e-5 up to 24, 1e-6 deeper."""
  if depth <= 18:
    return 0.1
  return 1e-5 if depth <= 24 else 1e-6


class PreNormBlock(nn.Module):
  """The fields and branches of the pre-norm blocks (`EncoderBlock`, `ClassAttentionBlock`).

  `attention` builds the attention module (called with name='attn'); any module mapping tokens
  (batch, tokens, width) to (batch, tokens, width) and taking `train=` fits. `layer_scale_init`
  adds CaiT's LayerScale (`gamma_1`, `gamma_2`, CaiT Eq. 4); `attention_residual=False` lets the
  attention output replace x (T2T's token attention already adds its own V skip).
  `scale_adjustment` s is DeepViT's official rescaling: x + f(LN(s x)) / s for both branches.
  """

  attention: ModuleDef
  mlp_dim: int
  dropout_rate: float = 0.0
  drop_path_rate: float = 0.0
  layer_norm_eps: float = 1e-6
  layer_scale_init: float | None = None
  attention_residual: bool = True
  scale_adjustment: float = 1.0
  mlp_activation: str = 'gelu'
  mlp_kernel_init: Initializer = initializers.DEFAULT_KERNEL_INIT
  mlp_bias_init: Initializer = nn.initializers.zeros
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def branch(self, y: jax.Array, name: str) -> jax.Array:
    """A residual branch's output times its LayerScale `name` (if any), over the scale
    adjustment (if any)."""
    if self.layer_scale_init is not None:
      gamma = self.param(
          name, nn.initializers.constant(self.layer_scale_init), (y.shape[-1],), self.param_dtype
      )
      y = y * gamma.astype(y.dtype)
    return y if self.scale_adjustment == 1.0 else y / jnp.asarray(self.scale_adjustment, y.dtype)

  def norm(self, x: jax.Array, name: str) -> jax.Array:
    """LayerNorm `name` of x (of s x under a scale adjustment s)."""
    if self.scale_adjustment != 1.0:
      x = x * jnp.asarray(self.scale_adjustment, x.dtype)
    return nn.LayerNorm(
        epsilon=self.layer_norm_eps, dtype=self.dtype, param_dtype=self.param_dtype, name=name
    )(x)

  def mlp(self, x: jax.Array, train: bool) -> jax.Array:
    """The block's MLP branch on LN(x), before LayerScale."""
    return Mlp(
        self.mlp_dim,
        dropout_rate=self.dropout_rate,
        activation=self.mlp_activation,
        kernel_init=self.mlp_kernel_init,
        bias_init=self.mlp_bias_init,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='mlp',
    )(self.norm(x, 'norm2'), train=train)


class EncoderBlock(PreNormBlock):
  """Pre-norm Transformer block: x + DropPath(Attn(LN(x))), then x + DropPath(MLP(LN(x)))."""

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    drop_path = DropPath(self.drop_path_rate)
    y = self.branch(self.attention(name='attn')(self.norm(x, 'norm1'), train=train), 'gamma_1')
    x = x + drop_path(y, train=train) if self.attention_residual else y
    x = x + drop_path(self.branch(self.mlp(x, train), 'gamma_2'), train=train)
    sow_feature(self, 'tokens', x)
    return x


class ClassAttentionBlock(PreNormBlock):
  """CaiT's `LayerScale_Block_CA`: cls + gamma_1 CA(LN([cls; x])), cls + gamma_2 MLP(LN(cls)).

  Called as block(x, cls): only the class token is updated (CaiT Eq. 5); the patches are frozen.
  No drop path and, as in CaiT, built without dropout.
  """

  @nn.compact
  def __call__(self, x: jax.Array, cls: jax.Array, *, train: bool = False) -> jax.Array:
    tokens = jnp.concatenate([cls, x], axis=1)
    cls = cls + self.branch(
        self.attention(name='attn')(self.norm(tokens, 'norm1'), train=train), 'gamma_1'
    )
    return cls + self.branch(self.mlp(cls, train), 'gamma_2')


class _Layer(nn.Module):
  """A block as one step of `nn.scan`/`nn.remat`: (x, drop_path_rate) -> (x, None).

  The block shares this module's scope, so its variables sit where the plain block's would.
  """

  block: ModuleDef
  train: bool

  @nn.compact
  def __call__(
      self, x: jax.Array, drop_path_rate: jax.Array | None = None
  ) -> tuple[jax.Array, None]:
    block = self.block() if drop_path_rate is None else self.block(drop_path_rate=drop_path_rate)
    nn.share_scope(self, block)
    return block(x, train=self.train), None


def apply_blocks(
    block: ModuleDef,
    x: jax.Array,
    *,
    count: int,
    first: int,
    train: bool,
    scan_layers: bool,
    remat: bool,
    prefix: str = 'blocks',
    drop_path_rates: Sequence[float] | None = None,
) -> jax.Array:
  """Applies `count` blocks `{prefix}_{first}`, ... in sequence (inside a compact method).

  The one place where every family's block stack is scanned or rematerialised. `block(name=...)`
  builds one block, given `drop_path_rate=` too when `drop_path_rates` (one per block) are given.
  `remat=True` recomputes each block's activations in the backward pass (memory).
  `scan_layers=True` traces one block and runs it with `nn.scan` (fast compilation of deep
  models); its variables are then stacked along a leading layer axis under
  `{prefix}_{first}_to_{last}` (as are sown intermediates), and `layouts.unstack_layers` /
  `stack_layers` convert to and from the unrolled `{prefix}_{i}` layout that checkpoints of
  unrolled models, the PyTorch converters and analysis use (`layouts.variables_to_torch` accepts
  either).
  """
  rates = None if drop_path_rates is None else [float(r) for r in drop_path_rates]
  if rates is not None and len(rates) != count:
    raise ValueError(f'{len(rates)} drop-path rates for {count} blocks.')

  def one_block(i: int) -> ModuleDef:
    return block if rates is None else functools.partial(block, drop_path_rate=rates[i])

  if not (scan_layers and count > 1):
    for i in range(count):
      name = f'{prefix}_{first + i}'
      if remat:
        x, _ = nn.remat(_Layer)(one_block(i), train, name=name)(x)
      else:
        x = one_block(i)(name=name)(x, train=train)
    return x
  layer = nn.remat(_Layer, prevent_cse=False) if remat else _Layer
  scan = nn.scan(
      layer,
      variable_axes={True: 0},
      split_rngs={'params': True, 'dropout': True},
      in_axes=0,
      length=count,
  )
  name = layouts.scanned_name(prefix, first, first + count - 1)
  if rates is None or all(rate == rates[0] for rate in rates):
    x, _ = scan(one_block(0), train, name=name)(x)
  else:
    x, _ = scan(block, train, name=name)(x, jnp.asarray(rates, jnp.float32))
  return x
