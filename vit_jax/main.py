r"""Trains and evaluates a model: `python -m vit_jax.main --config=configs/vit.py --workdir=/tmp/vit`.

The same command runs on a laptop, a GPU box, every task of a SLURM job step and every worker of a
Cloud TPU VM pod: when a multi-process run is detected (see `vit_jax.parallel.distributed`) JAX's
distributed runtime is initialised first; `--distributed=on|off` overrides the detection.
Override any config field with `--config.FIELD=VALUE`, or pass `key=value` pairs after the config
path: `--config=configs/vit.py:variant=S/16,dataset=cifar10`.

Exit status: 0 the run finished; 1 it was refused or failed (one line says why: a bad config,
a work directory in use or of another model, missing data); 75 (`exits.EXIT_PREEMPTED`,
EX_TEMPFAIL) it was interrupted (SIGTERM, Ctrl-C) and, where training had started, saved a
checkpoint: rerun the same command to resume.
"""

import sys

from vit_jax.process import exits  # Standard library only: watching the signals comes first.

if __name__ == '__main__':  # Before the imports that take seconds.
  exits.end_at_once_on_signals(
      "stopped before any training step could be saved; the work directory's checkpoints "
      '(if any) are intact. Rerun the same command to resume.'
  )

from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position
from ml_collections import config_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax.schema import checks as config_checks  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.parallel import distributed  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.parallel import peers  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.process import extensions  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.process import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Training configuration file.', lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Directory for checkpoints, logs and results.', required=True
)
_DISTRIBUTED = flags.DEFINE_enum(
    'distributed',
    'auto',
    ['auto', 'on', 'off'],
    "Join a multi-process run. 'auto': when one is detected (the flags below or their JAX_* "
    "environment variables, a SLURM job step of several tasks, Open MPI, a Cloud TPU VM); 'on': "
    "always call jax.distributed.initialize() and let JAX find the cluster; 'off': never.",
)
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address',
    None,
    'host:port of process 0, for multi-process runs started by hand '
    '(default: $JAX_COORDINATOR_ADDRESS).',
)
_NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes',
    None,
    'Number of processes, with --coordinator_address (default: ' '$JAX_NUM_PROCESSES).',
    lower_bound=1,
)
_PROCESS_ID = flags.DEFINE_integer(
    'process_id',
    None,
    'This process, 0..num_processes-1, with --coordinator_address (default: ' '$JAX_PROCESS_ID).',
    lower_bound=0,
)
extensions.define_allow_imports_flag()  # Reading a run imports its modules only with it.
flags.adopt_module_key_flags(extensions)
flags.mark_flag_as_required('config')


def _first_refusal(error: BaseException) -> Exception | None:
  """The first write the work directory refused, where cleaning up after it failed again."""
  from vit_jax.workdir import disk_writes  # pylint: disable=g-import-not-at-top

  return next(
      (x for x in reversed(runtime.error_chain(error)) if isinstance(x, disk_writes.Unwritable)),
      None,
  )


def _check_config() -> None:
  """The config's fields alone (`config_checks.validate_fields`), before TensorFlow and JAX are
  imported: a mistyped field or dataset is answered in a fraction of a second, as one line."""
  config_checks.validate_fields(_CONFIG.value)


def main(argv) -> None:
  del argv
  logging.debug('Process settings: %s', runtime.configure())  # Before JAX starts its backend.
  distributed.initialize(
      _DISTRIBUTED.value,
      coordinator_address=_COORDINATOR.value,
      num_processes=_NUM_PROCESSES.value,
      process_id=_PROCESS_ID.value,
  )
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax.loop import train  # pylint: disable=g-import-not-at-top
  from vit_jax.workdir import disk_writes  # pylint: disable=g-import-not-at-top
  from vit_jax.workdir import run_files  # pylint: disable=g-import-not-at-top

  if jax.process_index() != 0:  # Process 0 speaks for all; the others report only problems.
    logging.set_verbosity(logging.WARNING)
  logging.debug(
      'JAX process %d of %d; %d local / %d global devices (%s).',
      jax.process_index(),
      jax.process_count(),
      jax.local_device_count(),
      jax.device_count(),
      jax.devices()[0].device_kind,
  )
  try:
    result = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except (ValueError, FloatingPointError) as e:
    peers.end_run(e, _WORKDIR.value)  # A dead process of a multi-process run: one line, exit 75.
    logging.debug('Stopped by an error.', exc_info=True)
    sys.exit(f'error: {_first_refusal(e) or e}')
  except Exception as e:  # A write refused late (summaries, results): one line, else raise.
    peers.end_run(e, _WORKDIR.value)  # A dead process of a multi-process run: one line, exit 75.
    refusal = _first_refusal(e) or disk_writes.unwritable(e, _WORKDIR.value, run_files.ROOM)
    if refusal is None:
      raise
    logging.debug('Stopped by an error.', exc_info=True)
    sys.exit(f'error: {refusal}')
  except KeyboardInterrupt:  # Before the loop could save, or a second Ctrl-C: nothing new saved.
    logging.warning(
        'Interrupted; the newest checkpoint in %s (if any) is intact. Rerun the same '
        'command to resume.',
        _WORKDIR.value,
    )
    sys.exit(exits.EXIT_PREEMPTED)
  if result.preempted:
    sys.exit(exits.EXIT_PREEMPTED)


def main_of_one_process(argv) -> None:
  """`main`, where a process of a multi-process run that stops on an error ends at once (its
  peers' collectives fail now instead of waiting for it; `peers.exit_now`)."""
  try:
    main(argv)
  except SystemExit as e:
    import jax  # pylint: disable=g-import-not-at-top

    if e.code in (0, None) or not jax.distributed.is_initialized():
      raise
    peers.exit_now(
        e.code if isinstance(e.code, int) else 1, '' if isinstance(e.code, int) else str(e.code)
    )
  except Exception:  # pylint: disable=broad-except
    import jax  # pylint: disable=g-import-not-at-top

    if not jax.distributed.is_initialized():
      raise
    import traceback  # pylint: disable=g-import-not-at-top

    traceback.print_exc()
    peers.exit_now(1)


if __name__ == '__main__':
  runtime.run(main_of_one_process, before_libraries=_check_config)
