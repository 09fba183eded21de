"""The code is formatted as pyproject.toml's `[tool.pyink]` says (two-space indentation, 100
columns): `pyink vit_jax tests configs launch` formats it."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_code_is_formatted_with_pyink():
  result = subprocess.run(
      [sys.executable, '-m', 'pyink', '--check', 'vit_jax', 'tests', 'configs', 'launch'],
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=300,
      check=False,
  )
  assert (
      result.returncode == 0
  ), f'pyink would reformat (run `pyink vit_jax tests configs launch`):\n{result.stderr[-4000:]}'
