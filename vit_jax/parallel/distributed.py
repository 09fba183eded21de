"""Which multi-process run this process belongs to (read from flags and the environment), and
joining it."""

import glob
import importlib.util
import os
from typing import Any, Mapping

from absl import logging


def _environment_int(environ: Mapping[str, str], name: str) -> int | None:
  value = environ.get(name)
  if value is None or not value.strip():
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f'Environment variable {name}={value!r} must be an integer.') from None


def on_cloud_tpu_vm() -> bool:
  """Whether this machine has TPU chips and libtpu, i.e. is a Cloud TPU VM (one host or a pod)."""
  has_chips = bool(glob.glob('/dev/accel[0-9]*') or glob.glob('/dev/vfio/[0-9]*'))
  return has_chips and importlib.util.find_spec('libtpu') is not None


def distributed_arguments(
    environ: Mapping[str, str],
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    on_cloud_tpu_vm: bool = False,
) -> dict[str, Any] | None:
  """The arguments for `jax.distributed.initialize`, or None when this process runs alone.

  Explicit values (flags, else JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID) come
  first. Otherwise a cluster that JAX can read on its own is joined only when it really has
  several processes: a SLURM job step (srun) of several tasks, not the sbatch script itself nor a
  one-task step; an Open MPI world of several ranks; a multi-host TPU slice or multislice; any
  Cloud TPU VM (JAX reads the pod's workers from the VM's metadata; one host joins alone).
  """
  coordinator_address = coordinator_address or environ.get('JAX_COORDINATOR_ADDRESS') or None
  if num_processes is None:
    num_processes = _environment_int(environ, 'JAX_NUM_PROCESSES')
  if process_id is None:
    process_id = _environment_int(environ, 'JAX_PROCESS_ID')
  slurm_tasks = _environment_int(environ, 'SLURM_STEP_NUM_TASKS') or 1
  in_slurm_step = slurm_tasks > 1 and 'SLURM_PROCID' in environ
  mpi_ranks = _environment_int(environ, 'OMPI_COMM_WORLD_SIZE') or 1
  tpu_hosts = environ.get('TPU_PROCESS_ADDRESSES') or environ.get('TPU_WORKER_HOSTNAMES') or ''
  on_tpu_slice = ',' in tpu_hosts or 'MEGASCALE_COORDINATOR_ADDRESS' in environ

  if coordinator_address or num_processes is not None or process_id is not None:
    if num_processes is not None and num_processes < 1:
      raise ValueError(f'--num_processes={num_processes} must be at least 1.')
    if num_processes is not None and process_id is not None:
      if not 0 <= process_id < num_processes:
        raise ValueError(
            f'--process_id={process_id} must be in [0, {num_processes}) for '
            f'--num_processes={num_processes}.'
        )
      if num_processes == 1:
        return None
      if not coordinator_address:
        raise ValueError(
            '--num_processes and --process_id need --coordinator_address=HOST:PORT '
            '(or JAX_COORDINATOR_ADDRESS), the address of process 0.'
        )
      return {
          'coordinator_address': coordinator_address,
          'num_processes': num_processes,
          'process_id': process_id,
      }
    if not (in_slurm_step or mpi_ranks > 1 or on_tpu_slice or on_cloud_tpu_vm):
      raise ValueError(
          f'An explicit multi-process run needs all of --coordinator_address '
          f'({coordinator_address}), --num_processes ({num_processes}) and --process_id '
          f'({process_id}), or their JAX_* environment variables.'
      )
    arguments = {
        'coordinator_address': coordinator_address,
        'num_processes': num_processes,
        'process_id': process_id,
    }
    return {k: v for k, v in arguments.items() if v is not None}
  if in_slurm_step:
    return {'num_processes': slurm_tasks, 'process_id': int(environ['SLURM_PROCID'])}
  if mpi_ranks > 1 or on_tpu_slice or on_cloud_tpu_vm:
    return {}
  return None


def initialize(
    mode: str = 'auto',
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
  """Connects the processes of a multi-process run; a no-op for one process. `mode`: 'auto'
  joins a run that `distributed_arguments` detects, 'on' always calls
  jax.distributed.initialize() (JAX finds the cluster), 'off' never."""
  import jax  # pylint: disable=g-import-not-at-top

  if mode == 'off':
    return
  arguments = distributed_arguments(
      os.environ,
      coordinator_address=coordinator_address,
      num_processes=num_processes,
      process_id=process_id,
      on_cloud_tpu_vm=on_cloud_tpu_vm(),
  )
  if arguments is None and mode == 'on':
    arguments = {}
  if arguments is not None:
    logging.info(
        'jax.distributed.initialize(%s)', ', '.join(f'{k}={v!r}' for k, v in arguments.items())
    )
    from vit_jax.parallel import peers  # pylint: disable=g-import-not-at-top

    peers.initialize(arguments)
    peers.quiet_fatal_errors(logging.get_verbosity())
