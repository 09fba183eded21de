"""Faults: unreadable checkpoints, two runs on one work directory, signals, missing or bad data.

Every test checks the message a user sees and that no file of the run was lost. The checkpoint
tests corrupt copies of the session's tiny trained run (`checkpointed_run`).
"""

import gc
import json
import logging as std_logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading

import jax
import numpy as np
from PIL import Image
import pytest

from tests.tiny_runs import compiled_programs
from tests.tiny_runs import CHECKPOINTED_STEPS as STEPS
from tests.tiny_runs import checkpointed_config
from tests.tiny_runs import tiny_config
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.data import sources
from vit_jax.loop import train
from vit_jax.training import run_writer
from vit_jax.data import folder
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings
from vit_jax.training import start as start_lib
from vit_jax.workdir import checksums
from vit_jax.workdir import reader
from vit_jax.workdir import run_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _files(root: str) -> dict[str, bytes]:
  return {
      os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), 'rb').read()
      for d, _, names in os.walk(root)
      for f in names
  }


def _largest_array_file(step_dir: str) -> str:
  arrays = os.path.join(step_dir, 'state', 'ocdbt.process_0', 'd')
  return max((os.path.join(arrays, f) for f in os.listdir(arrays)), key=os.path.getsize)


def _truncate(step_dir):
  path = _largest_array_file(step_dir)
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 3)


def _garbage_arrays(step_dir):
  path = _largest_array_file(step_dir)
  with open(path, 'wb') as f:
    f.write(np.random.default_rng(0).bytes(os.path.getsize(path) or 100))


def _delete_manifests(step_dir):
  os.remove(os.path.join(step_dir, 'state', 'manifest.ocdbt'))
  os.remove(os.path.join(step_dir, 'state', 'ocdbt.process_0', 'manifest.ocdbt'))


def _delete_metadata(step_dir):
  os.remove(os.path.join(step_dir, 'state', '_METADATA'))
  os.remove(os.path.join(step_dir, '_CHECKPOINT_METADATA'))


def _garbage_metadata(step_dir):
  for path in (
      os.path.join(step_dir, 'state', '_METADATA'),
      os.path.join(step_dir, 'meta', 'metadata'),
  ):
    with open(path, 'wb') as f:
      f.write(b'\xf4\x88garbage\x00' * 20)


def _empty_step_directory(step_dir):
  shutil.rmtree(step_dir)
  os.mkdir(step_dir)


CORRUPTIONS = {
    'truncated_array': _truncate,
    'garbage_array': _garbage_arrays,
    'deleted_manifests': _delete_manifests,
    'deleted_metadata': _delete_metadata,
    'garbage_metadata': _garbage_metadata,
    'empty_step_directory': _empty_step_directory,
}


def _abstract_state(config):
  return jax.eval_shape(
      start_lib.for_run(setting.build(run_settings.Settings, config), 10, lambda _: 1e-3).init
  )


@pytest.mark.parametrize('kind', CORRUPTIONS)
def test_resume_falls_back_past_an_unreadable_checkpoint(
    checkpointed_run, data_dir, tmp_path, caplog, kind
):
  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  newest = os.path.join(workdir, 'checkpoints', str(STEPS[-1]))
  CORRUPTIONS[kind](newest)
  corrupted = _files(newest)
  intact = {step: _files(os.path.join(workdir, 'checkpoints', str(step))) for step in STEPS[:-1]}
  config = checkpointed_config(data_dir)
  run = run_writer.RunWriter(workdir, keep_checkpoints=config.keep_checkpoints)
  gc.collect()  # The previous case's abandoned orbax reads report themselves when collected.
  with caplog.at_level(std_logging.WARNING):
    state = run.resume(_abstract_state(config))
  assert int(state.step) == STEPS[-2]
  assert (
      f'Skipping the checkpoint of step {STEPS[-1]} in {newest}, which cannot be read ('
      in caplog.text
  )
  # Set aside, byte for byte, where orbax neither restores nor deletes it; the others untouched.
  aside_root = os.path.join(workdir, run_files.UNREADABLE_DIR)
  (aside,) = os.listdir(aside_root)
  assert aside.startswith(f'{STEPS[-1]}.')
  assert f'Moved the unreadable checkpoint of step {STEPS[-1]} to {aside_root}/{aside}' in (
      caplog.text
  )
  moved = _files(os.path.join(aside_root, aside))
  assert moved.pop('reason.txt').startswith(f'step {STEPS[-1]} could not be read: '.encode())
  assert moved == corrupted
  assert run.steps() == list(STEPS[:-1])
  for step, files in intact.items():
    assert _files(os.path.join(workdir, 'checkpoints', str(step))) == files
  # asyncio reports the reads that orbax abandoned (here or in the previous case) whenever they
  # finish or are collected: those are not our lines.
  ours = [r for r in caplog.records if r.name != 'asyncio']
  assert not any(r.exc_info or 'Traceback' in r.getMessage() for r in ours)


def test_training_resumes_and_retention_keeps_intact_checkpoints(
    checkpointed_run, data_dir, tmp_path
):
  """The run passes the set-aside step again: a fresh checkpoint there, the broken one kept."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  _truncate(os.path.join(workdir, 'checkpoints', str(STEPS[-1])))
  config = checkpointed_config(data_dir, total_steps=10, keep_checkpoints=3)
  train.train_and_evaluate(config, workdir)
  assert sorted(int(s) for s in os.listdir(os.path.join(workdir, 'checkpoints'))) == [6, 8, 10]
  assert len(os.listdir(os.path.join(workdir, run_files.UNREADABLE_DIR))) == 1
  steps = json.loads(open(os.path.join(workdir, 'results.json')).read())['steps']
  assert set(steps.values()) == {10}


def test_readers_of_a_run_skip_an_unreadable_checkpoint_and_move_nothing(
    checkpointed_run, tmp_path
):
  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  _truncate(os.path.join(workdir, 'checkpoints', str(STEPS[-1])))
  before = _files(workdir)
  step = reader.Workdir(workdir).read_variables().step  # What analysis, teachers, init_from read.
  assert step == STEPS[-2]
  assert _files(workdir) == before


@pytest.mark.parametrize('kind', CORRUPTIONS)
def test_a_command_reading_past_an_unreadable_checkpoint_prints_one_line_not_tracebacks(
    checkpointed_run, tmp_path, kind
):
  """The reads orbax abandons on a bad checkpoint end on a closed event loop; a command (export
  here; analysis, evaluation and prediction read runs the same way) reports the skip in one
  line, without their tracebacks."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  CORRUPTIONS[kind](os.path.join(workdir, 'checkpoints', str(STEPS[-1])))
  out = str(tmp_path / 'run.safetensors')
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.export', f'--workdir={workdir}', f'--out={out}'],
      capture_output=True,
      text=True,
      check=False,
      timeout=300,
  )
  assert result.returncode == 0, result.stderr
  assert f'(step {STEPS[-2]},' in result.stdout
  assert (
      'Traceback' not in result.stderr and 'Event loop is closed' not in result.stderr
  ), result.stderr


def test_no_readable_checkpoint_is_an_error_not_a_silent_restart(
    checkpointed_run, data_dir, tmp_path
):
  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  for step in STEPS:
    _empty_step_directory(os.path.join(workdir, 'checkpoints', str(step)))
  config = checkpointed_config(data_dir)
  run = run_writer.RunWriter(workdir, keep_checkpoints=config.keep_checkpoints)
  with pytest.raises(ValueError, match=r'None of the 3 checkpoints .* could be read'):
    run.resume(_abstract_state(config))
  assert len(os.listdir(os.path.join(workdir, run_files.UNREADABLE_DIR))) == 3


# Two runs on one work directory.


def test_a_second_run_is_refused_naming_the_holder(checkpointed_run, data_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  before = _files(workdir)
  with run_writer.lock(workdir):
    holder = json.loads(open(os.path.join(workdir, run_files.LOCK_FILE)).read())
    assert holder['pid'] == os.getpid() and holder['host'] and holder['started']
    with (
        compiled_programs() as compiled,
        pytest.raises(
            run_writer.WorkdirInUse,
            match=rf"'{workdir}' is in use by another run: pid {os.getpid()} on ",
        ),
    ):
      train.train_and_evaluate(checkpointed_config(data_dir, total_steps=8), workdir)
    assert 'jit(train_step)' not in compiled  # Refused before the memory check compiles the step.
    after = _files(workdir)
    after.pop(run_files.LOCK_FILE)
    before.pop(run_files.LOCK_FILE, None)
    assert after == before  # Not a file of the first run touched.


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path, caplog):
  workdir = str(tmp_path / 'run')
  script = textwrap.dedent(
      f"""
      import sys, time
      sys.path.insert(0, {REPO!r})
      from vit_jax.training import run_writer
      with run_writer.lock({workdir!r}):
        print('LOCKED', flush=True)
        time.sleep(60)
      """
  )
  holder = subprocess.Popen([sys.executable, '-c', script], stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == 'LOCKED'
    with pytest.raises(run_writer.WorkdirInUse, match=f'pid {holder.pid} on .*command: '):
      with run_writer.lock(workdir):
        pass
  finally:
    holder.kill()  # SIGKILL: the lock file still names it, but the kernel freed the lock.
    holder.wait()
  with caplog.at_level(std_logging.WARNING):
    with run_writer.lock(workdir):
      pass
  assert f'Taking over the lock of pid {holder.pid} on ' in caplog.text
  assert open(os.path.join(workdir, run_files.LOCK_FILE)).read() == ''  # Released cleanly.


# Signals: SIGTERM and Ctrl-C save and exit 75; the rerun finishes and exits 0.


def _start_main(workdir: str, data_dir: str) -> subprocess.Popen:
  flags = [
      '--config=configs/vit.py',
      f'--workdir={workdir}',
      f'--config.data_dir={data_dir}',
      '--config.total_steps=100000',
      '--config.log_every=1',
      '--config.model.depth=1',
      '--config.model.hidden_size=16',
      '--config.model.num_heads=1',
      '--config.model.mlp_dim=16',
      '--config.batch_size=16',
  ]
  return subprocess.Popen(
      [sys.executable, '-m', 'vit_jax.main', *flags],
      cwd=REPO,
      stderr=subprocess.PIPE,
      text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )


def _stop_after_first_step(process: subprocess.Popen, signum: int) -> tuple[int, str]:
  lines = []
  for line in process.stderr:
    lines.append(line)
    if ' step 1/' in line:
      process.send_signal(signum)
      break
  _, rest = process.communicate(timeout=120)
  return process.returncode, ''.join(lines) + rest


@pytest.mark.e2e  # 30-50 s each on 2 shared cores: a process, a compile, one step.
@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_save_and_exit_75(data_dir, tmp_path, signum):
  workdir = str(tmp_path / 'run')
  code, log = _stop_after_first_step(_start_main(workdir, data_dir), signum)
  assert code == 75, log[-3000:]
  assert 'Traceback' not in log and 'KeyboardInterrupt' not in log
  assert f'{signal.Signals(signum).name}: saving a checkpoint after this step' in log
  assert 'saved checkpoint' not in log  # A save in flight is "saving" until it has finished.
  assert 'Rerun the same command to resume.' in log
  (saved,) = os.listdir(os.path.join(workdir, 'checkpoints'))
  assert int(saved) >= 1
  assert open(os.path.join(workdir, run_files.LOCK_FILE)).read() == ''


def test_a_signal_in_the_final_evaluation_stops_it_with_the_last_step_saved(
    checkpointed_run, data_dir, tmp_path, monkeypatch, caplog
):
  """The loop has saved its last step: SIGTERM then ends the evaluation at once, saying so, and a
  rerun evaluates that step (nothing is trained again)."""
  from vit_jax import evaluators  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  os.remove(os.path.join(workdir, run_files.RESULTS_FILE))
  evaluate = evaluators.run

  def signalled(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return evaluate(*args, **kwargs)

  monkeypatch.setattr(evaluators, 'run', signalled)
  with caplog.at_level(std_logging.WARNING):
    result = train.train_and_evaluate(checkpointed_config(data_dir), workdir)
  assert result.preempted and result.step == STEPS[-1] and not result.metrics
  assert (
      f'SIGTERM: step {STEPS[-1]} is saved; the final evaluation stops (rerun the same command '
      'to evaluate it).'
  ) in caplog.text
  assert 'saving a checkpoint after this step' not in caplog.text
  assert not os.path.exists(os.path.join(workdir, run_files.RESULTS_FILE))
  monkeypatch.setattr(evaluators, 'run', evaluate)
  rerun = train.train_and_evaluate(checkpointed_config(data_dir), workdir)
  assert rerun.step == STEPS[-1] and rerun.metrics['count'] > 0


def test_resuming_past_the_steps_to_train_is_refused(checkpointed_run, data_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  results = open(os.path.join(workdir, run_files.RESULTS_FILE)).read()
  with pytest.raises(ValueError) as refusal:
    train.train_and_evaluate(checkpointed_config(data_dir, total_steps=4), workdir)
  assert str(refusal.value) == (
      f'{workdir!r} holds a checkpoint of step {STEPS[-1]}, past the 4 steps this config trains '
      f'(total_steps, or num_epochs): give at least {STEPS[-1]} to resume it (exactly that to '
      'evaluate it), or a new --workdir.'
  )
  assert open(os.path.join(workdir, run_files.RESULTS_FILE)).read() == results


# Misleading messages.


def test_nan_without_any_checkpoint_says_so(data_dir, tmp_path):
  config = tiny_config(data_dir, total_steps=40, log_every=2, base_lr=1e30, warmup_steps=0)
  with pytest.raises(FloatingPointError, match='No checkpoint had been saved yet') as raised:
    train.train_and_evaluate(config, str(tmp_path))
  assert 'last good checkpoint' not in str(raised.value)


# Data that is missing or broken.


def test_unprepared_manual_dataset_says_where_the_archives_go(tmp_path):
  config = tiny_config(str(tmp_path), dataset='imagenet2012')
  with pytest.raises(ValueError) as raised:
    input_pipeline.get_dataset_info(setting.build(data_settings.DataSettings, config))
  message = str(raised.value)
  assert message.startswith(
      f"Dataset 'imagenet2012' is not prepared in data_dir={tmp_path}, "
      'and TFDS cannot download it'
  )
  assert f'Put its archives in {tmp_path}/downloads/manual (manual_dir should contain' in message
  assert f'`tfds build imagenet2012 --data_dir={tmp_path} --file_format=array_record`' in message


def test_unprepared_dataset_without_network_names_the_command(tmp_path, monkeypatch):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  def offline(self, *args, **kwargs):
    raise ConnectionError("HTTPSConnectionPool(host='www.cs.toronto.edu'): Max retries exceeded")

  monkeypatch.setattr(tfds.core.DatasetBuilder, 'download_and_prepare', offline)
  with pytest.raises(ValueError) as raised:
    input_pipeline.get_dataset_info(
        setting.build(data_settings.DataSettings, tiny_config(str(tmp_path), dataset='cifar10'))
    )
  assert str(raised.value) == (
      f"Dataset 'cifar10' is not prepared in data_dir={tmp_path}, and preparing it failed "
      "(ConnectionError: HTTPSConnectionPool(host='www.cs.toronto.edu'): Max retries exceeded). "
      f'Prepare it once where the network is reachable, `tfds build cifar10 '
      f'--data_dir={tmp_path} --file_format=array_record` (copy that directory here if this '
      f'machine is offline), then train with --config.data_dir={tmp_path}.'
  )


def _cifar10_info(data_dir):
  return input_pipeline.get_dataset_info(
      setting.build(data_settings.DataSettings, tiny_config(str(data_dir), dataset='cifar10'))
  )


def _no_network(monkeypatch) -> list[tuple[str, int]]:
  """The (host, port) of every connection tried from now on, each failing as it does without
  network: no name resolves (Python's and urllib3's connections both look names up here)."""
  for name in ('http_proxy', 'https_proxy', 'all_proxy', 'no_proxy'):
    monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(name.upper(), raising=False)
  attempts = []

  def resolve(host, port, *args, **kwargs):
    attempts.append((host, port))
    raise socket.gaierror(socket.EAI_NONAME, 'Name or service not known')

  monkeypatch.setattr(socket, 'getaddrinfo', resolve)
  return attempts


def test_unprepared_dataset_without_network_is_refused_at_once_in_one_line(tmp_path, monkeypatch):
  attempts = _no_network(monkeypatch)
  with pytest.raises(ValueError) as raised:
    _cifar10_info(tmp_path)
  # One try, of the host of cifar10's archive: TFDS's download and its retries never began.
  assert attempts == [('www.cs.toronto.edu', 443)]
  assert str(raised.value) == (
      f"Dataset 'cifar10' is not prepared in data_dir={tmp_path}, and its download cannot start "
      '(www.cs.toronto.edu:443 unreachable: gaierror: [Errno -2] Name or service not known). '
      f'Prepare it once where the network is reachable, `tfds build cifar10 '
      f'--data_dir={tmp_path} --file_format=array_record` (copy that directory here if this '
      f'machine is offline), then train with --config.data_dir={tmp_path}.'
  )
  assert not os.listdir(tmp_path)  # Nothing written in the data dir.


def test_a_download_host_that_does_not_answer_is_refused_when_the_probe_times_out(
    tmp_path, monkeypatch
):
  _no_network(monkeypatch)
  released = threading.Event()
  monkeypatch.setattr(socket, 'getaddrinfo', lambda *args, **kwargs: released.wait(60))
  monkeypatch.setattr(sources, 'DOWNLOAD_PROBE_SECONDS', 0.2)
  try:
    with pytest.raises(ValueError, match=r'www.cs.toronto.edu:443 unreachable: no answer within '):
      _cifar10_info(tmp_path)  # The name lookup hangs, as with an unreachable name server.
  finally:
    released.set()


def test_the_download_probe_tries_the_proxy_and_leaves_archives_on_disk_to_tfds(
    tmp_path, monkeypatch
):
  attempts = _no_network(monkeypatch)
  monkeypatch.setenv('https_proxy', 'http://proxy.example:3128')
  with pytest.raises(ValueError, match=r'its download cannot start \(proxy.example:3128 unre'):
    _cifar10_info(tmp_path / 'proxied')
  assert attempts == [('proxy.example', 3128)]

  manual = tmp_path / 'offline' / 'downloads' / 'manual'  # TFDS reads archives put here.
  manual.mkdir(parents=True)
  (manual / 'cifar-10-binary.tar.gz').write_bytes(b'not the archive')
  with pytest.raises(ValueError, match=r'preparing it failed \(NonMatchingChecksumError: '):
    _cifar10_info(tmp_path / 'offline')
  assert attempts == [('proxy.example', 3128)]  # No probe: TFDS read the archive offline.


def _folder_with_a_truncated_jpeg(root: str) -> str:
  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for name in ('a', 'b'):
      os.makedirs(os.path.join(root, split, name))
      for i in range(2):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(
            os.path.join(root, split, name, f'{i}.jpg'), quality=90
        )
  broken = os.path.join(root, 'train', 'b', '1.jpg')
  with open(broken, 'r+b') as f:
    f.truncate(os.path.getsize(broken) // 2)
  return broken


def test_a_truncated_jpeg_is_named_at_preparation(tmp_path):
  broken = _folder_with_a_truncated_jpeg(str(tmp_path / 'images'))
  with pytest.raises(
      ValueError,
      match=(
          rf"1 file\(s\) in the image folder '{tmp_path}/images' cannot be decoded: {broken} \("
      ),
  ):
    folder.prepare(str(tmp_path / 'images'), str(tmp_path / 'tfds'))
  assert os.path.exists(broken)


def test_a_truncated_jpeg_is_skipped_with_a_warning_when_asked(tmp_path, caplog):
  broken = _folder_with_a_truncated_jpeg(str(tmp_path / 'images'))
  with caplog.at_level(std_logging.WARNING):
    builder = folder.prepare(str(tmp_path / 'images'), str(tmp_path / 'tfds'), skip_unreadable=True)
  assert f'Leaving out {broken}, which cannot be decoded' in caplog.text
  assert builder.info.splits['train'].num_examples == 3
  assert builder.info.splits['test'].num_examples == 4


def test_checksums_are_the_same_on_the_host_and_on_devices():
  """A checkpoint saved from an accelerator is checked by a reader on the host, and CPU runs sum
  their state on the host (compiling nothing): both ways give each dtype's leaf the same sum."""
  rng = np.random.default_rng(0)
  leaves = [
      rng.normal(size=(5, 7)).astype(np.float32),
      rng.normal(size=(3, 4)).astype(jax.numpy.bfloat16),
      rng.normal(size=(9,)).astype(np.float16),
      rng.integers(0, 256, (11,), dtype=np.uint8),
      rng.integers(-(2**31), 2**31 - 1, (1000,), dtype=np.int32),
      rng.integers(0, 2, (13,)).astype(bool),
      np.full((2**20,), -1.0, np.float32),  # Its sum wraps at 2**32.
  ]
  keys = jax.random.split(jax.random.key(4), 3)
  on_cpu = [jax.numpy.asarray(leaf) for leaf in leaves] + [keys]
  with compiled_programs() as compiled:
    summed = checksums.checksums(on_cpu)
  assert not [name for name in compiled if 'device_sums' in name], compiled
  on_devices = checksums._device_sums([checksums._plain(leaf) for leaf in on_cpu])
  assert summed == [int(x) for x in jax.device_get(on_devices)]
  assert summed == checksums.checksums(leaves + [np.asarray(jax.random.key_data(keys))])
  assert len(set(summed)) == len(summed)  # No two leaves alike: each sum is of its own leaf.


def test_a_checkpoint_whose_bytes_changed_after_saving_is_never_read_as_good(
    checkpointed_run, data_dir, tmp_path, caplog
):
  """A flipped bit in an array file reads without any error from orbax: the checksums its save
  recorded catch it, and readers and resuming fall back to the checkpoint before."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  step_dir = os.path.join(workdir, 'checkpoints', str(STEPS[-1]), 'state')
  data_files = [
      os.path.join(folder, name)
      for folder, _, names in os.walk(step_dir)
      if os.path.basename(folder) == 'd'
      for name in names
  ]
  largest = max(data_files, key=os.path.getsize)
  with open(largest, 'r+b') as f:
    f.seek(os.path.getsize(largest) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x10]))
  run = reader.Workdir(workdir)
  with pytest.raises(ValueError, match=f'the arrays of step {STEPS[-1]} differ from what was'):
    run.read_state(STEPS[-1])
  with caplog.at_level(std_logging.WARNING):
    assert run.read_variables().step == STEPS[-2]
  assert 'changed or damaged since' in caplog.text
  train.train_and_evaluate(checkpointed_config(data_dir, total_steps=STEPS[-1]), workdir)
  assert os.listdir(os.path.join(workdir, run_files.UNREADABLE_DIR))[0].startswith(f'{STEPS[-1]}.')
