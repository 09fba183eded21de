"""How a command ends: exit statuses, its last line when it must end at once, and a quiet end when
its reader stops reading (`| head`). Standard library only, so signals are watched before the slow
imports."""

import contextlib
import os
import signal
import sys
from typing import Iterator

EXIT_PREEMPTED = os.EX_TEMPFAIL  # 75: interrupted; rerunning the same command resumes.
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130: a side command stopped by Ctrl-C, as shells report.
EXIT_PIPE_CLOSED = 128 + signal.SIGPIPE  # 141: the reader of the output stopped reading.
# What stops a run: SIGTERM (a scheduler's preemption), Ctrl-C and SIGHUP (its terminal or ssh
# session closed), unless the process ignores SIGHUP (`nohup`), which then keeps it running.
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def watched_signals() -> tuple[signal.Signals, ...]:
  """`SIGNALS`, but SIGHUP where this process ignores it (`nohup`)."""
  return tuple(
      s for s in SIGNALS if s != signal.SIGHUP or signal.getsignal(s) is not signal.SIG_IGN
  )


_STDERR = os.dup(2)  # Kept: the TensorFlow import points fd 2 at /dev/null for a while.


def write_line(line: str) -> None:
  """`line` on the process's standard error as it was at start, wherever fd 2 points now."""
  os.write(_STDERR, (line.rstrip('\n') + '\n').encode())


def end_at_once_on_signals(what_then: str) -> None:
  """Until a training loop watches them: SIGTERM, Ctrl-C or SIGHUP end the process at once with
  '<SIGNAL>: <what_then>' and EXIT_PREEMPTED, however deep in an import or a compilation it is,
  as nothing a checkpoint would keep has been trained."""

  def end(signum, frame) -> None:
    del frame
    write_line(f'{signal.Signals(signum).name}: {what_then}')
    os._exit(EXIT_PREEMPTED)  # pylint: disable=protected-access

  for signum in watched_signals():
    signal.signal(signum, end)


@contextlib.contextmanager
def closed_output_ends_quietly() -> Iterator[None]:
  """A reader that stops reading (`| head`) ends the command with EXIT_PIPE_CLOSED, no traceback;
  stdout goes to /dev/null so that Python's flush at exit does not fail again."""
  try:
    yield
  except BrokenPipeError:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(EXIT_PIPE_CLOSED)
