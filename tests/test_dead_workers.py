"""A process of a multi-process run dies: the others stop within seconds with one line, exit 75.

Two `python -m vit_jax.main` processes join over 127.0.0.1 (one CPU device each, gloo
collectives), as the tasks of a hand-started run (--coordinator_address, --num_processes,
--process_id); one is killed with SIGKILL once the run has saved a checkpoint. Every subprocess
is killed with SIGKILL at the end (JAX traps SIGTERM).
"""

import os
import signal
import socket
import subprocess
import sys
import time

import jax
import pytest

from vit_jax.parallel import peers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    '--config=configs/vit.py',
    '--config.warmup_steps=1',
    '--config.log_every=1',
    '--config.checkpoint_every=2',
    '--config.eval_every=100000',
    '--config.model.depth=1',
    '--config.model.hidden_size=16',
    '--config.model.num_heads=1',
    '--config.model.mlp_dim=16',
    '--config.batch_size=16',
    '--config.image_size=16',
    '--config.crop_padding=2',
    '--config.flip=False',
    '--config.normalization=digits',
    '--config.model.patch_size=4',
    '--config.total_steps=100000',
]


def test_a_lost_connection_is_told_from_other_errors():
  gloo = jax.errors.JaxRuntimeError(
      'UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/'
      'transport/tcp/pair.cc:547] Connection closed by peer '
      '[127.0.0.1]:50879'
  )
  assert peers.lost_peer(gloo).startswith('UNKNOWN: Gloo all-reduce failed')
  try:
    try:
      raise gloo
    except jax.errors.JaxRuntimeError as e:
      raise RuntimeError('while saving') from e
  except RuntimeError as wrapped:
    assert peers.lost_peer(wrapped) is not None
  # Gloo's errors reach Python as ValueError.
  assert peers.lost_peer(ValueError('UNKNOWN: Gloo AllGather failed: Connection reset by peer'))
  assert peers.lost_peer(jax.errors.JaxRuntimeError('RESOURCE_EXHAUSTED: out of memory')) is None
  assert peers.lost_peer(ValueError('--config.batch_size=-1: must be at least 1.')) is None
  assert peers.initialize_options() == {'heartbeat_timeout_seconds': peers.HEARTBEAT_TIMEOUT_S}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_when_a_worker_dies_the_other_stops_at_once_with_one_line_and_exit_75(tmp_path):
  port, workdir = _free_port(), tmp_path / 'run'
  env = {k: v for k, v in os.environ.items() if not k.startswith(('SLURM_', 'JAX_'))}
  env.update(TF_CPP_MIN_LOG_LEVEL='2', JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  logs = [tmp_path / f'process{i}.log' for i in range(2)]
  processes = []
  try:
    for i in range(2):
      with open(logs[i], 'w') as f:
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    '-m',
                    'vit_jax.main',
                    f'--workdir={workdir}',
                    *TINY,
                    f'--config.data_dir={tmp_path / "tfds"}',
                    f'--coordinator_address=127.0.0.1:{port}',
                    '--num_processes=2',
                    f'--process_id={i}',
                ],
                cwd=REPO,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + 400
    while not (workdir / 'checkpoints' / '4').exists():
      assert time.monotonic() < deadline and processes[0].poll() is None, logs[0].read_text()
      time.sleep(0.2)
    processes[1].kill()
    killed = time.monotonic()
    code = processes[0].wait(timeout=120)
    stopped_after = time.monotonic() - killed
  finally:
    for p in processes:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
  log = logs[0].read_text()
  assert code == 75, log[-3000:]
  assert stopped_after < 20, stopped_after
  errors = [line for line in log.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and errors[0].endswith('Rerun all processes to resume.'), log[-3000:]
  assert 'Traceback' not in log and 'Extension modules' not in log
  assert sorted(os.listdir(workdir / 'checkpoints'))[:2] == ['2', '4']
