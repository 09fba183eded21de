"""A run directory is data, not code, and needs nothing but itself.

Reading a run (one shared or downloaded: its config.json may say anything) imports none of the
modules it names and prepares no dataset where it points, unless its user says so on the command
line (`--import_run_modules`, `--data_dir`); a run records its classes, its first eval images and
its image folder's absolute path, so that its side commands work once its training data is gone.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from vit_jax.process import extensions
from vit_jax.data import storage
from vit_jax.loop import train
from vit_jax.workdir import reader
from vit_jax.workdir import run_files

from tests import tiny_runs

MARKER_MODULE = 'shared_run_marker'


def _hostile(run: str, tmp_path) -> tuple[str, str]:
  """`run`'s config.json edited to import a module of another folder that writes a marker file
  when imported, and to name a data dir elsewhere; the marker's path and that data dir."""
  folder = tmp_path / 'elsewhere'
  folder.mkdir()
  marker = str(tmp_path / 'marker')
  (folder / f'{MARKER_MODULE}.py').write_text(f'open({marker!r}, "w").close()\n')
  path = os.path.join(run, run_files.CONFIG_FILE)
  with open(path) as f:
    config = json.load(f)
  other_data_dir = str(tmp_path / 'elsewhere' / 'tfds')
  config['data_dir'] = other_data_dir
  config[extensions.IMPORTS] = [
      {'module': MARKER_MODULE, 'path': str(folder), 'registers': ["attention='x'"]}
  ]
  with open(path, 'w') as f:
    json.dump(config, f)
  return marker, other_data_dir


def _refused(result: subprocess.CompletedProcess) -> str:
  """The one line a refused command printed (exit status 1, no traceback)."""
  assert result.returncode == 1, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr, result.stderr[-3000:]
  return result.stderr.strip().splitlines()[-1]


def _image(tmp_path) -> str:
  from PIL import Image  # pylint: disable=g-import-not-at-top

  path = str(tmp_path / 'seven.png')
  Image.fromarray(np.full((16, 16, 3), 128, np.uint8)).save(path)
  return path


def test_a_data_dir_a_run_names_is_read_and_never_prepared_in(tmp_path):
  """Within a command that reads runs; a process's later work (a notebook's training) may."""
  theirs, mine = str(tmp_path / 'theirs'), str(tmp_path / 'mine')
  with storage.runs_read_only():
    storage.read_only(theirs, 'RUN/config.json')
    with pytest.raises(ValueError) as refusal:
      storage.check_writable(theirs, "dataset 'digits'")
    storage.check_writable(mine, "dataset 'digits'")
  assert str(refusal.value) == (
      f"dataset 'digits' is not prepared in data_dir={theirs}, which RUN/config.json names; "
      'reading a run prepares nothing where it points. Give --data_dir=DIR, a folder of yours '
      'to read and prepare datasets in.'
  )
  assert not os.path.exists(theirs)
  storage.check_writable(theirs, "dataset 'digits'")


def test_recorded_modules_are_imported_only_with_leave(tmp_path, monkeypatch):
  folder = tmp_path / 'theirs'
  folder.mkdir()
  (folder / 'leave_marker.py').write_text('LOADED = True\n')
  (folder / 'exits_at_import.py').write_text('import sys\nsys.exit(0)\n')
  monkeypatch.setattr(sys, 'path', list(sys.path))
  record = {'module': 'leave_marker', 'path': str(folder), 'registers': ["attention='x'"]}
  with pytest.raises(ValueError) as refusal:
    extensions.import_recorded([record], 'RUN/config.json', allowed=False)
  assert str(refusal.value) == (
      'RUN/config.json records modules of your own that reading it would import, running their '
      f"code: 'leave_marker' ({folder}); nothing was imported. If you trust this run, give "
      '--import_run_modules.'
  )
  assert 'leave_marker' not in sys.modules
  extensions.import_recorded([record], 'RUN/config.json', allowed=True)
  assert sys.modules['leave_marker'].LOADED
  extensions.import_recorded([record], 'RUN/config.json', allowed=False)  # Loaded already.
  monkeypatch.delitem(sys.modules, 'leave_marker')

  # A module that exits at import: one line naming it, not a silent end.
  exits = {'module': 'exits_at_import', 'path': str(folder)}
  with pytest.raises(ValueError, match="records module 'exits_at_import'.*SystemExit: 0"):
    extensions.import_recorded([exits], 'RUN/config.json', allowed=True)

  # Two modules of one name in two folders (a student's and its teacher's): named, not mixed up.
  other = tmp_path / 'other'
  other.mkdir()
  (other / 'json.py').write_text('')
  with pytest.raises(ValueError) as clash:
    extensions.import_recorded(
        [{'module': 'json', 'path': str(other)}], 'TEACHER/config.json', allowed=True
    )
  assert str(clash.value).startswith(
      f"TEACHER/config.json records module 'json' of {other}, but a module of that name is "
      f'loaded from {json.__file__}: rename one of them'
  )


@pytest.mark.e2e
def test_reading_a_shared_run_runs_no_code_and_writes_nowhere_it_names(
    checkpointed_run, data_dir, tmp_path
):
  run = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, run)
  marker, other_data_dir = _hostile(run, tmp_path)
  image = _image(tmp_path)
  tiny = ','.join(
      f'--config.{k}={v}'
      for k, v in {
          'model.hidden_size': 32,
          'model.mlp_dim': 64,
          'model.num_heads': 2,
          'total_steps': 1,
          'warmup_steps': 0,
      }.items()
  ).split(',')
  commands = {
      'predict': ('predict', f'--workdir={run}', image),
      'evaluate': ('evaluate', f'--workdir={run}', '--evaluators=fewshot'),
      'export': ('export', f'--workdir={run}', f'--out={tmp_path / "w.safetensors"}'),
      'analyze': ('analyze', f'--workdir={run}', '--what=maps', '--num_images=2'),
      'init_from': (
          'main',
          f'--config={tiny_runs.DIGITS_RUN_CONFIG}',
          f'--workdir={tmp_path / "student"}',
          f'--config.data_dir={data_dir}',
          f'--config.init_from={run}',
          *tiny,
      ),
      'teacher': (
          'main',
          f'--config=vit_jax/configs/deit.py:teacher={run}',
          f'--workdir={tmp_path / "distilled"}',
          f'--config.data_dir={data_dir}',
      ),
  }
  for name, command in commands.items():
    line = _refused(tiny_runs.run_command(*command))
    assert f"'{MARKER_MODULE}' ({tmp_path / 'elsewhere'})" in line, (name, line)
    assert line.endswith('If you trust this run, give --import_run_modules.'), (name, line)
    assert not os.path.exists(marker), name

  # With leave, the module is imported; the data dir the run names is still not written.
  allowed = tiny_runs.run_command('predict', f'--workdir={run}', '--import_run_modules', image)
  assert allowed.returncode == 0, allowed.stderr[-3000:]
  assert os.path.exists(marker)
  line = _refused(
      tiny_runs.run_command(
          'evaluate', f'--workdir={run}', '--import_run_modules', '--evaluators=fewshot'
      )
  )
  assert f"'digits' dataset is not prepared in data_dir={other_data_dir}" in line, line
  assert line.endswith('Give --data_dir=DIR, a folder of yours to read and prepare datasets in.')
  assert not os.path.exists(other_data_dir)
  mine = tiny_runs.run_command(
      'evaluate',
      f'--workdir={run}',
      '--import_run_modules',
      f'--data_dir={data_dir}',
      '--evaluators=fewshot',
      '--config.evaluators.fewshot.shots=(1,)',
      '--config.evaluators.fewshot.seeds=1',
  )
  assert mine.returncode == 0, mine.stderr[-3000:]
  assert 'fewshot/digits_1shot' in mine.stdout


def _command_in(cwd: str, name: str, *flags: str) -> subprocess.CompletedProcess:
  """`python -m vit_jax.NAME FLAGS` from the folder `cwd`, as a user runs it there."""
  return subprocess.run(
      [sys.executable, '-m', f'vit_jax.{name}', *flags],
      cwd=cwd,
      env=dict(os.environ, PYTHONPATH=tiny_runs.REPO, TF_CPP_MIN_LOG_LEVEL='2'),
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )


@pytest.mark.e2e
def test_a_run_needs_nothing_but_itself_once_its_image_folder_is_gone(
    jpeg_folder, tmp_path, monkeypatch
):
  root, _ = jpeg_folder
  trained_in, elsewhere = tmp_path / 'a', tmp_path / 'b'
  trained_in.mkdir()
  elsewhere.mkdir()
  shutil.copytree(root, trained_in / 'ok')
  monkeypatch.chdir(trained_in)
  workdir = str(tmp_path / 'run')
  config = tiny_runs.tiny_config(
      str(tmp_path / 'tfds'), dataset='folder:ok', total_steps=2, eval_batch_size=8
  )
  train.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, run_files.CONFIG_FILE)) as f:
    assert json.load(f)['dataset'] == f'folder:{trained_in / "ok"}'  # Absolute, as read anywhere.
  recorded = reader.Workdir(workdir)
  assert recorded.dataset()['class_names'] == ['class0', 'class1', 'class2']
  assert recorded.eval_images().shape == (6, 16, 16, 3)  # The whole (small) eval split.

  # The training folder moved away, and another `ok/` of other classes where the user stands.
  moved = str(tmp_path / 'moved')
  shutil.move(str(trained_in / 'ok'), moved)
  for name in ('cat', 'dog'):
    shutil.copytree(os.path.join(root, 'train', 'class0'), elsewhere / 'ok' / 'train' / name)
    shutil.copytree(os.path.join(root, 'test', 'class0'), elsewhere / 'ok' / 'test' / name)
  image = _image(tmp_path)
  predicted = _command_in(str(elsewhere), 'predict', f'--workdir={workdir}', '--json', image)
  assert predicted.returncode == 0, predicted.stderr[-3000:]
  (prediction,) = json.loads(predicted.stdout)['predictions']
  assert {entry['name'] for entry in prediction['top_k']} == {'class0', 'class1', 'class2'}

  evaluated = _command_in(
      str(elsewhere),
      'evaluate',
      f'--workdir={workdir}',
      f"--config.eval_sets=('folder:{moved}',)",
      f'--data_dir={tmp_path / "my_tfds"}',
  )
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert f'folder:{moved}/accuracy' in evaluated.stdout

  analysed = _command_in(str(elsewhere), 'analyze', f'--workdir={workdir}', '--what=maps')
  assert analysed.returncode == 0, analysed.stderr[-3000:]
  with open(os.path.join(workdir, 'analysis', 'analysis.json')) as f:
    assert json.load(f)['num_images'] == 6
