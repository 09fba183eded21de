"""Every command (`command_modules`): `--help` answers before any library loads and lists the
command's own flags only, the README shows it, and every command line the README, the configs and
the launchers show names flags that its command defines. (The main command training its default
config, as the README shows it, is `test_train.test_default_config_reaches_95_percent`.)"""

import glob
import os
import re

import pytest

from tests import command_modules
from tests import tiny_runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = command_modules.names()
ABSL_MODULES = {'absl.app', 'absl.logging', 'absl.flags'}
SHARED_FLAG_MODULES = {
    'main': {'vit_jax.process.extensions'},
    'evaluate': {'vit_jax.weights.source_flags', 'vit_jax.process.extensions'},
    'predict': {'vit_jax.weights.source_flags', 'vit_jax.process.extensions'},
    'export': {'vit_jax.process.extensions'},
    'analyze': {'vit_jax.weights.source_flags', 'vit_jax.process.extensions'},
}
HEAVY = ('tensorflow', 'jax', 'torch')
# Runs a command as `python -m` does, asks for --helpfull, then names the heavy libraries loaded.
_HELP = """
import runpy, sys
sys.argv = [sys.argv[1], '--helpfull']
try:
  runpy.run_path(sys.argv[0], run_name='__main__')
except SystemExit:
  pass
print('loaded:', ','.join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
""".format(
    heavy=HEAVY
)


@pytest.fixture(scope='module')
def helps() -> dict[str, tuple[str, str]]:
  """Each command's --helpfull output and stderr, all commands' processes at once."""
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO, env.get('PYTHONPATH')]))
  done = tiny_runs.run_at_once({c: ['-c', _HELP, _path(c)] for c in COMMANDS}, env)
  return {c: (done[c].stdout, done[c].stderr) for c in COMMANDS}


def _path(command: str) -> str:
  return os.path.join(REPO, 'vit_jax', f'{command}.py')


def _sections(help_text: str) -> dict[str, set[str]]:
  """The flags absl lists, by the module that defines them."""
  sections, module = {}, None
  for line in help_text.split('\nflags:\n', 1)[-1].splitlines():
    if re.fullmatch(r'\S.*:', line):
      module = line[:-1]
      sections[module] = set()
    elif module and (match := re.match(r'  --(?:\[no\])?([\w-]+)', line)):
      sections[module].add(match.group(1))
  return sections


@pytest.mark.parametrize('command', COMMANDS)
def test_help_lists_the_commands_own_flags_before_any_library_loads(helps, command):
  out, err = helps[command]
  sections = _sections(out)
  assert _path(command) in sections, out
  assert set(sections) - {_path(command)} <= ABSL_MODULES | SHARED_FLAG_MODULES.get(command, set())
  assert err.strip().splitlines()[-1] == 'loaded:', err  # Nor any start-up notice.


def test_ablate_lists_none_of_the_flags_of_the_commands_it_once_borrowed_from(helps):
  ablate = set().union(*_sections(helps['ablate'][0]).values())
  assert {'config', 'workdir', 'seeds', 'timing_steps', 'collapse_images'} <= ablate
  assert not ablate & {'what', 'num_images', 'finetune_steps', 'batch', 'vs_timm', 'mode'}


def _shown_command_lines() -> list[tuple[str, str, str]]:
  """(file, command, arguments) of every `python -m vit_jax.COMMAND ...` that the READMEs, the
  configs, the notebooks, the launchers and vit_jax's own docstrings show."""
  files = [
      os.path.relpath(path, REPO)
      for pattern in ('*.md', 'launch/*', 'configs/*.py', 'notebooks/*.ipynb', 'vit_jax/**/*.py')
      for path in glob.glob(os.path.join(REPO, pattern), recursive=True)
  ]
  lines = []
  for name in files:
    with open(os.path.join(REPO, name)) as f:
      text = f.read().replace('\\\n', ' ')  # Continued lines.
    for match in re.finditer(r'python -m vit_jax\.(\w+)([^\n`]*)', text):
      if match.group(1) != 'config':  # The schema's field list, not a command with flags.
        lines.append((name, match.group(1), match.group(2)))
  return lines


def test_the_readme_shows_every_command():
  shown = {command for name, command, _ in _shown_command_lines() if name == 'README.md'}
  missing = sorted(set(COMMANDS) - shown)
  assert not missing, f'README.md shows no `python -m vit_jax.{{{",".join(missing)}}}`'


def test_every_command_line_shown_names_its_commands_flags(helps):
  lines = _shown_command_lines()
  assert {command for _, command, _ in lines} == set(COMMANDS)
  for name, command, arguments in lines:
    defined = set().union(*_sections(helps[command][0]).values(), {'help', 'helpfull'})
    for flag in re.findall(r'(?<![\w-])--([\w-]+)', arguments.split('#')[0]):
      negated = flag.startswith('no') and flag[2:] in defined  # --nouse_ema
      assert flag in defined or negated, (name, command, flag)
