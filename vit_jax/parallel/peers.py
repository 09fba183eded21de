"""The other processes of a multi-process run: noticing that one died, and ending this one fast.

When a process of a run dies, the others learn it in one of three ways, and each ends them with one
line and `exits.EXIT_PREEMPTED` (rerunning every process resumes from the last checkpoint; exit 1
where the peer stopped on an error of its own):
- `watch`: every worker holds a TCP link to process 0 (the coordinator), opened beside JAX's own
  connections. A process killed or crashed closes its links at once: the coordinator learns that a
  worker died, a worker that the coordinator died, within milliseconds, whatever either is doing
  (preparing data, compiling, waiting at a barrier or in a collective). A process that leaves on
  purpose first says so on its links, with its exit status.
- A worker reaches the coordinator's service through `_Relay`, a local TCP relay, so that JAX's
  client never sees the coordinator's connections reset: it would end the process at once with
  its own fatal error (exit 134, a stack dump), before `watch` could speak.
- A collective under way fails at once (gloo: "Connection closed by peer"): `end_run`.
JAX's coordination service still ends every process with its own fatal error after
`HEARTBEAT_TIMEOUT_S` without heartbeats, where a whole machine vanished without closing its
connections. A process that stops on an error of its own skips JAX's distributed shutdown
(`exit_now`), which would wait minutes for the others.

jax is imported where it is used: the commands import this module before it.
"""

import atexit
import faulthandler
import logging as python_logging
import os
import select
import socket
import sys
import threading
from typing import Any, NoReturn

from vit_jax.process import exits

# JAX's default is 100 s; a machine that vanished stops the run this long after its last heartbeat.
HEARTBEAT_TIMEOUT_S = 10
_LINK_KEY = 'vit_jax/peers/link_port'  # The coordinator's link port, in JAX's key-value store.
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
_EXITING = threading.Lock()  # Held by the thread that ends the process: one line, one status.
_finished = threading.Event()  # This process leaves: a peer that leaves now is no news.
_links: list[socket.socket] = []  # To process 0 from a worker; to every worker from process 0.
_run = {'process': 0, 'count': 0}  # This process and the number of processes.


def initialize(arguments: dict[str, Any]) -> None:
  """`jax.distributed.initialize(**arguments)`, with a worker's client behind a `_Relay` where the
  coordinator's address is known beforehand, and the links of `watch` opened after."""
  import jax  # pylint: disable=g-import-not-at-top

  address, process = arguments.get('coordinator_address'), arguments.get('process_id')
  _run.update(process=process or 0, count=arguments.get('num_processes') or 0)
  relay = _Relay(address) if address and process not in (None, 0) else None
  jax.distributed.initialize(
      **{**arguments, **({'coordinator_address': relay.address} if relay else {})},
      heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
  )
  if address is None:  # Found by JAX (SLURM, MPI, TPU pods): ask it where process 0 is.
    from jax._src import distributed  # pylint: disable=g-import-not-at-top

    address = distributed.global_state.coordinator_address
    if address is None:
      raise RuntimeError('jax.distributed.initialize started without a coordinator address.')
  watch(address, jax.process_index(), jax.process_count())


def quiet_fatal_errors(verbosity: int) -> None:
  """Leaves Python's dump of every thread and extension module out of JAX's fatal error (its
  own line says a task died), unless `verbosity` is 1 or more: absl enables that dump."""
  if verbosity < 1:
    faulthandler.disable()


def _chain(error: BaseException) -> list[BaseException]:
  chain = [error]
  while len(chain) < 20:
    raised_from = chain[-1].__cause__ or chain[-1].__context__
    if raised_from is None:
      break
    chain.append(raised_from)
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
    alive = _coordination_client().get_live_nodes(list(range(jax.process_count())))
  except Exception:  # pylint: disable=broad-except
    return []
  return sorted(set(range(jax.process_count())) - set(alive))


def exit_now(code: int, line: str = '') -> NoReturn:
  """Ends this process with `code` after writing `line`, telling the other processes that it
  leaves on purpose and flushing the logs, skipping JAX's distributed shutdown, which waits for
  every other process (minutes, for a dead one). The first caller of several threads wins."""
  _EXITING.acquire()
  _say_leaving(code)
  for handler in python_logging.getLogger().handlers + python_logging.getLogger('absl').handlers:
    try:
      handler.flush()
    except Exception:  # pylint: disable=broad-except
      pass
  sys.stdout.flush()
  sys.stderr.flush()
  if line:
    exits.write_line(line)
  os._exit(code)  # pylint: disable=protected-access


def end_run(error: BaseException, workdir: str) -> NoReturn | None:
  """Where `error` is a lost peer in a multi-process run, ends this process with one line naming
  the dead process(es) and exits.EXIT_PREEMPTED; otherwise returns."""
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
      exits.EXIT_PREEMPTED,
      f'error: {who} stopped (process {jax.process_index()} lost its connection: {words}); '
      f'the checkpoints in {workdir} are intact. Rerun all processes to resume.',
  )


def _say_leaving(code: int) -> None:
  _finished.set()
  for link in list(_links):
    try:
      link.sendall(f'{code}\n'.encode())
    except OSError:
      pass


def _peer_left(process: int, code: int | None) -> None:
  """Ends this process after `process` left with exit status `code` (None: it was killed or
  crashed). Not where this process leaves itself, nor where a worker left having finished or
  saved (its exit status 0 or 75): this process's own work ends it then."""
  if _finished.is_set() or (process != 0 and code in (0, exits.EXIT_PREEMPTED)):
    return
  me, count = _run['process'], _run['count']
  name = f'process {process} of {count}' + (' (the coordinator)' if process == 0 else '')
  if code not in (None, 0, exits.EXIT_PREEMPTED):
    exit_now(
        1, f'error: {name} stopped on an error (exit {code}); see its log. Process {me} stops.'
    )
  how = 'was killed or crashed' if code is None else f'stopped (exit {code})'
  exit_now(
      exits.EXIT_PREEMPTED,
      f'error: {name} {how}; process {me} stops too (the checkpoints saved, if any, are '
      'intact). Rerun all processes to resume.',
  )


def _follow(link: socket.socket, process: int | None) -> None:
  """Reads `link` to `process` (None: the first line names it) until it closes, then acts on the
  last exit status it said (`_peer_left`)."""
  code, buffer = None, b''
  while True:
    try:
      data = link.recv(64)
    except OSError:
      data = b''
    if not data:
      break
    *lines, buffer = (buffer + data).split(b'\n')
    for line in lines:
      if process is None:
        process = int(line)
      else:
        code = int(line)
  if process is not None:
    _peer_left(process, code)


def _coordination_client() -> Any:
  """The client of JAX's coordination service (its key-value store, its list of live processes),
  which `jax.distributed.initialize` starts."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top

  client = distributed.global_state.client
  if client is None:
    raise RuntimeError('jax.distributed.initialize has not started a coordination client.')
  return client


def watch(coordinator_address: str, process: int, count: int) -> None:
  """Opens the links between process 0 and every worker (the port through JAX's key-value store)
  and follows each in a daemon thread: a peer that dies ends this process with one line."""
  _run.update(process=process, count=count)
  client = _coordination_client()
  atexit.register(_say_leaving, 0)  # Runs before JAX's own shutdown, registered earlier.
  if process == 0:
    dual = socket.has_dualstack_ipv6()
    server = socket.create_server(
        ('', 0), family=socket.AF_INET6 if dual else socket.AF_INET, dualstack_ipv6=dual
    )
    client.key_value_set(_LINK_KEY, str(server.getsockname()[1]))

    def accept() -> None:
      for _ in range(count - 1):
        link = server.accept()[0]
        _links.append(link)
        threading.Thread(target=_follow, args=(link, None), daemon=True).start()
      server.close()

    threading.Thread(target=accept, daemon=True).start()
    return
  port = int(client.blocking_key_value_get(_LINK_KEY, 60_000))
  link = socket.create_connection((_host(coordinator_address), port))
  link.sendall(f'{process}\n'.encode())
  _links.append(link)
  threading.Thread(target=_follow, args=(link, 0), daemon=True).start()


def _host(address: str) -> str:
  return address.rsplit(':', 1)[0].strip('[]')


class _Relay:
  """Forwards a worker's connections to the coordinator's service (`address`, host:port) through
  a local port. Where the coordinator is gone (its port refuses connections), the worker's
  connections are held open until this process has ended: JAX's client would end it at once with
  its own fatal error on seeing them reset."""

  def __init__(self, address: str):
    self._target = (_host(address), int(address.rsplit(':', 1)[1]))
    self._server = socket.create_server(('127.0.0.1', 0))
    self.address = f'127.0.0.1:{self._server.getsockname()[1]}'
    threading.Thread(target=self._accept, daemon=True).start()

  def _accept(self) -> None:
    while True:
      local = self._server.accept()[0]
      try:
        remote = socket.create_connection(self._target, timeout=10)
        remote.settimeout(None)
      except OSError:  # Not listening yet: JAX's client tries again.
        local.close()
        continue
      threading.Thread(target=self._forward, args=(local, remote), daemon=True).start()

  def _forward(self, local: socket.socket, remote: socket.socket) -> None:
    other = {local: remote, remote: local}
    while True:
      for readable in select.select([local, remote], [], [])[0]:
        try:
          data = readable.recv(1 << 16)
          if data:
            other[readable].sendall(data)
            continue
        except OSError:
          pass
        if readable is remote and not self._reachable():
          # The link of `watch` names how the coordinator left; where there is none yet, this.
          if not _finished.is_set() and not _finished.wait(2):
            _peer_left(0, None)
          if _EXITING.locked():
            threading.Event().wait()  # This process is ending: the connection stays open.
        local.close()
        remote.close()
        return

  def _reachable(self) -> bool:
    try:
      socket.create_connection(self._target, timeout=5).close()
      return True
    except OSError:
      return False
