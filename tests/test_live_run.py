"""Side commands beside a live run: pinned checkpoints, results kept by both, eval-set classes.

A reader of a work directory that a live run holds reads a pin of a checkpoint that retention
cannot delete under it; the run's final results and an evaluation's are both kept in
results.json; an eval set whose classes the model does not name alike is refused before anything
compiles. The end-to-end tests start a real training run and read it while it trains.
"""

import contextlib
import fcntl
import logging as std_logging
import os
import shutil
import subprocess
import sys
import threading
import time

import jax
from PIL import Image
import pytest

from tests import tiny_runs
from tests.tiny_runs import CHECKPOINTED_STEPS as STEPS
from vit_jax.evaluators import eval_sets
from vit_jax.training import run_writer
from vit_jax.loop import train
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings
from vit_jax.workdir import pins
from vit_jax.workdir import reader
from vit_jax.workdir import run_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _copy(checkpointed_run: str, tmp_path) -> str:
  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  return workdir


def _pins(workdir: str) -> list[str]:
  return [name for name in os.listdir(workdir) if name.startswith(pins.PIN_PREFIX)]


def _assert_same_tree(a, b) -> None:
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert (x == y).all()


# The pin.


def test_a_step_deleted_after_pinning_is_still_read_from_the_pin(checkpointed_run, tmp_path):
  workdir = _copy(checkpointed_run, tmp_path)
  run = reader.Workdir(workdir)
  expected = run.read_state(STEPS[-1])
  with run.pin(STEPS[-1]) as pinned:
    shutil.rmtree(os.path.join(workdir, 'checkpoints', str(STEPS[-1])))  # Retention, meanwhile.
    _assert_same_tree(pinned.read_state(STEPS[-1]), expected)
  assert not _pins(workdir)  # Removed afterwards.


def test_where_links_are_refused_the_pin_is_a_copy(checkpointed_run, tmp_path, monkeypatch):
  workdir = _copy(checkpointed_run, tmp_path)
  run = reader.Workdir(workdir)
  expected = run.read_state(STEPS[-1])

  def refused(source, target):
    raise PermissionError(1, 'Operation not permitted', source)

  monkeypatch.setattr(os, 'link', refused)
  with run.pin(STEPS[-1]) as pinned:
    shutil.rmtree(os.path.join(workdir, 'checkpoints', str(STEPS[-1])))
    _assert_same_tree(pinned.read_state(STEPS[-1]), expected)
  assert not _pins(workdir)


def test_a_live_run_is_named_in_one_line_and_read_from_a_pin(checkpointed_run, tmp_path, caplog):
  workdir = _copy(checkpointed_run, tmp_path)
  with run_writer.lock(workdir), caplog.at_level(std_logging.WARNING):
    saved = reader.Workdir.open(workdir).read_variables()
  assert saved.step == STEPS[-1]
  lines = [r.getMessage() for r in caplog.records if 'is being trained' in r.getMessage()]
  assert lines == [
      f'{workdir} is being trained (pid {os.getpid()} on host {os.uname().nodename}); reading '
      f'its checkpoint at step {STEPS[-1]}, pinned against retention.'
  ]
  assert not _pins(workdir)


def test_a_step_deleted_while_being_pinned_gives_way_to_the_newest(
    checkpointed_run, tmp_path, monkeypatch, caplog
):
  """The run saves step 8 and its retention deletes step 6 while the reader pins step 6: the
  reader pins step 8 instead."""
  workdir = _copy(checkpointed_run, tmp_path)
  run = reader.Workdir(workdir)
  expected = run.read_state(STEPS[-1])
  checkpoints = os.path.join(workdir, 'checkpoints')
  link_tree = pins._link_tree  # pylint: disable=protected-access
  pinned_steps = []

  def retention_meanwhile(source, target):
    pinned_steps.append(int(os.path.basename(source)))
    if len(pinned_steps) == 1:
      os.rename(source, os.path.join(checkpoints, '8'))  # Saved as 8; 6 deleted.
    link_tree(source, target)

  monkeypatch.setattr(pins, '_link_tree', retention_meanwhile)
  with run_writer.lock(workdir), caplog.at_level(std_logging.WARNING):
    state = reader.Workdir(workdir).read_state()
  assert pinned_steps == [STEPS[-1], 8]
  _assert_same_tree(state, expected)  # Step 8 holds step 6's state, renamed.
  assert 'reading its checkpoint at step 8, pinned against retention' in caplog.text
  assert not _pins(workdir)


def test_a_step_deleted_while_orbax_lists_the_steps_is_listed_again(
    checkpointed_run, tmp_path, monkeypatch, caplog
):
  """Retention deletes the oldest step after orbax has listed it, as orbax looks inside it."""
  workdir = _copy(checkpointed_run, tmp_path)
  oldest = os.path.join(os.path.abspath(workdir), 'checkpoints', str(STEPS[0]))
  stat = os.stat
  deleted = []

  def retention_meanwhile(path, *args, **kwargs):
    if str(path).startswith(oldest + os.sep) and not deleted:
      deleted.append(path)
      monkeypatch.setattr(os, 'stat', stat)  # rmtree stats too.
      shutil.rmtree(oldest)
    return stat(path, *args, **kwargs)

  monkeypatch.setattr(os, 'stat', retention_meanwhile)
  with run_writer.lock(workdir), caplog.at_level(std_logging.INFO):
    run = reader.Workdir.open(workdir)
    assert deleted and run.steps() == list(STEPS[1:])
    _assert_same_tree(run.read_state(), reader.Workdir(checkpointed_run).read_state())
  assert 'Metadata file' not in caplog.text  # Orbax's notice of the deleted step: not news.


def test_checkpoints_changing_under_every_listing_are_one_clear_error(
    checkpointed_run, tmp_path, monkeypatch
):
  workdir = _copy(checkpointed_run, tmp_path)
  listings = []

  def retention_meanwhile(directory, **unused_kwargs):
    listings.append(directory)
    raise FileNotFoundError(2, 'No such file or directory', f'{directory}/{len(listings)}')

  monkeypatch.setattr(reader.ocp, 'CheckpointManager', retention_meanwhile)
  with pytest.raises(ValueError, match='changed under each of 5 listings'):
    reader.Workdir(workdir).steps()
  assert len(listings) == pins.PIN_ATTEMPTS


def test_the_commands_reader_of_a_run_reads_a_live_one_from_a_pin(
    checkpointed_run, tmp_path, caplog
):
  """`inference.load_run`: how evaluate, predict and analyze read a run."""
  from vit_jax.weights import inference  # pylint: disable=g-import-not-at-top

  workdir = _copy(checkpointed_run, tmp_path)
  with run_writer.lock(workdir), caplog.at_level(std_logging.WARNING):
    run = inference.load_run(workdir, unroll=True)
  assert run.step == STEPS[-1]
  assert caplog.text.count(' is being trained (pid ') == 1
  assert not _pins(workdir)


def test_a_reader_beside_no_live_run_pins_nothing(checkpointed_run, tmp_path, monkeypatch):
  workdir = _copy(checkpointed_run, tmp_path)
  monkeypatch.setattr(reader.Workdir, 'pin', None)  # Would fail if called.
  with run_writer.lock(workdir):
    pass  # A finished run's lock: released.
  assert reader.Workdir(workdir).read_variables().step == STEPS[-1]


def _abandoned_pin(workdir: str, name: str) -> str:
  """A pin as a killed reader leaves it: its files, its lock file, the lock free."""
  pin_dir = os.path.join(workdir, pins.PIN_PREFIX + name)
  shutil.copytree(os.path.join(workdir, 'checkpoints'), os.path.join(pin_dir, 'checkpoints'))
  open(os.path.join(pin_dir, pins.PIN_LOCK_FILE), 'w').close()
  return pin_dir


def test_a_readers_pin_removes_the_pins_of_killed_readers_and_keeps_those_in_use(
    checkpointed_run, tmp_path
):
  workdir = _copy(checkpointed_run, tmp_path)
  _abandoned_pin(workdir, 'killed')
  in_use = _abandoned_pin(workdir, 'reading')
  made_now = os.path.join(workdir, pins.PIN_PREFIX + 'no-lock-yet')
  os.makedirs(made_now)
  with open(os.path.join(in_use, pins.PIN_LOCK_FILE)) as held:
    fcntl.flock(held, fcntl.LOCK_EX)  # Another reader's, as flock sees it.
    run = reader.Workdir(workdir)
    with run.pin(STEPS[-1]) as pinned:
      assert sorted(_pins(workdir)) == sorted(
          [os.path.basename(in_use), os.path.basename(made_now), os.path.basename(pinned.path)]
      )
  assert sorted(_pins(workdir)) == sorted([os.path.basename(in_use), os.path.basename(made_now)])


def test_a_run_starting_removes_the_pins_of_killed_readers(checkpointed_run, tmp_path):
  workdir = _copy(checkpointed_run, tmp_path)
  _abandoned_pin(workdir, 'killed')
  config = reader.Workdir(workdir).config()
  with contextlib.ExitStack() as run_scope:
    run_writer.RunWriter(workdir).start(config, run_scope)
    assert not _pins(workdir)


@pytest.mark.e2e
def test_a_reader_killed_mid_read_leaves_a_pin_that_the_next_reader_removes(
    checkpointed_run, tmp_path
):
  workdir = _copy(checkpointed_run, tmp_path)
  reading = subprocess.Popen(
      [
          sys.executable,
          '-c',
          'import time\n'
          'from vit_jax.workdir import reader\n'
          f'with reader.Workdir({workdir!r}).pin({STEPS[-1]}):\n'
          '  print("pinned", flush=True)\n'
          '  time.sleep(600)\n',
      ],
      cwd=REPO,
      stdout=subprocess.PIPE,
      text=True,
  )
  try:
    assert reading.stdout.readline() == 'pinned\n'
    assert len(_pins(workdir)) == 1
  finally:
    reading.kill()
    reading.communicate()
  assert len(_pins(workdir)) == 1  # SIGKILL: nothing of the reader's removed it.
  with run_writer.lock(workdir):
    reader.Workdir(workdir).read_state()
  assert not _pins(workdir)


# results.json: merged by every writer.


RUN_RESULTS = {'test_accuracy': 0.9, 'test_loss': 0.3, 'digits/accuracy': 0.85}
EVALUATION = {'digits/accuracy': 0.8, 'digits/count': 100, 'imagenet_v2/accuracy': 0.1}


@pytest.mark.parametrize('run_first', [True, False])
def test_the_runs_results_and_an_evaluations_are_both_kept_each_with_its_step(tmp_path, run_first):
  """The run's final write at step 400; an evaluation of its checkpoint at step 105."""
  out = reader.Workdir(str(tmp_path))
  writes = [(RUN_RESULTS, 400), (EVALUATION, 105)]
  for metrics, step in writes if run_first else writes[::-1]:
    out.write_results(metrics, step=step)
  later = EVALUATION if run_first else RUN_RESULTS
  results = reader.Workdir(str(tmp_path)).results()
  steps = results.pop(run_files.RESULTS_STEPS)
  assert results == {**RUN_RESULTS, **EVALUATION, **later}
  assert steps == {
      'test_accuracy': 400,
      'test_loss': 400,
      'digits/accuracy': 105 if run_first else 400,  # Both wrote it: the later writer's.
      'digits/count': 105,
      'imagenet_v2/accuracy': 105,
  }


def test_concurrent_writers_of_results_lose_nothing(tmp_path):
  writers = [
      threading.Thread(
          target=lambda i=i: reader.Workdir(str(tmp_path)).write_results({f'w{i}': i}, step=i)
      )
      for i in range(16)
  ]
  for writer in writers:
    writer.start()
  for writer in writers:
    writer.join()
  results = reader.Workdir(str(tmp_path)).results()
  assert results == {**{f'w{i}': i for i in range(16)}, 'steps': {f'w{i}': i for i in range(16)}}


# Eval sets whose classes differ from the model's.


def test_the_same_classes_in_another_order_are_named():
  assert eval_sets.class_difference(('a', 'b', 'c'), ('a', 'b', 'c')) is None
  assert eval_sets.class_difference(('a', 'b', 'c'), ('a', 'c', 'b')) == (
      "the same 3 classes in another order (index 1: 'c' there, 'b' in the model)"
  )
  assert eval_sets.class_difference(('0', '1'), ('0', 'one')) == (
      "classes one there are not the model's, which has 1 instead"
  )


def _digit_folder(root, names) -> str:
  for split in ('train', 'test'):
    for name in names:
      (root / split / name).mkdir(parents=True)
      Image.new('RGB', (8, 8), (int(name.encode()[0]) % 256, 0, 0)).save(
          root / split / name / '0.png'
      )
  return str(root)


def test_an_eval_set_with_other_class_names_is_refused_before_anything_compiles(
    data_dir, tmp_path, monkeypatch
):
  names = ['zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine']
  images = _digit_folder(tmp_path / 'images', names)

  def compile_steps(*args, **kwargs):
    raise AssertionError('compiled an evaluation of a set scored by index')

  monkeypatch.setattr(eval_sets, 'compile_steps', compile_steps)
  monkeypatch.setattr(jax, 'jit', compile_steps)
  config = tiny_runs.tiny_config(data_dir, eval_sets=(f'folder:{images}:test',))
  with pytest.raises(ValueError) as refusal:
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  message = str(refusal.value)
  assert '\n' not in message
  assert f"'folder:{images}:test' names its classes differently" in message
  assert 'classes eight, five, four, nine, one, seven, six, three, … (2 more) there' in message
  assert 'which has 0, 1, 2, 3, 4, 5, 6, 7, … (2 more) instead' in message
  assert not os.path.exists(tmp_path / 'run')


def test_an_eval_set_with_the_models_class_names_is_accepted(data_dir, tmp_path):
  images = _digit_folder(tmp_path / 'images', [str(i) for i in range(10)])
  settings = setting.build(
      run_settings.Settings, tiny_runs.tiny_config(data_dir, eval_sets=(f'folder:{images}:test',))
  )
  names = tuple(str(i) for i in range(10))
  (checked,) = eval_sets.checked(
      settings.eval_sets, settings.data, num_classes=10, class_names=names
  )
  assert checked.dataset == f'folder:{images}'


def test_weights_names_for_classes_are_not_compared(data_dir, tmp_path):
  """Weights name their classes in their own words (Hub label names), not as datasets do."""
  images = _digit_folder(tmp_path / 'images', [f'digit {i}' for i in range(10)])
  settings = setting.build(
      run_settings.Settings, tiny_runs.tiny_config(data_dir, eval_sets=(f'folder:{images}:test',))
  )
  assert eval_sets.checked(settings.eval_sets, settings.data, num_classes=10)


# Beside a real training run.


def _start_training(workdir: str, data_dir: str, *flags: str) -> subprocess.Popen:
  """`vit_jax.main` on the digits with a tiny ViT, checkpointing every 5 steps, 1 kept."""
  return subprocess.Popen(
      [
          sys.executable,
          '-m',
          'vit_jax.main',
          '--config=configs/vit.py',
          f'--workdir={workdir}',
          f'--config.data_dir={data_dir}',
          '--config.total_steps=400',
          '--config.checkpoint_every=5',
          '--config.keep_checkpoints=1',
          '--config.log_every=50',
          '--config.model.depth=1',
          '--config.model.hidden_size=16',
          '--config.model.num_heads=1',
          '--config.model.mlp_dim=16',
          '--config.batch_size=16',
          *flags,
      ],
      cwd=REPO,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )


def _wait_for_a_checkpoint(training: subprocess.Popen, workdir: str) -> None:
  checkpoints = os.path.join(workdir, 'checkpoints')
  deadline = time.monotonic() + 300
  while not (os.path.isdir(checkpoints) and any(n.isdigit() for n in os.listdir(checkpoints))):
    assert training.poll() is None, training.communicate()[1][-3000:]
    assert time.monotonic() < deadline, 'no checkpoint within 300 s'
    time.sleep(0.2)


def _finish(training: subprocess.Popen) -> None:
  _, log = training.communicate(timeout=600)
  assert training.returncode == 0, log[-3000:]


@pytest.mark.e2e
def test_evaluate_during_a_run_keeps_its_results_beside_the_runs(data_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  training = _start_training(workdir, data_dir)
  try:
    _wait_for_a_checkpoint(training, workdir)
    evaluation = tiny_runs.run_command(
        'evaluate', f'--workdir={workdir}', "--config.eval_sets=('digits:test[:64]',)"
    )
    assert training.poll() is None, 'the run finished before the evaluation: make it longer'
  finally:
    _finish(training)
  assert evaluation.returncode == 0, evaluation.stderr[-3000:]
  live = [line for line in evaluation.stderr.splitlines() if 'is being trained' in line]
  assert len(live) == 1 and 'pinned against retention' in live[0], evaluation.stderr[-3000:]
  results = reader.Workdir(workdir).results()
  assert 0 <= results['test_accuracy'] <= 1  # The run's final write.
  assert 0 <= results['digits:test[:64]/accuracy'] <= 1  # The evaluation's, kept.
  assert results['digits:test[:64]/count'] == 64
  steps = results['steps']
  assert steps['test_accuracy'] == 400  # Each with the step it was measured at.
  assert 0 < steps['digits:test[:64]/accuracy'] == steps['digits:test[:64]/count'] < 400


@pytest.mark.e2e
def test_export_during_a_run_with_one_checkpoint_kept_exports_a_whole_one(data_dir, tmp_path):
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / 'run')
  out = str(tmp_path / 'run.safetensors')
  training = _start_training(workdir, data_dir)
  try:
    _wait_for_a_checkpoint(training, workdir)
    export = tiny_runs.run_command('export', f'--workdir={workdir}', f'--out={out}')
    assert training.poll() is None, 'the run finished before the export: make it longer'
  finally:
    _finish(training)
  assert export.returncode == 0, export.stderr[-3000:]
  live = [line for line in export.stderr.splitlines() if 'is being trained' in line]
  assert len(live) == 1, export.stderr[-3000:]
  step = int(live[0].split('at step ')[1].split(',')[0])
  assert f'(step {step},' in export.stdout
  # The export holds a whole checkpoint: the tensors that the finished run exports, same shapes.
  final = str(tmp_path / 'final.safetensors')
  assert tiny_runs.run_command('export', f'--workdir={workdir}', f'--out={final}').returncode == 0
  exported, whole = safetensors_numpy.load_file(out), safetensors_numpy.load_file(final)
  assert {k: v.shape for k, v in exported.items()} == {k: v.shape for k, v in whole.items()}
  assert not _pins(workdir)


def test_a_run_before_its_first_checkpoint_is_named_so(tmp_path):
  """A side command on a live run that has written config.json but no checkpoint yet is told so,
  not that the folder is no work directory."""
  with pytest.raises(ValueError, match='is not a work directory of a vit_jax.main run'):
    reader.Workdir.open(str(tmp_path))
  (tmp_path / run_files.CONFIG_FILE).write_text('{}')
  with pytest.raises(ValueError, match='is a vit_jax.main run with no checkpoint yet: a run in'):
    reader.Workdir.open(str(tmp_path))


@pytest.mark.parametrize(
    'damaged', ['{"test/accuracy": 0.9, "steps": {"te', '[]', '{"steps": [1, 2]}', '\xff\xfe']
)
def test_a_damaged_results_json_is_set_aside_and_the_new_metrics_kept(tmp_path, damaged):
  path = tmp_path / run_files.RESULTS_FILE
  path.write_bytes(damaged.encode('latin-1'))
  run = reader.Workdir(str(tmp_path))
  with pytest.raises(ValueError, match=f'{path} is damaged'):
    run.results()
  run.write_results({'test/accuracy': 0.95}, step=7)
  assert run.results() == {'test/accuracy': 0.95, 'steps': {'test/accuracy': 7}}
  assert (tmp_path / 'results.json.damaged').read_bytes() == damaged.encode('latin-1')
