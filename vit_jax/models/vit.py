"""Vision Transformer (Dosovitskiy et al.): the shared backbone of every transformer family.

`VisionTransformer` is built of interchangeable parts, each a field with ViT's default: the stem
(`stem`: patch embedding, DeepViT's CNN stem, T2T's tokens-to-token module, SA-conv's 2x2
space-to-depth), the attention of the main blocks (`attention`: standard, CaiT's talking heads,
DeepViT's Re-attention, Cordonnier et al.'s positional kinds, or a kind of your own registered in
`attention`), LayerScale (`layer_scale_init`), the class stage (`class_stage`: a class token from
the start, or CaiT's class-attention blocks after the patches) and DeiT's distillation token
(`distilled`). DeiT, CaiT, DeepViT and T2T-ViT are presets of these parts (subclasses that change
defaults only, and extend `attention_fields`/`block_fields` for what only they have); `check_fields`
refuses the combinations that cannot work.

The parts and shared settings are declared in `parts.Parts`; the building blocks are in `layers`
(MLP, drop path, the encoder and class-attention blocks, init schemes), the stems in `stems`, the
attention kinds in `attention`. Parameter names follow the timm layout (`patch_embed/proj`,
`blocks_i/{norm1,attn,norm2,mlp}`, `norm`, `head`) so `from_timm`/`to_timm` are transposes and
renames (`layouts.variables_from_torch`, `layouts.variables_to_torch`).
"""

import functools
import itertools
import re
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.models import Dtype, Initializer, ModuleDef
from vit_jax.models import attention as attention_lib
from vit_jax.models import initializers
from vit_jax.models import layers
from vit_jax.models import layouts
from vit_jax.models import numerics
from vit_jax.schema import parts
from vit_jax.models import stems

# 'token': a class token from the first block (ViT); 'class_attention': CaiT's class-attention
# blocks take the class token after the patch blocks (CaiT Section 3).
CLASS_STAGES = ('token', 'class_attention')
INFERENCE_MODES = ('average_logits', 'sum_softmax')


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
  kernel_init: Initializer = initializers.DEFAULT_KERNEL_INIT
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    batch, tokens, width = x.shape
    head_dim = attention_lib.check_heads(width, self.num_heads, 'hidden')
    dense = functools.partial(
        numerics.Dense,
        kernel_init=self.kernel_init,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )
    latent = self.param('latent', self.kernel_init, (1, 1, width), self.param_dtype)
    q = dense(width, name='q')(latent.astype(x.dtype)).reshape(1, self.num_heads, 1, head_dim)
    k, v = jnp.split(
        dense(2 * width, name='kv')(x).reshape(batch, tokens, 2 * self.num_heads, head_dim),
        2,
        axis=2,
    )
    scores = numerics.einsum_float32(
        'bhqd,bkhd->bhqk',
        jnp.broadcast_to(q * jnp.asarray(head_dim**-0.5, q.dtype), (batch,) + q.shape[1:]),
        k,
    )
    y = attention_lib.attend(self, scores, v, dropout_rate=0.0, train=train)
    y = dense(width, name='proj')(y.reshape(batch, 1, width))
    norm = nn.LayerNorm(
        epsilon=self.layer_norm_eps, dtype=self.dtype, param_dtype=self.param_dtype, name='norm'
    )
    mlp = layers.Mlp(
        self.mlp_dim,
        activation=self.mlp_activation,
        kernel_init=self.kernel_init,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='mlp',
    )
    y = y + mlp(norm(y), train=train)
    return y[:, 0]


class VisionTransformer(nn.Module, parts.Parts):
  """ViT: stem + [cls] + learned position embedding, pre-norm blocks, LN, head on cls.

  `init_scheme='google'` (default; the paper's official code) zero-initialises the head and uses
  xavier Dense kernels; `'timm'` is DeiT/timm's N(0, 0.02) scheme. `representation_size` adds the
  paper's tanh pre-logits layer. The position embedding length is set by the input at init.
  `attention_implementation` picks what runs attention where no probabilities are needed
  (`numerics.choose_attention`): 'auto' (None in configs recorded before it) cuDNN flash attention
  on NVIDIA GPUs for the shapes and dtypes it computes correctly, padded where it needs it
  (`numerics.cudnn_attention`), else XLA (`numerics.softmax_attention`, whose backward pass keeps
  bfloat16 operands in mixed precision; on CPU sequences of 1024+ tokens by query chunks,
  `numerics.chunked_attention`); 'cudnn' cuDNN wherever it is not known wrong; 'xla'
  `jax.nn.dot_product_attention`'s XLA implementation. `vit_jax.models.attention.plan` says what
  each attention of a model runs, and why; training logs it in one line.

  `global_pool` picks what the head reads, as timm's field of that name: 'token' the class token;
  'avg' the mean of all tokens after the final LayerNorm (no class token; big_vision's 'gap',
  timm's `global_pool='avg', class_token=False, fc_norm=False`); 'map' multihead attention
  pooling (`AttentionPool`, no class token; big_vision's 'map'). `mlp_activation='gelu_tanh'` is
  the tanh-approximated GELU of big_vision's and Google's JAX models.

  The parts (module docstring), each with its paper's settings:
  - `stem`: 'patch' (`patch_size`); 'cnn', DeepViT's (`patch_size` even); 't2t', T2T-ViT's
    (its own settings `stem_settings=parts.T2TSettings(tokens_type=..., token_dim=...,
    soft_splits=...)`; `patch_size` unused); 'space_to_depth',
    SA-conv's (`patch_size` is the block, 2 in SA-conv).
  - `attention`: 'standard'; 'talking_heads' (CaiT Section 3); 're_attention' (DeepViT Eq. 3,
    `attention_settings=parts.ReAttentionSettings(re_attention_norm=...)`, 'batch' as the
    official code or 'layer' as lucidrains'); 'quadratic',
    'gaussian', 'learned', 'learned_content' (Cordonnier et al. Section 3, own settings
    `attention_settings=parts.PositionalSettings(...)`; heads of the full width, so the patch
    tokens only: `class_stage='class_attention'` or `global_pool` 'avg'/'map'); any kind
    registered with `attention.register`.
  - LayerScale: none (`layer_scale_init=None`), an init value, or CaiT's depth rule
    (`layer_scale_init='paper'`, `layers.paper_layer_scale_init`).
  - MLP width: `mlp_dim`, or `mlp_ratio` times `hidden_size` (one of them; neither: the family's
    `default_mlp_ratio`).
  - `class_stage`: 'token' or 'class_attention' (`class_stage_settings=parts.ClassAttentionSettings(
    class_attention_depth=...)` CaiT blocks, whose
    attention is standard class attention whatever `attention` is).
  - `distilled`: DeiT's distillation token and second head `head_dist`; with train=True the model
    returns (cls_logits, dist_logits), at inference per `inference_mode` (see `deit.py`).
  - `num_classes=0`: no head (timm's headless models): the pre-logits come out.
  """

  num_classes: int = 1000
  patch_size: int = 16
  hidden_size: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: int | None = None
  representation_size: int | None = None
  init_scheme: str = 'google'
  inference_mode: str = 'average_logits'
  # The own settings of the chosen stem, attention and class stage kinds (registered:
  # `parts.register_settings`); None: the kind's defaults. A kind without settings ignores them.
  stem_settings: parts.KindSettings | None = None
  attention_settings: parts.KindSettings | None = None
  class_stage_settings: parts.KindSettings | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  # The MLP width over the token width when neither `mlp_dim` nor `mlp_ratio` is set.
  default_mlp_ratio = 4.0

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
    """The LayerScale init in use: `layer_scale_init`, or CaiT's depth rule for 'paper'."""
    if isinstance(self.layer_scale_init, str):  # 'paper': `check_fields` refuses other words.
      return layers.paper_layer_scale_init(self.depth)
    return self.layer_scale_init

  @property
  def class_attention_depth(self) -> int:
    """CaiT's class-attention blocks: `ClassAttentionSettings`' count with that class stage,
    else 0."""
    if self.class_stage != 'class_attention':
      return 0
    return self.kind_settings(parts.ClassAttentionSettings).class_attention_depth

  @property
  def mlp_width(self) -> int:
    """The hidden width of the blocks' MLP: `mlp_dim`, else `mlp_ratio` (or the family's default
    ratio) times `hidden_size`."""
    if self.mlp_dim is not None:
      return self.mlp_dim
    return int((self.mlp_ratio or self.default_mlp_ratio) * self.hidden_size)

  def kind_settings(self, settings: type[parts.KindSettingsT]) -> parts.KindSettingsT:
    """The own settings of type `settings` (a registered kind settings dataclass) of the chosen kind
    of `settings.part`: the model's `{part}_settings`, or the dataclass' defaults when unset."""
    field = parts.settings_field(settings.part)
    value = getattr(self, field)
    if value is None:
      return settings()
    if not isinstance(value, settings):
      kind = getattr(self, settings.part)
      raise ValueError(
          f'{field}={value!r} are not the settings of {settings.part}={kind!r}; give '
          f'{settings.__module__}.{settings.__qualname__}(...) or None.'
      )
    return value

  def check_fields(self) -> None:
    """Raises ValueError for a bad field or parts that cannot work together."""
    if self.num_classes < 0:
      raise ValueError(f'num_classes={self.num_classes} must be >= 0 (0: no head).')
    for name in ('depth', 'patch_size', 'hidden_size', 'mlp_dim', 'representation_size'):
      value = getattr(self, name)
      if value is not None and value < 1:
        raise ValueError(f'{name}={value} must be >= 1.')
    if self.mlp_ratio is not None and self.mlp_ratio <= 0:
      raise ValueError(f'mlp_ratio={self.mlp_ratio} must be > 0.')
    attention_lib.check_heads(self.hidden_size, self.num_heads, 'hidden')
    for name in ('dropout_rate', 'attention_dropout_rate', 'drop_path_rate'):
      rate = getattr(self, name)
      if not 0.0 <= rate < 1.0:
        raise ValueError(f'{name}={rate} must be in [0, 1).')
    layers.InitScheme.named(self.init_scheme)
    for name, valid in (
        ('global_pool', GLOBAL_POOLS),
        ('mlp_activation', layers.ACTIVATIONS),
        ('attention_implementation', (None, *numerics.ATTENTION_IMPLEMENTATIONS)),
        ('stem', stems.names()),
        ('attention', attention_lib.kinds()),
        ('class_stage', CLASS_STAGES),
        ('inference_mode', INFERENCE_MODES),
    ):
      attention_lib.check_choice(getattr(self, name), valid, name)
    if isinstance(self.layer_scale_init, str) and self.layer_scale_init != 'paper':
      raise ValueError(
          f'layer_scale_init={self.layer_scale_init!r} is not valid; choose a number, '
          "None (no LayerScale) or 'paper' (CaiT's depth rule)."
      )
    if self.mlp_dim is not None and self.mlp_ratio is not None:
      raise ValueError(
          f'mlp_dim={self.mlp_dim} and mlp_ratio={self.mlp_ratio} both give the MLP '
          'width; set one of them (the other None).'
      )
    check_stem = stems.stem(self.stem).check
    if check_stem is not None:
      check_stem(self)
    if self.attention == 're_attention':
      attention_lib.check_choice(
          self.kind_settings(parts.ReAttentionSettings).re_attention_norm,
          attention_lib.RE_ATTENTION_NORMS,
          're_attention_norm',
      )
    self.check_parts()

  def check_parts(self) -> None:
    """Raises ValueError for parts that cannot work together."""
    if self.class_stage == 'class_attention':
      if self.class_attention_depth < 1:
        raise ValueError(
            f'class_attention_depth={self.class_attention_depth} must be >= 1 with '
            "class_stage='class_attention'."
        )
      if self.global_pool != 'token':
        raise ValueError(
            f"class_stage='class_attention' makes the head read the class token; "
            f"global_pool={self.global_pool!r} must be 'token'."
        )
    if self.distilled:
      if self.class_stage != 'token' or self.global_pool != 'token':
        raise ValueError(
            'distilled=True needs the class and distillation tokens from the first '
            f"block: class_stage='token' and global_pool='token' (got "
            f'{self.class_stage!r}, {self.global_pool!r}).'
        )
      if self.representation_size is not None:
        raise ValueError(
            f'representation_size={self.representation_size} is not supported with '
            'distilled=True; use representation_size=None.'
        )
    if attention_lib.kind(self.attention).patch_tokens_only and self.prefix_tokens:
      raise ValueError(
          f'attention={self.attention!r} attends over the patch grid only, but the '
          f'main blocks also carry {list(self.prefix_tokens)}: set '
          "class_stage='class_attention' or global_pool='avg' or 'map'."
      )

  @property
  def scheme(self) -> layers.InitScheme:
    return layers.InitScheme.named(self.init_scheme)

  @property
  def top_layer(self) -> int:
    """The last layer id of layer-wise lr decay (`layer_ids`), the head's: depth + 1."""
    return self.depth + 1

  def layer_ids(self, path: Sequence[str]) -> np.ndarray:
    """Layer-wise lr decay's layer of parameter `path`, one id per stacked block (timm's
    `group_matcher` of ViT, DeiT and CaiT, BEiT Section 2.5).

    The stem (its registered `module_name`: the patch embedding, DeepViT's CNN stem, T2T's
    tokens-to-token module, a stem of your own), the class and distillation tokens and the
    position embedding are layer 0; main block i is i + 1; CaiT's
    class-attention block j shares a layer with the main block depth - class_attention_depth + j
    (timm's `Cait.group_matcher`); the final norm goes with the last block (depth); the head(s),
    pre-logits and attention pool are `top_layer`.
    """
    name = path[0]
    if name in (stems.stem(self.stem).module_name, 'pos_embed', 'cls_token', 'dist_token'):
      return np.array([0])
    for prefix, offset in (
        ('blocks', 1),
        ('blocks_token_only', self.depth - self.class_attention_depth + 1),
    ):
      indices = layouts.block_indices(name, prefix)
      if indices is not None:
        return indices + offset
    if name == 'norm':
      return np.array([self.depth])
    return np.array([self.top_layer])

  def blocks(
      self,
      block: ModuleDef,
      x: jax.Array,
      *,
      first: int,
      drop_path_rates: Sequence[float],
      train: bool,
      prefix: str = 'blocks',
  ) -> jax.Array:
    """`layers.apply_blocks` with this model's `scan_layers` and `remat`, one block per
    drop-path rate."""
    return layers.apply_blocks(
        block,
        x,
        count=len(drop_path_rates),
        first=first,
        train=train,
        scan_layers=self.scan_layers,
        remat=self.remat,
        prefix=prefix,
        drop_path_rates=drop_path_rates,
    )

  def attention_fields(self) -> dict[str, Any]:
    """What every content-attention module of the model receives; families extend it."""
    scheme = self.scheme
    return dict(
        num_heads=self.num_heads,
        qkv_bias=self.qkv_bias,
        attention_dropout_rate=self.attention_dropout_rate,
        dropout_rate=self.dropout_rate,
        kernel_init=scheme.dense_kernel,
        bias_init=scheme.dense_bias,
        fast_path_implementation=self.attention_implementation,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )

  def block_fields(self) -> dict[str, Any]:
    """What every block of the model receives (main and class stage); families extend it."""
    scheme = self.scheme
    return dict(
        mlp_dim=self.mlp_width,
        dropout_rate=self.dropout_rate,
        layer_norm_eps=self.layer_norm_eps,
        layer_scale_init=self.layer_scale,
        mlp_activation=self.mlp_activation,
        mlp_kernel_init=scheme.dense_kernel,
        mlp_bias_init=scheme.mlp_bias,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )

  def block_attention(self, index: int) -> str:
    """The attention kind of main block `index` (`attention` in every block by default)."""
    del index
    return self.attention

  def attention_module(self, kind: str, grid: tuple[int, int]) -> ModuleDef:
    """The attention of a main block of `kind`, for tokens on `grid` (rows, cols)."""
    return attention_lib.kind(kind).build(self, grid)

  def drop_path_rates(self) -> np.ndarray:
    """The main blocks' stochastic-depth rates: linear in depth up to `drop_path_rate`."""
    return np.linspace(0.0, self.drop_path_rate, self.depth)

  def patch_tokens(self, images: jax.Array, *, train: bool) -> jax.Array:
    """The image as (batch, rows, cols, hidden) tokens of the `stem` (`stems.register`)."""
    stem = stems.stem(self.stem)
    return stem.build(self)(name=stem.module_name)(images, train=train)

  def token_block(self) -> ModuleDef:
    """T2T's token block (`T2TSettings.tokens_type`): a Performer, or a transformer block over
    one-head token attention with a V skip (T2T-ViT Section 3.1, official `Token_transformer`)."""
    settings = self.kind_settings(parts.T2TSettings)
    scheme = self.scheme
    common = dict(
        kernel_init=scheme.dense_kernel,
        bias_init=scheme.dense_bias,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )
    if settings.tokens_type == 'performer':
      return functools.partial(
          stems.TokenPerformer,
          layers.ACTIVATIONS[self.mlp_activation],
          settings.token_dim,
          **common,
      )
    attention = functools.partial(
        attention_lib.TokenAttention,
        features=settings.token_dim,
        fast_path_implementation=self.attention_implementation,
        **common,
    )
    return functools.partial(
        layers.EncoderBlock,
        attention,
        settings.token_dim,
        layer_norm_eps=1e-5,
        attention_residual=False,
        mlp_activation=self.mlp_activation,
        mlp_kernel_init=scheme.dense_kernel,
        mlp_bias_init=scheme.dense_bias,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )

  def position_embedding(self, tokens: tuple[int, int]) -> jax.Array:
    """The learned (1, tokens, width) position embedding `pos_embed`."""
    return self.param('pos_embed', self.scheme.pos_embed, (1,) + tokens, self.param_dtype)

  def embed(self, images: jax.Array, *, train: bool) -> tuple[jax.Array, tuple[int, int]]:
    """Stem tokens with the prefix tokens prepended, plus position embedding and dropout; and
    the grid (rows, cols) of the patch tokens."""
    x = self.patch_tokens(images, train=train)
    batch, rows, cols, width = x.shape
    x = self.with_prefix_tokens(x.reshape(batch, -1, width))
    x = x + self.checked_position_embedding((x.shape[1], width), images.shape[1:3]).astype(x.dtype)
    return nn.Dropout(rate=self.dropout_rate, deterministic=not train)(x), (rows, cols)

  def with_prefix_tokens(self, x: jax.Array) -> jax.Array:
    """(batch, tokens, width) tokens with the `prefix_tokens` prepended, in their order."""
    batch, _, width = x.shape
    prefix = [
        jnp.broadcast_to(
            self.param(name, self.scheme.cls_token, (1, 1, width), self.param_dtype).astype(
                x.dtype
            ),
            (batch, 1, width),
        )
        for name in self.prefix_tokens
    ]
    return jnp.concatenate(prefix + [x], axis=1)

  def checked_position_embedding(
      self, tokens: tuple[int, int], image_shape: Sequence[int]
  ) -> jax.Array:
    """`position_embedding(tokens)`, after checking that stored weights have that shape."""
    if self.has_variable('params', 'pos_embed'):
      stored: tuple[int, ...] = self.get_variable('params', 'pos_embed').shape
      if stored != (1,) + tuple(tokens):
        raise ValueError(
            f'pos_embed has shape {stored} but images of size {tuple(image_shape)} give '
            f'{tokens[0]} tokens; resize the position embedding.'
        )
    return self.position_embedding(tokens)

  def encode(self, x: jax.Array, *, train: bool, grid: tuple[int, int]) -> jax.Array:
    """The main blocks (runs of one attention kind), the class stage if any, the final LN."""
    rates = self.drop_path_rates().tolist()
    first = 0
    for kind, run in itertools.groupby(self.block_attention(i) for i in range(self.depth)):
      count = len(list(run))
      block = functools.partial(
          layers.EncoderBlock, self.attention_module(kind, grid), **self.block_fields()
      )
      x = self.blocks(
          block, x, first=first, drop_path_rates=rates[first : first + count], train=train
      )
      first += count
    if self.class_stage == 'class_attention':
      x = jnp.concatenate([self.class_attention_stage(x, train=train), x], axis=1)
    return nn.LayerNorm(
        epsilon=self.layer_norm_eps, dtype=self.dtype, param_dtype=self.param_dtype, name='norm'
    )(x)

  def class_attention_stage(self, x: jax.Array, *, train: bool) -> jax.Array:
    """CaiT's class stage: the class token, updated by `class_attention_depth` blocks whose
    query is the class token alone (no dropout or drop path, as deit's cait_models.py)."""
    batch, _, width = x.shape
    cls = self.param('cls_token', self.scheme.cls_token, (1, 1, width), self.param_dtype)
    cls = jnp.broadcast_to(cls.astype(x.dtype), (batch, 1, width))
    attention = functools.partial(
        attention_lib.ClassAttention,
        **{**self.attention_fields(), 'attention_dropout_rate': 0.0, 'dropout_rate': 0.0},
    )
    fields = {**self.block_fields(), 'dropout_rate': 0.0}
    for i in range(self.class_attention_depth):
      cls = layers.ClassAttentionBlock(attention, **fields, name=f'blocks_token_only_{i}')(
          x, cls, train=train
      )
    return cls

  def classify(self, features: jax.Array, name: str = 'head') -> jax.Array:
    """Optional tanh pre-logits, then the linear head (none when num_classes is 0); in float32.

    What the head reads is sown as `head_input` (once per head: twice in a distilled DeiT).
    """
    if self.representation_size is not None:
      features = nn.tanh(
          nn.Dense(
              self.representation_size,
              dtype=self.dtype,
              param_dtype=self.param_dtype,
              name='pre_logits',
          )(features)
      )
    layers.sow_feature(self, 'head_input', features)
    if not self.num_classes:  # timm's num_classes=0: no head, the pre-logits out.
      return features.astype(jnp.float32)
    scheme = self.scheme
    logits = nn.Dense(
        self.num_classes,
        kernel_init=scheme.head_kernel,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name=name,
    )(features)
    return logits.astype(jnp.float32)

  @nn.compact
  def __call__(
      self, images: jax.Array, *, train: bool = False
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    self.check_fields()
    x, grid = self.embed(images, train=train)
    x = self.encode(x, train=train, grid=grid)
    layers.sow_feature(self, 'encoded', x)
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
      return AttentionPool(
          self.num_heads,
          self.mlp_width,
          mlp_activation=self.mlp_activation,
          layer_norm_eps=self.layer_norm_eps,
          kernel_init=self.scheme.dense_kernel,
          dtype=self.dtype,
          param_dtype=self.param_dtype,
          name='attn_pool',
      )(x, train=train)
    return x[:, 0]


# timm VisionTransformer / deit keys this family understands (timm models/vision_transformer.py).
_TIMM_KEY = re.compile(
    r'(patch_embed\.proj\.(weight|bias)|cls_token|dist_token|pos_embed|(norm|head|head_dist)\.'
    r'(weight|bias)|pre_logits\.fc\.(weight|bias)|blocks\.\d+\.(norm1|norm2|attn\.qkv|attn\.proj|'
    r'mlp\.fc1|mlp\.fc2)\.(weight|bias)'
    r'|attn_pool\.(latent|(q|kv|proj|norm|mlp\.fc[12])\.(weight|bias)))'
)


def from_timm(state_dict: Mapping[str, Any]) -> dict[str, dict]:
  """timm `VisionTransformer` / deit state dict -> Flax variables {'params': ...}."""
  layouts.checked_keys(state_dict, _TIMM_KEY, 'timm ViT/DeiT (timm models/vision_transformer.py)')
  renamed = {
      key.replace('pre_logits.fc.', 'pre_logits.'): value for key, value in state_dict.items()
  }
  return layouts.variables_from_torch(renamed)


def to_timm(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Flax variables -> timm `VisionTransformer` / deit state dict (inverse of `from_timm`)."""
  return {
      key.replace('pre_logits.', 'pre_logits.fc.'): value
      for key, value in layouts.variables_to_torch(variables).items()
  }


# (depth, hidden_size, num_heads) of the papers' sizes (ViT Table 1; DeiT Table 1); the MLP is
# 4 times the width in every one.
SIZES = {
    'ti': (12, 192, 3),
    's': (12, 384, 6),
    'b': (12, 768, 12),
    'l': (24, 1024, 16),
    'h': (32, 1280, 16),
}


def _vit(size: str, patch_size: int) -> functools.partial:
  depth, hidden_size, num_heads = SIZES[size]
  return functools.partial(
      VisionTransformer,
      patch_size=patch_size,
      hidden_size=hidden_size,
      depth=depth,
      num_heads=num_heads,
  )


# /16, /32 (and H/14) for 224x224 inputs; /4 and /2 for 32x32 inputs (CIFAR, digits).
MODELS = {
    **{
        f'vit_{size}{patch}': _vit(size, patch)
        for size in ('ti', 's', 'b', 'l')
        for patch in (16, 32)
    },
    'vit_h14': _vit('h', 14),
    **{f'vit_{size}{patch}': _vit(size, patch) for size in ('ti', 's', 'b') for patch in (4, 2)},
}

# timm's ViT names -> ours; the resolution suffix names the input size the weights were made for.
TIMM_ARCHITECTURES = {
    f'vit_{timm_size}_patch{patch}_{resolution}': f'vit_{size}{patch}'
    for size, timm_size, patch, resolutions in (
        ('ti', 'tiny', 16, (224, 384)),
        ('s', 'small', 16, (224, 384)),
        ('s', 'small', 32, (224, 384)),
        ('b', 'base', 16, (224, 384)),
        ('b', 'base', 32, (224, 384)),
        ('l', 'large', 16, (224, 384)),
        ('l', 'large', 32, (224, 384)),
        ('h', 'huge', 14, (224,)),
    )
    for resolution in resolutions
}
# timm's VisionTransformer / Cait arguments -> our fields (None: training only). `img_size` is
# the input's (the position embedding follows it).
TIMM_ARGUMENTS = {
    'patch_size': 'patch_size',
    'embed_dim': 'hidden_size',
    'depth': 'depth',
    'num_heads': 'num_heads',
    'mlp_ratio': 'mlp_ratio',
    'qkv_bias': 'qkv_bias',
    'global_pool': 'global_pool',
    'init_values': 'layer_scale_init',
    'depth_token_only': 'class_attention_depth',
    'img_size': None,
    'in_chans': None,
    'num_classes': None,
    'drop_rate': None,
    'pos_drop_rate': None,
    'proj_drop_rate': None,
    'attn_drop_rate': None,
    'drop_path_rate': None,
}

FAMILY = models.Family(
    'vit', VisionTransformer, MODELS, from_timm, to_timm, TIMM_ARCHITECTURES, TIMM_ARGUMENTS
)
