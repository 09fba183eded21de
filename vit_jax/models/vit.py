"""Vision Transformer (Dosovitskiy et al.): the shared backbone of every transformer family.

`VisionTransformer` is built of interchangeable parts, each a field with ViT's default: the stem
(`stem`: patch embedding, DeepViT's CNN stem, T2T's tokens-to-token module, SA-conv's 2x2
space-to-depth), the attention of the main blocks (`attention`: standard, CaiT's talking heads,
DeepViT's Re-attention, Cordonnier et al.'s positional kinds), LayerScale (`layer_scale_init`,
`paper_layer_scale`), the class stage (`class_stage`: a class token from the start, or CaiT's
class-attention blocks after the patches) and DeiT's distillation token (`distilled`). DeiT,
CaiT, DeepViT and T2T-ViT are presets of these parts (subclasses that change defaults only, and
extend `attention_fields`/`block_fields` for what only they have); `check_fields` refuses the
combinations that cannot work.

Building blocks: `PatchEmbedding`, `Mlp`, `DropPath`, `EncoderBlock` (pre-norm, parameterised by
the attention module it builds), `ClassAttentionBlock` and `InitScheme` (the timm/DeiT and Google
initialisations). Parameter names follow the timm layout (`patch_embed/proj`,
`blocks_i/{norm1,attn,norm2,mlp}`, `norm`, `head`) so `from_timm`/`to_timm` are transposes and
renames (`variables_from_torch`, `variables_to_torch`, reusable by every family).
"""

import dataclasses
import functools
import itertools
import re
from typing import Any, Callable, Mapping, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.models import Dtype, Initializer, ModuleDef
from vit_jax.models import attention as attention_lib
from vit_jax.models import stems

INIT_SCHEMES = ('google', 'timm')
# The attention of the main blocks: content attention without or with head mixing, or one of
# Cordonnier et al.'s positional kinds (patch tokens only).
ATTENTION_KINDS = ('standard', 'talking_heads', 're_attention') + attention_lib.POSITIONAL_KINDS
_HEAD_MIXING = {'standard': 'none', 'talking_heads': 'talking_heads',
                're_attention': 're_attention'}
# 'token': a class token from the first block (ViT); 'class_attention': CaiT's class-attention
# blocks take the class token after the patch blocks (CaiT Section 3).
CLASS_STAGES = ('token', 'class_attention')
INFERENCE_MODES = ('average_logits', 'sum_softmax')
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
      return cls(dense_kernel=normal, dense_bias=nn.initializers.zeros,
                 mlp_bias=nn.initializers.zeros, head_kernel=normal, cls_token=normal,
                 pos_embed=normal, patch_kernel=attention_lib.torch_default_kernel_init,
                 patch_bias_from_fan_in=attention_lib.torch_default_bias_init)
    if name == 'google':
      return cls(dense_kernel=nn.initializers.xavier_uniform(), dense_bias=nn.initializers.zeros,
                 mlp_bias=nn.initializers.normal(stddev=1e-6),
                 head_kernel=nn.initializers.zeros, cls_token=nn.initializers.zeros,
                 pos_embed=nn.initializers.normal(stddev=0.02),
                 patch_kernel=nn.initializers.lecun_normal(),
                 patch_bias_from_fan_in=lambda _: nn.initializers.zeros)
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
ACTIVATIONS = {'gelu': gelu, 'gelu_tanh': functools.partial(nn.gelu, approximate=True)}


class Mlp(nn.Module):
  """fc1 -> GELU (`activation`, exact by default) -> dropout -> fc2 -> dropout (timm `Mlp`)."""
  hidden_dim: int
  out_dim: int | None = None
  dropout_rate: float = 0.0
  activation: str = 'gelu'
  kernel_init: Initializer = attention_lib.DEFAULT_KERNEL_INIT
  bias_init: Initializer = nn.initializers.zeros
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    out_dim = self.out_dim or x.shape[-1]
    dense = functools.partial(attention_lib.Dense, kernel_init=self.kernel_init,
                              bias_init=self.bias_init, dtype=self.dtype,
                              param_dtype=self.param_dtype)
    dropout = nn.Dropout(rate=self.dropout_rate, deterministic=not train)
    x = dropout(ACTIVATIONS[self.activation](dense(self.hidden_dim, name='fc1')(x)))
    return dropout(dense(out_dim, name='fc2')(x))


def paper_layer_scale_init(depth: int) -> float:
  """CaiT's LayerScale init for a network of `depth` blocks (CaiT Section 3): 0.1 up to depth
  18, 1e-5 up to 24, 1e-6 deeper."""
  if depth <= 18:
    return 0.1
  return 1e-5 if depth <= 24 else 1e-6


class EncoderBlock(nn.Module):
  """Pre-norm Transformer block: x + DropPath(Attn(LN(x))), then x + DropPath(MLP(LN(x))).

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
  mlp_kernel_init: Initializer = attention_lib.DEFAULT_KERNEL_INIT
  mlp_bias_init: Initializer = nn.initializers.zeros
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def branch(self, y: jax.Array, name: str) -> jax.Array:
    """A residual branch's output times its LayerScale `name` (if any), over the scale
    adjustment (if any)."""
    if self.layer_scale_init is not None:
      gamma = self.param(name, nn.initializers.constant(self.layer_scale_init), (y.shape[-1],),
                         self.param_dtype)
      y = y * gamma.astype(y.dtype)
    return y if self.scale_adjustment == 1.0 else y / jnp.asarray(self.scale_adjustment, y.dtype)

  def norm(self, x: jax.Array, name: str) -> jax.Array:
    """LayerNorm `name` of x (of s x under a scale adjustment s)."""
    if self.scale_adjustment != 1.0:
      x = x * jnp.asarray(self.scale_adjustment, x.dtype)
    return nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.dtype,
                        param_dtype=self.param_dtype, name=name)(x)

  def mlp(self, x: jax.Array, train: bool) -> jax.Array:
    """The block's MLP branch on LN(x), before LayerScale."""
    return Mlp(self.mlp_dim, dropout_rate=self.dropout_rate, activation=self.mlp_activation,
               kernel_init=self.mlp_kernel_init, bias_init=self.mlp_bias_init, dtype=self.dtype,
               param_dtype=self.param_dtype, name='mlp')(self.norm(x, 'norm2'), train=train)

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    drop_path = DropPath(self.drop_path_rate)
    y = self.branch(self.attention(name='attn')(self.norm(x, 'norm1'), train=train), 'gamma_1')
    x = x + drop_path(y, train=train) if self.attention_residual else y
    x = x + drop_path(self.branch(self.mlp(x, train), 'gamma_2'), train=train)
    sow_feature(self, 'tokens', x)
    return x


class ClassAttentionBlock(EncoderBlock):
  """CaiT's `LayerScale_Block_CA`: cls + gamma_1 CA(LN([cls; x])), cls + gamma_2 MLP(LN(cls)).

  Called as block(x, cls): only the class token is updated (CaiT Eq. 5); the patches are frozen.
  No drop path and, as in CaiT, built without dropout.
  """

  @nn.compact
  def __call__(self, x: jax.Array, cls: jax.Array, *, train: bool = False) -> jax.Array:
    tokens = jnp.concatenate([cls, x], axis=1)
    cls = cls + self.branch(self.attention(name='attn')(self.norm(tokens, 'norm1'), train=train),
                            'gamma_1')
    return cls + self.branch(self.mlp(cls, train), 'gamma_2')


class _Layer(nn.Module):
  """A block as one step of `nn.scan`/`nn.remat`: (x, drop_path_rate) -> (x, None).

  The block shares this module's scope, so its variables sit where the plain block's would.
  """
  block: ModuleDef
  train: bool

  @nn.compact
  def __call__(self, x: jax.Array, drop_path_rate: jax.Array | None = None
               ) -> tuple[jax.Array, None]:
    block = self.block() if drop_path_rate is None else self.block(drop_path_rate=drop_path_rate)
    nn.share_scope(self, block)
    return block(x, train=self.train), None


def apply_blocks(block: ModuleDef, x: jax.Array, *, count: int, first: int, train: bool,
                 scan_layers: bool, remat: bool, prefix: str = 'blocks',
                 drop_path_rates: Sequence[float] | None = None) -> jax.Array:
  """Applies `count` blocks `{prefix}_{first}`, ... in sequence (inside a compact method).

  The one place where every family's block stack is scanned or rematerialised. `block(name=...)`
  builds one block, given `drop_path_rate=` too when `drop_path_rates` (one per block) are given.
  `remat=True` recomputes each block's activations in the backward pass (memory).
  `scan_layers=True` traces one block and runs it with `nn.scan` (fast compilation of deep
  models); its variables are then stacked along a leading layer axis under
  `{prefix}_{first}_to_{last}` (as are sown intermediates), and `unstack_layers` / `stack_layers`
  convert to and from the unrolled `{prefix}_{i}` layout that checkpoints of unrolled models,
  `from_timm` and analysis use (`to_timm` accepts either).
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
  scan = nn.scan(layer, variable_axes={True: 0}, split_rngs={'params': True, 'dropout': True},
                 in_axes=0, length=count)
  name = scanned_name(prefix, first, first + count - 1)
  if rates is None or all(rate == rates[0] for rate in rates):
    x, _ = scan(one_block(0), train, name=name)(x)
  else:
    x, _ = scan(block, train, name=name)(x, jnp.asarray(rates, jnp.float32))
  return x


def block_indices(name: str, prefix: str) -> np.ndarray | None:
  """The indices of the blocks that variable collection `name` holds: [i] for `{prefix}_{i}`,
  [a, ..., b] for a scanned stack `{prefix}_{a}_to_{b}`; None for any other name."""
  single = re.fullmatch(rf'{re.escape(prefix)}_(\d+)', name)
  if single:
    return np.array([int(single.group(1))])
  stack = _SCANNED_NAME.fullmatch(name)
  if stack and stack.group(1) == prefix:
    return np.arange(int(stack.group(2)), int(stack.group(3)) + 1)
  return None


def scanned_name(prefix: str, first: int, last: int) -> str:
  """Name of the stack of blocks `{prefix}_{first}` .. `{prefix}_{last}` in a scanned model."""
  return f'{prefix}_{first}_to_{last}'


_SCANNED_NAME = re.compile(r'(.+)_(\d+)_to_(\d+)')


def unstack_layers(tree: Any) -> Any:
  """Scanned-model variables -> the unrolled `{prefix}_{i}` layout (inverse of `stack_layers`).

  Every `{prefix}_{a}_to_{b}` stack (leading layer axis) in any nested dict (params,
  batch_stats, intermediates, optimizer moments) becomes `{prefix}_{a}` .. `{prefix}_{b}`.
  """
  if not isinstance(tree, Mapping):
    return tree
  out = {}
  for key, value in tree.items():
    match = _SCANNED_NAME.fullmatch(str(key))
    if match and isinstance(value, Mapping):
      prefix, first, last = match.group(1), int(match.group(2)), int(match.group(3))
      for i in range(last - first + 1):
        out[f'{prefix}_{first + i}'] = jax.tree.map(lambda x, i=i: x[i], dict(value))
    else:
      out[key] = unstack_layers(value)
  return out


def stack_layers(tree: Any, like: Any) -> Any:
  """Unrolled variables -> the layout of `like`, e.g. a scanned model's `jax.eval_shape(init)`.

  Blocks `{prefix}_{a}` .. `{prefix}_{b}` are stacked wherever `like` has `{prefix}_{a}_to_{b}`.
  """
  if not isinstance(tree, Mapping) or not isinstance(like, Mapping):
    return tree
  out = {key: value for key, value in tree.items()}
  for key, value in like.items():
    match = _SCANNED_NAME.fullmatch(str(key))
    if match and key not in tree:
      prefix, first, last = match.group(1), int(match.group(2)), int(match.group(3))
      names = [f'{prefix}_{i}' for i in range(first, last + 1)]
      missing = [name for name in names if name not in tree]
      if missing:
        raise ValueError(f'Cannot stack {key}: the variables lack {missing}.')
      out[key] = jax.tree.map(lambda *xs: jnp.stack(xs), *[dict(out.pop(n)) for n in names])
    elif key in tree:
      out[key] = stack_layers(tree[key], value)
  return out


class PatchEmbedding(nn.Module):
  """Conv(kernel = stride = patch): (batch, rows, cols, hidden) patch tokens."""
  patch_size: int
  hidden_size: int
  kernel_init: Initializer = attention_lib.torch_default_kernel_init
  bias_init_from_fan_in: Callable[[int], Initializer] = attention_lib.torch_default_bias_init
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array) -> jax.Array:
    stems.check_images(images, self.patch_size)
    fan_in = images.shape[-1] * self.patch_size ** 2
    p = self.patch_size
    return nn.Conv(self.hidden_size, (p, p), strides=(p, p), padding='VALID',
                   kernel_init=self.kernel_init, bias_init=self.bias_init_from_fan_in(fan_in),
                   dtype=self.dtype, param_dtype=self.param_dtype, name='proj')(images)


GLOBAL_POOLS = ('token', 'avg', 'map')


class AttentionPool(nn.Module):
  """Multihead attention pooling: big_vision's `MAPHead` in timm's `AttentionPoolLatent` layout.

  A learned `latent` query attends to the tokens (`q`, `kv`, `proj`); then y + MLP(LN(y)).
  Returns (batch, width); the attention probabilities are sown like every attention's.
  """
  num_heads: int
  mlp_dim: int
  mlp_activation: str = 'gelu'
  layer_norm_eps: float = 1e-6
  kernel_init: Initializer = attention_lib.DEFAULT_KERNEL_INIT
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    batch, tokens, width = x.shape
    head_dim = attention_lib.check_heads(width, self.num_heads, 'hidden')
    dense = functools.partial(attention_lib.Dense, kernel_init=self.kernel_init, dtype=self.dtype,
                              param_dtype=self.param_dtype)
    latent = self.param('latent', self.kernel_init, (1, 1, width), self.param_dtype)
    q = dense(width, name='q')(latent.astype(x.dtype)).reshape(1, self.num_heads, 1, head_dim)
    k, v = jnp.split(dense(2 * width, name='kv')(x).reshape(
        batch, tokens, 2 * self.num_heads, head_dim), 2, axis=2)
    scores = attention_lib.einsum_float32(
        'bhqd,bkhd->bhqk', jnp.broadcast_to(q * jnp.asarray(head_dim ** -0.5, q.dtype),
                                            (batch,) + q.shape[1:]), k)
    y = attention_lib.attend(self, scores, v, dropout_rate=0.0, train=train)
    y = dense(width, name='proj')(y.reshape(batch, 1, width))
    norm = nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.dtype, param_dtype=self.param_dtype,
                        name='norm')
    y = y + Mlp(self.mlp_dim, activation=self.mlp_activation, kernel_init=self.kernel_init,
                dtype=self.dtype, param_dtype=self.param_dtype, name='mlp')(norm(y), train=train)
    return y[:, 0]


class VisionTransformer(nn.Module):
  """ViT: stem + [cls] + learned position embedding, pre-norm blocks, LN, head on cls.

  `init_scheme='google'` (default; the paper's official code) zero-initialises the head and uses
  xavier Dense kernels; `'timm'` is DeiT/timm's N(0, 0.02) scheme. `representation_size` adds the
  paper's tanh pre-logits layer. The position embedding length is set by the input at init.
  attention_implementation='cudnn' runs the fast attention path as cuDNN flash attention (GPU,
  float16/bfloat16), 'xla' as `jax.nn.dot_product_attention`'s XLA implementation; None computes
  the same as 'xla' (`attention.softmax_attention`, whose backward pass keeps bfloat16 operands in
  mixed precision), and on CPU takes sequences of 1024+ tokens by query chunks
  (`attention.chunked_attention`).

  `global_pool` picks what the head reads, as timm's field of that name: 'token' the class token;
  'avg' the mean of all tokens after the final LayerNorm (no class token; big_vision's 'gap',
  timm's `global_pool='avg', class_token=False, fc_norm=False`); 'map' multihead attention
  pooling (`AttentionPool`, no class token; big_vision's 'map'). `mlp_activation='gelu_tanh'` is
  the tanh-approximated GELU of big_vision's and Google's JAX models.

  The parts (module docstring), each with its paper's settings:
  - `stem`: 'patch' (`patch_size`); 'cnn', DeepViT's (`patch_size` even); 't2t', T2T-ViT's
    (`tokens_type` 'performer' or 'transformer', `token_dim`, `soft_splits`; `patch_size` unused);
    'space_to_depth', SA-conv's (`patch_size` is the block, 2 in SA-conv).
  - `attention`: 'standard'; 'talking_heads' (CaiT Section 3); 're_attention' (DeepViT Eq. 3,
    `re_attention_norm` 'batch' as the official code or 'layer' as lucidrains'); 'quadratic',
    'gaussian', 'learned', 'learned_content' (Cordonnier et al. Section 3, settings
    `centre_init_std`, `spread_init_std`, `position_encoding_size`; heads of the full width, so
    the patch tokens only: `class_stage='class_attention'` or `global_pool` 'avg'/'map').
  - LayerScale: none (`layer_scale_init=None`), an init value, or CaiT's depth rule
    (`paper_layer_scale=True`, `paper_layer_scale_init`).
  - `class_stage`: 'token' or 'class_attention' (`class_attention_depth` CaiT blocks, whose
    attention is standard class attention whatever `attention` is).
  - `distilled`: DeiT's distillation token and second head `head_dist`; with train=True the model
    returns (cls_logits, dist_logits), at inference per `inference_mode` (see `deit.py`).
  """
  num_classes: int = 1000
  patch_size: int = 16
  hidden_size: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: int | None = None
  mlp_ratio: float = 4.0
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  drop_path_rate: float = 0.0
  qkv_bias: bool = True
  representation_size: int | None = None
  global_pool: str = 'token'
  mlp_activation: str = 'gelu'
  layer_norm_eps: float = 1e-6
  init_scheme: str = 'google'
  head_bias_init: float = 0.0
  attention_implementation: str | None = None
  stem: str = 'patch'
  tokens_type: str = 'performer'
  token_dim: int = 64
  soft_splits: tuple[tuple[int, int, int], ...] = ((7, 4, 2), (3, 2, 1), (3, 2, 1))
  attention: str = 'standard'
  re_attention_norm: str = 'batch'
  centre_init_std: float = 2.0
  spread_init_std: float = 0.01
  position_encoding_size: int | None = None
  layer_scale_init: float | None = None
  paper_layer_scale: bool = False
  class_stage: str = 'token'
  class_attention_depth: int = 2
  distilled: bool = False
  inference_mode: str = 'average_logits'
  scan_layers: bool = False
  remat: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @property
  def prefix_tokens(self) -> tuple[str, ...]:
    """The tokens before the patch tokens in the main blocks, each a parameter of that name."""
    if self.class_stage == 'class_attention' or self.global_pool != 'token':
      return ()
    return ('cls_token', 'dist_token') if self.distilled else ('cls_token',)

  @property
  def embedded_prefix_tokens(self) -> tuple[str, ...]:
    """The prefix tokens that `pos_embed` has positions for, before the patches' (all of them)."""
    return self.prefix_tokens

  @property
  def layer_scale(self) -> float | None:
    """The LayerScale init in use: CaiT's depth rule or `layer_scale_init` (None: none)."""
    return paper_layer_scale_init(self.depth) if self.paper_layer_scale else self.layer_scale_init

  def check_fields(self) -> None:
    """Raises ValueError for a bad field or parts that cannot work together."""
    for name in ('num_classes', 'depth', 'token_dim'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name}={getattr(self, name)} must be >= 1.')
    attention_lib.check_heads(self.hidden_size, self.num_heads, 'hidden')
    for name in ('dropout_rate', 'attention_dropout_rate', 'drop_path_rate'):
      rate = getattr(self, name)
      if not 0.0 <= rate < 1.0:
        raise ValueError(f'{name}={rate} must be in [0, 1).')
    InitScheme.named(self.init_scheme)
    for name, valid in (('global_pool', GLOBAL_POOLS), ('mlp_activation', ACTIVATIONS),
                        ('attention_implementation', (None, 'xla', 'cudnn')),
                        ('stem', stems.STEMS), ('tokens_type', stems.TOKENS_TYPES),
                        ('attention', ATTENTION_KINDS),
                        ('re_attention_norm', attention_lib.RE_ATTENTION_NORMS),
                        ('class_stage', CLASS_STAGES), ('inference_mode', INFERENCE_MODES)):
      if getattr(self, name) not in valid:
        raise ValueError(f'{name}={getattr(self, name)!r} is not valid; choose from '
                         f'{list(valid)}.')
    if self.stem == 't2t':
      stems.check_soft_splits(self.soft_splits)
    if self.stem == 'cnn' and self.patch_size % 2:
      raise ValueError(f'patch_size={self.patch_size} must be even with stem=\'cnn\' (its first '
                       'conv has stride 2).')
    self.check_parts()

  def check_parts(self) -> None:
    """Raises ValueError for parts that cannot work together."""
    if self.class_stage == 'class_attention':
      if self.class_attention_depth < 1:
        raise ValueError(f'class_attention_depth={self.class_attention_depth} must be >= 1 with '
                         "class_stage='class_attention'.")
      if self.global_pool != 'token':
        raise ValueError(f"class_stage='class_attention' makes the head read the class token; "
                         f"global_pool={self.global_pool!r} must be 'token'.")
    if self.distilled:
      if self.class_stage != 'token' or self.global_pool != 'token':
        raise ValueError('distilled=True needs the class and distillation tokens from the first '
                         f"block: class_stage='token' and global_pool='token' (got "
                         f'{self.class_stage!r}, {self.global_pool!r}).')
      if self.representation_size is not None:
        raise ValueError(f'representation_size={self.representation_size} is not supported with '
                         'distilled=True; use representation_size=None.')
    if self.attention in attention_lib.POSITIONAL_KINDS and self.prefix_tokens:
      raise ValueError(f'attention={self.attention!r} attends over the patch grid only, but the '
                       f'main blocks also carry {list(self.prefix_tokens)}: set '
                       "class_stage='class_attention' or global_pool='avg' or 'map'.")

  @property
  def scheme(self) -> InitScheme:
    return InitScheme.named(self.init_scheme)

  @property
  def top_layer(self) -> int:
    """The last layer id of layer-wise lr decay (`layer_ids`), the head's: depth + 1."""
    return self.depth + 1

  def layer_ids(self, path: Sequence[str]) -> np.ndarray:
    """Layer-wise lr decay's layer of parameter `path`, one id per stacked block (timm's
    `group_matcher` of ViT, DeiT and CaiT, BEiT Section 2.5).

    The stem (patch embedding, DeepViT's CNN stem, T2T's tokens-to-token module), the class and
    distillation tokens and the position embedding are layer 0; main block i is i + 1; CaiT's
    class-attention block j shares a layer with the main block depth - class_attention_depth + j
    (timm's `Cait.group_matcher`); the final norm goes with the last block (depth); the head(s),
    pre-logits and attention pool are `top_layer`.
    """
    name = path[0]
    if name in ('patch_embed', 'tokens_to_token', 'pos_embed', 'cls_token', 'dist_token'):
      return np.array([0])
    for prefix, offset in (('blocks', 1),
                           ('blocks_token_only', self.depth - self.class_attention_depth + 1)):
      indices = block_indices(name, prefix)
      if indices is not None:
        return indices + offset
    if name == 'norm':
      return np.array([self.depth])
    return np.array([self.top_layer])

  def blocks(self, block: ModuleDef, x: jax.Array, *, first: int, drop_path_rates: Sequence[float],
             train: bool, prefix: str = 'blocks') -> jax.Array:
    """`apply_blocks` with this model's `scan_layers` and `remat`, one block per drop-path rate."""
    return apply_blocks(block, x, count=len(drop_path_rates), first=first, train=train,
                        scan_layers=self.scan_layers, remat=self.remat, prefix=prefix,
                        drop_path_rates=drop_path_rates)

  def attention_fields(self) -> dict[str, Any]:
    """What every content-attention module of the model receives; families extend it."""
    scheme = self.scheme
    return dict(num_heads=self.num_heads, qkv_bias=self.qkv_bias,
                attention_dropout_rate=self.attention_dropout_rate,
                dropout_rate=self.dropout_rate, kernel_init=scheme.dense_kernel,
                bias_init=scheme.dense_bias, fast_path_implementation=self.attention_implementation,
                dtype=self.dtype, param_dtype=self.param_dtype)

  def block_fields(self) -> dict[str, Any]:
    """What every block of the model receives (main and class stage); families extend it."""
    scheme = self.scheme
    return dict(mlp_dim=self.mlp_dim or int(self.mlp_ratio * self.hidden_size),
                dropout_rate=self.dropout_rate, layer_norm_eps=self.layer_norm_eps,
                layer_scale_init=self.layer_scale, mlp_activation=self.mlp_activation,
                mlp_kernel_init=scheme.dense_kernel, mlp_bias_init=scheme.mlp_bias,
                dtype=self.dtype, param_dtype=self.param_dtype)

  def block_attention(self, index: int) -> str:
    """The attention kind of main block `index` (`attention` in every block by default)."""
    del index
    return self.attention

  def attention_module(self, kind: str, grid: tuple[int, int]) -> ModuleDef:
    """The attention of a main block of `kind`, for tokens on `grid` (rows, cols)."""
    if kind in attention_lib.POSITIONAL_KINDS:
      return attention_lib.positional(
          kind, grid=grid, num_heads=self.num_heads, centre_init_std=self.centre_init_std,
          spread_init_std=self.spread_init_std, position_encoding_size=self.position_encoding_size,
          attention_dropout_rate=self.attention_dropout_rate, dropout_rate=self.dropout_rate,
          dtype=self.dtype, param_dtype=self.param_dtype)
    return functools.partial(attention_lib.SelfAttention, head_mixing=_HEAD_MIXING[kind],
                             re_attention_norm=self.re_attention_norm, **self.attention_fields())

  def drop_path_rates(self) -> np.ndarray:
    """The main blocks' stochastic-depth rates: linear in depth up to `drop_path_rate`."""
    return np.linspace(0.0, self.drop_path_rate, self.depth)

  def patch_tokens(self, images: jax.Array, *, train: bool) -> jax.Array:
    """The image as (batch, rows, cols, hidden) tokens of the `stem`."""
    scheme = self.scheme
    dtypes = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    if self.stem == 'cnn':
      return stems.CnnStem(self.patch_size, self.hidden_size, **dtypes,
                           name='patch_embed')(images, train=train)
    if self.stem == 'space_to_depth':
      return stems.SpaceToDepthEmbedding(self.patch_size, self.hidden_size, **dtypes,
                                         name='patch_embed')(images, train=train)
    if self.stem == 't2t':
      return stems.TokensToToken(self.hidden_size, self.soft_splits, self.token_block(),
                                 kernel_init=scheme.dense_kernel, bias_init=scheme.dense_bias,
                                 **dtypes, name='tokens_to_token')(images, train=train)
    return PatchEmbedding(self.patch_size, self.hidden_size, kernel_init=scheme.patch_kernel,
                          bias_init_from_fan_in=scheme.patch_bias_from_fan_in, **dtypes,
                          name='patch_embed')(images)

  def token_block(self) -> ModuleDef:
    """T2T's token block (`tokens_type`): a Performer, or a transformer block over one-head
    token attention with a V skip (T2T-ViT Section 3.1, official `Token_transformer`)."""
    scheme = self.scheme
    common = dict(kernel_init=scheme.dense_kernel, bias_init=scheme.dense_bias,
                  dtype=self.dtype, param_dtype=self.param_dtype)
    if self.tokens_type == 'performer':
      return functools.partial(stems.TokenPerformer, ACTIVATIONS[self.mlp_activation],
                               self.token_dim, **common)
    attention = functools.partial(attention_lib.TokenAttention, features=self.token_dim,
                                  fast_path_implementation=self.attention_implementation,
                                  **common)
    return functools.partial(
        EncoderBlock, attention, self.token_dim, layer_norm_eps=1e-5, attention_residual=False,
        mlp_activation=self.mlp_activation, mlp_kernel_init=scheme.dense_kernel,
        mlp_bias_init=scheme.dense_bias, dtype=self.dtype, param_dtype=self.param_dtype)

  def position_embedding(self, tokens: tuple[int, int]) -> jax.Array:
    """The learned (1, tokens, width) position embedding `pos_embed`."""
    return self.param('pos_embed', self.scheme.pos_embed, (1,) + tokens, self.param_dtype)

  def embed(self, images: jax.Array, *, train: bool) -> tuple[jax.Array, tuple[int, int]]:
    """Stem tokens with the prefix tokens prepended, plus position embedding and dropout; and
    the grid (rows, cols) of the patch tokens."""
    x = self.patch_tokens(images, train=train)
    batch, grid, width = x.shape[0], x.shape[1:3], x.shape[-1]
    x = self.with_prefix_tokens(x.reshape(batch, -1, width))
    x = x + self.checked_position_embedding(x.shape[1:], images.shape[1:3]).astype(x.dtype)
    return nn.Dropout(rate=self.dropout_rate, deterministic=not train)(x), grid

  def with_prefix_tokens(self, x: jax.Array) -> jax.Array:
    """(batch, tokens, width) tokens with the `prefix_tokens` prepended, in their order."""
    batch, _, width = x.shape
    prefix = [jnp.broadcast_to(
        self.param(name, self.scheme.cls_token, (1, 1, width), self.param_dtype).astype(x.dtype),
        (batch, 1, width)) for name in self.prefix_tokens]
    return jnp.concatenate(prefix + [x], axis=1)

  def checked_position_embedding(self, tokens: tuple[int, int],
                                 image_shape: tuple[int, int]) -> jax.Array:
    """`position_embedding(tokens)`, after checking that stored weights have that shape."""
    if self.has_variable('params', 'pos_embed'):
      stored = self.get_variable('params', 'pos_embed').shape
      if stored != (1,) + tuple(tokens):
        raise ValueError(
            f'pos_embed has shape {stored} but images of size {tuple(image_shape)} give '
            f'{tokens[0]} tokens; resize the position embedding.')
    return self.position_embedding(tokens)

  def encode(self, x: jax.Array, *, train: bool, grid: tuple[int, int]) -> jax.Array:
    """The main blocks (runs of one attention kind), the class stage if any, the final LN."""
    rates = self.drop_path_rates()
    first = 0
    for kind, run in itertools.groupby(self.block_attention(i) for i in range(self.depth)):
      count = len(list(run))
      block = functools.partial(EncoderBlock, self.attention_module(kind, grid),
                                **self.block_fields())
      x = self.blocks(block, x, first=first, drop_path_rates=rates[first:first + count],
                      train=train)
      first += count
    if self.class_stage == 'class_attention':
      x = jnp.concatenate([self.class_attention_stage(x, train=train), x], axis=1)
    return nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.dtype,
                        param_dtype=self.param_dtype, name='norm')(x)

  def class_attention_stage(self, x: jax.Array, *, train: bool) -> jax.Array:
    """CaiT's class stage: the class token, updated by `class_attention_depth` blocks whose
    query is the class token alone (no dropout or drop path, as deit's cait_models.py)."""
    batch, _, width = x.shape
    cls = self.param('cls_token', self.scheme.cls_token, (1, 1, width), self.param_dtype)
    cls = jnp.broadcast_to(cls.astype(x.dtype), (batch, 1, width))
    attention = functools.partial(attention_lib.ClassAttention, **{
        **self.attention_fields(), 'attention_dropout_rate': 0.0, 'dropout_rate': 0.0})
    fields = {**self.block_fields(), 'dropout_rate': 0.0}
    for i in range(self.class_attention_depth):
      cls = ClassAttentionBlock(attention, **fields, name=f'blocks_token_only_{i}')(
          x, cls, train=train)
    return cls

  def classify(self, features: jax.Array, name: str = 'head') -> jax.Array:
    """Optional tanh pre-logits, then the linear head; logits in float32.

    What the head reads is sown as `head_input` (once per head: twice in a distilled DeiT).
    """
    if self.representation_size is not None:
      features = nn.tanh(nn.Dense(self.representation_size, dtype=self.dtype,
                                  param_dtype=self.param_dtype, name='pre_logits')(features))
    sow_feature(self, 'head_input', features)
    scheme = self.scheme
    logits = nn.Dense(self.num_classes, kernel_init=scheme.head_kernel,
                      bias_init=nn.initializers.constant(self.head_bias_init), dtype=self.dtype,
                      param_dtype=self.param_dtype, name=name)(features)
    return logits.astype(jnp.float32)

  @nn.compact
  def __call__(self, images: jax.Array, *,
               train: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
    self.check_fields()
    x, grid = self.embed(images, train=train)
    x = self.encode(x, train=train, grid=grid)
    sow_feature(self, 'encoded', x)
    if not self.distilled:
      return self.classify(self.pool(x, train=train))
    cls_logits, dist_logits = self.classify(x[:, 0], 'head'), self.classify(x[:, 1], 'head_dist')
    if train:
      return cls_logits, dist_logits
    if self.inference_mode == 'average_logits':
      return (cls_logits + dist_logits) / 2
    return jnp.log((jax.nn.softmax(cls_logits) + jax.nn.softmax(dist_logits)) / 2)

  def pool(self, x: jax.Array, *, train: bool) -> jax.Array:
    """The (batch, width) features the head reads, per `global_pool`."""
    if self.global_pool == 'avg':
      return jnp.mean(x, axis=1)
    if self.global_pool == 'map':
      return AttentionPool(self.num_heads, self.block_fields()['mlp_dim'],
                           mlp_activation=self.mlp_activation, layer_norm_eps=self.layer_norm_eps,
                           kernel_init=self.scheme.dense_kernel, dtype=self.dtype,
                           param_dtype=self.param_dtype, name='attn_pool')(x, train=train)
    return x[:, 0]


def _module_path(parts: list[str]) -> list[str]:
  """['blocks', '3', 'attn'] -> ['blocks_3', 'attn']: PyTorch list indices join their parent."""
  path: list[str] = []
  for part in parts:
    if part.isdigit() and path:
      path[-1] = f'{path[-1]}_{part}'
    else:
      path.append(part)
  return path


def variables_from_torch(state_dict: Mapping[str, Any]) -> dict[str, dict]:
  """PyTorch state dict -> Flax variables by timm's `VisionTransformer` key names.

  The key names are timm/models/vision_transformer.py's.

  Linear weight -> kernel W^T; Conv weight (O, I, kh, kw) -> kernel (kh, kw, I, O); 1-D weight
  (LayerNorm, BatchNorm) -> scale; BatchNorm running_mean/var -> batch_stats mean/var
  (num_batches_tracked dropped); any other tensor (tokens, position embeddings, LayerScale) is
  copied. Module `a.3.b` becomes `a_3/b`.
  """
  variables: dict[str, dict] = {}
  for key, value in state_dict.items():
    value = np.asarray(value)
    *modules, leaf = key.split('.')
    collection = 'params'
    if leaf == 'num_batches_tracked':
      continue
    if leaf in ('running_mean', 'running_var'):
      collection, leaf = 'batch_stats', leaf[len('running_'):]
    elif leaf == 'weight':
      if value.ndim == 1:
        leaf = 'scale'
      elif value.ndim == 2:
        leaf, value = 'kernel', value.T
      elif value.ndim == 4:
        leaf, value = 'kernel', value.transpose(2, 3, 1, 0)
      else:
        raise ValueError(f'{key}: no rule for a weight of shape {value.shape}.')
    node = variables.setdefault(collection, {})
    for name in _module_path(modules):
      node = node.setdefault(name, {})
    node[leaf] = value
  return variables


def variables_to_torch(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """The inverse of `variables_from_torch`: Flax variables (unrolled or scanned) -> PyTorch."""
  state_dict: dict[str, np.ndarray] = {}
  variables = unstack_layers(variables)
  for collection in ('params', 'batch_stats'):
    flat = flax.traverse_util.flatten_dict(dict(variables.get(collection, {})))
    for path, value in flat.items():
      value = np.asarray(value)
      *modules, leaf = path
      if collection == 'batch_stats':
        leaf = f'running_{leaf}'
      elif leaf == 'kernel':
        leaf, value = 'weight', value.T if value.ndim == 2 else value.transpose(3, 2, 0, 1)
      elif leaf == 'scale':
        leaf = 'weight'
      names = [re.sub(r'_(\d+)$', r'.\1', name) for name in modules]
      state_dict['.'.join(names + [leaf])] = value
  return state_dict


# timm VisionTransformer / deit keys this family understands (timm models/vision_transformer.py).
_TIMM_KEY = re.compile(
    r'(patch_embed\.proj\.(weight|bias)|cls_token|dist_token|pos_embed|(norm|head|head_dist)\.'
    r'(weight|bias)|pre_logits\.fc\.(weight|bias)|blocks\.\d+\.(norm1|norm2|attn\.qkv|attn\.proj|'
    r'mlp\.fc1|mlp\.fc2)\.(weight|bias)'
    r'|attn_pool\.(latent|(q|kv|proj|norm|mlp\.fc[12])\.(weight|bias)))')


def from_timm(state_dict: Mapping[str, Any]) -> dict[str, dict]:
  """timm `VisionTransformer` / deit state dict -> Flax variables {'params': ...}."""
  unknown = [key for key in state_dict if not _TIMM_KEY.fullmatch(key)]
  if unknown:
    raise ValueError(f'Keys outside the timm ViT/DeiT layout: {unknown}.')
  renamed = {key.replace('pre_logits.fc.', 'pre_logits.'): value
             for key, value in state_dict.items()}
  return variables_from_torch(renamed)


def to_timm(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Flax variables -> timm `VisionTransformer` / deit state dict (inverse of `from_timm`)."""
  return {key.replace('pre_logits.', 'pre_logits.fc.'): value
          for key, value in variables_to_torch(variables).items()}


# (depth, hidden_size, num_heads, mlp_dim) of the papers' sizes (ViT Table 1; DeiT Table 1).
SIZES = {
    'ti': (12, 192, 3, 768),
    's': (12, 384, 6, 1536),
    'b': (12, 768, 12, 3072),
    'l': (24, 1024, 16, 4096),
    'h': (32, 1280, 16, 5120),
}


def _vit(size: str, patch_size: int) -> functools.partial:
  depth, hidden_size, num_heads, mlp_dim = SIZES[size]
  return functools.partial(VisionTransformer, patch_size=patch_size, hidden_size=hidden_size,
                           depth=depth, num_heads=num_heads, mlp_dim=mlp_dim)


# /16, /32 (and H/14) for 224x224 inputs; /4 and /2 for 32x32 inputs (CIFAR, digits).
MODELS = {
    **{f'vit_{size}{patch}': _vit(size, patch)
       for size in ('ti', 's', 'b', 'l') for patch in (16, 32)},
    'vit_h14': _vit('h', 14),
    **{f'vit_{size}{patch}': _vit(size, patch) for size in ('ti', 's', 'b') for patch in (4, 2)},
}

# timm's ViT names -> ours; the resolution suffix names the input size the weights were made for.
TIMM_ARCHITECTURES = {
    f'vit_{timm_size}_patch{patch}_{resolution}': f'vit_{size}{patch}'
    for size, timm_size, patch, resolutions in (
        ('ti', 'tiny', 16, (224, 384)), ('s', 'small', 16, (224, 384)),
        ('s', 'small', 32, (224, 384)), ('b', 'base', 16, (224, 384)),
        ('b', 'base', 32, (224, 384)), ('l', 'large', 16, (224, 384)),
        ('l', 'large', 32, (224, 384)), ('h', 'huge', 14, (224,)))
    for resolution in resolutions}
# timm's VisionTransformer / Cait arguments -> our fields (None: training only). `img_size` is
# the input's (the position embedding follows it).
TIMM_ARGUMENTS = {
    'patch_size': 'patch_size', 'embed_dim': 'hidden_size', 'depth': 'depth',
    'num_heads': 'num_heads', 'mlp_ratio': 'mlp_ratio', 'qkv_bias': 'qkv_bias',
    'global_pool': 'global_pool', 'init_values': 'layer_scale_init',
    'depth_token_only': 'class_attention_depth', 'img_size': None, 'in_chans': None,
    'num_classes': None, 'drop_rate': None, 'pos_drop_rate': None, 'proj_drop_rate': None,
    'attn_drop_rate': None, 'drop_path_rate': None,
}

FAMILY = models.Family('vit', VisionTransformer, MODELS, from_timm, to_timm, TIMM_ARCHITECTURES,
                       TIMM_ARGUMENTS)
