"""Resuming with a changed config: state-only changes carry the run over, others are refused.

Two tiny finished runs (the session's plain `checkpointed_run`, and one with gradient clipping and
an EMA) are copied and resumed with one field changed; the state the loop would start from is
compared with the saved one.
"""

import logging as std_logging
import os
import shutil

import jax
import numpy as np
import pytest

from tests.tiny_runs import compiled_programs
from tests.tiny_runs import CHECKPOINTED_STEPS
from tests.tiny_runs import checkpointed_config
from tests.tiny_runs import tiny_config
from vit_jax.loop import train
from vit_jax.workdir import reader
from vit_jax.workdir import run_files

STEPS = CHECKPOINTED_STEPS[-1]


@pytest.fixture(scope='module')
def runs(checkpointed_run, data_dir, tmp_path_factory):
  """'plain': no clipping, no EMA (the session's `checkpointed_run`); 'clipped_ema': both; each
  trained to step `STEPS`."""
  clipped_ema = {'grad_clip_norm': 1.0, 'ema_decay': 0.9}
  workdir = str(tmp_path_factory.mktemp('clipped_ema') / 'run')
  train.train_and_evaluate(checkpointed_config(data_dir, **clipped_ema), workdir)
  return {'plain': (checkpointed_run, {}), 'clipped_ema': (workdir, clipped_ema)}


def _files(root):
  return {
      os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), 'rb').read()
      for d, _, names in os.walk(root)
      for f in names
  }


def _checkpoints(workdir):
  return _files(os.path.join(workdir, run_files.CHECKPOINT_DIR))


def _assert_same(a, b):
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class _Started(Exception):
  """Carries the state the loop would start from."""

  def __init__(self, state):
    super().__init__('started')
    self.state = state


def _starting_state(config, workdir, monkeypatch):
  """The state `train_and_evaluate` would start its loop from; no step runs."""
  restore_or_init = train._restore_or_init  # pylint: disable=protected-access

  def stop(*args, **kwargs):
    raise _Started(restore_or_init(*args, **kwargs))

  monkeypatch.setattr(train, '_restore_or_init', stop)
  with pytest.raises(_Started) as started:
    train.train_and_evaluate(config, workdir)
  return started.value.state


def _copy(runs, name, tmp_path):
  workdir, overrides = runs[name]
  copy = str(tmp_path / 'run')
  shutil.copytree(workdir, copy)
  return copy, overrides


CARRIED = {  # name: (base run, changed fields, the log line's note)
    'clipping_on': ('plain', {'grad_clip_norm': 1.0}, 'gradient clipping starts now'),
    'clipping_off': ('clipped_ema', {'grad_clip_norm': 0.0}, 'gradient clipping stops now'),
    'ema_on': ('plain', {'ema_decay': 0.99}, 'the EMA starts from the current weights'),
    'ema_off': ('clipped_ema', {'ema_decay': 0.0}, 'the EMA is dropped'),
    'total_steps': ('plain', {'total_steps': 9}, 'schedule is recomputed'),
    'schedule': (
        'plain',
        {'base_lr': 3e-3, 'warmup_steps': 3, 'min_lr': 1e-5},
        'schedule is recomputed',
    ),
}


@pytest.mark.parametrize('case', CARRIED)
def test_a_change_that_adds_or_drops_state_resumes_with_everything_else_carried(
    runs, data_dir, tmp_path, caplog, monkeypatch, case
):
  base, changes, note = CARRIED[case]
  workdir, overrides = _copy(runs, base, tmp_path)
  saved = reader.Workdir(workdir).read_state()
  checkpoints = _checkpoints(workdir)
  config = checkpointed_config(data_dir, **{**overrides, **changes})
  with caplog.at_level(std_logging.INFO):
    state = _starting_state(config, workdir, monkeypatch)
  assert int(state.step) == STEPS
  # Bit for bit: parameters, rng (the data position follows the step), the optimizer's moments.
  _assert_same(state.params, saved['params'])
  _assert_same(state.rng, saved['rng'])
  _assert_same(jax.tree.leaves(state.opt_state), jax.tree.leaves(saved['opt_state']))
  if config.ema_decay and saved['ema']:
    _assert_same(state.ema, saved['ema'])
  elif config.ema_decay:  # Started from the current weights.
    _assert_same(state.ema['params'], saved['params'])
  else:
    assert state.ema == {}
  for field, new in changes.items():
    old = overrides.get(field, tiny_config(data_dir)[field]) if field != 'total_steps' else STEPS
    assert f'with {field} changed from {old} to {new}: ' in caplog.text
  assert note in caplog.text
  assert _checkpoints(workdir) == checkpoints  # Nothing moved, nothing rewritten.
  assert not os.path.exists(os.path.join(workdir, run_files.UNREADABLE_DIR))


def test_a_changed_mu_dtype_names_both_values_and_casts_the_moments(
    runs, data_dir, tmp_path, caplog, monkeypatch
):
  workdir, _ = _copy(runs, 'plain', tmp_path)
  saved = reader.Workdir(workdir).read_state()
  with caplog.at_level(std_logging.INFO):
    state = _starting_state(
        checkpointed_config(data_dir, mu_dtype='bfloat16'), workdir, monkeypatch
    )
  _assert_same(state.params, saved['params'])
  assert "with mu_dtype changed from '' (the parameters' dtype) to bfloat16: " in caplog.text
  assert 'first moment is cast to bfloat16' in caplog.text
  assert {x.dtype for x in jax.tree.leaves(state.opt_state)} >= {np.dtype(jax.numpy.bfloat16)}


def test_a_resumed_run_with_clipping_and_an_ema_added_trains_to_the_new_end(
    runs, data_dir, tmp_path
):
  """The change the loss-is-NaN message advises, with more steps, as MEASURED.md's run did."""
  workdir, _ = _copy(runs, 'plain', tmp_path)
  config = checkpointed_config(data_dir, total_steps=STEPS + 2, grad_clip_norm=1.0, ema_decay=0.9)
  result = train.train_and_evaluate(config, workdir)
  assert result.step == STEPS + 2 and 'ema_accuracy' in result.metrics
  assert reader.Workdir(workdir).steps() == [*CHECKPOINTED_STEPS, STEPS + 2]


REFUSED = {
    'optimizer': (
        {'optimizer': 'sgd'},
        'changed optimizer (adamw -> sgd)',
        '--config.optimizer=adamw',
    ),
    'model': (
        {'model.hidden_size': 64},
        'changed model.hidden_size (32 -> 64)',
        '--config.model.hidden_size=32',
    ),
    'model_name': (
        {'model.name': 'deepvit_ti4'},
        'changed model.name (vit_ti4 -> deepvit_ti4)',
        '--config.model.name=vit_ti4',
    ),
}


@pytest.mark.parametrize('case', REFUSED)
def test_a_change_the_state_cannot_take_is_refused_leaving_every_file_as_it_was(
    runs, data_dir, tmp_path, case
):
  changes, what, revert = REFUSED[case]
  workdir, _ = _copy(runs, 'plain', tmp_path)
  before = _files(workdir)
  with compiled_programs() as compiled, pytest.raises(ValueError) as raised:
    train.train_and_evaluate(checkpointed_config(data_dir, total_steps=8, **changes), workdir)
  assert 'jit(train_step)' not in compiled  # Refused before the memory check compiles the step.
  message = str(raised.value)
  assert message.startswith(
      f"The work directory '{workdir}' holds a checkpoint (step {STEPS}) "
      'that this config cannot resume: '
  )
  assert what in message and revert in message
  assert f'--config.init_from={workdir}' in message
  assert _files(workdir) == before  # config.json and every checkpoint, byte for byte.


def test_without_config_json_the_saved_arrays_decide(runs, data_dir, tmp_path, monkeypatch):
  workdir, _ = _copy(runs, 'clipped_ema', tmp_path)
  os.remove(os.path.join(workdir, run_files.CONFIG_FILE))
  saved = reader.Workdir(workdir).read_state()
  state = _starting_state(checkpointed_config(data_dir), workdir, monkeypatch)
  _assert_same(state.params, saved['params'])
  assert state.ema == {}


def test_a_damaged_config_json_is_named_with_what_is_wrong(runs, tmp_path):
  workdir, _ = _copy(runs, 'plain', tmp_path)
  path = os.path.join(workdir, run_files.CONFIG_FILE)
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)
  with pytest.raises(
      ValueError,
      match=rf'^{path} is damaged \(Unterminated string|^{path} is ' r'damaged \(Expecting',
  ):
    reader.Workdir(workdir).config()


def test_a_checkpoint_whose_metadata_names_another_model_than_its_run_is_called_damaged(
    checkpointed_run, data_dir, tmp_path
):
  import json  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  step_dir = os.path.join(workdir, 'checkpoints', str(STEPS))
  path = os.path.join(step_dir, 'meta', 'metadata')
  with open(path) as f:
    meta = json.load(f)
  with open(path, 'w') as f:
    json.dump({**meta, 'model': 'cait_ti4'}, f)
  with pytest.raises(ValueError) as refusal:
    train.train_and_evaluate(checkpointed_config(data_dir), workdir)
  assert str(refusal.value) == (
      f"The checkpoint of step {STEPS} in {workdir!r} names the model 'cait_ti4' in its metadata, "
      "but the run's config.json and this config name 'vit_ti4': its metadata is damaged. Move "
      f'{step_dir} away to resume from the checkpoint before it.'
  )
