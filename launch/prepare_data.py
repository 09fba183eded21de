r"""Prepares the dataset of a config in a TFDS data dir, once, before a multi-host run reads it.

`python launch/prepare_data.py --config=configs/vit.py:variant=S/4,dataset=cifar10 \
    --data_dir=gs://BUCKET/tensorflow_datasets`

Run it on one machine only (launch/tpu_vm.sh runs it on worker 0): every process of a training
run reads the prepared files, and none of them prepares concurrently with another.
"""

import os
import sys

from absl import app
from absl import flags
from ml_collections import config_flags
from vit_jax.schema import setting

# This checkout's vit_jax (config files import vit_jax.configs), installed or not.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Training configuration file.', lock_config=False
)
_DATA_DIR = flags.DEFINE_string(
    'data_dir', None, 'TFDS data dir (local or gs://); default: the ' "config's data_dir."
)
flags.mark_flags_as_required(['config'])


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  tf.config.set_visible_devices([], 'GPU')
  from vit_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from vit_jax.schema import data as data_settings  # pylint: disable=g-import-not-at-top

  config = _CONFIG.value
  if _DATA_DIR.value:
    config.data_dir = _DATA_DIR.value
  info = input_pipeline.get_dataset_info(setting.build(data_settings.DataSettings, config))
  print(
      f'Prepared {info.name} in {config.data_dir or "the TFDS default data dir"}: '
      f'{info.num_train_examples} train / {info.num_eval_examples} eval examples, '
      f'{info.num_classes} classes.'
  )


if __name__ == '__main__':
  app.run(main)
