"""Prints pip constraints that pin every dependency of pyproject.toml at its lower bound.

The oldest leg of `.ci/run` installs with them (`pip install -c`), so that each `>=` the project
declares is a version its tests have passed on.
"""

import pathlib
import tomllib

from packaging.requirements import Requirement


def lower_bounds(pyproject: pathlib.Path) -> list[str]:
  """`name==version` for each requirement of the project and its extras with a `>=` bound."""
  project = tomllib.loads(pyproject.read_text())['project']
  requirements = list(project['dependencies'])
  for extra in project.get('optional-dependencies', {}).values():
    requirements += extra
  pins = []
  for text in requirements:
    requirement = Requirement(text)
    for specifier in requirement.specifier:
      if specifier.operator in ('>=', '=='):
        pins.append(f'{requirement.name}=={specifier.version}')
  return pins


if __name__ == '__main__':
  root = pathlib.Path(__file__).resolve().parent.parent
  print('\n'.join(lower_bounds(root / 'pyproject.toml')))
