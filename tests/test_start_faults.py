"""Before training starts: an unknown dataset name is said first; SIGTERM and Ctrl-C exit 75."""

import os
import signal
import subprocess
import sys
import time

import pytest

from vit_jax.schema import checks as config_checks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize('dataset', ['cifar100000', 'imagenet2012x:5.0.0'])
def test_an_unknown_dataset_is_said_to_be_unknown_not_to_need_a_variant(dataset):
  problems = config_checks.quick_default_problems(dataset, 'digits', ('S/16',))
  assert problems == [
      f"--config.dataset={dataset!r}: no such dataset. Valid: 'digits' "
      "(embedded), 'folder:/path/to/images' (your own images) or a TFDS dataset "
      "name, e.g. 'cifar10', 'cifar100', 'imagenet2012' (tfds.list_builders())."
  ]


def test_a_known_dataset_still_gets_the_variant_advice():
  (problem,) = config_checks.quick_default_problems('cifar100', 'digits', ('S/16',))
  assert 'add variant= with one of S/16' in problem


@pytest.mark.parametrize(
    'signum, after', [(signal.SIGTERM, 0.2), (signal.SIGINT, 1.5), (signal.SIGTERM, 3.0)]
)
def test_sigterm_or_ctrl_c_while_starting_exits_75_with_one_line(tmp_path, signum, after):
  process = subprocess.Popen(
      [
          sys.executable,
          '-m',
          'vit_jax.main',
          '--config=configs/vit.py',
          f'--workdir={tmp_path / "run"}',
          f'--config.data_dir={tmp_path / "tfds"}',
      ],
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'),
  )
  time.sleep(after)
  process.send_signal(signum)
  out, err = process.communicate(timeout=120)
  assert process.returncode == 75, err[-3000:]
  assert 'Traceback' not in err and 'KeyboardInterrupt' not in err, err[-3000:]
  shown = [line for line in (out + err).splitlines() if not line.startswith(('I1', 'W1'))]
  assert shown == [
      f'{signal.Signals(signum).name}: stopped before any training step could be '
      "saved; the work directory's checkpoints (if any) are intact. Rerun the same "
      'command to resume.'
  ], err[-3000:]
