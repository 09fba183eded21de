"""The registries the project and its tests enumerate, each derived from the tree: the families
(`models.family_modules`), their configs (`configs.family_configs`) and the commands
(`command_modules`). A new family is its module and its config: the registries, the device report
and every test parametrised over families take it up, and nothing else names it."""

import importlib
import os
import pathlib
import subprocess
import sys

import pytest

from tests import command_modules
from vit_jax import configs
from vit_jax import models
from vit_jax.benchmarks import device_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY_MODULE = '''"""Toy: the ViT as a family of its own."""

import functools

from vit_jax import models
from vit_jax.models import vit


class Toy(vit.VisionTransformer):
  """The ViT, under its own class."""


MODELS = {
    'toy_ti4': functools.partial(
        Toy, patch_size=4, hidden_size=32, depth=2, num_heads=2, mlp_dim=64
    )
}
FAMILY = models.Family('toy', Toy, MODELS)
'''
TOY_CONFIG = '''"""Toy on the embedded digits."""

from vit_jax.configs import common

FAMILY = 'toy'


def get_config(arg=None):
  config = common.get_config()
  common.quick_run(config)
  config.model.name = 'toy_ti4'
  return config
'''
# The tests parametrised over every family, and a test of each that the toy family would add.
PARAMETRISED = {
    'tests/test_lowering.py': 'test_train_and_eval_steps_export_for_tpu_and_cuda[toy[',
    'tests/test_configs.py': 'test_default_config_trains_with_falling_loss[toy]',
    'tests/test_features.py': 'test_shapes_and_the_heads_of_the_head_inputs_give_the_logits[toy]',
    'tests/test_layer_decay.py': 'test_every_family_trains_two_steps_with_layer_decay[toy]',
    'tests/test_model_hashes.py': 'test_every_registered_models_variable_tree_is_unchanged[toy]',
}


def _write_toy(folder: pathlib.Path, module: str = TOY_MODULE) -> tuple[str, str]:
  """The toy family's module and config, in their own folders under `folder`."""
  written = []
  for package, source in (('models', module), ('configs', TOY_CONFIG)):
    (folder / package).mkdir()
    (folder / package / 'toy.py').write_text(source)
    written.append(str(folder / package))
  return written[0], written[1]


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
  """A factory: the toy family (its module's source given) and its config, in folders that the
  model and config packages search (their `__path__`), for the rest of the test."""

  def add(module: str = TOY_MODULE) -> None:
    for package, folder in zip((models, configs), _write_toy(tmp_path, module)):
      monkeypatch.setattr(package, '__path__', [*package.__path__, folder])
    forget()

  def forget() -> None:
    for package in (models, configs):
      sys.modules.pop(f'{package.__name__}.toy', None)
      if hasattr(package, 'toy'):
        delattr(package, 'toy')
    models.families.cache_clear()
    models._registry.cache_clear()  # pylint: disable=protected-access

  yield add
  monkeypatch.undo()
  forget()


def test_every_family_module_has_a_config_and_both_are_named_after_it():
  assert models.family_modules() == tuple(family.name for family in models.families())
  assert configs.family_configs() == models.family_modules()
  assert device_report.FAMILIES == configs.family_configs()
  for name in configs.family_configs():
    config = importlib.import_module(f'vit_jax.configs.{name}')
    assert config.FAMILY == name
    assert models.family(config.get_config().model.name).name == name  # Its quick model.
  assert not {'common', 'finetune', 'ablations'} & set(configs.family_configs())


def test_a_new_family_is_its_module_and_its_config(toy_family):
  toy_family()
  assert 'toy' in models.family_modules() and 'toy' in configs.family_configs()
  assert 'vit_jax.models.toy' not in sys.modules  # Found by reading, not importing.
  assert models.family('toy_ti4').name == 'toy' and 'toy_ti4' in models.names()
  config = device_report.family_config('toy')
  model = models.create_model(config, 10)
  assert models.family(model).name == 'toy' and type(model).__name__ == 'Toy'


def test_a_family_module_named_otherwise_is_refused(toy_family):
  toy_family(TOY_MODULE.replace("Family('toy'", "Family('toys'"))
  with pytest.raises(ValueError, match=r"vit_jax\.models\.toy declares the family 'toys'"):
    models.families()


def test_the_commands_are_the_modules_whose_main_starts_through_runtime_run(tmp_path, monkeypatch):
  assert 'main' in command_modules.names()
  assert not {'config', 'runtime'} & set(command_modules.names())  # No `runtime.run` in them.
  (tmp_path / 'tool.py').write_text(
      "from vit_jax.process import runtime\n\nif __name__ == '__main__':\n  runtime.run(print)\n"
  )
  (tmp_path / 'listing.py').write_text("if __name__ == '__main__':\n  print('fields')\n")
  monkeypatch.setattr(command_modules, 'PACKAGE', tmp_path)
  command_modules.names.cache_clear()
  try:
    assert command_modules.names() == ('tool',)
  finally:
    command_modules.names.cache_clear()


# Extends the model and config packages' search paths, prints the device report's families, then
# collects the tests named.
_COLLECT = """
import sys
import pytest
import vit_jax.configs
import vit_jax.models
vit_jax.models.__path__.append(sys.argv[1])
vit_jax.configs.__path__.append(sys.argv[2])
from vit_jax.benchmarks import device_report
print('device report:', ' '.join(device_report.FAMILIES))
sys.exit(pytest.main(
    ['--collect-only', '-q', '-p', 'no:cacheprovider', '-n', '0', '-m', 'e2e or not e2e',
     *sys.argv[3:]]
))
"""


@pytest.mark.e2e
def test_the_device_report_and_the_tests_over_families_take_up_a_new_family(tmp_path):
  collected = subprocess.run(
      [sys.executable, '-c', _COLLECT, *_write_toy(tmp_path), *PARAMETRISED],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )
  assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
  lines = collected.stdout.splitlines()
  assert 'toy' in lines[0].split(), lines[0]
  for path, test in PARAMETRISED.items():
    assert any(line.startswith(f'{path}::{test}') for line in lines), (path, test)
