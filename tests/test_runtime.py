"""Process settings: XLA flags that this jaxlib knows, glibc malloc and TensorFlow allocator
reuse, quiet libraries."""

import gc
import logging as std_logging
import os
import platform
import subprocess
import sys
import warnings

from absl import flags as absl_flags
from absl import logging as absl_logging
import orbax.checkpoint
import pytest

from vit_jax.process import runtime
from vit_jax.loop import train


def _python(code: str, without: str) -> subprocess.CompletedProcess:
  """`python -c code` in a fresh process, with this environment less the variable `without`."""
  env = {k: v for k, v in os.environ.items() if k != without}
  return subprocess.run(
      [sys.executable, '-c', code],
      capture_output=True,
      text=True,
      check=False,
      timeout=300,
      env=env,
  )


def test_flags_are_added_once_and_never_override_the_user(monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', '--xla_dump_to=/tmp/dump')
  flags = runtime.add_xla_flags({'--xla_cpu_experimental_ynn_fusion_type=': (0,)})
  assert flags == '--xla_dump_to=/tmp/dump --xla_cpu_experimental_ynn_fusion_type='
  assert runtime.add_xla_flags({'--xla_cpu_experimental_ynn_fusion_type=': (0,)}) == flags

  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_experimental_ynn_fusion_type=dot')
  assert (
      runtime.add_xla_flags({'--xla_cpu_experimental_ynn_fusion_type=': (0,)})
      == '--xla_cpu_experimental_ynn_fusion_type=dot'
  )


def test_flags_unknown_to_the_installed_jaxlib_are_left_out(monkeypatch):
  monkeypatch.delenv('XLA_FLAGS', raising=False)
  assert runtime.add_xla_flags({'--xla_from_the_future=1': (999, 0, 0)}) == ''
  assert runtime.jaxlib_version() >= (0, 7)


@pytest.mark.skipif(
    platform.system() != 'Linux' or platform.libc_ver()[0] != 'glibc',
    reason='glibc malloc settings',
)
def test_configure_keeps_freed_memory_and_jax_and_tensorflow_still_run():
  """In a fresh process: malloc keeps freed memory, JAX computes, and TensorFlow's CPU tensors
  come from its BFC allocator (the stock allocator keeps no statistics)."""
  code = (
      'from vit_jax.process import runtime; applied = runtime.configure(); '
      'import jax.numpy as jnp; assert float(jnp.ones(3).sum()) == 3.0; print(applied); '
      'import tensorflow as tf; assert float(tf.reduce_sum(tf.ones([512, 512]))) == 512 ** 2; '
      "print('peak', tf.config.experimental.get_memory_info('CPU:0')['peak'])"
  )
  result = _python(code, without=runtime.TF_BFC_ENV)
  assert result.returncode == 0, result.stderr
  assert "'keep_freed_host_memory': True" in result.stdout
  assert f"'{runtime.TF_INTRA_OP_ENV}': '1'" in result.stdout
  assert int(result.stdout.split('peak ')[1]) >= 512 * 512 * 4


def test_tensorflow_settings_never_override_the_user(monkeypatch):
  for name, setting, default in (
      (runtime.TF_BFC_ENV, runtime.tensorflow_reuses_freed_memory, 'true'),
      (runtime.TF_INTRA_OP_ENV, runtime.tensorflow_ops_on_one_thread, '1'),
  ):
    monkeypatch.setenv(name, '4')
    assert setting() == '4'
    monkeypatch.delenv(name)
    assert setting() == default
    assert os.environ[name] == default


def _record(pathname: str, level: int) -> std_logging.LogRecord:
  return std_logging.LogRecord('absl', level, pathname, 1, 'message', None, None)


def test_library_info_lines_are_dropped_unless_verbosity_is_raised():
  orbax_file = os.path.join(os.path.dirname(orbax.checkpoint.__file__), 'checkpoint_manager.py')
  ours = os.path.abspath(train.__file__)
  keep = runtime._own_or_important  # pylint: disable=protected-access
  assert keep(_record(ours, std_logging.INFO))
  assert not keep(_record(orbax_file, std_logging.INFO))
  assert keep(_record(orbax_file, std_logging.WARNING))
  verbosity = absl_logging.get_verbosity()
  try:
    absl_logging.set_verbosity(1)  # --verbosity=1
    assert keep(_record(orbax_file, std_logging.INFO))
  finally:
    absl_logging.set_verbosity(verbosity)


def test_reads_abandoned_after_an_unreadable_checkpoint_print_no_traceback():
  keep = runtime._own_or_important  # pylint: disable=protected-access
  abandoned = std_logging.LogRecord(
      'asyncio',
      std_logging.ERROR,
      'base_events.py',
      1771,
      'Future exception was never retrieved',
      None,
      None,
  )
  other = std_logging.LogRecord(
      'asyncio', std_logging.ERROR, 'base_events.py', 1, 'Unclosed loop', None, None
  )
  assert not keep(abandoned)
  assert keep(other)


def _pending_read(name):
  """A coroutine called `name` that, like orbax's array reads, turns being closed into an error."""

  class Pending:

    def __await__(self):
      yield

  async def read():
    try:
      await Pending()
    except BaseException as e:
      raise Exception('Encountered error while reading array index') from e

  read.__qualname__ = name
  coroutine = read()
  coroutine.send(None)  # Suspended, as a read in flight is.
  return coroutine


def test_reads_closed_unfinished_after_an_unreadable_checkpoint_print_no_traceback(monkeypatch):
  reported = []
  monkeypatch.setattr(sys, 'unraisablehook', lambda unraisable: reported.append(unraisable.object))
  monkeypatch.setattr(sys, 'excepthook', sys.excepthook)
  runtime._silence_closed_event_loops()  # pylint: disable=protected-access
  _pending_read('_read_array_index_and_device_put')  # Collected at once: closed unfinished.
  _pending_read('another_read')
  gc.collect()
  assert [coroutine.__qualname__ for coroutine in reported] == ['another_read']


def test_orbax_read_only_notice_is_dropped_for_work_directories_opened_to_be_read():
  keep = runtime._own_or_important  # pylint: disable=protected-access
  orbax_file = os.path.join(os.path.dirname(orbax.checkpoint.__file__), 'checkpoint_manager.py')
  notice = std_logging.LogRecord(
      'absl',
      std_logging.WARNING,
      orbax_file,
      849,
      'Given directory is read only=%s',
      ('/tmp/run/checkpoints',),
      None,
  )
  assert not keep(notice)
  assert keep(_record(orbax_file, std_logging.WARNING))


def test_tensorflow_loads_without_start_up_notices():
  code = (
      'import sys; from vit_jax.process import runtime; runtime.quiet_library_logs(); '
      'import tensorflow as tf; tf.constant(1); print("after", file=sys.stderr)'
  )
  result = _python(code, without='TF_CPP_MIN_LOG_LEVEL')
  assert result.returncode == 0, result.stderr
  assert result.stderr == 'after\n'  # Written to stderr after the import: stderr is back.


@pytest.mark.parametrize('platforms', ['tpu', None])
def test_a_platform_that_cannot_start_is_one_line_naming_jax_platforms(monkeypatch, platforms):
  if platforms is None:
    monkeypatch.delenv('JAX_PLATFORMS', raising=False)
  else:
    monkeypatch.setenv('JAX_PLATFORMS', platforms)
  error = RuntimeError(
      "Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so: libtpu.so: "
      'cannot open shared object file: No such file or directory (you may need to uninstall '
      'the failing plugin package, or set JAX_PLATFORMS=cpu to skip this backend.)'
  )
  line = runtime.backend_failure(error)
  assert '\n' not in line and line.startswith("Unable to initialize backend 'tpu'"), line
  assert ('JAX_PLATFORMS=tpu names a platform' in line) == (platforms is not None), line
  assert runtime.backend_failure(RuntimeError('something else')) is None
  assert runtime.backend_failure(ValueError(str(error))) is None


def test_a_config_file_given_twice_is_one_line_naming_the_flag():
  error = absl_flags.DuplicateFlagError(
      "The flag 'config.data_dir' is defined twice. First from absl.flags._flag, second from "
      "absl.flags._flag. Description from first occurrence: An override of config's field"
  )
  assert runtime.flag_error(error) == (
      '--config is given more than once: give one config file, and change its fields with '
      '--config.FIELD=VALUE.'
  )


def test_the_unstarted_writes_of_a_refused_save_are_not_reported_at_exit():
  """A full disk mid-save is one error line: orbax's writes left unstarted are not reported as
  coroutines never awaited; any other never-awaited coroutine still is."""

  async def async_serialize_from_host():
    pass

  async def other():
    pass

  with warnings.catch_warnings(record=True) as caught:
    runtime.quiet_library_logs()
    for coroutine in (async_serialize_from_host(), other()):
      del coroutine
    gc.collect()
  assert [str(w.message) for w in caught if 'never awaited' in str(w.message)] == [
      "coroutine 'test_the_unstarted_writes_of_a_refused_save_are_not_reported_at_exit.<locals>."
      "other' was never awaited"
  ]


def _unknown_key(key: str) -> AttributeError:
  """What ml_collections raises for an override of a field the config lacks."""
  try:
    try:
      try:
        raise KeyError(key)
      except KeyError as e:
        raise KeyError(repr(key)) from e
    except KeyError as e:
      raise AttributeError(e) from e
  except AttributeError as e:
    return e


@pytest.mark.parametrize(
    'flag, line',
    [
        (
            '--config.model.num_classes=5',
            '--config.model.num_classes is not a config field: the class count comes from the '
            'dataset (--config.dataset).',
        ),
        (
            '--config.model.dtype=int32',
            '--config.model.dtype is not a config field; did you mean --config.dtype=int32?',
        ),
        (
            '--config.model.foo=1',
            '--config.model.foo is not a config field (python -m vit_jax.config lists the fields).',
        ),
    ],
)
def test_an_unknown_field_is_named_as_typed_with_where_it_belongs(flag, line):
  key = flag.split('=')[0].rsplit('.', 1)[1]
  argv = ['main.py', '--config=configs/vit.py', '--config.batch_size=8', flag]
  assert runtime.flag_error(_unknown_key(key), argv) == line
  assert runtime.flag_error(_unknown_key(key), ['main.py']) == f'{key!r} is not a config field.'


class OpError(Exception):
  """Stands for TensorFlow's `tf.errors.OpError`, which `runtime` knows by name only."""


class UnknownError(OpError):
  """Stands for `tf.errors.UnknownError`, which wraps a Python error raised in a tf.data thread."""


def test_no_thread_can_start_is_one_line_naming_the_error_and_the_limits():
  line = runtime.thread_failure(RuntimeError("can't start new thread"))
  assert line.startswith(
      "the process cannot start threads (RuntimeError: can't start new thread): a memory "
      '(ulimit -v, now '
  ), line
  wrapped = UnknownError("RuntimeError: can't start new thread\nTraceback (most recent call last):")
  assert runtime.thread_failure(wrapped).startswith(
      "the process cannot start threads (UnknownError: RuntimeError: can't start new thread): "
  )
  assert 'or process (ulimit -u, now ' in line and '\n' not in line
  assert runtime.thread_failure(RuntimeError('other')) is None
  assert runtime.thread_failure(ValueError("can't start new thread")) is None


def test_a_command_that_cannot_start_a_thread_ends_with_that_line(monkeypatch):
  def main(argv):
    del argv
    try:
      raise RuntimeError("can't start new thread")
    except RuntimeError as e:
      raise UnknownError("{{function_node x}} RuntimeError: can't start new thread") from e

  monkeypatch.setattr(sys, 'argv', ['command'])
  monkeypatch.setattr(runtime, 'tensorflow_installed', lambda: False)
  with pytest.raises(SystemExit) as ended:
    runtime.run(main)
  assert ended.value.code.startswith(
      "error: the process cannot start threads (UnknownError: RuntimeError: can't start new "
      'thread): a memory (ulimit -v'
  ), ended.value.code


def test_a_virtual_memory_limit_too_low_for_the_libraries_is_said_before_they_start(monkeypatch):
  import resource  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(resource, 'getrlimit', lambda _: (2_000_000 * 1024, resource.RLIM_INFINITY))
  assert runtime.address_space_warning() == (
      'warning: the virtual memory limit (ulimit -v 2000000) is below the 32 GiB of address space '
      'JAX and TensorFlow reserve; they may fail or hang starting their threads. Raise it (ulimit '
      '-v unlimited) and limit memory with ulimit -m or a cgroup instead.'
  )
  monkeypatch.setattr(resource, 'getrlimit', lambda _: (resource.RLIM_INFINITY,) * 2)
  assert runtime.address_space_warning() is None
