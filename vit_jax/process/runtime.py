"""Process-wide settings every command runs under (`run`): malloc's, TensorFlow's and XLA's on CPU
hosts (`configure`, before JAX starts its backend), and which libraries' log lines are shown.

glibc malloc keeps freed memory (XLA allocates every execution's temporary buffer afresh, about
1 GiB for a ViT-Ti/4 step at batch 64, and mmap would fault and zero those pages each step);
TensorFlow's CPU tensors come from its BFC allocator; XLA's CPU compiler leaves matmuls to Eigen,
faster than YNNPACK fusions on ViT's shapes. Settings already in the environment are kept.
"""

import contextlib
import ctypes
import importlib.metadata
import importlib.util
import logging
import os
import platform
import re
import sys
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

from absl import app
from absl import flags as absl_flags
from absl import logging as absl_logging

from vit_jax.process import exits
from vit_jax.process import extensions

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # vit_jax/

# Each flag is added unless XLA_FLAGS already names it, with the first jaxlib that knows it (XLA
# aborts on flags it does not know).
CPU_XLA_FLAGS = {'--xla_cpu_experimental_ynn_fusion_type=': (0, 10, 0)}

# Read by TensorFlow when it creates its CPU allocator, at its first tensor.
TF_BFC_ENV = 'TF_CPU_ALLOCATOR_USE_BFC'
# Read by TensorFlow when it creates its thread pools: the threads one op may split its work over.
TF_INTRA_OP_ENV = 'TF_NUM_INTRAOP_THREADS'

# mallopt(3) parameters of glibc.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def keep_freed_host_memory() -> bool:
  """Makes glibc malloc reuse freed memory instead of returning it; False if not glibc."""
  if platform.system() != 'Linux' or platform.libc_ver()[0] != 'glibc':
    return False
  try:
    libc = ctypes.CDLL('libc.so.6')
  except OSError:
    return False
  # A threshold of -1 reads as the largest size_t: the heap top is never trimmed.
  settings = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1), (_M_ARENA_MAX, 1))
  return all(libc.mallopt(parameter, value) == 1 for parameter, value in settings)


def jaxlib_version() -> tuple[int, ...]:
  """The installed jaxlib's (major, minor, patch), without importing it; () if unknown."""
  try:
    text = importlib.metadata.version('jaxlib')
  except importlib.metadata.PackageNotFoundError:
    return ()
  return tuple(int(part) for part in re.findall(r'\d+', text)[:3])


def add_xla_flags(flags: Mapping[str, tuple[int, ...]] = CPU_XLA_FLAGS) -> str:
  """Appends each flag that the installed jaxlib knows to XLA_FLAGS, unless that option is
  already set; returns XLA_FLAGS."""
  current = os.environ.get('XLA_FLAGS', '')
  version = jaxlib_version()
  for flag, since in flags.items():
    if version >= since and flag.split('=')[0] not in current:
      current = f'{current} {flag}'.strip()
  os.environ['XLA_FLAGS'] = current
  return current


def tensorflow_reuses_freed_memory() -> str:
  """Makes TensorFlow's CPU tensors come from its BFC allocator, which reuses freed blocks, unless
  the environment says otherwise; returns the setting."""
  return os.environ.setdefault(TF_BFC_ENV, 'true')


def tensorflow_ops_on_one_thread() -> str:
  """Makes each TensorFlow op run on one thread unless the environment says otherwise (`tf.data`
  maps already work on one image per core); returns the setting."""
  return os.environ.setdefault(TF_INTRA_OP_ENV, '1')


def configure() -> dict[str, object]:
  """Applies the four settings; returns what was applied, for logs and benchmark reports."""
  return {
      'keep_freed_host_memory': keep_freed_host_memory(),
      TF_BFC_ENV: tensorflow_reuses_freed_memory(),
      TF_INTRA_OP_ENV: tensorflow_ops_on_one_thread(),
      'XLA_FLAGS': add_xla_flags(),
  }


def _expected_library_report(record: logging.LogRecord) -> bool:
  """Library reports of states vit_jax creates or handles on purpose."""
  message = record.getMessage()
  return (
      # asyncio's report of a read that orbax gave up on (an unreadable checkpoint, skipped).
      (record.name == 'asyncio' and 'exception was never retrieved' in message)
      # orbax's traceback of a failed save, which it re-raises in the caller (`Workdir.save`).
      or (
          record.levelno >= logging.ERROR
          and record.exc_info is not None
          and f'{os.sep}orbax{os.sep}checkpoint{os.sep}' in record.pathname
      )
      # orbax: a work directory opened to be read (`Workdir.open`), a checkpoint's metadata not
      # written yet or set aside; TFDS: a variant folder while a dataset is prepared.
      or message.startswith(
          ('Given directory is read only', 'Metadata file does not exist', 'Variant folder ')
      )
  )


@contextlib.contextmanager
def quiet_preparation() -> Iterator[None]:
  """TFDS's progress bars and its printed "Downloading and preparing dataset ..." lines are left
  out of a run's output while a dataset is prepared, unless --verbosity is 1 or more."""
  if absl_logging.get_verbosity() >= 1:
    yield
    return
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  tfds.disable_progress_bar()
  try:
    with contextlib.redirect_stdout(open(os.devnull, 'w', encoding='utf-8')) as devnull:
      with devnull:
        yield
  finally:
    tfds.enable_progress_bar()


def _own_or_important(record: logging.LogRecord) -> bool:
  """vit_jax's records, every library's warnings and errors but `_expected_library_report`'s, and
  everything at --verbosity ≥ 1."""
  if absl_logging.get_verbosity() >= 1:
    return True
  return not _expected_library_report(record) and (
      record.levelno >= logging.WARNING or record.pathname.startswith(_PACKAGE_DIR)
  )


@contextlib.contextmanager
def _native_stderr_discarded() -> Iterator[None]:
  """Points file descriptor 2 at /dev/null for the block (Python exceptions still propagate)."""
  sys.stderr.flush()
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


def _is_closed_event_loop(kind: type, value: BaseException) -> bool:
  return kind is RuntimeError and str(value) == 'Event loop is closed'


def _is_abandoned_read(unraisable: Any) -> bool:
  """An orbax array read closed unfinished (its checkpoint was found unreadable and skipped):
  the read turns the GeneratorExit of its closing into an error of its own."""
  name = getattr(unraisable.object, '__qualname__', '')
  cause = getattr(unraisable.exc_value, '__cause__', None)
  return name == '_read_array_index_and_device_put' and isinstance(cause, GeneratorExit)


def _silence_closed_event_loops() -> None:
  """Drops the 'Event loop is closed' tracebacks (hundreds) of the reads tensorstore completes
  after a failed orbax read (an unreadable checkpoint, reported and skipped)."""
  excepthook, unraisablehook = sys.excepthook, sys.unraisablehook
  if getattr(unraisablehook, 'drops_closed_event_loops', False):
    return  # Installed already.

  def quiet_excepthook(kind, value, traceback):
    if not _is_closed_event_loop(kind, value):
      excepthook(kind, value, traceback)

  def quiet_unraisablehook(unraisable):
    if not (
        _is_closed_event_loop(unraisable.exc_type, unraisable.exc_value)
        or _is_abandoned_read(unraisable)
    ):
      unraisablehook(unraisable)

  setattr(quiet_unraisablehook, 'drops_closed_event_loops', True)
  sys.excepthook, sys.unraisablehook = quiet_excepthook, quiet_unraisablehook


def quiet_library_logs() -> None:
  """Shows below WARNING only vit_jax's own lines (told apart on absl's shared handler by the file
  that logged), unless --verbosity is 1 or more. TensorFlow is imported here with its C++ start-up
  notices discarded (they ignore `TF_CPP_MIN_LOG_LEVEL` unless it is 0): call this first."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  if os.environ['TF_CPP_MIN_LOG_LEVEL'] != '0' and tensorflow_installed():
    with _native_stderr_discarded():
      import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
  handler = absl_logging.get_absl_handler()
  if _own_or_important not in handler.filters:
    handler.addFilter(_own_or_important)
  _silence_closed_event_loops()
  warnings.filterwarnings(
      'ignore',
      message=r"coroutine '[^']*async_serialize[^']*' was never awaited",
      category=RuntimeWarning,
  )


def tensorflow_installed() -> bool:
  """Whether TensorFlow can be imported: the input pipeline needs it; a JAX-only machine still
  runs what needs no data (`benchmark --mode=device_report`'s model rows)."""
  return importlib.util.find_spec('tensorflow') is not None


def error_chain(error: BaseException) -> list[BaseException]:
  """`error` and the exceptions it was raised from, outermost first."""
  chain = [error]
  while (raised_from := chain[-1].__cause__ or chain[-1].__context__) is not None:
    chain.append(raised_from)
  return chain


def _override_naming(key: str, argv: Sequence[str]) -> tuple[str, str] | None:
  """(flag, value) of the first field override in `argv` ('--config.model.x=1') whose dotted
  name has the part `key`, as typed; None if none has."""
  for arg in argv:
    name, _, value = arg.partition('=')
    override = re.fullmatch(r'--?(?:no)?\w+\.([\w.]+)', name)
    if override and key in override.group(1).split('.'):
      return name, value
  return None


def _unknown_field(key: str, argv: Sequence[str]) -> str:
  """One line for an override of a field the config lacks: the flag as typed, and where the value
  belongs instead if that is known."""
  named = _override_naming(key, argv)
  if named is None:
    return f'{key!r} is not a config field.'
  flag, value = named
  prefix, last = flag[: flag.index('.') + 1], flag.rsplit('.', 1)[1]
  if last == 'num_classes':
    return (
        f'{flag} is not a config field: the class count comes from the dataset ({prefix}dataset).'
    )
  schema = sys.modules.get('vit_jax.schema.config')  # Loaded by the config file; above this layer.
  fields = getattr(schema, 'FIELDS', ())
  if flag != f'{prefix}{last}' and any(field.name == last for field in fields):
    return f'{flag} is not a config field; did you mean {prefix}{last}={value or "VALUE"}?'
  return f'{flag} is not a config field (python -m vit_jax.config lists the fields).'


def flag_error(error: Exception, argv: Sequence[str] | None = None) -> str:
  """One line for flags that cannot be read: a missing config file, a misspelt field, a bad
  value; `argv` (default `sys.argv`) names the override of a field the config lacks as typed."""
  chain = error_chain(error)
  root = chain[-1]
  lines = [line.strip() for line in str(root).splitlines() if line.strip()]
  misspelt = re.search(r'Did you mean "([\w.]+)" instead of "([\w.]+)"', ' '.join(map(str, chain)))
  if misspelt:  # ml_collections' suggestion first.
    return f'Did you mean "{misspelt.group(1)}"? "{misspelt.group(2)}" is not a config field.'
  if isinstance(root, KeyError):
    return _unknown_field(str(root.args[0]), sys.argv if argv is None else argv)
  twice = re.match(r"The flag '(\w+)\.[\w.]+' is defined twice", str(root))
  if isinstance(root, absl_flags.DuplicateFlagError) and twice:  # Its fields' flags, redefined.
    name = twice.group(1)
    return (
        f'--{name} is given more than once: give one config file, and change its fields with '
        f'--{name}.FIELD=VALUE.'
    )
  if isinstance(root, OSError) and lines:  # The config file: its path and why it did not load.
    return f'cannot load the config file: {lines[-1]}'
  if isinstance(error, absl_flags.Error) and 'Error whilst parsing config file' not in str(error):
    return str(error).strip().splitlines()[0]  # Names the flag: '--config.x=abc: invalid ...'.
  return lines[-1] if lines else type(root).__name__


def backend_failure(error: BaseException) -> str | None:
  """One line for a JAX platform that cannot start (`JAX_PLATFORMS` naming one this machine lacks,
  a GPU without its driver); None for any other error."""
  text = str(error).strip()
  if not (isinstance(error, RuntimeError) and text.startswith('Unable to initialize backend')):
    return None
  platforms = os.environ.get('JAX_PLATFORMS')
  hint = (
      f'JAX_PLATFORMS={platforms} names a platform this machine cannot start: unset it, or '
      'name one it has, e.g. JAX_PLATFORMS=cpu.'
      if platforms
      else "install the platform's JAX plugin and driver, or set JAX_PLATFORMS=cpu."
  )
  return f'{text.splitlines()[0].rstrip(".")}. {hint}'


def _ulimit(resource_id: int, unit: int = 1) -> str:
  """A soft resource limit as `ulimit` shows it: 'unlimited', or the limit in `unit`s."""
  import resource  # pylint: disable=g-import-not-at-top

  soft = resource.getrlimit(resource_id)[0]
  return 'unlimited' if soft == resource.RLIM_INFINITY else str(soft // unit)


# Below this virtual memory limit (ulimit -v) JAX and TensorFlow, which reserve address space far
# beyond what they use, fail or hang in their native thread pools.
MIN_ADDRESS_SPACE = 32 * 2**30


def address_space_warning() -> str | None:
  """One line where a virtual memory limit (`ulimit -v`) is set below `MIN_ADDRESS_SPACE`, said
  before the libraries start; None otherwise."""
  import resource  # pylint: disable=g-import-not-at-top

  soft = resource.getrlimit(resource.RLIMIT_AS)[0]
  if soft == resource.RLIM_INFINITY or soft >= MIN_ADDRESS_SPACE:
    return None
  return (
      f'warning: the virtual memory limit (ulimit -v {soft // 1024}) is below the '
      f'{MIN_ADDRESS_SPACE // 2**30} GiB of address space JAX and TensorFlow reserve; they may fail '
      'or hang starting their threads. Raise it (ulimit -v unlimited) and limit memory with '
      'ulimit -m or a cgroup instead.'
  )


def thread_failure(error: BaseException) -> str | None:
  """One line for a process that cannot start a thread (Python's RuntimeError, or TensorFlow's
  error wrapping it, raised by the input pipeline); None for any other error."""
  for cause in error_chain(error):
    kinds = {kind.__name__ for kind in type(cause).__mro__}
    found = re.search(r"(\w+: )?can't start new thread", str(cause))
    if found and kinds & {'RuntimeError', 'OpError'}:
      break
  else:
    return None
  import resource  # pylint: disable=g-import-not-at-top

  name = type(cause).__name__
  what = found.group(0) if found.group(0).startswith(f'{name}: ') else f'{name}: {found.group(0)}'
  return (
      f'the process cannot start threads ({what}): a memory (ulimit -v, now '
      f'{_ulimit(resource.RLIMIT_AS, 1024)}) or process (ulimit -u, now '
      f'{_ulimit(resource.RLIMIT_NPROC)}) limit is too low; raise it, e.g. ulimit -v unlimited.'
  )


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, where every unusable flag or config file is one line on stderr; a config
  file imports the modules beside it (`extensions.make_config_folders_importable`)."""
  extensions.make_config_folders_importable(argv, absl_flags.FLAGS)
  try:
    remaining = absl_flags.FLAGS(argv)
    for name in absl_flags.FLAGS:  # A config file that failed to load raises when first read.
      getattr(absl_flags.FLAGS[name].value, 'keys', None)
  except Exception as e:  # pylint: disable=broad-except
    sys.exit(f'error: {flag_error(e, argv)}')
  return remaining


def run(
    main: Callable[[list[str]], None],
    *,
    takes_arguments: bool = False,
    before_libraries: Callable[[], None] | None = None,
) -> None:
  """Runs a command's `main(argv)` under absl after flags (`--help` loads no library),
  `before_libraries`, quiet logs and TensorFlow kept off the accelerators; a `ValueError`, a
  platform or threads that cannot start end it in one line, `error: ...`, status 1."""

  def prologue_then_main(argv: list[str]) -> None:
    if argv[1:] and not takes_arguments:  # One line, not absl's whole usage text.
      sys.exit(
          f'error: unexpected argument(s) {" ".join(map(repr, argv[1:]))}: every setting '
          'is a flag (--helpfull lists them).'
      )
    try:
      if warning := address_space_warning():
        exits.write_line(warning)
      if before_libraries is not None:
        before_libraries()
      quiet_library_logs()
      if tensorflow_installed():
        import tensorflow as tf  # pylint: disable=g-import-not-at-top

        tf.config.set_visible_devices([], 'GPU')
      with exits.closed_output_ends_quietly():
        main(argv)
    except KeyboardInterrupt:
      absl_logging.debug('Interrupted.', exc_info=True)
      exits.write_line(
          'Interrupted (Ctrl-C): stopped; what it writes is written whole or not at all.'
      )
      sys.exit(exits.EXIT_INTERRUPTED)
    except ValueError as e:
      absl_logging.debug('Stopped by an error.', exc_info=True)
      sys.exit(f'error: {e}')
    except Exception as e:  # pylint: disable=broad-except
      line = backend_failure(e) or thread_failure(e)
      if line is None:
        raise
      absl_logging.debug('Stopped by an error.', exc_info=True)
      sys.exit(f'error: {line}')

  app.run(prologue_then_main, flags_parser=parse_flags)
