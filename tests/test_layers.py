"""The layers of vit_jax/: its import graph (read with ast, imports inside functions included) has
no cycle, and no module imports one of a higher layer. README.md's "Code layout" lists the layers.
"""

import ast
import functools
import pathlib

import vit_jax

from tests import command_modules

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / 'vit_jax'

# The layers as the package declares them, bottom to top, then the commands at its top.
LAYERS = tuple(
    ('/'.join(packages), tuple(f'vit_jax.{p}' for p in packages)) for packages in vit_jax.LAYERS
)
COMMANDS = len(LAYERS)


@functools.cache
def _modules() -> dict[str, pathlib.Path]:
  """Every module of the package by dotted name ('vit_jax.models' for models/__init__.py)."""
  modules = {}
  for path in PACKAGE.rglob('*.py'):
    parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
    modules['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
  return modules


@functools.cache
def _imports() -> dict[str, frozenset[str]]:
  """The vit_jax modules each module imports, anywhere in it; `from P import N` counts as P.N
  where that is a module, else as P."""
  modules = _modules()

  def known(name: str) -> str:
    while name not in modules:
      name = name.rpartition('.')[0]
    return name

  graph = {}
  for name, path in modules.items():
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        imported |= {known(a.name) for a in node.names if a.name.split('.')[0] == 'vit_jax'}
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ''
        if node.level:
          anchor = package.split('.')[: len(package.split('.')) - node.level + 1]
          base = '.'.join(anchor + ([base] if base else []))
        if base.split('.')[0] == 'vit_jax':
          imported |= {known(f'{base}.{a.name}') for a in node.names}
    graph[name] = frozenset(imported - {name})
  return graph


def _layer(module: str) -> int | None:
  """The index in LAYERS of `module`'s package (COMMANDS for a module at the top of vit_jax/);
  None for a package LAYERS does not name."""
  parts = module.split('.')
  if len(parts) == 2 and (PACKAGE / f'{parts[1]}.py').is_file():
    return COMMANDS
  for index, (_, packages) in enumerate(LAYERS):
    if '.'.join(parts[:2]) in packages:
      return index
  return None


def _name(layer: int) -> str:
  return 'commands' if layer == COMMANDS else LAYERS[layer][0]


def _graph() -> dict[str, frozenset[str]]:
  """The import graph of the package."""
  return _imports()


def test_every_module_has_a_layer():
  unplaced = sorted(m for m in _modules() if m != 'vit_jax' and _layer(m) is None)
  assert not unplaced, f'add their packages to vit_jax.LAYERS: {unplaced}'


def _upward(graph: dict[str, frozenset[str]]) -> list[str]:
  """Each import of a module of a higher layer, in words."""
  return sorted(
      f'{m} ({_name(_layer(m))}) imports {i} ({_name(_layer(i))})'
      for m, imported in graph.items()
      if _layer(m) is not None
      for i in imported
      if _layer(i) is not None and _layer(i) > _layer(m)
  )


def _cycles(graph: dict[str, frozenset[str]]) -> list[str]:
  """The cycles a depth-first walk of `graph` closes, each as 'a -> b -> a'."""
  state, path, cycles = {}, [], []

  def visit(module: str) -> None:
    state[module] = 'open'
    path.append(module)
    for imported in sorted(graph.get(module, ())):
      if state.get(imported) == 'open':
        cycles.append(' -> '.join(path[path.index(imported) :] + [imported]))
      elif imported not in state:
        visit(imported)
    path.pop()
    state[module] = 'done'

  for module in sorted(graph):
    if module not in state:
      visit(module)
  return cycles


def test_no_module_imports_a_higher_layer():
  upward = _upward(_graph())
  assert not upward, '\n'.join(upward)


def test_the_imports_have_no_cycle():
  cycles = _cycles(_graph())
  assert not cycles, '\n'.join(cycles)


def test_the_checks_find_an_upward_import_and_a_cycle():
  """The checks on made-up graphs, and the reader on imports inside functions."""
  made_up = {
      'vit_jax.models.vit': {'vit_jax.loop.train'},
      'vit_jax.loop.train': {'vit_jax.models.vit'},
  }
  assert _upward(made_up) == [
      'vit_jax.models.vit (data/models/parallel/workdir) imports vit_jax.loop.train (loop)'
  ]
  assert _cycles(made_up) == ['vit_jax.loop.train -> vit_jax.models.vit -> vit_jax.loop.train']
  assert _upward({'vit_jax.loop.train': {'vit_jax.models.vit'}}) == []
  graph = _imports()
  assert 'vit_jax.workdir.reader' in graph['vit_jax.training.run_writer']
  assert 'vit_jax.loop.train' in graph['vit_jax.main']  # Imported inside `main`.


def test_the_top_of_the_package_holds_the_commands_alone():
  """Every module at the top of vit_jax/ is a command (`command_modules`, and the schema's
  listing, `python -m vit_jax.config`): the library lives in the layer packages."""
  top = {path.stem for path in PACKAGE.glob('*.py')} - {'__init__'}
  assert top == {*command_modules.names(), 'config'}
