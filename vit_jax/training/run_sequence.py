"""Several trainings in a row (an ablation grid): SIGTERM or Ctrl-C stops between them, and a
rerun skips the ones that finished.

Inside a training, `train.PreemptionWatcher` owns the signals (it saves a checkpoint and the
training returns `preempted`); between trainings `Stopper` holds them, so an interruption while a
run is evaluated, analysed or timed lets that piece finish and stops before the next. Each
finished run's measurements are recorded beside its checkpoints (`RECORD_FILE`) with the config
that produced them, and read back instead of being measured again on a rerun of that config.
"""

import json
import os
import signal
from typing import Any

from absl import logging
import ml_collections

EXIT_PREEMPTED = os.EX_TEMPFAIL  # 75: interrupted; rerunning the same command resumes.
RECORD_FILE = 'measured.json'
_STDERR = os.dup(2)  # Kept: the TensorFlow import points fd 2 at /dev/null for a while.


class Interrupted(Exception):
  """SIGTERM or Ctrl-C stopped the sequence; the message says where and how to resume."""


class Stopper:
  """Watches SIGTERM and Ctrl-C between the trainings of a sequence (a context manager).

  The first signal is remembered and `check` raises Interrupted at the next boundary; a second
  Ctrl-C raises KeyboardInterrupt at once. The previous handlers come back on exit.
  """

  def __init__(self):
    self.requested: str | None = None
    self._previous = {}

  def __enter__(self) -> 'Stopper':
    for signum in (signal.SIGTERM, signal.SIGINT):
      self._previous[signum] = signal.signal(signum, self._on_signal)
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def _on_signal(self, signum, frame) -> None:
    del frame
    if signum == signal.SIGINT and self.requested:
      raise KeyboardInterrupt
    self.requested = signal.Signals(signum).name
    logging.warning(
        '%s: stopping after the current step of the sequence (Ctrl-C again stops at ' 'once).',
        self.requested,
    )

  def check(self, before: str) -> None:
    """Raises Interrupted if a signal came; `before` names the training not yet started."""
    if self.requested:
      raise Interrupted(
          f'{self.requested}: stopped before {before}; the finished trainings are '
          'recorded. Rerun the same command to resume where it stopped.'
      )


def stop_at_once(signum, frame) -> None:
  """A handler for SIGTERM and Ctrl-C while a command starts (imports, flags): nothing has been
  trained, so the process ends now with one line and EXIT_PREEMPTED."""
  del frame
  os.write(
      _STDERR,
      f'{signal.Signals(signum).name}: stopped before any training started. Rerun the '
      'same command to resume.\n'.encode(),
  )
  os._exit(EXIT_PREEMPTED)  # pylint: disable=protected-access


def _config_text(config: ml_collections.ConfigDict) -> str:
  return config.to_json_best_effort(sort_keys=True)


def recorded(run_dir: str, config: ml_collections.ConfigDict) -> dict[str, Any] | None:
  """The measurements recorded for `run_dir` trained with `config`; None if there are none, or
  they came from another config (that run is trained and measured again)."""
  path = os.path.join(run_dir, RECORD_FILE)
  try:
    with open(path, encoding='utf-8') as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  if not isinstance(record, dict) or record.get('config') != _config_text(config):
    return None
  return record.get('measured')


def record(run_dir: str, config: ml_collections.ConfigDict, measured: dict[str, Any]) -> None:
  """Records `measured` for `run_dir` and `config` (written whole or not at all)."""
  path = os.path.join(run_dir, RECORD_FILE)
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    json.dump({'config': _config_text(config), 'measured': measured}, f)
  os.replace(path + '.tmp', path)
