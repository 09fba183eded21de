r"""Trains and evaluates a model: `python -m vit_jax.main --config=configs/vit.py --workdir=/tmp/vit`.

The same command runs on a laptop, a GPU box, every task of a SLURM job step and every worker of a
Cloud TPU VM pod: when a multi-process run is detected (see `vit_jax.distributed`) JAX's
distributed runtime is initialised first; `--distributed=on|off` overrides the detection.
Override any config field with `--config.FIELD=VALUE`, or pass `key=value` pairs after the config
path: `--config=configs/vit.py:variant=S/16,dataset=cifar10`.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from vit_jax import distributed
from vit_jax import runtime

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Training configuration file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, logs and results.')
_DISTRIBUTED = flags.DEFINE_enum(
    'distributed', 'auto', ['auto', 'on', 'off'],
    "Join a multi-process run. 'auto': when one is detected (the flags below or their JAX_* "
    "environment variables, a SLURM job step of several tasks, Open MPI, a Cloud TPU VM); 'on': "
    "always call jax.distributed.initialize() and let JAX find the cluster; 'off': never.")
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'host:port of process 0, for multi-process runs started by hand '
    '(default: $JAX_COORDINATOR_ADDRESS).')
_NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', None, 'Number of processes, with --coordinator_address (default: '
    '$JAX_NUM_PROCESSES).')
_PROCESS_ID = flags.DEFINE_integer(
    'process_id', None, 'This process, 0..num_processes-1, with --coordinator_address (default: '
    '$JAX_PROCESS_ID).')
flags.mark_flags_as_required(['config', 'workdir'])


def initialize_distributed(mode: str = 'auto') -> None:
  """Connects the processes of a multi-process run; a no-op for one process."""
  import jax  # pylint: disable=g-import-not-at-top
  if mode == 'off':
    return
  arguments = distributed.distributed_arguments(
      os.environ, coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
      process_id=_PROCESS_ID.value, on_cloud_tpu_vm=distributed.on_cloud_tpu_vm())
  if arguments is None and mode == 'on':
    arguments = {}
  if arguments is not None:
    logging.info('jax.distributed.initialize(%s)',
                 ', '.join(f'{k}={v!r}' for k, v in arguments.items()))
    jax.distributed.initialize(**arguments)


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  logging.info('Process settings: %s', runtime.configure())  # Before JAX starts its backend.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.set_visible_devices([], 'GPU')  # tf.data only: the accelerators belong to JAX.
  try:
    initialize_distributed(_DISTRIBUTED.value)
  except ValueError as e:
    sys.exit(f'error: {e}')
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax import train  # pylint: disable=g-import-not-at-top
  if jax.process_index() != 0:  # Process 0 speaks for all; the others report only problems.
    logging.set_verbosity(logging.WARNING)
  logging.info('JAX process %d of %d; %d local / %d global devices (%s).', jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count(),
               jax.devices()[0].device_kind)
  try:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except (ValueError, FloatingPointError) as e:
    logging.debug('Stopped by an error.', exc_info=True)
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  app.run(main)
