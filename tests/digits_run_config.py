"""`tiny_runs.digits_run_config` as a config file, for `python -m vit_jax.main --config=` (the data
directory comes from `--config.data_dir=`)."""

from tests import tiny_runs


def get_config():
  return tiny_runs.digits_run_config('')
