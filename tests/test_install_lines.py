"""The GPU and TPU install lines of the README and the launch scripts resolve with pip.

pip's resolver (`pip install --dry-run`) reads the packages' metadata only: a pin that cannot
resolve beside JAX's accelerator extra fails here, not on the cluster. Skipped where the package
registry cannot be reached.
"""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIREMENTS = os.path.join(REPO, 'launch', 'requirements.txt')
EXTRAS = ('cuda12', 'tpu')


def pinned_jax() -> str:
  with open(REQUIREMENTS) as f:
    return re.search(r'^jax==(\S+)$', f.read(), re.M).group(1)


def readme_install_lines() -> dict[str, str]:
  """Accelerator extra -> the README's `pip install` line that names it."""
  with open(os.path.join(REPO, 'README.md')) as f:
    return {
        m.group(1): m.group(0)
        for m in re.finditer(r"^pip install .*'jax\[(\w+)\]==([\w.]+)'.*$", f.read(), re.M)
    }


def test_readme_names_the_pinned_jax_with_each_accelerator_extra():
  """The launch scripts' pip commands are checked word for word in test_launch.py."""
  lines = readme_install_lines()
  assert set(lines) == set(EXTRAS), lines
  for extra, line in lines.items():
    assert f"'jax[{extra}]=={pinned_jax()}'" in line, line


def _dry_run(*requirements: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [
          sys.executable,
          '-m',
          'pip',
          'install',
          '--dry-run',
          '--ignore-installed',
          '--quiet',
          '--disable-pip-version-check',
          *requirements,
      ],
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )


@pytest.fixture(scope='module')
def registry():
  """Skips unless pip finds itself on the package registry (which it then can reach)."""
  control = _dry_run('--no-deps', 'pip')
  if control.returncode:
    pytest.skip(
        'pip cannot reach the package registry: '
        f'{(control.stderr.strip().splitlines() or ["?"])[-1]}'
    )


@pytest.mark.e2e
@pytest.mark.parametrize('extra', EXTRAS)
def test_launch_install_resolves_with_the_accelerator_extra(registry, extra):
  """What launch/slurm_gpu.sh and launch/tpu_vm.sh install: the pinned requirements and
  jax[EXTRA] at the pinned version, resolved together."""
  del registry
  out = _dry_run('-r', REQUIREMENTS, f'jax[{extra}]=={pinned_jax()}')
  assert out.returncode == 0, out.stderr[-3000:]
