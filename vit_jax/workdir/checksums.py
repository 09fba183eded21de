"""Checksums of a training state's arrays: saved in each checkpoint's meta, checked by reads."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

CHECKSUMS = 'checksums'  # In a checkpoint's meta: `checksums` of its state as saved.


def checksums(tree: Any) -> list[int]:
  """Each array leaf's bits summed as unsigned words of up to 32 bits (wrapping at 2**32), in
  leaf order: a changed bit changes its array's sum. Device arrays (`_summed_on_device`) are summed
  in one program, compiled once per state's layout; the others on the host."""
  leaves = jax.tree.leaves(tree)
  on_device = [i for i, leaf in enumerate(leaves) if _summed_on_device(leaf)]
  sums = {}
  if on_device:
    device_sums = jax.device_get(_device_sums([_plain(leaves[i]) for i in on_device]))
    sums = dict(zip(on_device, map(int, device_sums)))
  return [sums[i] if i in sums else _host_sum(leaf) for i, leaf in enumerate(leaves)]


def _summed_on_device(leaf: Any) -> bool:
  """Whether `checksums` sums `leaf` on its devices: a device array that is not on CPUs only, or
  whose shards other processes hold (the same answer in every process)."""
  return isinstance(leaf, jax.Array) and (
      not leaf.is_fully_addressable or any(device.platform != 'cpu' for device in leaf.devices())
  )


def _host_sum(leaf: Any) -> int:
  """`checksums` of one host array (or CPU array), as `_device_sums` computes it."""
  if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(leaf)
  array = np.ascontiguousarray(np.asarray(leaf))
  if array.dtype == bool:
    array = array.astype(np.uint8)
  words = array.reshape(-1).view(f'uint{min(array.dtype.itemsize, 4) * 8}')
  return int(np.sum(words, dtype=np.uint64) % 2**32)


def _plain(leaf: jax.Array) -> jax.Array:
  """A device array as plain numbers: typed PRNG keys as their data, booleans as bytes."""
  if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(leaf)
  return leaf.astype(jnp.uint8) if leaf.dtype == jnp.bool_ else leaf


@jax.jit
def _device_sums(leaves: list[jax.Array]) -> list[jax.Array]:
  """`checksums` of device arrays, in one program (compiled once per state's layout)."""
  sums = []
  for leaf in leaves:
    bits = jax.lax.bitcast_convert_type(leaf, f'uint{min(leaf.dtype.itemsize, 4) * 8}')
    sums.append(jnp.sum(bits.astype(jnp.uint32), dtype=jnp.uint32))
  return sums
