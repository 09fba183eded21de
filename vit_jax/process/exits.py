"""How a command ends: its exit status when interrupted, its last line when it must end at once,
and its quiet end when the reader of its output stops reading (`| head`).

Free of everything but the standard library, so that `vit_jax.main` and `vit_jax.ablate` watch
for SIGTERM and Ctrl-C before the imports that take seconds, and a process of a multi-process run
can say why it ends while TensorFlow's import has fd 2 pointed elsewhere.
"""

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
  """A reader that stops reading the output (`| head`) ends the command with EXIT_PIPE_CLOSED and
  no traceback, as command-line tools end; standard output goes to /dev/null first, so that
  Python's flush at exit does not fail on the closed pipe again."""
  try:
    yield
  except BrokenPipeError:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(EXIT_PIPE_CLOSED)
