"""Multi-process training: two processes on one machine equal one process with two devices.

Two `python -m vit_jax.main` processes, started with the environment that srun gives the tasks of
a two-task SLURM job step, find each other through vit_jax.main's detection and JAX's SLURM
support, join over 127.0.0.1 (one CPU device each, gloo collectives) and train the tiny ViT of
`tests.tiny_runs.tiny_config`. A reference process with two CPU devices runs
`train.train_and_evaluate` on the same global batches (each process's input stream, concatenated in
process order). Every subprocess has a hard timeout and is killed with SIGKILL (JAX traps SIGTERM).
"""

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
from conftest import OLDER_EMITTERS
from conftest import without_cluster_settings
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vit_jax.parallel import distributed
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.training import start as start_lib
from vit_jax.loop import train
from vit_jax.data import digits
from vit_jax.schema import run as run_settings
from vit_jax.schema import setting
from vit_jax.workdir import reader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, 'tests')
STEPS = 6
TIMEOUT_S = 420

CONFIG_FILE = '''\
"""The tiny test ViT, with dropout so that the random streams are compared too."""
import os, sys
sys.path.insert(0, os.path.dirname({tests!r}))  # The repository, for `tests.tiny_runs`.
from tests.tiny_runs import tiny_config


def get_config():
  return tiny_config({data_dir!r}, total_steps={steps}, log_every=2, checkpoint_every=4,
                     **{{'model.dropout_rate': 0.1, 'model.drop_path_rate': 0.1}})
'''

# One process, two CPU devices, fed the two processes' streams concatenated in process order.
REFERENCE = """
import os, sys
os.environ['XLA_FLAGS'] += ' --xla_force_host_platform_device_count=2'  # After conftest's.
os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'
sys.path.insert(0, {repo!r})
from vit_jax.process import runtime
runtime.configure()  # As vit_jax.main does: the same XLA flags, so the same kernels.
import importlib.util
import jax, numpy as np
from vit_jax.data import input_pipeline
from vit_jax.loop import train
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings
assert jax.device_count() == 2 and jax.process_count() == 1

def concatenated(iterator):
  def iterate(config, **kwargs):
    streams = [iterator(config, process_index=i, process_count=2, **kwargs) for i in range(2)]
    for parts in zip(*streams):
      yield {{k: np.concatenate([p[k] for p in parts]) for k in parts[0]}}
  return iterate

input_pipeline.train_iterator = concatenated(input_pipeline.train_iterator)
input_pipeline.eval_iterator = concatenated(input_pipeline.eval_iterator)
spec = importlib.util.spec_from_file_location('tiny', {config_file!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
train.train_and_evaluate(module.get_config(), {workdir!r})
"""


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def slurm_task(task: int, tasks: int, port: int) -> dict[str, str]:
  """The variables srun sets for task `task` of a one-node job step (JAX reads these)."""
  return {
      'SLURM_JOB_ID': '4242',
      'SLURM_NTASKS': str(tasks),
      'SLURM_STEP_NUM_TASKS': str(tasks),
      'SLURM_PROCID': str(task),
      'SLURM_LOCALID': str(task),
      'SLURM_NODEID': '0',
      'SLURM_STEP_NODELIST': '127.0.0.1',
      'SLURM_STEP_NUM_NODES': '1',
      'JAX_COORDINATOR_PORT': str(port),
  }


def run_all(
    commands: list[list[str]], envs: list[dict[str, str]], logs: list[str], timeout: float
) -> list[int]:
  """Runs the commands at once; returns their exit codes, SIGKILLing every one still alive."""
  base = without_cluster_settings(os.environ)
  base.update(TF_CPP_MIN_LOG_LEVEL='2', JAX_PLATFORMS='cpu')
  base['XLA_FLAGS'] = base.get('XLA_FLAGS', '').replace(OLDER_EMITTERS, '').strip()
  processes = []
  try:
    for command, env, log in zip(commands, envs, logs):
      with open(log, 'w') as f:
        processes.append(
            subprocess.Popen(
                command,
                cwd=REPO,
                env={**base, **env},
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
      if any(p.poll() not in (None, 0) for p in processes):
        break  # One failed: the others would wait for it forever.
      time.sleep(0.5)
    return [p.poll() if p.poll() is not None else -signal.SIGKILL for p in processes]
  finally:
    for p in processes:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def read_log(path: str) -> str:
  with open(path) as f:
    return f.read()


def assert_all_succeeded(codes: list[int], logs: list[str]) -> None:
  """Fails with every process's exit code and the end of each failed log (errors first)."""
  failed = [(code, log) for code, log in zip(codes, logs) if code != 0]
  report = []
  for code, log in failed:
    # A fatal abort ends with Python's list of extension modules: drop it, keep what came before.
    text = read_log(log).split('\nExtension modules:')[0]
    errors = [line for line in text.splitlines() if line.startswith(('error:', 'F1', 'E1'))]
    report.append(
        f'{log} exited with {code}; error lines:\n'
        + '\n'.join(errors[:20])
        + f'\n... end of log:\n{text[-3000:]}'
    )
  assert not failed, f'exit codes {codes}\n' + '\n\n'.join(report)


def load_config(config_file: str):
  spec = importlib.util.spec_from_file_location('tiny', config_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def one_device_state(config) -> steps.TrainState:
  """The abstract training state, replicated on this process's one-device mesh."""
  settings = setting.build(run_settings.Settings, config)
  schedule = optim.learning_rate_schedule(settings.schedule, STEPS, 2)
  start = start_lib.for_run(settings, digits.NUM_CLASSES, schedule)
  sharding = NamedSharding(Mesh(np.array(jax.devices()[:1]), ('data',)), P())
  return jax.tree.map(
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
      jax.eval_shape(start.init),
  )


def saved_state(workdir: str, config, step: int | None = None) -> steps.TrainState:
  return reader.Workdir(workdir).read_state(step, like=one_device_state(config))


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """The two-process run and its one-process, two-device reference, run side by side."""
  root = tmp_path_factory.mktemp('multiprocess')
  data_dir = str(root / 'tfds')
  digits.prepare(data_dir)  # Prepared once, not raced by the processes.
  config_file = str(root / 'tiny.py')
  with open(config_file, 'w') as f:
    f.write(CONFIG_FILE.format(tests=TESTS, data_dir=data_dir, steps=STEPS))
  two, one = str(root / 'two_processes'), str(root / 'reference')
  port = free_port()
  # --verbosity=1: the connection and device lines checked below are kept out of a default log.
  commands = [
      [
          sys.executable,
          '-m',
          'vit_jax.main',
          f'--config={config_file}',
          f'--workdir={two}',
          '--verbosity=1',
      ]
  ] * 2
  commands.append(
      [sys.executable, '-c', REFERENCE.format(repo=REPO, config_file=config_file, workdir=one)]
  )
  envs = [slurm_task(0, 2, port), slurm_task(1, 2, port), {}]
  logs = [str(root / name) for name in ('process0.log', 'process1.log', 'reference.log')]
  codes = run_all(commands, envs, logs, TIMEOUT_S)
  assert_all_succeeded(codes, logs)
  return {
      'two': two,
      'one': one,
      'logs': logs,
      'config': load_config(config_file),
      'config_file': config_file,
  }


@pytest.mark.e2e
def test_two_processes_train_like_one_process_with_two_devices(runs):
  log0, log1, _ = (read_log(log) for log in runs['logs'])
  assert 'jax.distributed.initialize(num_processes=2, process_id=0)' in log0
  assert 'jax.distributed.initialize(num_processes=2, process_id=1)' in log1
  assert 'Connecting to JAX distributed service on 127.0.0.1' in log1
  assert 'JAX process 0 of 2; 1 local / 2 global devices' in log0
  config = runs['config']
  two, one = saved_state(runs['two'], config).params, saved_state(runs['one'], config).params
  assert jax.tree.structure(two) == jax.tree.structure(one)
  for a, b in zip(jax.tree.leaves(two), jax.tree.leaves(one)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)
  # Training moved the parameters, so the agreement is not that of two idle models.
  earlier = saved_state(runs['two'], config, step=4).params
  assert (
      max(
          float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
          for a, b in zip(jax.tree.leaves(two), jax.tree.leaves(earlier))
      )
      > 1e-4
  )
  with open(os.path.join(runs['two'], 'results.json')) as f:
    results_two = json.load(f)
  with open(os.path.join(runs['one'], 'results.json')) as f:
    results_one = json.load(f)
  assert results_two['test_count'] == results_one['test_count'] == digits.NUM_TEST_EXAMPLES
  assert results_two['test_accuracy'] == pytest.approx(results_one['test_accuracy'], abs=1e-9)


@pytest.mark.e2e
def test_only_process_zero_writes_logs_and_summaries(runs):
  log0, log1, _ = (read_log(log) for log in runs['logs'])
  assert f'step {STEPS}/{STEPS}' in log0 and 'Final test accuracy' in log0
  assert f'step {STEPS}/{STEPS}' not in log1 and 'Final test accuracy' not in log1
  events = [n for n in os.listdir(runs['two']) if n.startswith('events.out.tfevents')]
  assert len(events) == 1
  assert {'config.json', 'results.json', 'checkpoints'} <= set(os.listdir(runs['two']))


@pytest.mark.e2e
def test_two_process_checkpoint_restores_and_resumes_in_one_process(runs, tmp_path):
  assert jax.process_count() == 1 and jax.device_count() == 1
  workdir = str(tmp_path / 'resumed')
  shutil.copytree(runs['two'], workdir)
  config = runs['config']
  # Restored onto this process's one device, with that mesh's shardings.
  state = saved_state(workdir, config)
  assert int(state.step) == STEPS
  for a, b in zip(
      jax.tree.leaves(state.params), jax.tree.leaves(saved_state(runs['one'], config).params)
  ):
    assert a.sharding.mesh.devices.shape == (1,)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)

  # Training resumes from the two-process checkpoint and carries on to a later step.
  config = config.copy_and_resolve_references()
  config.total_steps = STEPS + 2
  metrics = train.train_and_evaluate(config, workdir).metrics
  assert metrics['count'] == digits.NUM_TEST_EXAMPLES
  assert reader.Workdir(workdir).steps()[-1] == STEPS + 2
  resumed = saved_state(workdir, config)
  assert int(resumed.step) == STEPS + 2
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(resumed.params))


@pytest.fixture(scope='module')
def fsdp_run(runs, tmp_path_factory):
  """The same two-process run with the training state sharded over both processes (fsdp=2)."""
  root = tmp_path_factory.mktemp('multiprocess_fsdp')
  workdir = str(root / 'fsdp')
  port = free_port()
  commands = [
      [
          sys.executable,
          '-m',
          'vit_jax.main',
          f'--config={runs["config_file"]}',
          f'--workdir={workdir}',
          '--config.mesh.fsdp=2',
          '--config.mesh.fsdp_min_size=0',
          '--verbosity=1',
      ]
  ] * 2  # For the mesh line.
  logs = [str(root / f'process{i}.log') for i in range(2)]
  codes = run_all(commands, [slurm_task(0, 2, port), slurm_task(1, 2, port)], logs, TIMEOUT_S)
  assert_all_succeeded(codes, logs)
  return workdir


@pytest.mark.e2e
def test_two_processes_sharing_the_state_train_like_one_process(runs, fsdp_run):
  assert "Mesh {'data': 1, 'fsdp': 2}" in read_log(
      os.path.join(os.path.dirname(fsdp_run), 'process0.log')
  )
  config = runs['config']
  sharded, one = saved_state(fsdp_run, config).params, saved_state(runs['one'], config).params
  for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(one)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)


# Which environments start a multi-process run, and with which arguments.


def arguments(environ, **flags):
  return distributed.distributed_arguments(environ, **flags)


def test_a_plain_process_runs_alone():
  assert arguments({}) is None


def test_explicit_flags_and_environment_variables():
  expected = {'coordinator_address': '10.0.0.1:1234', 'num_processes': 4, 'process_id': 3}
  assert (
      arguments({}, coordinator_address='10.0.0.1:1234', num_processes=4, process_id=3) == expected
  )
  environ = {
      'JAX_COORDINATOR_ADDRESS': '10.0.0.1:1234',
      'JAX_NUM_PROCESSES': '4',
      'JAX_PROCESS_ID': '3',
  }
  assert arguments(environ) == expected
  assert arguments(environ, process_id=1)['process_id'] == 1  # A flag beats the environment.
  assert arguments({}, coordinator_address='h:1', num_processes=1, process_id=0) is None


@pytest.mark.parametrize(
    'environ, flags, message',
    [
        ({}, {'coordinator_address': 'h:1'}, 'needs all of'),
        ({}, {'num_processes': 2, 'process_id': 0}, 'coordinator_address'),
        ({}, {'coordinator_address': 'h:1', 'num_processes': 2, 'process_id': 2}, 'process_id=2'),
        ({'JAX_NUM_PROCESSES': 'two'}, {}, 'JAX_NUM_PROCESSES'),
        (
            {},
            {'coordinator_address': 'h:1', 'num_processes': 0, 'process_id': 0},
            'num_processes=0',
        ),
    ],
)
def test_incomplete_or_bad_settings_are_refused(environ, flags, message):
  with pytest.raises(ValueError, match=message):
    arguments(environ, **flags)


SBATCH_SCRIPT = {
    'SLURM_JOB_ID': '77',
    'SLURM_NTASKS': '8',
    'SLURM_JOB_NUM_NODES': '2',
    'SLURM_NODELIST': 'gpu[01-02]',
}


def test_slurm_joins_only_a_job_step_of_several_tasks():
  # The sbatch script itself (or an salloc shell) is one process, whatever --ntasks says.
  assert arguments(SBATCH_SCRIPT) is None
  one_task = dict(
      SBATCH_SCRIPT,
      SLURM_STEP_NUM_TASKS='1',
      SLURM_PROCID='0',
      SLURM_LOCALID='0',
      SLURM_STEP_NODELIST='gpu01',
  )
  assert arguments(one_task) is None
  srun = dict(
      SBATCH_SCRIPT,
      SLURM_STEP_NUM_TASKS='8',
      SLURM_PROCID='5',
      SLURM_LOCALID='1',
      SLURM_STEP_NODELIST='gpu[01-02]',
  )
  # JAX reads the coordinator (first node) and this task's GPU (SLURM_LOCALID) itself.
  assert arguments(srun) == {'num_processes': 8, 'process_id': 5}
  assert arguments(dict(srun, JAX_COORDINATOR_ADDRESS='gpu01:5000')) == {
      'coordinator_address': 'gpu01:5000'
  }


def test_tpu_and_mpi_clusters_are_left_to_jax():
  assert arguments({}, on_cloud_tpu_vm=True) == {}
  assert arguments({'TPU_WORKER_HOSTNAMES': 'w0,w1,w2,w3', 'TPU_WORKER_ID': '2'}) == {}
  assert arguments({'TPU_WORKER_HOSTNAMES': 'w0'}) is None
  assert arguments({'MEGASCALE_COORDINATOR_ADDRESS': 'w0'}) == {}
  assert arguments({'OMPI_COMM_WORLD_SIZE': '4', 'OMPI_COMM_WORLD_RANK': '1'}) == {}
  assert arguments({'OMPI_COMM_WORLD_SIZE': '1'}) is None
