"""`vit_jax.ablate` stops between trainings on SIGTERM or Ctrl-C (exit 75, one line) and a rerun
resumes the grid where it stopped, measuring no finished training again."""

import os
import signal
import subprocess
import sys
import time

import pytest

from vit_jax.configs import ablations
from vit_jax.analysis import ablation
from vit_jax.training import run_sequence
from vit_jax.loop import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def grid(monkeypatch):
  """A two-variant grid whose trainings, analyses and timings are recorded, not run."""
  config = ablations.get_config('grid=cait_talking_heads')
  trained, interrupt_during = [], {}

  def fake_train(run_config, run_dir):
    trained.append(os.path.basename(run_dir))
    os.makedirs(run_dir, exist_ok=True)
    if interrupt_during.get(len(trained)) == 'signal':
      os.kill(os.getpid(), signal.SIGTERM)  # Lands between trainings' own signal handling.
    if interrupt_during.get(len(trained)) == 'preempted':
      return train.RunResult(step=3, metrics={}, preempted=True)
    return train.RunResult(step=10, metrics={'accuracy': 0.5 + 0.1 * len(trained)})

  monkeypatch.setattr(ablation.train, 'train_and_evaluate', fake_train)
  monkeypatch.setattr(
      ablation.report_lib,
      'analyze',
      lambda run_dir, analyses, num_images: {'collapse': {'main': {'similar_block_count': 1}}},
  )
  monkeypatch.setattr(
      ablation,
      'step_costs',
      lambda configs, num_classes, steps: [
          {'params': 1, 'GFLOPs/step': 1.0, 'step ms': 1.0} for _ in configs
      ],
  )
  return config, trained, interrupt_during


def test_sigterm_between_trainings_stops_before_the_next_and_a_rerun_resumes(tmp_path, grid):
  config, trained, interrupt_during = grid
  names = list(config.variants)
  interrupt_during[1] = 'signal'
  with run_sequence.Stopper() as stopper:
    with pytest.raises(
        run_sequence.Interrupted,
        match=r'^SIGTERM: stopped before .*'
        + names[1]
        + '.*Rerun the same command to resume where it stopped',
    ):
      ablation.run_grid(config, str(tmp_path), stopper=stopper)
  assert trained == [names[0]]
  assert os.path.exists(tmp_path / names[0] / run_sequence.RECORD_FILE)

  interrupt_during.clear()
  with run_sequence.Stopper() as stopper:
    rows = ablation.run_grid(config, str(tmp_path), stopper=stopper)
  assert trained == [names[0], names[1]]  # The finished training is not run again.
  assert [row['accuracy'] for row in rows] == pytest.approx([0.6, 0.7])
  assert os.path.exists(tmp_path / 'ablation.json')


def test_a_training_preempted_inside_its_loop_stops_the_grid(tmp_path, grid):
  config, trained, interrupt_during = grid
  interrupt_during[2] = 'preempted'
  with pytest.raises(run_sequence.Interrupted, match='Interrupted at step 3 of .*saved'):
    ablation.run_grid(config, str(tmp_path), stopper=run_sequence.Stopper())
  config.seed = 1  # Another config: its recorded measurements are not reused.
  interrupt_during.clear()
  ablation.run_grid(config, str(tmp_path))
  assert len(trained) == 4


def test_a_signal_before_a_training_watches_is_seen_by_its_loop():
  previous = signal.getsignal(signal.SIGTERM)
  with run_sequence.Stopper() as stopper:
    os.kill(os.getpid(), signal.SIGTERM)  # After the grid's check, before the loop's watcher.
    with train.PreemptionWatcher() as watcher:
      assert watcher.requested
    assert stopper.requested == 'SIGTERM'  # Still set: the whole command stops.
  assert signal.getsignal(signal.SIGTERM) is previous
  with train.PreemptionWatcher() as watcher:  # A later command starts afresh.
    assert not watcher.requested


def test_sigterm_while_a_training_sets_up_stops_it_before_its_first_step(
    tmp_path, data_dir, monkeypatch
):
  config = ablations.get_config('grid=cait_talking_heads')
  config.data_dir = data_dir
  config.total_steps, config.warmup_steps, config.batch_size = 3, 1, 16
  config.model.depth, config.model.hidden_size, config.model.mlp_dim = 1, 16, 16
  signalled = []

  def check_fits_then_sigterm(*args):  # A moment of the set-up, long after the grid's check.
    del args
    signalled.append(True)
    os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(train.memory, 'check_fits', check_fits_then_sigterm)
  first = tmp_path / list(config.variants)[0]
  with run_sequence.Stopper() as stopper:
    with pytest.raises(
        run_sequence.Interrupted,
        match=f'^Interrupted before training {first}; rerun the same command to resume',
    ):
      ablation.run_grid(config, str(tmp_path), stopper=stopper)
  assert signalled == [True]  # Only the first variant began to set up.
  assert not os.path.exists(first / run_sequence.RECORD_FILE)
  assert not list(first.glob('checkpoints/[0-9]*'))  # Nothing trained, nothing saved.
  assert not os.path.exists(tmp_path / list(config.variants)[1])


def test_sigterm_while_the_command_starts_exits_75_with_one_line(tmp_path):
  process = subprocess.Popen(
      [
          sys.executable,
          '-m',
          'vit_jax.ablate',
          '--config=configs/ablations.py',
          f'--workdir={tmp_path}',
      ],
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', PYTHONPATH=REPO),
  )
  time.sleep(1.0)
  process.send_signal(signal.SIGTERM)
  out, err = process.communicate(timeout=120)
  assert process.returncode == 75, err[-3000:]
  assert err.strip().splitlines() == [
      'SIGTERM: stopped before any training started. Rerun the same command to resume.'
  ]
  assert out == ''
