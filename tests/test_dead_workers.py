"""A process of a multi-process run dies: the others stop within seconds with one line, exit 75.

Two `python -m vit_jax.main` processes join over 127.0.0.1 (one CPU device each, gloo
collectives), as the tasks of a hand-started run (--coordinator_address, --num_processes,
--process_id); the worker is killed with SIGKILL once the run has saved a checkpoint, then the
coordinator while the rerun starts. Every subprocess is killed with SIGKILL at the end (JAX traps
SIGTERM).
"""

import os
import signal
import socket
import subprocess
import sys
import time

import jax
import pytest

from conftest import without_cluster_settings
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


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _start(tmp_path, workdir, run: str) -> tuple[list[subprocess.Popen], list]:
  """Both processes of a run, each writing `tmp_path/{run}{i}.log`."""
  port = _free_port()
  env = without_cluster_settings(os.environ)
  env.update(TF_CPP_MIN_LOG_LEVEL='2', JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  processes, logs = [], [tmp_path / f'{run}{i}.log' for i in range(2)]
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
  return processes, logs


def _kill_when(ready, victim: int, processes, logs) -> tuple[int, float]:
  """Kills process `victim` with SIGKILL once `ready()`; the survivor's exit status and how long
  it took to stop."""
  survivor = processes[1 - victim]
  try:
    deadline = time.monotonic() + 400
    while not ready():
      assert time.monotonic() < deadline and survivor.poll() is None, logs[0].read_text()
      time.sleep(0.2)
    processes[victim].kill()
    killed = time.monotonic()
    code = survivor.wait(timeout=120)
    return code, time.monotonic() - killed
  finally:
    for p in processes:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _one_line(log: str, naming: str) -> None:
  errors = [line for line in log.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and naming in errors[0], log[-3000:]
  assert errors[0].endswith('Rerun all processes to resume.'), log[-3000:]
  assert 'Traceback' not in log and 'Extension modules' not in log and 'F1' not in log


@pytest.mark.e2e
def test_when_a_process_dies_the_other_stops_at_once_with_one_line_and_exit_75(tmp_path):
  workdir = tmp_path / 'run'
  # A worker killed while training.
  processes, logs = _start(tmp_path, workdir, 'first')
  code, stopped_after = _kill_when(
      lambda: (workdir / 'checkpoints' / '4').exists(), 1, processes, logs
  )
  assert code == 75 and stopped_after < 20, (stopped_after, logs[0].read_text()[-3000:])
  _one_line(logs[0].read_text(), 'process 1 of 2 was killed')
  assert sorted(os.listdir(workdir / 'checkpoints'))[:2] == ['2', '4']
  # The coordinator killed while the rerun starts, at its first collective: the worker's service
  # connections die with it.
  processes, logs = _start(tmp_path, workdir, 'rerun')
  code, stopped_after = _kill_when(lambda: 'Gloo' in logs[0].read_text(), 0, processes, logs)
  assert code == 75 and stopped_after < 20, (stopped_after, logs[1].read_text()[-3000:])
  _one_line(logs[1].read_text(), 'process 0 of 2 (the coordinator) was killed')
  assert sorted(os.listdir(workdir / 'checkpoints'))[:2] == ['2', '4']


def test_the_relay_to_the_coordinator_forwards_both_ways():
  with socket.create_server(('127.0.0.1', 0)) as service:
    relay = peers._Relay(f'127.0.0.1:{service.getsockname()[1]}')  # pylint: disable=protected-access
    host, port = relay.address.rsplit(':', 1)
    with socket.create_connection((host, int(port))) as client:
      accepted = service.accept()[0]
      client.sendall(b'ping')
      assert accepted.recv(4) == b'ping'
      accepted.sendall(b'pong')
      assert client.recv(4) == b'pong'
      accepted.close()  # The service closed the connection but still listens: so does the relay.
      assert client.recv(4) == b''
