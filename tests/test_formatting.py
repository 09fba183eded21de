"""The code is formatted as pyproject.toml's `[tool.pyink]` says (two-space indentation, 100
columns): `pyink vit_jax tests configs launch` formats it."""

import os

from click import testing
import pyink

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_code_is_formatted_with_pyink():
  folders = [os.path.join(REPO, name) for name in ('vit_jax', 'tests', 'configs', 'launch')]
  result = testing.CliRunner().invoke(pyink.main, ['--check', *folders])
  assert (
      result.exit_code == 0
  ), f'pyink would reformat (run `pyink vit_jax tests configs launch`):\n{result.output[-4000:]}'
