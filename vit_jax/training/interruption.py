"""SIGTERM and Ctrl-C, remembered for the whole of a command that watches for them.

Watching scopes nest: `vit_jax.ablate` watches for its whole grid (`run_sequence.Stopper`), each
training inside it for its loop (`train.PreemptionWatcher`). All of them read one flag, set by one
handler that the outermost scope installs, so a signal that lands between two scopes (a training
setting up, after the grid's last check) is still seen by the next one to look. The flag is
cleared, and the handlers from before come back, when the outermost scope ends.
"""

import contextlib
import signal
from typing import Iterator

from absl import logging

from vit_jax import exits

_requested: str | None = None  # The first signal's name while watching.
_notices: list[str] = []  # What each open scope does on a signal, the innermost last.


def requested() -> str | None:
  """'SIGTERM' or 'SIGINT' if one came while a scope was open (and one still is), else None."""
  return _requested


@contextlib.contextmanager
def watching(notice: str) -> Iterator[None]:
  """Remembers SIGTERM and Ctrl-C while open; the first is logged with `notice` (what happens
  next), a second Ctrl-C raises KeyboardInterrupt at once. Off the main thread nothing is
  installed (signals reach only the main thread's handlers)."""
  global _requested
  previous = {}
  if not _notices:
    try:
      for signum in exits.SIGNALS:
        previous[signum] = signal.signal(signum, _on_signal)
    except ValueError:  # Not the main thread.
      pass
  _notices.append(notice)
  try:
    yield
  finally:
    _notices.pop()
    for signum, handler in previous.items():
      signal.signal(signum, handler)
    if not _notices:
      _requested = None


def _on_signal(signum, frame) -> None:
  global _requested
  del frame
  if signum == signal.SIGINT and _requested:
    raise KeyboardInterrupt
  _requested = signal.Signals(signum).name
  logging.warning(
      '%s: %s%s.',
      _requested,
      _notices[-1] if _notices else 'stopping',
      ' (Ctrl-C again stops at once)' if signum == signal.SIGINT else '',
  )
