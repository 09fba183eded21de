"""The GPU and TPU install lines of the README and the launch scripts resolve with pip, and
installing the project keeps the jax and flax that an accelerator image or Colab already has.

pip's resolver (`pip install --dry-run`) reads the packages' metadata only: a pin that cannot
resolve beside JAX's accelerator extra fails here, not on the cluster. The installs into fresh
virtual environments are real. Skipped where the package registry cannot be reached.
"""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib

from conftest import copy_of_project
from packaging.requirements import Requirement
from packaging.version import Version
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIREMENTS = os.path.join(REPO, 'launch', 'requirements.txt')
EXTRAS = ('cuda13', 'cuda12', 'tpu')
# What the H200 image of the device report holds (jax's CUDA 13 plugin beside them).
ACCELERATOR_IMAGE = {'jax': '0.11.2', 'jaxlib': '0.11.2', 'flax': '0.12.10'}


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


def _pip(python: str, *args: str) -> None:
  out = subprocess.run(
      [python, '-m', 'pip', '--disable-pip-version-check', *args],
      capture_output=True,
      text=True,
      timeout=900,
      check=False,
  )
  assert out.returncode == 0, out.stderr[-3000:]


def _venv_holding(tmp_path, *packages: str) -> str:
  """A fresh virtual environment with `packages` installed from the registry; its python."""
  venv = tmp_path / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True)
  python = str(venv / 'bin' / 'python')
  _pip(python, 'install', '--quiet', *packages)
  return python


def _versions(python: str) -> dict[str, Version]:
  out = subprocess.run(
      [python, '-m', 'pip', 'list', '--format=json', '--disable-pip-version-check'],
      capture_output=True,
      text=True,
      check=True,
  )
  return {
      p['name'].lower().replace('_', '-'): Version(p['version']) for p in json.loads(out.stdout)
  }


def _install_project(python: str, tmp_path) -> tuple[dict[str, Version], dict[str, Version]]:
  """The environment's versions before and after `pip install .` of a copy of this checkout."""
  before = _versions(python)
  _pip(python, 'install', '--quiet', str(copy_of_project(tmp_path / 'source')))
  after = _versions(python)
  assert 'vit-jax' in after
  return before, after


def _downgraded(before: dict[str, Version], after: dict[str, Version]) -> dict[str, str]:
  return {
      name: f'{version} -> {after.get(name)}'
      for name, version in before.items()
      if name not in after or after[name] < version
  }


@pytest.mark.e2e
@pytest.mark.skipif(sys.version_info < (3, 12), reason='jax 0.11.2 needs Python >= 3.12')
def test_install_keeps_the_jax_and_flax_of_an_accelerator_image(registry, tmp_path):
  del registry
  python = _venv_holding(tmp_path, *(f'{name}=={v}' for name, v in ACCELERATOR_IMAGE.items()))
  before, after = _install_project(python, tmp_path)
  assert {name: str(after[name]) for name in ACCELERATOR_IMAGE} == ACCELERATOR_IMAGE
  assert not _downgraded(before, after)


@pytest.mark.e2e
def test_install_downgrades_none_of_the_newest_versions(registry, tmp_path):
  """Every dependency of the project at the newest version this Python gets, then the project."""
  del registry
  with open(os.path.join(REPO, 'pyproject.toml'), 'rb') as f:
    dependencies = tomllib.load(f)['project']['dependencies']
  python = _venv_holding(tmp_path, *(Requirement(d).name for d in dependencies))
  before, after = _install_project(python, tmp_path)
  assert not _downgraded(before, after)


def test_every_dependency_has_a_lower_bound_that_the_oldest_leg_pins():
  """`.ci/run`'s oldest leg installs `.ci/lower_bounds.py`'s pins: a dependency without a lower
  bound would escape it."""
  spec = importlib.util.spec_from_file_location(
      'lower_bounds', os.path.join(REPO, '.ci', 'lower_bounds.py')
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  pins = {
      Requirement(pin).name: pin
      for pin in module.lower_bounds(pathlib.Path(REPO, 'pyproject.toml'))
  }
  with open(os.path.join(REPO, 'pyproject.toml'), 'rb') as f:
    project = tomllib.load(f)['project']
  for text in project['dependencies'] + project['optional-dependencies']['test']:
    requirement = Requirement(text)
    assert requirement.name in pins, f'{text} has no lower bound'
    assert requirement.specifier.contains(pins[requirement.name].split('==')[1]), text
  assert pins['jax'] == 'jax==0.10' and pins['flax'] == 'flax==0.12.7'
