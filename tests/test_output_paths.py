"""Every output is checked before the work: the device report's --report_json, evaluate's
--out_dir and export's --out are refused in one line naming the path and the cause (a directory, a
parent that is a file, a read-only or full disk) before any row is measured or weights are read;
a failed export leaves no partial file.

Read-only and full disks are small tmpfs mounts (as root); where mounting is not allowed a
read-only directory is chmod 0o555 (which binds only a user who is not root), else skipped.
"""

import contextlib
import errno
import os
import shutil

import jax
import numpy as np
import pytest

from tests import tiny_runs
from tests.tiny_runs import mounted_tmpfs
from vit_jax import models
from vit_jax.benchmarks import device_report
from vit_jax.weights import pretrained
from vit_jax.workdir import disk_writes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEEDS = 'write access and room for the test'


@pytest.fixture
def read_only(tmp_path):
  """A directory no file can be written into."""
  with mounted_tmpfs(tmp_path / 'ro', 'ro') as mounted:
    if mounted is not None:
      yield mounted
      return
    if os.geteuid() == 0:
      pytest.skip('root writes through chmod, and mounting a read-only tmpfs is not allowed')
    path = tmp_path / 'ro'
    path.chmod(0o555)
    yield str(path)
    path.chmod(0o755)


@pytest.fixture
def full(tmp_path):
  """A directory on a file system without a free byte."""
  with mounted_tmpfs(tmp_path / 'full') as mounted:
    if mounted is None:
      pytest.skip('mounting a tmpfs is not allowed here')
    with contextlib.suppress(OSError), open(os.path.join(mounted, 'filler'), 'wb') as f:
      f.write(b'\0' * shutil.disk_usage(mounted).total)
    yield mounted


def _bad_path(kind: str, tmp_path, read_only_dir: str | None = None) -> tuple[str, str]:
  """A path that cannot be written, and the cause its refusal names."""
  if kind == 'a directory':
    path = tmp_path / 'existing'
    path.mkdir()
    return str(path), 'it is a directory, not a file'
  if kind == 'a file for a directory':
    path = tmp_path / 'existing_file'
    path.write_text('x')
    return str(path), 'it is a file, not a directory'
  if kind == 'under a file':
    (tmp_path / 'plain_file').write_text('x')
    return str(tmp_path / 'plain_file' / 'sub' / 'out'), f'{tmp_path / "plain_file"} is a file'
  assert kind == 'read-only'
  return os.path.join(read_only_dir, 'sub', 'out'), 'the file system is read-only'


def _assert_one_line_naming(error: Exception, path: str, cause: str) -> None:
  message = str(error)
  assert '\n' not in message, message
  assert message.startswith(f'cannot write {path}: '), message
  assert cause in message, message


@pytest.mark.parametrize(
    'kind, directory',
    [
        ('a directory', False),
        ('a file for a directory', True),
        ('under a file', False),
        ('under a file', True),
    ],
)
def test_a_path_that_cannot_be_written_is_one_line_naming_it_and_why(tmp_path, kind, directory):
  path, cause = _bad_path(kind, tmp_path)
  before = sorted(os.listdir(tmp_path))
  with pytest.raises(disk_writes.Unwritable) as refused:
    disk_writes.check_writable(path, NEEDS, directory=directory)
  _assert_one_line_naming(refused.value, path, cause)
  assert str(refused.value).endswith(f'it needs {NEEDS}.')
  assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize('directory', [False, True])
def test_a_read_only_place_is_one_line_naming_the_path(read_only, directory):
  path = os.path.join(read_only, 'sub', 'out')
  with pytest.raises(disk_writes.Unwritable) as refused:
    disk_writes.check_writable(path, NEEDS, directory=directory)
  cause = 'read-only' if os.geteuid() == 0 else 'permission denied'
  _assert_one_line_naming(refused.value, path, cause)


def test_a_full_disk_is_one_line_naming_the_path(full):
  path = os.path.join(full, 'out.json')
  with pytest.raises(disk_writes.Unwritable) as refused:
    disk_writes.check_writable(path, NEEDS, directory=False)
  _assert_one_line_naming(refused.value, path, 'no space left on the device')
  assert os.listdir(full) == ['filler']


@pytest.mark.parametrize('directory', [False, True])
def test_a_writable_path_passes_and_nothing_is_left_behind(tmp_path, directory):
  disk_writes.check_writable(str(tmp_path / 'new' / 'deeper' / 'out'), NEEDS, directory=directory)
  disk_writes.check_writable(str(tmp_path), NEEDS, directory=True)
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('kind', ['a directory', 'under a file', 'read-only'])
def test_device_report_refuses_its_report_path_before_measuring_a_row(
    tmp_path, capsys, monkeypatch, request, kind
):
  read_only_dir = request.getfixturevalue('read_only') if kind == 'read-only' else None
  path, cause = _bad_path(kind, tmp_path, read_only_dir)
  if kind == 'read-only' and os.geteuid() != 0:
    cause = 'permission denied'

  def measured(check, measure):
    raise AssertionError(f'measured {check} before checking --report_json')

  monkeypatch.setattr(device_report, '_measured', measured)
  with pytest.raises(disk_writes.Unwritable) as refused:
    device_report.run(reduced=True, json_path=path)
  _assert_one_line_naming(refused.value, path, cause)
  assert '--report_json' in str(refused.value)
  assert not capsys.readouterr().out  # Not even the header: nothing was measured.


def _tiny_export():
  model = models.create('deit_ti16', patch_size=8, depth=2, num_classes=10)
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0), np.zeros((1, 32, 32, 3), np.float32), train=False)
  )
  return jax.tree.map(lambda s: np.ones(s.shape, s.dtype), shapes), model


def test_an_export_the_disk_cannot_hold_is_one_line_and_leaves_no_partial_file(
    tmp_path, monkeypatch
):
  variables, model = _tiny_export()
  with mounted_tmpfs(tmp_path / 'small') as small:  # 3 MB: the export holds more.
    if small is None:  # The refusal as the file system gives it, after part of the file.

      def save_file(tensors, path, metadata):
        del tensors, metadata
        with open(path, 'wb') as f:
          f.write(b'\0' * 1000)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

      monkeypatch.setattr(pretrained.safetensors_numpy, 'save_file', save_file)
      small = str(tmp_path)
    path = os.path.join(small, 'deit.safetensors')
    with open(path, 'wb') as f:
      f.write(b'an earlier export')
    with pytest.raises(disk_writes.Unwritable) as refused:
      pretrained.export_timm(variables, model, path)
    _assert_one_line_naming(refused.value, path, 'no space left on the device')
    assert os.listdir(small) == ['deit.safetensors']  # No partial file beside it.
    with open(path, 'rb') as f:
      assert f.read() == b'an earlier export'


def test_the_commands_refuse_a_bad_output_in_one_line_before_the_work(tmp_path):
  """Each command as a user runs it, its output a directory or under a file; the work directory
  does not exist, so a check after reading it would name it instead."""
  (tmp_path / 'a_dir').mkdir()
  (tmp_path / 'a_file').write_text('x')
  missing = str(tmp_path / 'no_run')
  commands = {
      'benchmark': (['--mode=device_report', f'--report_json={tmp_path / "a_dir"}'], 'a_dir'),
      'evaluate': ([f'--workdir={missing}', f'--out_dir={tmp_path / "a_file"}'], 'a_file'),
      'export': (
          [f'--workdir={missing}', f'--out={tmp_path / "a_file" / "x.safetensors"}'],
          'a_file/x.safetensors',
      ),
  }
  done = tiny_runs.run_at_once(
      {name: ['-m', f'vit_jax.{name}', *flags] for name, (flags, _) in commands.items()},
      dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'),
  )
  for name, process in done.items():
    out, err = process.stdout, process.stderr
    assert process.returncode == 1, (name, err[-3000:])
    shown = [line for line in err.splitlines() if line and not line.startswith(('I1', 'W1'))]
    assert shown == [shown[0]] and 'Traceback' not in err, (name, err[-3000:])
    assert shown[0].startswith(f'error: cannot write {tmp_path / commands[name][1]}: '), shown
    assert not out, (name, out)  # Nothing measured, read or evaluated.
  assert sorted(os.listdir(tmp_path)) == ['a_dir', 'a_file']
  assert not os.listdir(tmp_path / 'a_dir')


def test_an_export_named_as_another_format_is_refused(tmp_path):
  """Readers go by the suffix: safetensors written as `w.pth` would be taken for a pickle."""
  out = tmp_path / 'w.pth'
  done = tiny_runs.run_at_once(
      {'export': ['-m', 'vit_jax.export', f'--workdir={tmp_path / "no_run"}', f'--out={out}']},
      dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'),
  )
  process = done['export']
  assert process.returncode == 1 and 'Traceback' not in process.stderr, process.stderr
  assert process.stderr.strip().splitlines()[-1] == (
      f"error: --out='{out}': the export is a safetensors file; name it "
      f'{tmp_path / "w"}.safetensors.'
  )
  assert not out.exists()
