"""Attention modules of every family, sharing one pipeline.

scores -> (head mixing before softmax) -> probabilities -> (head mixing after softmax) -> values
-> output projection. Score kinds: content q.k (`SelfAttention`, `ClassAttention`,
`TokenAttention`) and the relative positional scores of Cordonnier et al. (`PositionalAttention`).
Head mixing: talking heads (CaiT) and Re-attention (DeepViT). Every module sows its final attention
probabilities (after any head mixing) as `intermediates/attention_probs`, shape
(batch, heads, queries, keys). Without head mixing, positional scores, attention dropout or an
`intermediates` collection to fill, content attention takes a fast path that keeps no
probabilities (`numerics.softmax_attention`, or `jax.nn.dot_product_attention` with cuDNN). Scores
and head mixing accumulate in float32 from operands in the compute dtype, in both passes
(`numerics.einsum_float32`).
"""

import contextvars
import dataclasses
import functools
import math
from typing import Any, Callable, Collection, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.process import extensions
from vit_jax.models import Dtype, Initializer
from vit_jax.models import initializers
from vit_jax.models import numerics
from vit_jax.schema import parts

HEAD_MIXINGS = ('none', 'talking_heads', 're_attention')
RE_ATTENTION_NORMS = ('batch', 'layer')
POSITIONAL_SCORES = ('quadratic', 'gaussian', 'learned')
# Cordonnier et al.'s attention kinds: isotropic and non-isotropic Gaussian, learned relative
# embeddings, and learned embeddings with content scores.
POSITIONAL_KINDS = ('quadratic', 'gaussian', 'learned', 'learned_content')


def check_heads(width: int, num_heads: int, what: str) -> int:
  """Returns the head dimension, or raises when `num_heads` does not divide `width`."""
  if num_heads < 1 or width % num_heads:
    divisors = [h for h in range(1, width + 1) if width % h == 0]
    raise ValueError(
        f'num_heads={num_heads} must divide the {what} width {width}; '
        f'valid num_heads: {divisors}.'
    )
  return width // num_heads


def _check_rank(x: jax.Array, rank: int, layout: str, name: str) -> None:
  if x.ndim != rank:
    raise ValueError(f'{name} expects inputs of shape {layout}; got shape {x.shape}.')


def check_choice(value: Any, choices: Collection[Any], field: str) -> None:
  """Raises ValueError naming `field`'s `value` and the `choices` unless it is one of them."""
  if value not in choices:
    raise ValueError(f'{field}={value!r} is not valid; choose from {list(choices)}.')


def attend(
    module: nn.Module,
    scores: jax.Array,
    values: jax.Array,
    *,
    dropout_rate: float,
    train: bool,
    pre_softmax: Callable[[jax.Array], jax.Array] | None = None,
    post_softmax: Callable[[jax.Array], jax.Array] | None = None,
    dropout_before_post_softmax: bool = False,
) -> jax.Array:
  """The shared pipeline: scores -> mix -> softmax -> mix -> sow -> dropout -> weighted values.

  scores: (batch, heads, queries, keys), or (heads, queries, keys) when they do not depend on the
  input (dropout then shares its mask over the batch). values: (batch, keys, heads, value_dim),
  or (batch, keys, value_dim) when every head reads the same values.
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
  if module.is_mutable_collection('intermediates'):
    batch = values.shape[0]
    module.sow(
        'intermediates', 'attention_probs', jnp.broadcast_to(probs, (batch,) + probs.shape[-3:])
    )
  if not dropout_before_post_softmax:
    probs = dropout(probs)
  probs_axes = 'bhqk' if probs.ndim == 4 else 'hqk'
  values_axes = 'bkhd' if values.ndim == 4 else 'bkd'
  return jnp.einsum(f'{probs_axes},{values_axes}->bqhd', probs.astype(values.dtype), values)


class PlannedAttention(NamedTuple):
  """One content attention of a model as traced: its shape and what it runs (`plan`)."""

  queries: int
  keys: int
  heads: int
  head_dim: int
  implementation: str
  reason: str


# The list that `plan` collects each traced content attention's choice into.
_PLANNED: contextvars.ContextVar[list[PlannedAttention] | None] = contextvars.ContextVar(
    '_PLANNED', default=None
)


def content_attention(
    module: nn.Module,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    dropout_rate: float,
    train: bool,
    implementation: str | None = 'auto',
    pre_softmax: Callable[[jax.Array], jax.Array] | None = None,
    post_softmax: Callable[[jax.Array], jax.Array] | None = None,
    dropout_before_post_softmax: bool = False,
) -> jax.Array:
  """softmax(q k^T) v for q pre-scaled, all (batch, tokens, heads, head_dim).

  When nothing needs the explicit probabilities, the fast path of `numerics.choose_attention`:
  cuDNN (`numerics.cudnn_attention`); 'xla' asked for, `jax.nn.dot_product_attention` of that
  implementation; else `numerics.softmax_attention` (on CPU `numerics.chunked_attention` for long
  sequences). Otherwise the shared pipeline `attend`, in XLA.
  """
  fast: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None = None
  if pre_softmax is not None:
    choice = numerics.AttentionChoice('xla', 'logits mixed between the product and the softmax')
  elif post_softmax is not None:
    choice = numerics.AttentionChoice('xla', 'probabilities mixed after the softmax')
  elif module.is_mutable_collection('intermediates'):
    choice = numerics.AttentionChoice('xla', 'probabilities sown')
  elif train and dropout_rate > 0.0:
    choice = numerics.AttentionChoice('xla', 'attention dropout')
  else:
    choice = numerics.choose_attention(implementation, q.shape[1], k.shape[1], q.shape[3], q.dtype)
    if choice.implementation == 'cudnn':
      fast = numerics.cudnn_attention
    elif implementation == 'xla':
      fast = functools.partial(jax.nn.dot_product_attention, scale=1.0, implementation='xla')
    elif (
        jax.default_backend() == 'cpu'
        and q.shape[1] * k.shape[1] >= numerics.CHUNKED_ATTENTION_MIN_PAIRS
    ):
      fast = numerics.chunked_attention
    else:
      fast = numerics.softmax_attention
  planned = _PLANNED.get()
  if planned is not None:
    planned.append(PlannedAttention(q.shape[1], k.shape[1], q.shape[2], q.shape[3], *choice))
  if fast is not None:
    return fast(q, k, v)
  scores = numerics.einsum_float32('bqhd,bkhd->bhqk', q, k)
  return attend(
      module,
      scores,
      v,
      dropout_rate=dropout_rate,
      train=train,
      pre_softmax=pre_softmax,
      post_softmax=post_softmax,
      dropout_before_post_softmax=dropout_before_post_softmax,
  )


def plan(model: nn.Module, image_size: int, *, train: bool = True) -> tuple[PlannedAttention, ...]:
  """What each content attention of `model` runs on `image_size`² images: traced (as
  `jax.eval_shape`), not computed; each distinct one once."""
  planned: list[PlannedAttention] = []
  token = _PLANNED.set(planned)
  try:
    images = jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32)
    rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
    jax.eval_shape(functools.partial(model.init, train=train), rngs, images)
  finally:
    _PLANNED.reset(token)
  return tuple(dict.fromkeys(planned))


def describe(planned: tuple[PlannedAttention, ...]) -> str:
  """One line: what each distinct attention of a model runs, and why."""
  if not planned:
    return 'Attention: none (no content attention in the model).'
  entries = []
  for p in planned:
    shape = f'{p.queries}x{p.keys} tokens, {p.heads} heads of {p.head_dim}'
    if p.implementation == 'cudnn':
      lengths = {numerics.cudnn_sequence_length(n) for n in (p.queries, p.keys)}
      if lengths != {p.queries, p.keys}:
        shape += f', padded to {"/".join(map(str, sorted(lengths)))} with the padding masked'
    entries.append(f'{p.implementation} for {shape} ({p.reason})')
  return 'Attention: ' + '; '.join(entries) + '.'


def _merge_heads(heads: jax.Array) -> jax.Array:
  return heads.reshape(heads.shape[:-2] + (-1,))


def _module_dense(module: nn.Module, features: int, name: str, **fields: Any) -> nn.Dense:
  """`Dense` to `features`, named `name`, with content attention `module`'s initialisers and
  dtypes (`fields` add to or replace them)."""
  return numerics.Dense(
      features,
      name=name,
      **{
          'kernel_init': module.kernel_init,
          'bias_init': module.bias_init,
          'dtype': module.dtype,
          'param_dtype': module.param_dtype,
          **fields,
      },
  )


def fused_qkv(
    module: nn.Module, x: jax.Array, features: int, head_dim: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """q, k, v of (batch, tokens, heads, head_dim) from content attention `module`'s one Dense
  `qkv` to 3 * `features`, laid out [3, heads, head_dim], each third initialised on its own."""
  qkv = _module_dense(
      module,
      3 * features,
      'qkv',
      use_bias=module.qkv_bias,
      kernel_init=initializers.split_heads_init(module.kernel_init, 3),
  )(x)
  qkv = qkv.reshape(x.shape[:2] + (3, module.num_heads, head_dim))
  return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]


def project_heads(module: nn.Module, heads: jax.Array, features: int, *, train: bool) -> jax.Array:
  """The output projection of content attention `module`: its heads merged, the Dense `proj` to
  `features`, then dropout at the module's `dropout_rate`."""
  out = _module_dense(module, features, 'proj')(_merge_heads(heads))
  return nn.Dropout(rate=module.dropout_rate, deterministic=not train)(out)


class SelfAttention(nn.Module):
  """Multi-head self-attention (timm `Attention`) with optional head mixing.

  qkv is one Dense(3D) laid out [3, heads, head_dim]; q is scaled by head_dim^-1/2 before q.k.
  head_mixing='talking_heads' (CaiT): Dense(heads -> heads) with bias over the head axis before
  (`proj_l`) and after (`proj_w`) the softmax. head_mixing='re_attention' (DeepViT official):
  after the softmax and its dropout, a 1x1 conv over heads with bias (`reatten_matrix`, PyTorch
  default init) and BatchNorm over heads with statistics over (batch, queries, keys)
  (`var_norm`, batch_stats collection); re_attention_norm='layer' is lucidrains' form, a N(0, 1)
  matrix without bias (`reattn_weights`) and LayerNorm over heads (`reattn_norm`).
  re_attention_scale multiplies the re-attention map by head_dim^-1/2 (`transform_scale`).
  """

  num_heads: int
  qkv_bias: bool = True
  attention_dropout_rate: float = 0.0
  dropout_rate: float = 0.0
  head_mixing: str = 'none'
  re_attention_norm: str = 'batch'
  re_attention_scale: bool = False
  kernel_init: Initializer = initializers.DEFAULT_KERNEL_INIT
  bias_init: Initializer = nn.initializers.zeros
  fast_path_implementation: str | None = 'auto'
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _mix_heads_dense(
      self,
      t: jax.Array,
      name: str,
      kernel_init: Initializer | None = None,
      bias_init: Initializer | None = None,
  ) -> jax.Array:
    """Dense with bias over the head axis of (batch, heads, queries, keys): operands in `dtype`,
    result in float32 (for the softmax or normalisation after it)."""
    mixed = nn.Dense(
        self.num_heads,
        kernel_init=kernel_init or self.kernel_init,
        bias_init=bias_init or self.bias_init,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        dot_general=numerics.float32_dot_general,
        name=name,
    )(jnp.moveaxis(t, 1, -1))
    return jnp.moveaxis(mixed, -1, 1)

  def _re_attention(self, probs: jax.Array, train: bool, head_dim: int) -> jax.Array:
    heads = self.num_heads
    if self.re_attention_norm == 'batch':
      mixed = self._mix_heads_dense(
          probs,
          'reatten_matrix',
          kernel_init=initializers.torch_default_kernel_init,
          bias_init=initializers.torch_default_bias_init(heads),
      )
      normed = nn.BatchNorm(
          use_running_average=not train,
          axis=1,
          momentum=0.9,
          epsilon=1e-5,
          use_fast_variance=False,
          dtype=jnp.float32,
          param_dtype=self.param_dtype,
          name='var_norm',
      )(mixed)
    else:
      theta = self.param(
          'reattn_weights', nn.initializers.normal(1.0), (heads, heads), self.param_dtype
      )
      mixed = numerics.einsum_float32(
          'bhqk,hg->bgqk', probs.astype(self.dtype), theta.astype(self.dtype)
      )
      normed = nn.LayerNorm(
          epsilon=1e-5,
          reduction_axes=1,
          feature_axes=1,
          use_fast_variance=False,
          dtype=jnp.float32,
          param_dtype=self.param_dtype,
          name='reattn_norm',
      )(mixed)
    return normed * (head_dim**-0.5 if self.re_attention_scale else 1.0)

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    _check_rank(x, 3, '(batch, tokens, features)', type(self).__name__)
    check_choice(self.head_mixing, HEAD_MIXINGS, 'head_mixing')
    check_choice(self.re_attention_norm, RE_ATTENTION_NORMS, 're_attention_norm')
    width = x.shape[-1]
    head_dim = check_heads(width, self.num_heads, 'token')
    q, k, v = fused_qkv(self, x, width, head_dim)
    q = q * jnp.asarray(head_dim**-0.5, q.dtype)
    pre_softmax = post_softmax = None
    if self.head_mixing == 'talking_heads':
      pre_softmax = lambda s: self._mix_heads_dense(s, 'proj_l')
      post_softmax = lambda p: self._mix_heads_dense(p, 'proj_w')
    elif self.head_mixing == 're_attention':
      post_softmax = lambda p: self._re_attention(p, train, head_dim)
    heads = content_attention(
        self,
        q,
        k,
        v,
        dropout_rate=self.attention_dropout_rate,
        train=train,
        implementation=self.fast_path_implementation,
        pre_softmax=pre_softmax,
        post_softmax=post_softmax,
        dropout_before_post_softmax=self.head_mixing == 're_attention',
    )
    return project_heads(self, heads, width, train=train)


class ClassAttention(nn.Module):
  """CaiT class attention: the query comes from the class token x[:, 0] only, keys and values
  from all of x = [class; patches]; separate q/k/v Dense. Returns (batch, 1, features)."""

  num_heads: int
  qkv_bias: bool = True
  attention_dropout_rate: float = 0.0
  dropout_rate: float = 0.0
  kernel_init: Initializer = initializers.DEFAULT_KERNEL_INIT
  bias_init: Initializer = nn.initializers.zeros
  fast_path_implementation: str | None = 'auto'
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    _check_rank(x, 3, '(batch, tokens, features)', type(self).__name__)
    width = x.shape[-1]
    head_dim = check_heads(width, self.num_heads, 'token')

    def project(inputs: jax.Array, name: str) -> jax.Array:
      out = _module_dense(self, width, name, use_bias=self.qkv_bias)(inputs)
      return out.reshape(out.shape[:2] + (self.num_heads, head_dim))

    q = project(x[:, :1], 'q')
    q = q * jnp.asarray(head_dim**-0.5, q.dtype)
    heads = content_attention(
        self,
        q,
        project(x, 'k'),
        project(x, 'v'),
        dropout_rate=self.attention_dropout_rate,
        train=train,
        implementation=self.fast_path_implementation,
    )
    return project_heads(self, heads, width, train=train)


class TokenAttention(nn.Module):
  """T2T-ViT token attention: input width `dim` -> `features` (= in_dim, 64 in T2T-ViT).

  qkv = Dense(dim -> 3 * features, no bias); q is scaled by (dim / num_heads)^-1/2, the INPUT
  width per head as in the official code; returns v + proj(A v), so the caller's block uses V as
  the skip connection (EncoderBlock(attention_residual=False)).
  """

  features: int = 64
  num_heads: int = 1
  qkv_bias: bool = False
  attention_dropout_rate: float = 0.0
  dropout_rate: float = 0.0
  kernel_init: Initializer = initializers.DEFAULT_KERNEL_INIT
  bias_init: Initializer = nn.initializers.zeros
  fast_path_implementation: str | None = 'auto'
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    _check_rank(x, 3, '(batch, tokens, features)', type(self).__name__)
    head_dim = check_heads(self.features, self.num_heads, 'output')
    input_head_dim = check_heads(x.shape[-1], self.num_heads, 'input')
    q, k, v = fused_qkv(self, x, self.features, head_dim)
    q = q * jnp.asarray(input_head_dim**-0.5, q.dtype)
    heads = content_attention(
        self,
        q,
        k,
        v,
        dropout_rate=self.attention_dropout_rate,
        train=train,
        implementation=self.fast_path_implementation,
    )
    return _merge_heads(v) + project_heads(self, heads, self.features, train=train)


def axis_offsets(length: int) -> jax.Array:
  """delta[q, k] = k - q along one grid axis: (length, length) ints."""
  positions = jnp.arange(length)
  return positions[None, :] - positions[:, None]


class AxisScores(NamedTuple):
  """Positional scores s[h, (q1, q2), (k1, k2)] = row[h, q1, k1] + col[h, q2, k2]
  + cross[h] (k1 - q1) (k2 - q2).

  row: (heads, rows, rows); col: (heads, cols, cols); cross: (heads,), or None when the scores
  split by axis (isotropic quadratic and learned encodings).
  """

  row: jax.Array
  col: jax.Array
  cross: jax.Array | None

  def full(self) -> jax.Array:
    """The (heads, N, N) scores over the row-major grid."""
    heads, rows, cols = self.row.shape[0], self.row.shape[1], self.col.shape[1]
    scores = self.row[:, :, None, :, None] + self.col[:, None, :, None, :]
    if self.cross is not None:
      d1 = axis_offsets(rows).astype(jnp.float32)[:, None, :, None]
      d2 = axis_offsets(cols).astype(jnp.float32)[None, :, None, :]
      scores = scores + self.cross[:, None, None, None, None] * (d1 * d2)
    return scores.reshape(heads, rows * cols, rows * cols)


def separable_attend(scores: AxisScores, x: jax.Array) -> jax.Array:
  """Per-head attention of a (batch, rows, cols, D) grid under scores that split by axis.

  softmax over keys of row + col scores is the product of a row softmax and a column softmax, so
  mixing goes one axis at a time: (rows + cols) instead of rows x cols multiply-adds per query.
  Returns (batch, rows, cols, heads, D).
  """
  row_probs = jax.nn.softmax(scores.row, axis=-1).astype(x.dtype)
  col_probs = jax.nn.softmax(scores.col, axis=-1).astype(x.dtype)
  by_cols = jnp.einsum('hjl,bkld->bkjhd', col_probs, x)
  return jnp.einsum('hik,bkjhd->bijhd', row_probs, by_cols)


class PositionalAttention(nn.Module):
  """Cordonnier et al. self-attention with relative positional scores (SA-conv).

  Each of `num_heads` heads attends over the unprojected input (head width = input width), the
  heads are concatenated (head-major) and projected back by `value` = Dense(heads * D -> D).
  Scores, with delta = key - query = (delta1 rows, delta2 cols):
  - 'quadratic' (isotropic) and 'gaussian' (non-isotropic): v_h . r_delta with
    r_delta = (d1, d2, d1^2, d2^2, d1 d2) and v_h = -1/2 (-2(a mu1 + b mu2), -2(c mu2 + b mu1),
    a, c, 2b), [[a, b], [b, c]] = A_h A_h^T (`attention_spreads` A_h = Sigma^-1/2; isotropic:
    a = c = s^2, b = 0), centres `attention_centers` mu ~ N(0, centre_init_std^2), s or A
    initialised to 1 + N(0, spread_init_std^2) or I + N(0, spread_init_std^2) (`settings`,
    `parts.PositionalSettings`).
  - 'learned': w_row,h . E_row[d1] + w_col,h . E_col[d2], E of (2 M - 1) x D_p
    (`settings.position_encoding_size`, None: D), N(0, 1) init,
    w = Dense(D_p -> heads, no bias). The official checkpoint names these the other way round:
    its `col_embeddings`/`head_keys_col` index row offsets (our `row_*`) and vice versa.
  use_content adds (W_q x)_h . (W_k x)_h / sqrt(D), W_q, W_k = Dense(D -> heads * D).
  Inputs and outputs are (batch, rows, cols, features), or (batch, rows * cols, features) tokens
  of the row-major `grid` (rows, cols) when it is given (a transformer block's tokens).
  `dropout_rate` drops the output (0 in SA-conv, whose layer drops after its own projection).
  Linears default to PyTorch's init.
  Scores that split into row and column parts ('quadratic', 'learned' without content) attend
  axis by axis (`separable_attend`) unless probabilities are collected or dropped out.
  """

  num_heads: int = 9
  scores: str = 'gaussian'
  use_content: bool = False
  max_grid_size: int | None = None
  settings: parts.PositionalSettings = parts.PositionalSettings()
  attention_dropout_rate: float = 0.0
  dropout_rate: float = 0.0
  grid: tuple[int, int] | None = None
  kernel_init: Initializer = initializers.torch_default_kernel_init
  bias_init_from_fan_in: Callable[[int], Initializer] = initializers.torch_default_bias_init
  embedding_init: Initializer = nn.initializers.normal(stddev=1.0)
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _dense(self, features: int, fan_in: int, name: str, use_bias: bool = True) -> nn.Dense:
    return numerics.Dense(
        features,
        use_bias=use_bias,
        kernel_init=self.kernel_init,
        bias_init=self.bias_init_from_fan_in(fan_in),
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name=name,
    )

  def _gaussian_scores(self, rows: int, cols: int) -> AxisScores:
    """v_h . r_delta of the quadratic / Gaussian encoding, split by offset axis."""
    heads, std = self.num_heads, self.settings.spread_init_std
    centres = self.param(
        'attention_centers',
        nn.initializers.normal(self.settings.centre_init_std),
        (heads, 2),
        self.param_dtype,
    ).astype(jnp.float32)
    if self.scores == 'quadratic':
      spreads = self.param(
          'attention_spreads',
          lambda key, shape, dtype: 1 + std * jax.random.normal(key, shape, dtype),
          (heads,),
          self.param_dtype,
      ).astype(jnp.float32)
      a = c = spreads**2
      b = None  # Isotropic: no d1 d2 term, so the scores split into row and column parts.
    else:
      spreads = self.param(
          'attention_spreads',
          lambda key, shape, dtype: jnp.eye(2, dtype=dtype)
          + std * jax.random.normal(key, shape, dtype),
          (heads, 2, 2),
          self.param_dtype,
      ).astype(jnp.float32)
      inverse_covariance = jnp.einsum('hij,hkj->hik', spreads, spreads)
      a, b, c = (
          inverse_covariance[:, 0, 0],
          inverse_covariance[:, 0, 1],
          inverse_covariance[:, 1, 1],
      )
    mu1, mu2 = centres[:, 0], centres[:, 1]
    # v_h . r_delta = v1 d1 + v2 d2 - a d1^2 / 2 - c d2^2 / 2 - b d1 d2.
    v1 = a * mu1 if b is None else a * mu1 + b * mu2
    v2 = c * mu2 if b is None else c * mu2 + b * mu1
    d1 = axis_offsets(rows).astype(jnp.float32)
    d2 = axis_offsets(cols).astype(jnp.float32)
    row = v1[:, None, None] * d1 - 0.5 * a[:, None, None] * d1**2
    col = v2[:, None, None] * d2 - 0.5 * c[:, None, None] * d2**2
    return AxisScores(row, col, None if b is None else -b)

  def _learned_scores(self, rows: int, cols: int, width: int) -> AxisScores:
    """Scores from learned row and column offset embeddings, split by offset axis."""
    size = self.max_grid_size or max(rows, cols)
    if max(rows, cols) > size:
      raise ValueError(
          f'A {rows}x{cols} grid exceeds max_grid_size={size}; '
          f'set max_grid_size >= {max(rows, cols)}.'
      )
    dim = self.settings.position_encoding_size or width
    by_axis = []
    for length, name in ((rows, 'row'), (cols, 'col')):
      table = self.param(
          f'{name}_embeddings', self.embedding_init, (2 * size - 1, dim), self.param_dtype
      )
      per_offset = self._dense(self.num_heads, dim, f'head_keys_{name}', use_bias=False)(
          table.astype(jnp.float32)
      )
      by_axis.append(jnp.moveaxis(per_offset[axis_offsets(length) + size - 1], -1, 0))
    return AxisScores(by_axis[0].astype(jnp.float32), by_axis[1].astype(jnp.float32), None)

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    check_choice(self.scores, POSITIONAL_SCORES, 'scores')
    if self.num_heads < 1:
      raise ValueError(f'num_heads={self.num_heads} must be >= 1.')
    if self.grid is None:
      _check_rank(x, 4, '(batch, rows, cols, features)', type(self).__name__)
      return self._attend(x, train)
    _check_rank(x, 3, '(batch, tokens, features)', type(self).__name__)
    if x.shape[1] != self.grid[0] * self.grid[1]:
      raise ValueError(
          f'{x.shape[1]} tokens do not fill grid={self.grid}; positional attention '
          'takes the patch tokens only (no class or distillation token).'
      )
    out = self._attend(x.reshape((x.shape[0],) + tuple(self.grid) + (x.shape[-1],)), train)
    return out.reshape(x.shape)

  def _attend(self, x: jax.Array, train: bool) -> jax.Array:
    batch, rows, cols, width = x.shape
    if self.scores == 'learned':
      axis_scores = self._learned_scores(rows, cols, width)
    else:
      axis_scores = self._gaussian_scores(rows, cols)
    separable = (
        axis_scores.cross is None
        and not self.use_content
        and not self.is_mutable_collection('intermediates')
        and (not train or self.attention_dropout_rate == 0.0)
    )
    if separable:
      heads = separable_attend(axis_scores, x).reshape(batch, rows * cols, self.num_heads, width)
    else:
      tokens = x.reshape(batch, rows * cols, width)
      scores = axis_scores.full()
      if self.use_content:
        shape = (batch, rows * cols, self.num_heads, width)
        q = self._dense(self.num_heads * width, width, 'query')(tokens).reshape(shape)
        k = self._dense(self.num_heads * width, width, 'key')(tokens).reshape(shape)
        content = numerics.einsum_float32('bqhd,bkhd->bhqk', q, k)
        scores = scores[None] + content / math.sqrt(width)
      heads = attend(self, scores, tokens, dropout_rate=self.attention_dropout_rate, train=train)
    out = self._dense(width, self.num_heads * width, 'value')(_merge_heads(heads))
    out = nn.Dropout(rate=self.dropout_rate, deterministic=not train)(out)
    return out.reshape(batch, rows, cols, width)


def positional(kind: str, **fields: Any) -> functools.partial:
  """`PositionalAttention` of one of `POSITIONAL_KINDS`, with `fields`."""
  check_choice(kind, POSITIONAL_KINDS, 'attention')
  return functools.partial(
      PositionalAttention,
      scores=kind.removesuffix('_content'),
      use_content=kind == 'learned_content',
      **fields,
  )


@dataclasses.dataclass(frozen=True)
class Kind:
  """An attention kind of the backbone's main blocks (`VisionTransformer.attention`).

  build(model, grid): the attention module (a `functools.partial` of a Flax module called with
  `name='attn'`) for `model`, a `VisionTransformer` whose fields it may read (a kind's own
  settings: `model.kind_settings(ItsSettings)`, a frozen dataclass registered with it whose `part`
  is 'attention'), and tokens whose patches lie on `grid` (rows, cols). The module maps (batch,
  tokens, width) to the same shape, takes `train=` and sows its probabilities as
  `intermediates/attention_probs` (`attend` does).
  patch_tokens_only: the kind attends over the patch grid alone (no class or distillation token
  in the main blocks).
  settings: the kind's own settings dataclass, None if it has none.
  module: the module that registered the kind, which a run that uses it records
  (`vit_jax.process.extensions`).
  """

  build: Callable[[Any, tuple[int, int]], Callable[..., nn.Module]]
  patch_tokens_only: bool = False
  settings: type | None = None
  module: str = __name__


_KINDS: dict[str, Kind] = {}


def register(
    name: str,
    build: Callable[[Any, tuple[int, int]], Callable[..., nn.Module]],
    *,
    patch_tokens_only: bool = False,
    settings: type | None = None,
) -> None:
  """Makes `name` an attention kind of every transformer (`--config.model.attention=name`); its
  own `settings` (a frozen dataclass whose `part` is 'attention') become `--config.model.FIELD`
  of every config (`parts.register_settings`)."""
  if name in _KINDS:
    raise ValueError(f'Attention kind {name!r} is registered already; registered: {kinds()}.')
  if settings is not None:
    parts.register_settings(settings, part='attention')
  module = extensions.caller_module()
  _KINDS[name] = Kind(build, patch_tokens_only, settings, module)
  extensions.note('attention', name, module, f'attention={name!r}')


def kinds() -> list[str]:
  """Every registered attention kind, in registration order."""
  return list(_KINDS)


def kind(name: str) -> Kind:
  """The registered attention kind `name`; ValueError naming the registered ones."""
  check_choice(name, _KINDS, 'attention')
  return _KINDS[name]


def _content(
    head_mixing: str, settings: type | None = None
) -> Callable[[Any, tuple[int, int]], Callable[..., nn.Module]]:
  """Content attention with `head_mixing`, from the model's shared attention fields and the kind's
  own `settings` (a kind settings dataclass whose fields `SelfAttention` takes), if any."""

  def build(model: Any, grid: tuple[int, int]) -> Callable[..., nn.Module]:
    del grid
    own = {} if settings is None else dataclasses.asdict(model.kind_settings(settings))
    return functools.partial(
        SelfAttention, head_mixing=head_mixing, **own, **model.attention_fields()
    )

  return build


def _positional(name: str) -> Callable[[Any, tuple[int, int]], Callable[..., nn.Module]]:
  """Cordonnier et al.'s kind `name` over the patch grid, from the model's fields and its
  attention settings (`parts.PositionalSettings`)."""
  return lambda model, grid: positional(
      name,
      grid=grid,
      num_heads=model.num_heads,
      settings=model.kind_settings(parts.PositionalSettings),
      attention_dropout_rate=model.attention_dropout_rate,
      dropout_rate=model.dropout_rate,
      dtype=model.dtype,
      param_dtype=model.param_dtype,
  )


# Content attention without or with head mixing (CaiT's talking heads, DeepViT's Re-attention),
# then Cordonnier et al.'s positional kinds (patch tokens only).
register('standard', _content('none'))
register('talking_heads', _content('talking_heads'))
register(
    're_attention',
    _content('re_attention', parts.ReAttentionSettings),
    settings=parts.ReAttentionSettings,
)
for _name in POSITIONAL_KINDS:
  register(_name, _positional(_name), patch_tokens_only=True, settings=parts.PositionalSettings)
