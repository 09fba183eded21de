"""How every command ends when its user stops it: Ctrl-C is one line and exit status 130, and a
reader that stops reading its output (`| head`) ends it quietly with 141, never a traceback."""

import subprocess
import sys

from vit_jax.process import exits

_RUN = 'import sys; from vit_jax.process import runtime; runtime.run({main})'


def _command(code: str, *, read_output: bool = True) -> tuple[int, str]:
  """`python -c code`'s exit status and standard error; with `read_output` False its standard
  output is closed before it writes."""
  process = subprocess.Popen(
      [sys.executable, '-c', code],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )
  if not read_output:
    process.stdout.close()
  _, stderr = process.communicate(timeout=300)
  return process.returncode, stderr


def test_ctrl_c_in_a_command_is_one_line():
  main = '(lambda argv: (_ for _ in ()).throw(KeyboardInterrupt()))'
  status, stderr = _command(_RUN.format(main=main))
  assert status == exits.EXIT_INTERRUPTED == 130
  assert stderr.strip().splitlines() == [
      'Interrupted (Ctrl-C): stopped; what it writes is written whole or not at all.'
  ]


def test_a_closed_output_ends_a_command_quietly():
  main = "(lambda argv: print('line\\n' * 100000))"
  status, stderr = _command(_RUN.format(main=main), read_output=False)
  assert status == exits.EXIT_PIPE_CLOSED == 141
  assert 'Traceback' not in stderr and 'BrokenPipe' not in stderr, stderr


def test_the_config_listing_into_a_closed_pipe_ends_quietly():
  status, stderr = _command(
      'import runpy; runpy.run_module("vit_jax.config", run_name="__main__")', read_output=False
  )
  assert status == exits.EXIT_PIPE_CLOSED
  assert 'Traceback' not in stderr and 'BrokenPipe' not in stderr, stderr
