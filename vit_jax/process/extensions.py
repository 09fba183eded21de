"""Modules of your own: the modules outside vit_jax that register attention kinds, stems, kind
settings or evaluators, recorded with a run so that every command that reads the run has them.

A run's config.json lists them under `imports` with their folders (`recorded_imports`); a command
reading the run imports them (`import_recorded`) only with `--import_run_modules`, since importing
runs code. Free of JAX and of the registries: they `note` each registration here.
"""

import ast
import importlib
import importlib.util
import os
import sys
from typing import Any, Mapping, Sequence

from absl import flags

from vit_jax.process import exits

# The key of config.json that lists the modules to import before the config is read.
IMPORTS = 'imports'
ALLOW_IMPORTS_FLAG = 'import_run_modules'


def define_allow_imports_flag() -> None:
  """Defines --import_run_modules (once), for the commands that read runs."""
  if ALLOW_IMPORTS_FLAG not in flags.FLAGS:
    flags.DEFINE_bool(
        ALLOW_IMPORTS_FLAG,
        False,
        "Import the modules of your own that a run's config.json records (its attention kinds, "
        'stems and evaluators): importing runs their code, so give it only for runs you trust.',
    )


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # vit_jax/


def caller_module() -> str:
  """The module that called the function calling this one (whose import makes a registration)."""
  return sys._getframe(2).f_globals.get('__name__', '__main__')  # pylint: disable=protected-access


def module_record(name: str) -> dict[str, str] | None:
  """{'module': the name to import, 'path': its folder} of the loaded module `name`, by its file's
  name where it was loaded under another ('config_config', __main__); None for vit_jax's own
  modules and modules without a file."""
  module = sys.modules.get(name)
  file = getattr(module, '__file__', None)
  if name == 'vit_jax' or name.startswith('vit_jax.') or not file:
    return None
  stem = os.path.splitext(os.path.abspath(file))[0]
  if os.path.basename(stem) == '__init__':
    stem = os.path.dirname(stem)
  tail = os.path.join(*name.split('.'))
  if stem.endswith(os.sep + tail):
    return {'module': name, 'path': stem[: -len(tail) - 1]}
  return {'module': os.path.basename(stem), 'path': os.path.dirname(stem)}


# (registry, name) -> (the module that registered it, what the run records it registered);
# filled by the registries as they register (`note`), so that this module imports none of them.
_REGISTERED: dict[tuple[str, str], tuple[str, str]] = {}


def note(registry: str, name: str, module: str, label: str) -> None:
  """Records that `module` registered `name` in `registry` ('attention', 'stem', 'setting' (a kind
  settings field), 'evaluator'), shown as `label` in a run's config.json."""
  _REGISTERED[(registry, name)] = (module, label)


def _registrations(config: Any, *, evaluators: bool = True) -> dict[str, list[str]]:
  """Module name -> what of `config` it registered: the attention kind and stem its model
  chooses, the kind settings whose fields its model section holds and (with `evaluators`) its
  evaluators."""
  model = config.model
  used = [('attention', model.get('attention')), ('stem', model.get('stem'))]
  used += [('setting', key) for key in model]  # Unset too: config.json holds every field.
  if evaluators:
    used += [('evaluator', name) for name in config.get('evaluators', {})]
  registered: dict[str, list[str]] = {}
  for key in used:
    if key in _REGISTERED:
      module, label = _REGISTERED[key]
      if label not in registered.setdefault(module, []):
        registered[module].append(label)
  return registered


def recorded_imports(config: Any) -> list[dict[str, Any]]:
  """What a run with `config` records under `imports`: each module outside vit_jax that registered
  what the config uses ({'module', 'path', 'registers'}; `module_record`)."""
  records: dict[tuple[str, str], dict[str, Any]] = {}
  for name, registers in _registrations(config).items():
    record = module_record(name)
    if record is not None:
      key = (record['module'], record['path'])
      records.setdefault(key, {**record, 'registers': []})['registers'] += registers
  return list(records.values())


def model_parts_of_yours(config: Any) -> list[str]:
  """What of `config`'s model the modules outside vit_jax registered, per module
  ("my_extension: attention='cosine', stem='pool'"): the parts no published layout has."""
  return [
      f'{module}: {", ".join(labels)}'
      for module, labels in _registrations(config, evaluators=False).items()
      if module_record(module) is not None
  ]


def _loaded(name: str, path: str) -> bool:
  """Whether the module `name` of folder `path` is loaded already, under any name (a config file
  that registered a kind was loaded by ml_collections as 'config_config')."""
  base = os.path.join(path, *name.split('.'))
  files = {base + '.py', os.path.join(base, '__init__.py')}
  return any(
      os.path.abspath(getattr(module, '__file__', None) or '') in files
      for module in list(sys.modules.values())
  )


def _importable_from(name: str, path: str) -> bool:
  """Whether `import name` finds the module in folder `path` as things stand."""
  try:
    spec = importlib.util.find_spec(name)
  except (ImportError, ValueError):
    return False
  origin = getattr(spec, 'origin', None) or ''
  return os.path.abspath(origin).startswith(os.path.join(os.path.abspath(path), ''))


def _loaded_elsewhere(name: str, path: str) -> str | None:
  """The file of the loaded module `name` when it is not the one in folder `path`."""
  module = sys.modules.get(name)
  if module is None or _loaded(name, path):
    return None
  return getattr(module, '__file__', None) or '<built-in>'


def import_recorded(imports: Any, source: str, *, allowed: bool | None = None) -> None:
  """Imports each module that `source` (a run's config.json) records in `imports` and is not loaded
  yet, only when `allowed` (default: `--import_run_modules`); ValueError, one line, otherwise."""
  if not isinstance(imports, list) or not all(
      isinstance(record, Mapping)
      and {'module', 'path'} <= set(record)
      and all(isinstance(record[key], str) for key in ('module', 'path'))
      for record in imports
  ):
    raise ValueError(
        f'{source}: {IMPORTS}={imports!r} is damaged; expected a list of '
        "{'module': NAME, 'path': FOLDER}."
    )
  for record in imports:
    other = _loaded_elsewhere(record['module'], record['path'])
    if other is not None:
      raise ValueError(
          f'{source} records module {record["module"]!r} of {record["path"]}, but a module of '
          f'that name is loaded from {other}: rename one of them (two runs read together, a '
          'student and its teacher, cannot use two modules of one name).'
      )
  pending = [record for record in imports if not _loaded(record['module'], record['path'])]
  if allowed is None:
    defined = ALLOW_IMPORTS_FLAG in flags.FLAGS  # By a command that reads runs.
    allowed = defined and flags.FLAGS[ALLOW_IMPORTS_FLAG].value  # Its default before parsing.
  if pending and not allowed:
    names = ', '.join(f'{record["module"]!r} ({record["path"]})' for record in pending)
    raise ValueError(
        f'{source} records modules of your own that reading it would import, running their '
        f'code: {names}; nothing was imported. If you trust this run, give '
        f'--{ALLOW_IMPORTS_FLAG}.'
    )
  for record in pending:
    name, path = record['module'], record['path']
    if not _importable_from(name, path) and os.path.isdir(path) and path not in sys.path:
      sys.path.append(path)  # Last, as a config file's folder: it hides no installed module.
      importlib.invalidate_caches()
    try:
      module = importlib.import_module(name)
    except (Exception, SystemExit) as e:  # pylint: disable=broad-except
      reason = (str(e).strip().splitlines() or [''])[0]
      raise ValueError(
          f'{source} records module {name!r} (imported from {path}), which registered '
          f'{", ".join(record.get("registers", [])) or "what the run uses"}, but it cannot be '
          f'imported ({type(e).__name__}: {reason}); put it back in {path} or make it '
          'importable (PYTHONPATH).'
      ) from None
    if not _loaded(name, path):
      raise ValueError(
          f'{source} records module {name!r} of {path}, but that name imports '
          f'{getattr(module, "__file__", None) or "a built-in module"}, an installed module: '
          'rename the module of the run (and the imports of its config file).'
      )


def make_config_folders_importable(argv: Sequence[str], flag_values: Any) -> None:
  """Puts the folder of each config file that `argv` names (`--config=PATH[:ARGS]`) last on
  sys.path, so that it imports the modules beside it and they hide no installed module."""
  config_flags = sys.modules.get('ml_collections.config_flags.config_flags')
  if config_flags is None:
    return
  names = [
      name
      for name in flag_values
      if isinstance(flag_values[name].parser, config_flags.ConfigFileFlagParser)
  ]
  values = []
  for i, arg in enumerate(argv[1:], start=1):
    for name in names:
      for prefix in (f'--{name}', f'-{name}'):
        if arg.startswith(f'{prefix}='):
          values.append(arg[len(prefix) + 1 :])
        elif arg == prefix and i + 1 < len(argv):
          values.append(argv[i + 1])
  for value in values:
    config_file = os.path.abspath(value.split(':', 1)[0])
    folder = os.path.dirname(config_file)
    inside_package = os.path.realpath(folder).startswith(os.path.join(_PACKAGE_DIR, ''))
    if not inside_package and folder not in sys.path:
      sys.path.append(folder)
      for name, installed in hidden_beside(config_file):
        exits.write_line(
            f'warning: {config_file} imports {name!r}: the installed {installed}, not the '
            f'{name} beside it in {folder}, which a module named like an installed one never '
            'is; rename yours to import it.'
        )


def hidden_beside(config_file: str) -> list[tuple[str, str]]:
  """(name, where the import finds it) of each module `config_file` imports whose name a module
  beside it shares but an installed module (`random`) answers to."""
  folder = os.path.dirname(config_file)
  try:
    with open(config_file, encoding='utf-8') as f:
      tree = ast.parse(f.read())
  except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
    return []  # Loading it says what is wrong.
  names: set[str] = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name.split('.')[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module.split('.')[0])
  hidden = []
  for name in sorted(names):
    beside = os.path.join(folder, name)
    if not (os.path.isfile(beside + '.py') or os.path.isfile(os.path.join(beside, '__init__.py'))):
      continue
    if name in sys.builtin_module_names:
      hidden.append((name, 'built-in module'))
      continue
    try:
      spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
      continue
    origin = os.path.abspath(getattr(spec, 'origin', None) or '')
    if spec is not None and not origin.startswith(os.path.join(folder, '')):
      hidden.append((name, f'module {origin}'))
  return hidden
