"""Where every array of a run lives: the device mesh, and fully sharded data parallelism by rule.

The mesh has two axes, `data` × `fsdp`, over every device of every process. A batch is split over
both axes, so each device sees its own examples. Each parameter, and with it its gradient,
optimizer moments, EMA copy and a distillation teacher's variables, is split over `fsdp` along
its largest axis that the `fsdp` size divides (big_vision `sharding.py`, rule `fsdp`); arrays of
fewer than `min_size` elements, or with no such axis, stay replicated. Under `jax.jit` XLA's SPMD
partitioner then gathers each parameter where it is used and reduce-scatters its gradient, so a
device holds 1/fsdp of the training state. `fsdp=1` replicates everything: data parallelism.

The rule reads shapes only (element counts, not bytes), so a parameter, its gradient and its
moments (whatever `mu_dtype`) always share one layout, and a checkpoint written on one mesh
restores onto another (`run_writer.RunWriter.resume` with this module's shardings of the new mesh).
"""

from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from vit_jax.schema import mesh as mesh_settings


MESH_AXES = ('data', 'fsdp')


def check_mesh(fsdp: int, device_count: int) -> None:
  """Raises ValueError unless `fsdp` is a positive divisor of the device count."""
  if isinstance(fsdp, bool) or not isinstance(fsdp, int) or fsdp < 1 or device_count % fsdp:
    divisors = [d for d in range(1, device_count + 1) if device_count % d == 0]
    raise ValueError(
        f'mesh.fsdp={fsdp!r}: must divide the number of devices ({device_count}); '
        f'valid: {divisors}.'
    )


def make_mesh(fsdp: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The (data, fsdp) mesh over `devices` (default: every device), data = devices / fsdp.

  Auto axes (sharding left to XLA's propagation), laid out by `jax.make_mesh` so that on TPU
  slices and GPU hosts the `fsdp` groups sit on the fastest links.
  """
  devices = list(jax.devices() if devices is None else devices)
  check_mesh(fsdp, len(devices))
  return jax.make_mesh(
      (len(devices) // fsdp, fsdp),
      MESH_AXES,
      axis_types=(AxisType.Auto,) * len(MESH_AXES),
      devices=devices,
  )


def fsdp_spec(shape: Sequence[int], fsdp: int, min_size: int) -> P:
  """The partition of an array of `shape`: `fsdp` on its largest axis that `fsdp` divides.

  Ties go to the earlier axis. Replicated (P()) when fsdp is 1, the array has fewer than
  `min_size` elements, or no axis is divisible.
  """
  if fsdp == 1 or int(np.prod(shape, dtype=np.int64)) < max(min_size, 1):
    return P()
  for axis in sorted(range(len(shape)), key=lambda i: (-shape[i], i)):
    if shape[axis] % fsdp == 0:
      return P(*(None,) * axis, 'fsdp')
  return P()


def fsdp_shardings(tree: Any, mesh: Mesh, min_size: int) -> Any:
  """A NamedSharding for every array (or ShapeDtypeStruct) of `tree`, by `fsdp_spec`."""
  fsdp = mesh.shape['fsdp']
  return jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(np.shape(x), fsdp, min_size)), tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (example) axis over every device: data × fsdp, in the mesh's device order."""
  return NamedSharding(mesh, P(MESH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  """A full copy on every device (metrics, scalars)."""
  return NamedSharding(mesh, P())


def place(tree: Any, shardings: Any) -> Any:
  """Host arrays that every process holds in full -> global arrays laid out by `shardings`.

  Each device receives only its own slice (no device ever holds a whole sharded array).
  """

  def put(x, sharding):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(put, tree, shardings)


def abstract(tree: Any, shardings: Any) -> Any:
  """`tree`'s shapes and dtypes as ShapeDtypeStructs carrying `shardings` (restore targets)."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), tree, shardings
  )


def bytes_per_device(tree: Any, shardings: Any) -> int:
  """The bytes of `tree` that one device holds under `shardings` (the largest shard)."""
  return sum(
      int(np.prod(s.shard_shape(np.shape(x)), dtype=np.int64)) * np.dtype(x.dtype).itemsize
      for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings))
  )


def global_batch(
    batch: dict[str, np.ndarray], data_sharding: NamedSharding
) -> dict[str, jax.Array]:
  """Assembles one global array per key from this process's share of the batch."""
  return {k: jax.make_array_from_process_local_data(data_sharding, v) for k, v in batch.items()}
