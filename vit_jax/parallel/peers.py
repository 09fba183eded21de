"""The other processes of a multi-process run: noticing that one died, and ending this one fast.

When a process of a run dies, the others learn it in one of two ways. A collective they are in
fails at once (gloo: "Connection closed by peer"); or JAX's coordination service misses its
heartbeats for `HEARTBEAT_TIMEOUT_S` and ends every other process with its own fatal error
(exit 134) — the way it goes when no collective is under way, and at once when process 0, the
coordinator, died; jax.distributed.initialize offers no hook to end them otherwise.
In the first case `end_run` makes the survivor say so in one line and exit with
`EXIT_PREEMPTED` at once: left to itself it would print a traceback and wait minutes in JAX's
distributed shutdown for the dead process before aborting. A process that stops on an error of
its own also skips that shutdown (`exit_now`), so that its peers' collectives fail at once
instead of waiting for it.

jax is imported where it is used: the commands import this module before it.
"""

import faulthandler
import logging as python_logging
import os
import sys
from typing import NoReturn

EXIT_PREEMPTED = os.EX_TEMPFAIL  # 75: rerunning every process resumes from the last checkpoint.
# JAX's default is 100 s; a dead process stops the run this long after its last heartbeat.
HEARTBEAT_TIMEOUT_S = 10
# Words of the runtime's errors for a connection to another process that was lost. Gloo's come as
# a ValueError, XLA's as JaxRuntimeError: the words decide, whatever the type.
_LOST_CONNECTION = (
    'connection closed by peer',
    'connection reset by peer',
    'socket closed',
    'broken pipe',
    'stopped sending heartbeats',
    'remote process exited',
)
_STDERR = os.dup(2)  # Kept: the TensorFlow import points fd 2 at /dev/null for a while.


def initialize_options() -> dict[str, int]:
  """Arguments for `jax.distributed.initialize` beside the cluster's: the heartbeat timeout."""
  return {'heartbeat_timeout_seconds': HEARTBEAT_TIMEOUT_S}


def quiet_fatal_errors(verbosity: int) -> None:
  """Leaves Python's dump of every thread and extension module out of JAX's fatal error (its
  own line says a task died), unless `verbosity` is 1 or more: absl enables that dump."""
  if verbosity < 1:
    faulthandler.disable()


def _chain(error: BaseException) -> list[BaseException]:
  chain = [error]
  while (chain[-1].__cause__ or chain[-1].__context__) is not None and len(chain) < 20:
    chain.append(chain[-1].__cause__ or chain[-1].__context__)
  return chain


def lost_peer(error: BaseException) -> str | None:
  """The runtime's words where `error` says a connection to another process was lost (a peer
  died); None for any other error."""
  for link in _chain(error):
    text = ' '.join(str(link).split())
    if any(word in text.lower() for word in _LOST_CONNECTION):
      return text[:200]
  return None


def dead_processes() -> list[int]:
  """The processes that JAX's coordination service no longer counts as alive ([] where it still
  counts them all, or cannot be asked)."""
  import jax  # pylint: disable=g-import-not-at-top

  try:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top

    client = distributed.global_state.client
    alive = client.get_live_nodes(list(range(jax.process_count())))
  except Exception:  # pylint: disable=broad-except
    return []
  return sorted(set(range(jax.process_count())) - set(alive))


def exit_now(code: int, line: str = '') -> NoReturn:
  """Ends this process with `code` after writing `line` and flushing the logs, skipping JAX's
  distributed shutdown, which waits for every other process (minutes, for a dead one)."""
  for handler in python_logging.getLogger().handlers + python_logging.getLogger('absl').handlers:
    try:
      handler.flush()
    except Exception:  # pylint: disable=broad-except
      pass
  sys.stdout.flush()
  sys.stderr.flush()
  if line:
    os.write(_STDERR, (line.rstrip('\n') + '\n').encode())
  os._exit(code)  # pylint: disable=protected-access


def end_run(error: BaseException, workdir: str) -> NoReturn | None:
  """Where `error` is a lost peer in a multi-process run, ends this process with one line naming
  the dead process(es) and EXIT_PREEMPTED; otherwise returns."""
  import jax  # pylint: disable=g-import-not-at-top

  words = lost_peer(error) if jax.process_count() > 1 else None
  if words is None:
    return None
  dead = dead_processes()
  who = (
      f'process {", ".join(map(str, dead))} of {jax.process_count()}'
      if dead
      else f'another of the {jax.process_count()} processes'
  )
  exit_now(
      EXIT_PREEMPTED,
      f'error: {who} stopped (process {jax.process_index()} lost its connection: {words}); '
      f'the checkpoints in {workdir} are intact. Rerun all processes to resume.',
  )
