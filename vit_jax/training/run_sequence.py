"""Several trainings in a row (an ablation grid): SIGTERM or Ctrl-C stops between them (`Stopper`),
and a rerun reads back the measurements each finished run recorded (`RECORD_FILE`) with its config.
"""

import contextlib
import json
import os
from typing import Any

import ml_collections

from vit_jax.training import interruption
from vit_jax.workdir import disk_writes

RECORD_FILE = 'measured.json'


class Interrupted(Exception):
  """SIGTERM or Ctrl-C stopped the sequence; the message says where and how to resume."""


class Stopper:
  """Watches SIGTERM and Ctrl-C for a whole sequence of trainings, in `interruption`'s flag: the
  training under way stops at its next step, or `check` raises Interrupted at the next boundary."""

  def __init__(self):
    self._scope = contextlib.ExitStack()

  def __enter__(self) -> 'Stopper':
    self._scope.enter_context(
        interruption.watching('stopping after the current step of the sequence')
    )
    return self

  def __exit__(self, *exc_info) -> None:
    self._scope.close()

  @property
  def requested(self) -> str | None:
    """The signal that asked to stop ('SIGTERM', 'SIGINT'), else None."""
    return interruption.requested()

  def check(self, before: str) -> None:
    """Raises Interrupted if a signal came; `before` names the training not yet started."""
    if self.requested:
      raise Interrupted(
          f'{self.requested}: stopped before {before}; the finished trainings are '
          'recorded. Rerun the same command to resume where it stopped.'
      )


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
  with disk_writes.replaced_whole(os.path.join(run_dir, RECORD_FILE)) as partial:
    with open(partial, 'w', encoding='utf-8') as f:
      json.dump({'config': _config_text(config), 'measured': measured}, f)
