"""The training loop: learning, resuming, sharding invariance, and refusing bad input early."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from clu import metric_writers
import jax
import numpy as np
import pytest

from tests import tiny_runs
from tests.tiny_runs import assert_trees_close
from tests.tiny_runs import checkpointed_config
from tests.tiny_runs import final_params
from tests.tiny_runs import tiny_config
from tests.tiny_runs import train_with_preemption
from vit_jax.loop import train
from vit_jax.workdir import reader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_loss_falls_and_accuracy_rises(data_dir, tmp_path, monkeypatch):
  config = tiny_config(data_dir, total_steps=100, base_lr=3e-3, log_every=20)
  logged, info = [], train.logging.info
  # The loop's own log lines, whatever handlers other tests left on the loggers.
  monkeypatch.setattr(
      train.logging,
      'info',
      lambda message, *args, **kwargs: (
          logged.append(str(message) % args if args else str(message)),
          info(message, *args, **kwargs),
      ),
  )
  metrics = train.train_and_evaluate(config, str(tmp_path)).metrics
  # What each attention runs, chosen once for the model, in one line.
  [line] = [text for text in logged if text.startswith('Attention: ')]
  assert line.startswith('Attention: xla for ') and '(cpu: no faster kernel known correct)' in line
  assert metrics['count'] == 360
  assert metrics['accuracy'] > 0.25  # 10 classes: chance is 0.1; 95 % is the slow test's.
  assert os.path.exists(tmp_path / 'config.json')
  assert os.path.exists(tmp_path / 'results.json')
  assert any(name.startswith('events.out.tfevents') for name in os.listdir(tmp_path))


def test_resume_after_preemption_equals_uninterrupted_run(data_dir, tmp_path, monkeypatch):
  """Preempted and resumed, a run with dropout, stochastic depth and an EMA ends with the
  parameters, EMA and metrics of an uninterrupted one; the EMA is evaluated."""
  config = tiny_config(
      data_dir, ema_decay=0.9, **{'model.dropout_rate': 0.1, 'model.drop_path_rate': 0.1}
  )
  straight = str(tmp_path / 'straight')
  metrics = train.train_and_evaluate(config, straight).metrics
  assert {'ema_accuracy', 'ema_loss'} <= set(metrics)
  assert metrics['ema_loss'] != metrics['loss']

  interrupted = str(tmp_path / 'interrupted')
  resumed = train_with_preemption(config, interrupted, monkeypatch)

  a, b = reader.Workdir(straight).read_state(), reader.Workdir(interrupted).read_state()
  assert_trees_close(a['ema'], b['ema'], atol=0)
  assert_trees_close(a['params'], b['params'], atol=0)
  assert resumed.metrics == metrics


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_sigterm_ctrl_c_and_sighup_request_a_checkpoint_and_restore_the_handlers(signum, request):
  if signum == signal.SIGHUP:  # As in a terminal's process (a test worker's may ignore it).
    original = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    request.addfinalizer(lambda: signal.signal(signal.SIGHUP, original))
  previous = signal.getsignal(signum)
  with train.PreemptionWatcher() as watcher:
    os.kill(os.getpid(), signum)
    assert watcher.requested
    if signum == signal.SIGINT:  # A second Ctrl-C stops at once.
      with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signum)
  assert signal.getsignal(signum) is previous


def test_a_run_under_nohup_is_not_stopped_by_sighup():
  previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # As `nohup` starts a process.
  try:
    with train.PreemptionWatcher() as watcher:
      os.kill(os.getpid(), signal.SIGHUP)
      assert not watcher.requested
      assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGHUP, previous)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(checkpointed_run, data_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  config = checkpointed_config(data_dir, total_steps=40, log_every=2, base_lr=1e30, warmup_steps=0)
  with pytest.raises(FloatingPointError, match='last good checkpoint'):
    train.train_and_evaluate(config, workdir)
  params = final_params(workdir)
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(params))


@pytest.mark.parametrize('checkpoint_every', [1, 2])
def test_diverging_run_names_only_the_checkpoint_a_rerun_resumes_from(
    data_dir, tmp_path, monkeypatch, checkpoint_every
):
  """A stop on a loss that is not finite finishes the save in flight before naming a checkpoint:
  the one named is committed on disk and is the rerun's start; none named, the rerun starts at 0."""
  config = tiny_config(
      data_dir,
      optimizer='lamb',
      base_lr=1e30,
      warmup_steps=0,
      checkpoint_every=checkpoint_every,
      total_steps=4,
      log_every=2,
  )
  workdir = str(tmp_path / 'run')
  with pytest.raises(FloatingPointError) as stop:
    train.train_and_evaluate(config, workdir)
  named = re.search(r'checkpoint \(step (\d+)\) is kept', str(stop.value))
  on_disk = reader.Workdir(workdir).steps()
  if named:
    assert on_disk and on_disk[-1] == int(named[1]), on_disk
    assert str(tmp_path / 'run' / 'checkpoints' / named[1]) in str(stop.value)
  else:
    assert 'No checkpoint had been saved yet' in str(stop.value) and on_disk == []
  assert not list((tmp_path / 'run' / 'checkpoints').glob('*tmp*'))  # No save left half-done.

  starts = []
  restore_or_init = train._restore_or_init  # pylint: disable=protected-access
  monkeypatch.setattr(
      train,
      '_restore_or_init',
      lambda *args, **kwargs: starts.append(int((s := restore_or_init(*args, **kwargs)).step)) or s,
  )
  with contextlib.suppress(FloatingPointError):  # It may diverge again; its start is the point.
    train.train_and_evaluate(config, workdir)
  assert starts == [int(named[1]) if named else 0]


@pytest.mark.parametrize(
    'overrides, message',
    [
        ({'model.name': 'vit_nonexistent'}, 'vit_nonexistent'),
        ({'dataset': 'not_a_dataset'}, 'not_a_dataset'),
        ({'image_size': 9}, '9'),
        ({'model.num_heads': 3}, 'num_heads'),
        ({'optimizer': 'adagrad'}, 'adagrad'),
    ],
)
def test_bad_input_fails_before_touching_the_workdir(data_dir, tmp_path, overrides, message):
  config = tiny_config(data_dir, **overrides)
  workdir = tmp_path / 'run'
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


def test_workdir_of_another_model_is_refused_and_left_untouched(
    checkpointed_run, data_dir, tmp_path
):
  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  before = {name: os.path.getmtime(os.path.join(workdir, name)) for name in os.listdir(workdir)}
  with pytest.raises(ValueError, match='holds a checkpoint'):
    train.train_and_evaluate(tiny_config(data_dir, **{'model.hidden_size': 64}), workdir)
  after = {name: os.path.getmtime(os.path.join(workdir, name)) for name in os.listdir(workdir)}
  assert before == after


def test_unknown_config_key_is_refused_by_the_command_line(tmp_path):
  out = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.main',
          '--config=configs/vit.py',
          f'--workdir={tmp_path / "run"}',
          '--config.not_a_field=1',
      ],
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=120,
  )
  assert out.returncode != 0
  assert 'not_a_field' in out.stderr
  assert not (tmp_path / 'run').exists()


@pytest.mark.e2e
def test_default_config_reaches_95_percent(data_dir, tmp_path):
  """The README's main command, configs/vit.py with no argument on the embedded digits, run as a
  user runs it: its own process, XLA's full optimisation (not the suite's fast compile)."""
  results = tiny_runs.train_as_a_user(
      'configs/vit.py', str(tmp_path / 'run'), f'--config.data_dir={data_dir}'
  )
  assert results['test_count'] == 360
  assert results['test_accuracy'] >= 0.95, results


def test_progress_rate_leaves_out_timed_sections():
  """Evaluation, checkpoints and compilation in `timed` do not lower steps/s or raise the ETA."""
  progress = train.Progress(
      num_train_steps=10, writer=metric_writers.MultiWriter([]), every_steps=1
  )
  progress(1)
  with progress.timed('eval'):
    time.sleep(0.5)
  progress(2)
  assert progress.steps_per_s > 10  # The 0.5 s of evaluation is not the step's.
  time.sleep(0.3)
  progress(3)
  assert progress.steps_per_s < 1 / 0.3  # Time outside the sections is.


def test_profile_steps_write_a_trace_of_training_steps(data_dir, tmp_path):
  """`profile_steps` traces training steps after the first (compiling) one with jax.profiler
  into WORKDIR/plugins/profile, where TensorBoard's profile tab reads it."""
  workdir = tmp_path / 'run'
  train.train_and_evaluate(tiny_config(data_dir, total_steps=4, profile_steps=2), str(workdir))
  traces = list(workdir.glob('plugins/profile/*/*.xplane.pb'))
  assert len(traces) == 1
  assert b'train_step' in traces[0].read_bytes()  # The jitted step's own name.
