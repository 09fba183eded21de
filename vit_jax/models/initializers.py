"""Parameter initialisers shared by the model modules: ViT's default kernel, PyTorch's default
Linear/Conv weight and bias, and a fused kernel initialised as independent parts."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import Dtype, Initializer

DEFAULT_KERNEL_INIT = nn.initializers.normal(stddev=0.02)
# PyTorch's default Linear/Conv weight, kaiming_uniform(a=sqrt(5)) = U(+-1/sqrt(fan_in)).
torch_default_kernel_init = nn.initializers.variance_scaling(1.0 / 3.0, 'fan_in', 'uniform')


def torch_default_bias_init(fan_in: int) -> Initializer:
  """PyTorch's default Linear/Conv bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = 1.0 / math.sqrt(fan_in)

  def init(key: jax.Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> jax.Array:
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def split_heads_init(kernel_init: Initializer, parts: int) -> Initializer:
  """Initialises a fused (in, parts * out) kernel as `parts` independent (in, out) kernels.

  Keeps fan-dependent schemes (xavier) identical to separate q/k/v projections.
  """

  def init(key: jax.Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> jax.Array:
    fan_in, fan_out = shape[0], shape[-1]
    keys = jax.random.split(key, parts)
    return jnp.concatenate(
        [kernel_init(k, (fan_in, fan_out // parts), dtype) for k in keys], axis=-1
    )

  return init
