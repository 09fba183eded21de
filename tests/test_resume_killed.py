"""A training run on a streamed JPEG folder, killed with SIGKILL and rerun, ends bit-identical."""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from vit_jax.workdir import reader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOTAL_STEPS = 10


def _command(jpeg_folder, workdir):
  root, data_dir = jpeg_folder
  overrides = {
      'dataset': f'folder:{root}',
      'data_dir': data_dir,
      'normalization': 'inception',
      'augment': 'inception_crop',
      'random_erase_prob': 0.25,
      'repeated_aug': 2,
      'batch_size': 8,
      'eval_batch_size': 6,
      'total_steps': TOTAL_STEPS,
      'warmup_steps': 2,
      'checkpoint_every': 1,
      'eval_every': 1000,
      'log_every': 5,
      'model.depth': 1,
  }
  return [
      sys.executable,
      '-m',
      'vit_jax.main',
      '--config=configs/vit.py',
      f'--workdir={workdir}',
  ] + [f'--config.{k}={v}' for k, v in overrides.items()]


def _run(command):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  result = subprocess.run(
      command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
  )
  assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.e2e
def test_sigkill_at_a_random_step_then_rerun_equals_uninterrupted(jpeg_folder, tmp_path):
  straight, killed = tmp_path / 'straight', tmp_path / 'killed'
  _run(_command(jpeg_folder, straight))  # Also prepares the folder, before the timed kill.

  kill_after = int(np.random.default_rng().integers(2, TOTAL_STEPS - 1))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  process = subprocess.Popen(
      _command(jpeg_folder, killed),
      cwd=REPO,
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
  )
  deadline = time.time() + 240
  while not (killed / 'checkpoints' / str(kill_after)).exists() and process.poll() is None:
    assert time.time() < deadline, 'the run to be killed made no progress'
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert process.returncode == -signal.SIGKILL, f'finished before the kill at step {kill_after}'
  _run(_command(jpeg_folder, killed))

  expected = jax.tree.leaves(reader.Workdir(str(straight)).read_state()['params'])
  actual = jax.tree.leaves(reader.Workdir(str(killed)).read_state()['params'])
  assert len(expected) == len(actual)
  for x, y in zip(expected, actual):
    np.testing.assert_array_equal(
        np.asarray(x), np.asarray(y), err_msg=f'killed after step {kill_after}'
    )
