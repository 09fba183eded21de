"""The products and attention computations shared by the model modules: `Dense` with a CPU-friendly
dot, products accumulated into float32 (`einsum_float32`), and softmax(q k^T) v as one product, by
query chunks or as cuDNN flash attention."""

import functools
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import Dtype


def dense_dot_general(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Dtype | None = None,
) -> jax.Array:
  """`lax.dot_general` for `Dense`: on CPU, (batch, tokens, in) x (in, out) as one 2-D matmul.

  With the leading axes merged, XLA's CPU compiler computes the kernel gradient as one direct
  matmul instead of a slower one on a transposed copy of the activations (about a tenth of a
  ViT training step). Elsewhere (TPU tiles the two minor axes) the dot is left as it is.
  """
  (lhs_contracting, rhs_contracting), (lhs_batch, _) = dimension_numbers
  if (
      jax.default_backend() == 'cpu'
      and lhs.ndim > 2
      and rhs.ndim == 2
      and not lhs_batch
      and tuple(lhs_contracting) == (lhs.ndim - 1,)
      and tuple(rhs_contracting) == (0,)
  ):
    out = jax.lax.dot_general(
        lhs.reshape(-1, lhs.shape[-1]),
        rhs,
        (((1,), (0,)), ((), ())),
        precision=precision,
        preferred_element_type=preferred_element_type,
    )
    return out.reshape(lhs.shape[:-1] + rhs.shape[1:])
  return jax.lax.dot_general(
      lhs,
      rhs,
      dimension_numbers,
      precision=precision,
      preferred_element_type=preferred_element_type,
  )


def Dense(features: int, **kwargs: Any) -> nn.Dense:  # pylint: disable=invalid-name
  """`nn.Dense` over the last axis of token arrays, with the CPU-friendly `dense_dot_general`."""
  return nn.Dense(features, dot_general=dense_dot_general, **kwargs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _float32_product(product: Callable[..., jax.Array], a: jax.Array, b: jax.Array) -> jax.Array:
  return product(a, b, jnp.float32)


def _float32_product_forward(product, a, b):
  return _float32_product(product, a, b), (a, b)


def _float32_product_backward(product, operands, cotangent):
  # The cotangent enters the transposed products in the operands' dtype: left float32, it would
  # make each of them a float32 product (bfloat16 operands upcast) on GPU and TPU.
  a, b = operands
  dtype = jnp.result_type(a, b)
  _, vjp = jax.vjp(lambda a, b: product(a, b, dtype), a, b)
  return vjp(cotangent.astype(dtype))


_float32_product.defvjp(_float32_product_forward, _float32_product_backward)


def einsum_float32(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
  """`jnp.einsum(spec, a, b)` of the operands in their own dtype, accumulated into float32.

  For attention scores in mixed precision: bfloat16 operands, float32 result for the softmax, and
  in the backward pass products of bfloat16 operands too (the float32 cotangent is rounded to
  bfloat16 first, as an einsum with a bfloat16 result would do).
  """
  return _float32_product(
      lambda a, b, dtype: jnp.einsum(spec, a, b, preferred_element_type=dtype), a, b
  )


def float32_dot_general(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Dtype | None = None,
) -> jax.Array:
  """`dense_dot_general` with a float32 result and `einsum_float32`'s backward pass.

  The `dot_general` of a `Dense` whose output feeds a float32 computation (head mixing before
  softmax or normalisation).
  """
  del preferred_element_type  # Always float32.
  return _float32_product(
      lambda a, b, dtype: dense_dot_general(
          a, b, dimension_numbers, precision=precision, preferred_element_type=dtype
      ),
      lhs,
      rhs,
  )


# On CPU, attention over at least this many (query, key) pairs per head goes by query chunks.
CHUNKED_ATTENTION_MIN_PAIRS = 1024 * 1024
ATTENTION_CHUNK_SIZE = 512


def chunked_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, chunk_size: int = ATTENTION_CHUNK_SIZE
) -> jax.Array:
  """softmax(q k^T) v by query chunks, each recomputed in the backward pass (Rabe & Staats 2021).

  Exactly `jax.nn.dot_product_attention(q, k, v, scale=1.0)` for q pre-scaled, all (batch, tokens,
  heads, head_dim), with (batch, heads, chunk, keys) score blocks in place of one queries x keys
  matrix (39 MB per image for T2T-ViT's 3136 tokens), and nothing of them kept for the backward
  pass: a quarter less CPU time for that attention's forward and backward.
  """
  queries = q.shape[1]
  num_chunks = -(-queries // chunk_size)
  bounds = [queries * i // num_chunks for i in range(num_chunks + 1)]  # Near-equal chunks.

  attend_chunk = jax.checkpoint(lambda q_chunk: softmax_attention(q_chunk, k, v))
  return jnp.concatenate(
      [attend_chunk(q[:, start:stop]) for start, stop in zip(bounds[:-1], bounds[1:])], axis=1
  )


def softmax_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """softmax(q k^T) v for q pre-scaled, all (batch, tokens, heads, head_dim).

  The computation of `jax.nn.dot_product_attention`'s XLA implementation (scores accumulated in
  float32, softmax in float32, probabilities rounded to the values' dtype), whose backward pass
  also multiplies operands of the inputs' dtype only (`einsum_float32`).
  """
  scores = einsum_float32('bqhd,bkhd->bhqk', q, k)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum('bhqk,bkhd->bqhd', probs, v)


# The implementations of the fast path (`choose_attention`).
ATTENTION_IMPLEMENTATIONS = ('auto', 'xla', 'cudnn')

# cuDNN's flash attention runs a sequence of a multiple of this many tokens as it is; any other
# length is padded, with the padded keys masked by their count (no bias), to a multiple of
# `CUDNN_MASKED_MULTIPLE`: its backward pass gives NaN query gradients for a masked length
# ≡ 64 (mod 128) on Hopper (pytorch #196678, huggingface/trl #7181).
CUDNN_UNMASKED_MULTIPLE = 64
CUDNN_MASKED_MULTIPLE = 128
# What cuDNN's flash attention takes: half-precision operands, heads of at most 128 features in
# multiples of 8.
CUDNN_DTYPES = ('bfloat16', 'float16')
CUDNN_MAX_HEAD_DIM = 128


def round_up(tokens: int, multiple: int) -> int:
  """`tokens` padded to a whole number of `multiple`."""
  return -(-tokens // multiple) * multiple


def cudnn_sequence_length(tokens: int) -> int:
  """The length `cudnn_attention` runs a sequence of `tokens` at (see `CUDNN_MASKED_MULTIPLE`)."""
  if tokens % CUDNN_UNMASKED_MULTIPLE == 0:
    return tokens
  return round_up(tokens, CUDNN_MASKED_MULTIPLE)


class AttentionChoice(NamedTuple):
  """The implementation a fast-path attention runs ('xla' or 'cudnn') and why."""

  implementation: str
  reason: str


def accelerator() -> str:
  """'cuda' on NVIDIA GPUs, else JAX's default backend ('cpu', 'tpu', 'gpu' for others)."""
  backend = jax.default_backend()
  if backend == 'gpu' and jax.devices()[0].device_kind.startswith('NVIDIA'):
    return 'cuda'
  return backend


def choose_attention(
    requested: str | None, queries: int, keys: int, head_dim: int, dtype: Any
) -> AttentionChoice:
  """What the fast path runs for `requested` ('auto', None for 'auto', 'xla', 'cudnn') on these
  shapes, on this machine: cuDNN where it is asked for or, with 'auto', on NVIDIA GPUs for the
  shapes and dtypes it computes correctly; XLA elsewhere. A single query never goes to cuDNN:
  its kernel gives NaN key and value gradients for one query with large negative logits on H200
  (NVIDIA/cudnn-frontend #1072)."""
  if requested == 'xla':
    return AttentionChoice('xla', 'asked for')
  if requested != 'cudnn' and accelerator() != 'cuda':
    return AttentionChoice('xla', f'{accelerator()}: no faster kernel known correct')
  if queries == 1:
    return AttentionChoice('xla', "one query: cuDNN's gives NaN gradients, cudnn-frontend #1072")
  if requested == 'cudnn':
    return AttentionChoice('cudnn', 'asked for')
  if jnp.dtype(dtype).name not in CUDNN_DTYPES:
    return AttentionChoice('xla', f'{jnp.dtype(dtype).name} (cuDNN takes {"/".join(CUDNN_DTYPES)})')
  if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
    return AttentionChoice('xla', f'head dim {head_dim} (cuDNN takes multiples of 8 up to 128)')
  return AttentionChoice('cudnn', 'fastest correct on NVIDIA GPUs')


def cudnn_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, lengths: tuple[int, int] | None = None
) -> jax.Array:
  """softmax(q k^T) v for q pre-scaled, all (batch, tokens, heads, head_dim), as cuDNN flash
  attention (`jax.nn.dot_product_attention`; GPU, float16/bfloat16).

  Queries and keys are padded to `lengths` (default: each to its `cudnn_sequence_length`), the
  padded keys masked (`key_value_seq_lengths`) and the padded queries' outputs dropped: the
  result and its gradients are those of the unpadded sequences.
  """
  queries, keys = q.shape[1], k.shape[1]
  padded_queries, padded_keys = lengths or (
      cudnn_sequence_length(queries),
      cudnn_sequence_length(keys),
  )
  if (padded_queries, padded_keys) == (queries, keys):
    return jax.nn.dot_product_attention(q, k, v, scale=1.0, implementation='cudnn')
  pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n - x.shape[1]), (0, 0), (0, 0)))
  out = jax.nn.dot_product_attention(
      pad(q, padded_queries),
      pad(k, padded_keys),
      pad(v, padded_keys),
      scale=1.0,
      key_value_seq_lengths=jnp.full((q.shape[0],), keys, jnp.int32),
      implementation='cudnn',
  )
  return out[:, :queries]
