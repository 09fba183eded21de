"""The TFDS data dir's faults, each one line naming the data dir and the cause before anything
compiles: a read-only or full data dir where a dataset must be prepared or converted (nothing
half written, no lock left), a data dir or $TFDS_DATA_DIR that is a file, and a prepared dataset
whose metadata lists files that are gone (prepared again from its source, else refused).

Read-only and full disks are small tmpfs mounts (`test_output_paths`' fixtures), else skipped.
"""

import contextlib
import os
import shutil
import subprocess
import types

import numpy as np
from PIL import Image
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tests.test_output_paths import full  # pylint: disable=unused-import
from tests.test_output_paths import read_only  # pylint: disable=unused-import
from tests import tiny_runs
from tests.tiny_runs import mounted_tmpfs
from vit_jax.data import convert
from vit_jax.data import digits
from vit_jax.data import folder
from vit_jax.data import input_pipeline
from vit_jax.data import reading
from vit_jax.schema import data as data_settings
from vit_jax.data import sources
from vit_jax.data import storage
from vit_jax.schema import setting
from vit_jax.workdir import disk_writes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _images(root: str, size: int = 12, per_class: int = 3) -> str:
  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for name in ('a', 'b'):
      os.makedirs(os.path.join(root, split, name))
      for i in range(per_class):
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
            os.path.join(root, split, name, f'{i}.png')
        )
  return root


def _one_line(error: BaseException, *named: str) -> str:
  message = str(error)
  assert '\n' not in message, message
  for text in named:
    assert text in message, message
  return message


def _files(path: str) -> list[str]:
  return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


def _read_only_cause() -> str:
  return 'read-only' if os.geteuid() == 0 else 'permission denied'


def test_a_folder_to_prepare_in_a_read_only_data_dir_names_the_data_dir(tmp_path, read_only):
  root = _images(str(tmp_path / 'images'))
  with pytest.raises(disk_writes.Unwritable) as refused:
    folder.prepare(root, read_only)
  _one_line(refused.value, f'cannot write {read_only}:', _read_only_cause(), 'data_dir', root)
  assert not os.listdir(read_only)


def test_digits_to_prepare_in_a_read_only_data_dir_names_the_data_dir(read_only):
  with pytest.raises(disk_writes.Unwritable) as refused:
    digits.prepare(read_only)
  _one_line(refused.value, f'cannot write {read_only}:', _read_only_cause(), 'data_dir')


def test_a_tfds_dataset_to_prepare_in_a_read_only_data_dir_is_refused_before_its_download(
    read_only, monkeypatch
):
  def download_and_prepare(*args, **kwargs):
    raise AssertionError('started preparing in a read-only data dir')

  monkeypatch.setattr(tfds.core.DatasetBuilder, 'download_and_prepare', download_and_prepare)
  data = types.SimpleNamespace(data_dir=read_only)
  with pytest.raises(disk_writes.Unwritable) as refused:
    sources._prepared_builder(data, 'mnist')  # pylint: disable=protected-access
  _one_line(refused.value, f'cannot write {read_only}:', _read_only_cause(), "'mnist'")


def test_prepared_digits_are_read_from_a_data_dir_that_became_read_only(tmp_path):
  data_dir = tmp_path / 'tfds'
  with mounted_tmpfs(data_dir) as mounted:
    if mounted is None:
      pytest.skip('mounting a tmpfs is not allowed here')
    digits.prepare(mounted)
    subprocess.run(['mount', '-o', 'remount,ro', mounted], check=True)
    before = _files(mounted)
    builder = digits.prepare(mounted)
    assert builder.info.splits['test'].num_examples == digits.NUM_TEST_EXAMPLES
    assert _files(mounted) == before


@pytest.mark.parametrize('through', ['data_dir', 'TFDS_DATA_DIR'])
@pytest.mark.parametrize('where', ['a file', 'under a file'])
def test_a_data_dir_that_is_a_file_is_one_line_naming_it(tmp_path, monkeypatch, through, where):
  (tmp_path / 'plain').write_text('x')
  path = str(tmp_path / 'plain') if where == 'a file' else str(tmp_path / 'plain' / 'tfds')
  monkeypatch.setenv('TFDS_DATA_DIR', path if through == 'TFDS_DATA_DIR' else str(tmp_path))
  with pytest.raises(ValueError) as refused:
    storage.check_location(path if through == 'data_dir' else None)
  cause = 'is a file, not a directory' if where == 'a file' else f'under the file {tmp_path}'
  assert _one_line(refused.value, cause).startswith(f'{through}={path} ')
  with pytest.raises(ValueError, match=f'^{through}='):  # Also where a dataset is resolved.
    sources.resolve(  # pylint: disable=protected-access
        types.SimpleNamespace(data_dir=path if through == 'data_dir' else None, dataset='digits')
    )
  storage.check_location(str(tmp_path / 'new'))  # A folder that is not there yet is created.


def test_a_disk_that_fills_while_a_folder_is_prepared_leaves_nothing_behind(tmp_path):
  root = _images(str(tmp_path / 'images'), size=96, per_class=8)  # About 900 KB of PNGs.
  with mounted_tmpfs(tmp_path / 'tfds') as mounted:
    if mounted is None:
      pytest.skip('mounting a tmpfs is not allowed here')
    with contextlib.suppress(OSError), open(os.path.join(mounted, 'filler'), 'wb') as f:
      f.write(b'\0' * (shutil.disk_usage(mounted).free - 300_000))  # Room for a third.
    with pytest.raises(disk_writes.Unwritable) as refused:
      folder.prepare(root, mounted)
    _one_line(refused.value, f'cannot write {mounted}:', 'no space left', 'Removed')
    assert _files(mounted) == ['filler']  # No lock, no incomplete.*, no version directory.
    os.remove(os.path.join(mounted, 'filler'))
    builder = folder.prepare(root, mounted)  # A rerun with room prepares it in full.
    assert builder.info.splits['train'].num_examples == 16


def _tfrecord_digits(data_dir: str) -> tfds.core.DatasetBuilder:
  builder = digits.Digits(data_dir=data_dir)
  builder.download_and_prepare()  # TFRecord only, as a dataset `convert` is for.
  return digits.Digits(data_dir=data_dir)


def test_converting_into_a_full_disk_is_one_line_and_leaves_no_partial_copy(tmp_path):
  with mounted_tmpfs(tmp_path / 'tfds') as mounted:
    if mounted is None:
      pytest.skip('mounting a tmpfs is not allowed here')
    builder = _tfrecord_digits(mounted)
    before = _files(mounted)
    with contextlib.suppress(OSError), open(os.path.join(mounted, 'filler'), 'wb') as f:
      f.write(b'\0' * (shutil.disk_usage(mounted).free - 100_000))  # Less than a copy.
    with pytest.raises(disk_writes.Unwritable) as refused:
      convert.add_array_record(builder)
    _one_line(refused.value, str(builder.data_dir), 'no space left', 'ArrayRecord')
    assert _files(mounted) == sorted(before + ['filler'])
    assert not convert.has_array_record(digits.Digits(data_dir=mounted))


def test_converting_into_a_read_only_data_dir_is_refused_before_copying(tmp_path):
  with mounted_tmpfs(tmp_path / 'tfds') as mounted:
    if mounted is None:
      pytest.skip('mounting a tmpfs is not allowed here')
    _tfrecord_digits(mounted)
    subprocess.run(['mount', '-o', 'remount,ro', mounted], check=True)
    with pytest.raises(disk_writes.Unwritable) as refused:
      convert.add_array_record(digits.Digits(data_dir=mounted))
    _one_line(refused.value, 'read-only', 'ArrayRecord')


def _delete_one(builder: tfds.core.DatasetBuilder, suffix: str) -> str:
  (path,) = [
      os.path.join(builder.data_dir, n)
      for n in os.listdir(builder.data_dir)
      if n.startswith(f'{builder.name}-train.{suffix}')
  ]
  os.remove(path)
  return path


def test_a_prepared_folder_with_a_file_gone_is_prepared_again(tmp_path, caplog):
  root, data_dir = _images(str(tmp_path / 'images')), str(tmp_path / 'tfds')
  gone = _delete_one(folder.prepare(root, data_dir), 'array_record')
  builder = folder.prepare(root, data_dir)
  assert os.path.exists(gone)
  assert not storage.missing_files(builder)
  assert len(builder.as_data_source(split='train')) == 6
  assert os.path.basename(gone) in caplog.text


def test_prepared_digits_with_a_file_gone_are_prepared_again(tmp_path):
  gone = _delete_one(digits.prepare(str(tmp_path)), 'tfrecord')
  digits.prepare(str(tmp_path))
  assert os.path.exists(gone)


def test_a_converted_copy_with_a_file_gone_is_written_again(tmp_path):
  builder = _tfrecord_digits(str(tmp_path))
  convert.add_array_record(builder)
  gone = _delete_one(digits.Digits(data_dir=str(tmp_path)), 'array_record')
  convert.add_array_record(digits.Digits(data_dir=str(tmp_path)))
  assert os.path.exists(gone)


def test_a_tfds_dataset_with_a_file_gone_is_refused_naming_it(tmp_path):
  builder = _tfrecord_digits(str(tmp_path))
  gone = _delete_one(builder, 'tfrecord')
  with pytest.raises(ValueError) as refused:
    storage.check_complete(digits.Digits(data_dir=str(tmp_path)), 'digits')
  _one_line(refused.value, gone, "Dataset 'digits'", 'tfds build')
  with pytest.raises(ValueError, match='lacks 1 of the files'):  # No copy from what is gone.
    convert.add_array_record(digits.Digits(data_dir=str(tmp_path)))


def _run(command: str, *flags: str) -> str:
  """The last line of stderr of `python -m vit_jax.<command>`, which must fail in one line."""
  done = tiny_runs.run_command(command, *flags, timeout=300)
  assert done.returncode == 1, done.stderr[-2000:]
  assert 'Traceback' not in done.stderr, done.stderr[-2000:]
  return done.stderr.strip().splitlines()[-1]


@pytest.mark.e2e  # The training and convert commands as a user runs them.
def test_the_commands_name_a_read_only_data_dir_in_one_line(tmp_path, read_only):
  root = _images(str(tmp_path / 'images'))
  last = _run(
      'main',
      f'--config={os.path.join(REPO, "tests", "digits_run_config.py")}',
      f'--config.dataset=folder:{root}',
      f'--config.data_dir={read_only}',
      f'--workdir={tmp_path / "run"}',
  )
  assert last.startswith(f'error: cannot write {read_only}: ') and 'data_dir' in last, last
  assert not os.path.exists(tmp_path / 'run' / 'checkpoints')
  with mounted_tmpfs(tmp_path / 'tfds') as mounted:
    if mounted is None:
      return
    _tfrecord_digits(mounted)
    subprocess.run(['mount', '-o', 'remount,ro', mounted], check=True)
    last = _run('convert', '--dataset=digits', f'--data_dir={mounted}')
    assert last.startswith(f'error: cannot write {mounted}/digits/1.0.0: ') and 'read-only' in last


def _change(path: str, damage) -> str:
  with open(path, 'rb') as f:
    data = damage(f.read())
  with open(path, 'wb') as f:
    f.write(data)
  return path


def _flipped(data: bytes) -> bytes:
  """`data` with one byte in every 5,000 inverted, from past the header to the middle."""
  flipped = bytearray(data)
  for i in range(1000, len(data) // 2, 5000):
    flipped[i] ^= 0xFF
  return bytes(flipped)


@pytest.mark.e2e  # Training as a user runs it.
def test_training_on_a_truncated_array_record_file_is_one_line_naming_it(data_dir, tmp_path):
  copy = str(tmp_path / 'tfds')
  shutil.copytree(data_dir, copy)
  version_dir = digits.Digits(data_dir=copy).data_dir
  shard = _change(
      os.path.join(version_dir, 'digits-train.array_record-00000-of-00001'),
      lambda data: data[: len(data) // 2],
  )
  last = _run(
      'main',
      f'--config={os.path.join(REPO, "tests", "digits_run_config.py")}',
      f'--config.data_dir={copy}',
      '--config.total_steps=2',
      '--config.warmup_steps=0',
      f'--workdir={tmp_path / "run"}',
  )
  assert last.startswith('error: ') and f'damaged file {shard} ' in last, last
  assert f'remove {version_dir} and the next run prepares it again' in last, last


def test_reading_flipped_bytes_of_an_array_record_file_is_one_line_naming_it(data_dir, tmp_path):
  copy = str(tmp_path / 'tfds')
  shutil.copytree(data_dir, copy)
  version_dir = digits.Digits(data_dir=copy).data_dir
  shard = _change(os.path.join(version_dir, 'digits-train.array_record-00000-of-00001'), _flipped)
  source = sources.resolve(types.SimpleNamespace(data_dir=copy, dataset='digits'))  # Opens.
  with pytest.raises(ValueError) as refused:
    reading.in_memory_lookup(source, 'train')
  message = _one_line(refused.value, f'damaged file {shard} (Corrupted Riegeli', version_dir)
  access = reading.array_record_lookup(source, 'train')  # Read as training reads a large split.
  with pytest.raises(tf.errors.OpError) as failed:
    list(access.lookup(tf.data.Dataset.range(access.num)).as_numpy_iterator())
  converted = reading.read_error(failed.value)
  assert converted is not None and f'damaged file {shard} (' in str(converted)
  assert reading.read_error(tf.errors.UnknownError(None, None, 'other')) is None


@pytest.mark.parametrize(
    'damage',
    [lambda text: 'not json', lambda text: '[]', lambda text: text[: len(text) // 2]],
    ids=['not JSON', 'a list', 'truncated'],
)
def test_a_damaged_dataset_info_json_is_one_line_naming_it(data_dir, tmp_path, damage):
  copy = str(tmp_path / 'tfds')
  shutil.copytree(data_dir, copy)
  version_dir = digits.Digits(data_dir=copy).data_dir
  info = os.path.join(version_dir, 'dataset_info.json')
  with open(info) as f:
    text = f.read()
  with open(info, 'w') as f:
    f.write(damage(text))
  settings = setting.build(data_settings.DataSettings, tiny_runs.tiny_config(copy))
  with pytest.raises(ValueError) as refused:
    input_pipeline.get_dataset_info(settings)
  _one_line(
      refused.value,
      f'damaged file {info} (',
      f'remove {version_dir} and the next run prepares it again',
  )
