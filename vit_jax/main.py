r"""Trains and evaluates a model: `python -m vit_jax.main --config=configs/vit.py --workdir=/tmp/vit`.

The same command runs on a laptop, a GPU box and every worker of a Cloud TPU VM pod: when a cluster
is detected (Cloud TPU pod, SLURM with several tasks, or the explicit --coordinator_address flags)
JAX's distributed runtime is initialised first. Override any config field with
`--config.FIELD=VALUE`, or pass `key=value` pairs after the config path:
`--config=configs/vit.py:variant=S/16,dataset=cifar10`.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Training configuration file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, logs and results.')
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'host:port of process 0, for multi-process runs started by hand.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Number of processes (with '
                                      '--coordinator_address).')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process (with --coordinator_address).')
flags.mark_flags_as_required(['config', 'workdir'])


def cluster_detected() -> bool:
  """Whether this process is one of several that JAX can connect on its own."""
  if int(os.environ.get('SLURM_NTASKS', '1')) > 1:
    return True
  hostnames = os.environ.get('TPU_WORKER_HOSTNAMES', '')
  return ',' in hostnames or 'MEGASCALE_COORDINATOR_ADDRESS' in os.environ


def initialize_distributed() -> None:
  """Connects the processes of a multi-process run; a no-op for one process."""
  import jax  # pylint: disable=g-import-not-at-top
  if _COORDINATOR.value:
    jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                               num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
  elif cluster_detected():
    jax.distributed.initialize()


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.set_visible_devices([], 'GPU')  # tf.data only: the accelerators belong to JAX.
  initialize_distributed()
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax import train  # pylint: disable=g-import-not-at-top
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
