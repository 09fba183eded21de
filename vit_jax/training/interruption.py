"""SIGTERM, Ctrl-C and SIGHUP (`exits.SIGNALS`), remembered for the whole of a command that watches for them.

Watching scopes nest (`run_sequence.Stopper` around each `train.PreemptionWatcher`) and read one
flag, set by the outermost scope's handler, so a signal between two scopes is seen by the next.
"""

import contextlib
import signal
from typing import Iterator

from absl import logging

from vit_jax.process import exits

_requested: str | None = None  # The first signal's name while watching.
_notices: list[str] = []  # What each open scope does on a signal, the innermost last.
_at_once: list[bool] = []  # Whether each open scope stops at once (`stopping_at_once`).


class Stopped(Exception):
  """A signal came inside `stopping_at_once`: what that scope did is abandoned."""


def requested() -> str | None:
  """'SIGTERM', 'SIGINT' or 'SIGHUP' if one came while a scope was open (and one still is), else
  None."""
  return _requested


@contextlib.contextmanager
def watching(notice: str, *, at_once: bool = False) -> Iterator[None]:
  """Remembers SIGTERM and Ctrl-C while open; the first is logged with `notice` (what happens
  next), a second Ctrl-C raises KeyboardInterrupt at once; with `at_once` the first raises
  `Stopped` (`stopping_at_once`). Off the main thread nothing is installed (signals reach only
  the main thread's handlers)."""
  global _requested
  previous = {}
  if not _notices:
    try:
      for signum in exits.watched_signals():
        previous[signum] = signal.signal(signum, _on_signal)
    except ValueError:  # Not the main thread.
      pass
  _notices.append(notice)
  _at_once.append(at_once)
  try:
    yield
  finally:
    _notices.pop()
    _at_once.pop()
    for signum, handler in previous.items():
      signal.signal(signum, handler)
    if not _notices:
      _requested = None


def stopping_at_once(notice: str) -> contextlib.AbstractContextManager[None]:
  """`watching` where the first SIGTERM or Ctrl-C (or one that came before) is logged with
  `notice` and raises `Stopped` at once: for work that nothing saves, such as the evaluation after
  the last checkpoint."""
  if _requested:
    logging.warning('%s: %s.', _requested, notice)
    raise Stopped(_requested)
  return watching(notice, at_once=True)


def _on_signal(signum, frame) -> None:
  global _requested
  del frame
  if signum == signal.SIGINT and _requested:
    raise KeyboardInterrupt
  _requested = signal.Signals(signum).name
  at_once = bool(_at_once and _at_once[-1])
  logging.warning(
      '%s: %s%s.',
      _requested,
      _notices[-1] if _notices else 'stopping',
      ' (Ctrl-C again stops at once)' if signum == signal.SIGINT and not at_once else '',
  )
  if at_once:
    raise Stopped(_requested)
