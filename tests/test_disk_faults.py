"""A work directory that refuses writes: disk full at start or while saving, read-only; bad paths.

The disk-full tests run on a small tmpfs the test mounts (as root); where mounting is not allowed
the refusal is injected as the ENOSPC that orbax's writer would raise.
"""

import errno
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.tiny_runs import tiny_config
from tests.tiny_runs import mounted_tmpfs
from vit_jax.loop import train
from vit_jax.training import run_writer
from vit_jax.workdir import disk_writes
from vit_jax.workdir import reader
from vit_jax.workdir import run_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fill(path, leave: int) -> str:
  """Fills the file system of `path` but for `leave` bytes; the filler's path."""
  filler = os.path.join(path, 'filler')
  free = shutil.disk_usage(path).free
  with open(filler, 'wb') as f:
    f.write(b'\0' * max(free - leave, 0))
  return filler


def _files(root):
  return {
      os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), 'rb').read()
      for d, _, names in os.walk(root)
      for f in names
  }


def _config(data_dir, total_steps):
  return tiny_config(data_dir, total_steps=total_steps, checkpoint_every=2)


def _main(workdir, data_dir, total_steps):
  """The command line of `_config`, as a user runs it: exit status and stderr."""
  flags = [
      '--config=configs/vit.py',
      f'--workdir={workdir}',
      f'--config.data_dir={data_dir}',
      f'--config.total_steps={total_steps}',
      '--config.checkpoint_every=2',
      '--config.warmup_steps=2',
      '--config.log_every=4',
      '--config.eval_every=1000',
      '--config.image_size=16',
      '--config.crop_padding=2',
      '--config.flip=False',
      '--config.normalization=digits',
      '--config.batch_size=32',
      '--config.eval_batch_size=64',
      '--config.model.patch_size=4',
      '--config.model.hidden_size=32',
      '--config.model.depth=2',
      '--config.model.num_heads=2',
      '--config.model.mlp_dim=64',
  ]
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', *flags],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'),
  )
  return result.returncode, result.stderr


def _assert_params_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.e2e  # A subprocess and three tiny runs.
def test_disk_full_while_saving_is_one_line_keeps_earlier_checkpoints_and_resumes_exactly(
    data_dir, tmp_path, monkeypatch
):
  straight = str(tmp_path / 'straight')
  train.train_and_evaluate(_config(data_dir, 4), straight)
  with mounted_tmpfs(tmp_path / 'small') as small:
    workdir = os.path.join(small or str(tmp_path), 'run')
    train.train_and_evaluate(_config(data_dir, 2), workdir)
    checkpoint_2 = _files(os.path.join(workdir, 'checkpoints', '2'))
    if small is not None:  # Room to start, not for the checkpoint of step 4.
      filler = _fill(small, leave=100_000)
      code, stderr = _main(workdir, data_dir, 4)
      assert code == 1, stderr[-3000:]
      shown = [line for line in stderr.splitlines() if not line.startswith(('I1', 'W1'))]
      assert 'Traceback' not in stderr, stderr[-3000:]
      assert len(shown) == 1, stderr[-3000:]
      message = shown[0]
      os.remove(filler)
    else:  # Orbax's writer threads raise what tensorstore says.
      save = ocp.CheckpointManager.save

      def full(self, step, *args, **kwargs):
        if step == 4:
          os.makedirs(os.path.join(workdir, 'checkpoints', '4.orbax-checkpoint-tmp', 'state'))
          raise ValueError(
              'RESOURCE_EXHAUSTED: Error writing local file: No space left on device '
              "[os_error_code='28']"
          )
        return save(self, step, *args, **kwargs)

      with monkeypatch.context() as patch:
        patch.setattr(ocp.CheckpointManager, 'save', full)
        with pytest.raises(disk_writes.Unwritable) as raised:
          train.train_and_evaluate(_config(data_dir, 4), workdir)
      message = f'error: {raised.value}'
    assert message.startswith(
        f'error: cannot write {workdir}/checkpoints: no space left on the ' 'device ('
    )
    assert (
        'for the checkpoint of step 4. Removed its partial checkpoint; the earlier ones '
        '(steps [2]) are intact.' in message
    )
    assert 'rerun the same command to resume' in message
    assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2']
    assert _files(os.path.join(workdir, 'checkpoints', '2')) == checkpoint_2
    train.train_and_evaluate(_config(data_dir, 4), workdir)  # With room again.
    _assert_params_equal(
        reader.Workdir(workdir).read_state()['params'],
        reader.Workdir(straight).read_state()['params'],
    )


def test_disk_full_at_start_is_one_error_naming_the_directory(data_dir, tmp_path, monkeypatch):
  with mounted_tmpfs(tmp_path / 'small') as small:
    if small is None:

      def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, 'No space left on device')

      monkeypatch.setattr(run_writer, 'hold', full)
      workdir = str(tmp_path / 'run')
    else:
      workdir = os.path.join(small, 'run')
      _fill(small, leave=0)
    with pytest.raises(
        disk_writes.Unwritable,
        match=(
            rf'^cannot write {workdir}: no space left on the device \(.*\); it needs write access '
            'and room for its config, logs and checkpoints.$'
        ),
    ):
      train.train_and_evaluate(_config(data_dir, 2), workdir)


def test_a_file_of_the_work_directory_rewritten_on_a_full_disk_is_left_as_it_was(
    tmp_path, monkeypatch
):
  """config.json, rewritten by every start of a run, and results.json: whole or not at all."""
  with mounted_tmpfs(tmp_path / 'small') as small:
    run = reader.Workdir(small or str(tmp_path))
    run.write_whole(run_files.CONFIG_FILE, 'a' * 3000)
    if small is not None:
      _fill(small, leave=0)
    else:

      def full(*args):
        raise OSError(errno.ENOSPC, 'No space left on device')

      monkeypatch.setattr(os, 'replace', full)
    with pytest.raises(OSError):
      run.write_whole(run_files.CONFIG_FILE, 'b' * 9000)
    assert run.file(run_files.CONFIG_FILE).read_text() == 'a' * 3000
    assert sorted(os.listdir(run.path)) == sorted(
        [run_files.CONFIG_FILE] + (['filler'] if small else [])
    )


def test_a_read_only_work_directory_is_one_error_and_left_as_it_was(data_dir, tmp_path):
  with mounted_tmpfs(tmp_path / 'ro', 'ro') as read_only:
    if read_only is None:
      pytest.skip('cannot mount a read-only file system here')
    workdir = os.path.join(read_only, 'run')
    with pytest.raises(
        disk_writes.Unwritable,
        match=(rf'^cannot write {workdir}: the file system is read-only; it needs write access'),
    ):
      train.train_and_evaluate(_config(data_dir, 2), workdir)
    assert os.listdir(read_only) == []


@pytest.mark.parametrize(
    'workdir, message',
    [
        ('', '--workdir is empty: name a directory'),
        ('  ', '--workdir is empty: name a directory'),
        ('FILE', 'is a file, not a directory'),
    ],
)
def test_an_empty_workdir_or_a_file_is_refused(data_dir, tmp_path, monkeypatch, workdir, message):
  monkeypatch.chdir(tmp_path)
  if workdir == 'FILE':
    workdir = str(tmp_path / 'notes.txt')
    with open(workdir, 'w') as f:
      f.write('mine')
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(_config(data_dir, 2), workdir)
  assert sorted(os.listdir(tmp_path)) == (['notes.txt'] if workdir.endswith('notes.txt') else [])


@pytest.mark.parametrize('name', run_files.RUN_FILES)
def test_a_directory_where_a_run_writes_a_file_is_one_line_before_training(tmp_path, name):
  workdir = tmp_path / 'run'
  (workdir / name).mkdir(parents=True)
  with pytest.raises(ValueError) as refusal:
    run_writer.check_path(str(workdir))
  assert str(refusal.value) == (
      f'cannot write {workdir / name}: it is a directory, not a file; it needs '
      f'{run_files.ROOM} (move it away).'
  )


def test_a_work_directory_on_a_store_that_cannot_be_reached_is_one_line(monkeypatch):
  from etils import epath  # pylint: disable=g-import-not-at-top

  def unreachable(self):
    raise OSError('Error executing an HTTP request: Could not resolve host: www.googleapis.com\n…')

  monkeypatch.setattr(epath.gpath.PosixGPath, 'exists', unreachable)
  with pytest.raises(ValueError) as refusal:
    run_writer.check_path('gs://bucket/run')
  assert str(refusal.value) == (
      '--workdir=gs://bucket/run cannot be reached (Error executing an HTTP request: Could not '
      "resolve host: www.googleapis.com): check the network and the store's credentials, or name "
      'a local directory.'
  )


@pytest.mark.parametrize('name', [run_files.CHECKPOINT_DIR, run_files.UNREADABLE_DIR])
def test_a_file_where_a_run_keeps_a_directory_is_one_line_before_training(tmp_path, name):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / name).write_text('mine')
  with pytest.raises(ValueError) as refusal:
    run_writer.check_path(str(workdir))
  assert str(refusal.value) == (
      f'cannot write {workdir / name}: it is a file, not a directory; it needs '
      f'{run_files.ROOM} (move it away).'
  )


def test_a_work_directory_where_no_file_can_be_made_is_one_line():
  with pytest.raises(ValueError) as refusal:
    run_writer.check_path('/proc/self/x')
  assert str(refusal.value) == (
      'cannot write /proc/self/x: /proc/self refused a file (No such file or directory); it '
      f'needs {run_files.ROOM}.'
  )


def test_a_file_named_like_a_step_among_the_checkpoints_is_one_line(tmp_path):
  workdir = tmp_path / 'run'
  (workdir / run_files.CHECKPOINT_DIR / '2').mkdir(parents=True)
  (workdir / run_files.CHECKPOINT_DIR / '4').write_text('mine')
  with pytest.raises(ValueError) as refusal:
    run_writer.check_path(str(workdir))
  assert str(refusal.value).startswith(
      f'cannot write {workdir / run_files.CHECKPOINT_DIR / "4"}: it is a file, not a directory'
  )
  with pytest.raises(ValueError, match='is a file, not the directory of the run.s checkpoints'):
    (workdir / run_files.CHECKPOINT_DIR / '2').rmdir()
    (workdir / run_files.CHECKPOINT_DIR / '4').unlink()
    (workdir / run_files.CHECKPOINT_DIR).rmdir()
    (workdir / run_files.CHECKPOINT_DIR).write_text('mine')
    reader.Workdir.open(str(workdir))


def test_a_work_directory_under_a_literal_tilde_is_the_home_one(monkeypatch, tmp_path):
  monkeypatch.setenv('HOME', str(tmp_path))
  assert reader.Workdir('~/runs/a').path == str(tmp_path / 'runs' / 'a')


@pytest.mark.parametrize(
    'error',
    [
        OSError(errno.EFBIG, 'File too large'),
        RuntimeError('OUT_OF_RANGE: Error writing "step/0" in OCDBT database: File too large'),
    ],
)
def test_a_file_size_limit_is_named_as_a_refused_write(error, tmp_path):
  refusal = disk_writes.unwritable(error, str(tmp_path), 'room for a checkpoint')
  assert str(refusal) == (
      f"cannot write {tmp_path}: a file would pass this process's file size limit (`ulimit -f`); "
      'it needs room for a checkpoint.'
  )
