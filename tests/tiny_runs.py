"""Tiny training configs and the checks on runs that many test modules share.

Test modules import these (`from tests.tiny_runs import tiny_config`); fixtures live in
conftest.py, which imports this module too.
"""

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
from typing import Iterator, Mapping, Sequence

import jax
import numpy as np

from vit_jax.configs import common
from vit_jax.loop import train
from vit_jax.workdir import reader


def tiny_config(data_dir: str, **overrides):
  """A ViT small enough to take a training step in milliseconds, on the embedded digits."""
  config = common.get_config()
  config.data_dir = data_dir
  config.image_size = 16
  config.crop_padding = 2
  config.flip = False
  config.normalization = 'digits'
  config.batch_size = 32
  config.eval_batch_size = 64
  config.total_steps = 12
  config.warmup_steps = 2
  config.log_every = 4
  config.eval_every = 1000
  config.checkpoint_every = 1000
  config.model.name = 'vit_ti4'
  config.model.patch_size = 4
  config.model.hidden_size = 32
  config.model.depth = 2
  config.model.num_heads = 2
  config.model.mlp_dim = 64
  for key, value in overrides.items():
    target = config
    *parents, leaf = key.split('.')
    for parent in parents:
      target = target[parent]
    target[leaf] = value
  return config


def digits_run_config(data_dir: str, **overrides):
  """800 steps of a ViT of width 64 on the digits at 16x16, with the few-shot evaluator at steps
  400 and 800 and the linear probe at the end: it reaches ~0.95 test accuracy."""
  return tiny_config(
      data_dir,
      **{
          'total_steps': 800,
          'warmup_steps': 30,
          'batch_size': 64,
          'base_lr': 3e-3,
          'log_every': 100,
          'model.hidden_size': 64,
          'model.mlp_dim': 128,
          'model.num_heads': 4,
          'evaluators.fewshot.every': 400,
          'evaluators.fewshot.shots': (10,),
          'evaluators.fewshot.seeds': 2,
          'evaluators.linear_probe.every': 800,
          **overrides,
      },
  )


CHECKPOINTED_STEPS = (2, 4, 6)


def checkpointed_config(data_dir: str, **overrides):
  """`tiny_config` trained 6 steps with a checkpoint every 2, up to 5 kept: the finished run that
  the fault, resume and analysis tests copy (conftest's `checkpointed_run`)."""
  return tiny_config(
      data_dir,
      **{
          'total_steps': CHECKPOINTED_STEPS[-1],
          'checkpoint_every': CHECKPOINTED_STEPS[0],
          'keep_checkpoints': 5,
          **overrides,
      },
  )


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS_RUN_CONFIG = os.path.join(REPO, 'tests', 'digits_run_config.py')


def _user_environment() -> dict[str, str]:
  """The environment of a run as a user starts it: XLA's full optimisation (the suite's fast
  compile makes long trainings several times slower), the suite's compilation cache kept."""
  from conftest import FAST_COMPILE  # pylint: disable=g-import-not-at-top

  return dict(
      os.environ,
      TF_CPP_MIN_LOG_LEVEL='2',
      XLA_FLAGS=os.environ.get('XLA_FLAGS', '').replace(FAST_COMPILE, '').strip(),
  )


def run_command(name: str, *flags: str, timeout: int = 600) -> subprocess.CompletedProcess:
  """`python -m vit_jax.NAME FLAGS` as a user runs it, from the repository, in its own process
  (its output captured, its exit code not checked)."""
  return subprocess.run(
      [sys.executable, '-m', f'vit_jax.{name}', *flags],
      cwd=REPO,
      env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL='2'),
      capture_output=True,
      text=True,
      timeout=timeout,
      check=False,
  )


def run_at_once(
    argvs: Mapping[str, Sequence[str]], env: Mapping[str, str], timeout: int = 300
) -> dict[str, subprocess.CompletedProcess]:
  """`python ARGV` for each of `argvs`, all in their own processes at once, from the repository
  with `env` (their output captured, their exit codes not checked), by the same keys."""
  processes = {
      key: subprocess.Popen(
          [sys.executable, *argv],
          cwd=REPO,
          env=env,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for key, argv in argvs.items()
  }
  done = {}
  for key, process in processes.items():
    out, err = process.communicate(timeout=timeout)
    done[key] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
  return done


def train_as_a_user(config_file: str, workdir: str, *flags: str) -> dict:
  """Runs `python -m vit_jax.main` as a user runs it, in its own process (`_user_environment`);
  returns its results.json."""
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', f'--config={config_file}', f'--workdir={workdir}']
      + list(flags),
      cwd=REPO,
      env=_user_environment(),
      capture_output=True,
      text=True,
      timeout=900,
      check=False,
  )
  assert result.returncode == 0, result.stderr[-4000:]
  with open(os.path.join(workdir, 'results.json')) as f:
    return json.load(f)


@contextlib.contextmanager
def compiled_programs() -> Iterator[list[str]]:
  """The names of the programs XLA compiled inside the block ('jit(train_step)', …), in order, as
  `jax.log_compiles` reports them (compilation cache hits included)."""
  names = []
  handler = logging.Handler()
  handler.emit = lambda record: names.extend(
      re.findall(r'^Finished XLA compilation of (\S+) in ', record.getMessage())
  )
  jax_logger = logging.getLogger('jax')
  jax_logger.addHandler(handler)
  try:
    with jax.log_compiles(True):
      yield names
  finally:
    jax_logger.removeHandler(handler)


_DIGITS_RUNS = """
import json, sys
sys.path.insert(0, {repo!r})
from vit_jax.process import runtime
runtime.configure()  # As vit_jax.main does, before JAX starts.
from tests import tiny_runs
from vit_jax.loop import train
for workdir, overrides in json.loads({runs!r}).items():
  train.train_and_evaluate(tiny_runs.digits_run_config({data_dir!r}, **overrides), workdir)
"""


def train_digits_runs_in_one_process(data_dir: str, runs: dict[str, dict]) -> dict[str, dict]:
  """Trains `digits_run_config` with the overrides of each work directory of `runs`, one after
  another in one process set up as `vit_jax.main` sets up its own (`_user_environment`); returns
  the results.json of each work directory."""
  script = _DIGITS_RUNS.format(repo=REPO, data_dir=data_dir, runs=json.dumps(runs))
  result = subprocess.run(
      [sys.executable, '-c', script],
      cwd=REPO,
      env=_user_environment(),
      capture_output=True,
      text=True,
      timeout=900 * len(runs),
      check=False,
  )
  assert result.returncode == 0, result.stderr[-4000:]
  results = {}
  for workdir in runs:
    with open(os.path.join(workdir, 'results.json')) as f:
      results[workdir] = json.load(f)
  return results


def final_params(workdir: str) -> dict:
  return reader.Workdir(workdir).read_state()['params']


def assert_trees_close(a, b, atol):
  flat_a, flat_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(flat_a) == len(flat_b)
  for x, y in zip(flat_a, flat_b):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=0)


def train_with_preemption(config, workdir: str, monkeypatch, at_step: int = 5) -> train.RunResult:
  """Trains in `workdir`, preempted after `at_step`, then resumed; returns the final result."""
  original = train.PreemptionWatcher.should_stop
  monkeypatch.setattr(
      train.PreemptionWatcher,
      'should_stop',
      lambda self, manager, step: step == at_step or original(self, manager, step),
  )
  assert train.train_and_evaluate(config, workdir) == train.RunResult(
      step=at_step, metrics={}, preempted=True
  )
  monkeypatch.setattr(train.PreemptionWatcher, 'should_stop', original)
  return train.train_and_evaluate(config, workdir)


@contextlib.contextmanager
def mounted_tmpfs(path, *options) -> Iterator[str | None]:
  """A 3 MB tmpfs at `path` for the block (`options`: mount's, e.g. 'ro'); None where this
  process may not mount."""
  os.makedirs(path, exist_ok=True)
  mount = subprocess.run(
      ['mount', '-t', 'tmpfs', '-o', ','.join(('size=3m', *options)), 'tmpfs', str(path)],
      capture_output=True,
      check=False,
  )
  if mount.returncode != 0:
    yield None
    return
  try:
    yield str(path)
  finally:
    subprocess.run(['umount', '-l', str(path)], check=False)
