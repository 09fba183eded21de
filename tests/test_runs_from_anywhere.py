"""The commands run from any directory with the project installed non-editable (`pip install .`):
a config file of the checkout given by path trains, and the device report finds its family
configs in the installed package."""

import json
import os
import shutil
import site
import subprocess
import sys

from conftest import copy_of_project
import pytest
from vit_jax import configs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CAIT = [
    '--config.model.depth=1',
    '--config.model.class_attention_depth=1',
    '--config.model.hidden_size=32',
    '--config.model.num_heads=2',
    '--config.model.mlp_dim=64',
    '--config.batch_size=16',
    '--config.total_steps=2',
    '--config.warmup_steps=1',
    '--config.log_every=1',
    '--config.eval_every=2',
    '--config.checkpoint_every=2',
]


def _installed_python(tmp_path) -> str:
  """A fresh virtual environment's python with a copy of the project installed non-editable;
  the test environment's packages (jax, flax, ...) are seen behind its own, so nothing is
  downloaded."""
  source = copy_of_project(tmp_path / 'source')
  venv = tmp_path / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
  python = str(venv / 'bin' / 'python')
  purelib = subprocess.run(
      [python, '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
      capture_output=True,
      text=True,
      check=True,
  ).stdout.strip()
  with open(os.path.join(purelib, 'test_environment.pth'), 'w') as f:
    f.write('\n'.join(site.getsitepackages()) + '\n')
  install = subprocess.run(
      [python, '-m', 'pip', 'install', '--no-deps', '--no-build-isolation', '--no-index', '-q']
      + [str(source)],
      capture_output=True,
      text=True,
      check=False,
      timeout=300,
  )
  assert install.returncode == 0, install.stderr[-3000:]
  shutil.rmtree(source)
  return python


def _run(python: str, cwd: str, *args: str) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  env['TF_CPP_MIN_LOG_LEVEL'] = '2'
  return subprocess.run(
      [python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
  )


@pytest.mark.e2e
def test_installed_project_trains_a_checkout_config_and_reports_from_another_directory(tmp_path):
  python = _installed_python(tmp_path)
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()

  where = _run(python, str(elsewhere), '-c', 'import vit_jax; print(vit_jax.__file__)')
  assert where.stdout.startswith(str(tmp_path / 'venv')), where.stdout + where.stderr

  config = os.path.join(REPO, 'configs', 'cait.py')
  workdir = str(tmp_path / 'cait')
  trained = _run(
      python,
      str(elsewhere),
      '-m',
      'vit_jax.main',
      f'--config={config}',
      f'--workdir={workdir}',
      *TINY_CAIT,
  )
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert 'Final test accuracy' in trained.stderr, trained.stderr[-3000:]

  report = _run(python, str(elsewhere), '-m', 'vit_jax.benchmark', '--mode=device_report')
  assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
  table = json.loads((elsewhere / 'device_report.json').read_text())
  assert table['reduced']
  rows = {row['check'].split(' (')[0]: row for row in table['rows']}
  for family in configs.family_configs():
    assert rows[f'{family} training']['ok'], rows[f'{family} training']
