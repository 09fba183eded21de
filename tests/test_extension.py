"""The README's worked extension, "Add your own attention (or stem, or evaluator)": one module of
the user's, outside vit_jax, registers an attention kind with settings of its own, a stem, an
evaluator of frozen features and one of the model's predictions (expected calibration error); a
config file imports it, and every command then trains, resumes, analyses, evaluates, predicts and
exports the run without any change to the project."""

import dataclasses
import importlib
import importlib.util
import json
import os
import random
import subprocess
import sys
import textwrap

from absl import flags
import jax
import numpy as np
import pytest

from vit_jax.schema import config as config_lib
from vit_jax import evaluators
from vit_jax.process import extensions
from vit_jax import models
from vit_jax.analysis import maps
from vit_jax.analysis import rollout
from vit_jax.models import attention
from vit_jax.schema import parts
from vit_jax.models import stems
from vit_jax.schema import evaluators as evaluator_settings
from vit_jax.training import optim
from vit_jax.loop import train
from vit_jax.workdir import reader
from vit_jax.workdir import run_files

from tests import tiny_runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The user's module: what the README shows, written outside vit_jax by each test.
EXTENSION = 'my_extension'
EXTENSION_SOURCE = '''
"""Cosine attention with a settings field, an average-pooling stem, a feature-norm evaluator and an
expected-calibration-error evaluator."""
import dataclasses
import functools
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from scipy import special

from vit_jax import evaluators
from vit_jax.evaluators import frozen
from vit_jax.evaluators import predictions
from vit_jax.models import attention
from vit_jax.models import stems


@dataclasses.dataclass(frozen=True, kw_only=True)
class CosineSettings:
  """The 'cosine' kind's own settings: --config.model.initial_temperature=..."""
  part: ClassVar[str] = 'attention'
  initial_temperature: float = 10.0


class CosineAttention(nn.Module):
  """Softmax of cosine similarities times a learned temperature per head."""
  num_heads: int
  initial_temperature: float = 10.0
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x, *, train=False):
    batch, tokens, width = x.shape
    qkv = nn.Dense(3 * width, name='qkv')(x).reshape(batch, tokens, 3 * self.num_heads, -1)
    q, k, v = jnp.split(qkv, 3, axis=2)
    q, k = (t / jnp.linalg.norm(t, axis=-1, keepdims=True) for t in (q, k))
    temperature = self.param(
        'temperature', nn.initializers.constant(self.initial_temperature), (self.num_heads,))
    scores = jnp.einsum('bqhd,bkhd->bhqk', q, k) * temperature[:, None, None]
    heads = attention.attend(self, scores, v, dropout_rate=self.dropout_rate, train=train)
    return nn.Dense(width, name='proj')(heads.reshape(batch, tokens, width))


attention.register(
    'cosine',
    lambda model, grid: functools.partial(
        CosineAttention,
        num_heads=model.num_heads,
        initial_temperature=model.kind_settings(CosineSettings).initial_temperature,
        dropout_rate=model.attention_dropout_rate,
    ),
    settings=CosineSettings,
)


class PoolStem(nn.Module):
  """Average pooling over patches, then a linear map to the token width."""
  patch_size: int
  hidden_size: int

  @nn.compact
  def __call__(self, images, *, train=False):
    p = self.patch_size
    x = nn.avg_pool(images, (p, p), strides=(p, p))
    return nn.Dense(self.hidden_size, name='proj')(x)


stems.register(
    'pool',
    lambda model: functools.partial(PoolStem, model.patch_size, model.hidden_size),
    module_name='pool_embed',
)


@dataclasses.dataclass(frozen=True)
class FeatureNorm(frozen.Evaluator):
  """The mean norm of the test split's frozen features."""

  def evaluate(self, data):
    return {f'{data.name}/feature_norm': float(np.linalg.norm(data.test.features, axis=-1).mean())}


evaluators.register('feature_norm', FeatureNorm)


@dataclasses.dataclass(frozen=True)
class ExpectedCalibrationError(predictions.Evaluator):
  """How far the top-1 confidence is from the accuracy, over `bins` equal-width bins."""

  bins: int = 15

  def evaluate(self, predictions):
    probabilities = special.softmax(predictions.logits, axis=-1)
    confidence = probabilities.max(-1)
    correct = probabilities.argmax(-1) == predictions.labels
    bin_of = np.minimum((confidence * self.bins).astype(int), self.bins - 1)
    gaps = np.bincount(bin_of, weights=confidence - correct, minlength=self.bins)
    return {'ece': float(np.abs(gaps).sum() / len(confidence))}


evaluators.register('ece', ExpectedCalibrationError)
'''

# The user's config file: imports the module, chooses its kind and stem, sets its evaluators.
CONFIG_SOURCE = f"""
import {EXTENSION}  # Registers 'cosine', 'pool', 'feature_norm' and 'ece'.

from tests import tiny_runs


def get_config():
  config = tiny_runs.tiny_config('', total_steps=1, warmup_steps=0, log_every=1)
  config.model.attention = 'cosine'
  config.model.initial_temperature = 5.0
  config.model.stem = 'pool'
  config.layer_decay = 0.75
  config.evaluators.ece.bins = 10
  config.evaluators.ece.every = 1
  return config
"""


def write_extension(folder) -> str:
  """The user's module and config file in `folder`; returns the config file's path."""
  (folder / f'{EXTENSION}.py').write_text(textwrap.dedent(EXTENSION_SOURCE))
  (folder / 'my_config.py').write_text(textwrap.dedent(CONFIG_SOURCE))
  return str(folder / 'my_config.py')


@pytest.fixture
def extension(tmp_path, monkeypatch, evaluator_registry):
  """The user's module imported from `tmp_path/ext`, its registrations undone after the test."""
  del evaluator_registry  # Undoes the evaluators'.
  # pylint: disable=protected-access
  monkeypatch.setattr(attention, '_KINDS', dict(attention._KINDS))
  monkeypatch.setattr(stems, '_STEMS', dict(stems._STEMS))
  monkeypatch.setattr(parts, '_SETTINGS', list(parts._SETTINGS))
  # pylint: enable=protected-access
  folder = tmp_path / 'ext'
  folder.mkdir()
  write_extension(folder)
  monkeypatch.syspath_prepend(str(folder))
  monkeypatch.delitem(sys.modules, EXTENSION, raising=False)
  module = importlib.import_module(EXTENSION)
  yield module
  sys.modules.pop(EXTENSION, None)


def test_a_kind_with_settings_a_stem_and_an_evaluator_register_from_one_module(extension):
  assert 'cosine' in attention.kinds() and 'pool' in stems.names()
  assert evaluators.EVALUATORS['feature_norm'] is extension.FeatureNorm
  assert evaluators.EVALUATORS['ece'] is extension.ExpectedCalibrationError
  assert config_lib.defaults().evaluators.ece.to_dict() == {'every': None, 'bins': None}
  assert attention.kind('cosine').module == stems.stem('pool').module == EXTENSION
  # The kind's settings field is a model field of every config and an override of `create`.
  assert config_lib.model_part_fields()['initial_temperature'] is float
  assert 'initial_temperature' in config_lib.defaults().model
  model = models.create(
      'vit_ti4',
      num_classes=10,
      attention='cosine',
      stem='pool',
      initial_temperature=3.0,
      hidden_size=32,
      depth=2,
      num_heads=2,
      mlp_dim=64,
  )
  assert model.attention_settings == extension.CosineSettings(initial_temperature=3.0)
  variables = model.init(jax.random.key(0), np.zeros((1, 16, 16, 3)))
  params = variables['params']
  assert set(params['pool_embed']) == {'proj'} and 'patch_embed' not in params
  np.testing.assert_allclose(params['blocks_0']['attn']['temperature'], 3.0)
  # Layer-wise lr decay puts the stem with the embeddings, in layer 0 (top layer 3: the head).
  scales = optim.layer_decay_scales(model, params, 0.5)
  assert scales['pool_embed']['proj']['kernel'] == 0.5**3
  assert scales['blocks_1']['attn']['temperature'] == 0.5


def test_registrations_are_checked(extension):
  with pytest.raises(ValueError, match="Stem 'pool' is registered already"):
    stems.register('pool', lambda model: None)
  with pytest.raises(
      ValueError, match=r"T2TSettings.part='stem' is not valid; choose from \['attention'\]"
  ):
    attention.register('other', lambda model, grid: None, settings=parts.T2TSettings)
  clash = dataclasses.make_dataclass(
      'Clash', [('initial_temperature', float, 1.0)], frozen=True, namespace={'part': 'attention'}
  )
  with pytest.raises(ValueError, match=r"repeats fields .*'initial_temperature': 'CosineSettings'"):
    parts.register_settings(clash)
  with pytest.raises(ValueError, match="stem='banana' is not valid; choose from .*'pool'"):
    models.create('vit_ti4', stem='banana').check_fields()


def fresh_process(monkeypatch, folder: str) -> None:
  """As in a new process: the user's module not loaded nor registered, its folder not on
  sys.path."""
  # pylint: disable=protected-access
  monkeypatch.delitem(sys.modules, EXTENSION)
  monkeypatch.setattr(sys, 'path', [p for p in sys.path if p != folder])
  monkeypatch.setattr(
      attention, '_KINDS', {k: v for k, v in attention._KINDS.items() if v.module != EXTENSION}
  )
  monkeypatch.setattr(
      stems, '_STEMS', {k: v for k, v in stems._STEMS.items() if v.module != EXTENSION}
  )
  monkeypatch.setattr(parts, '_SETTINGS', [s for s in parts._SETTINGS if s.__module__ != EXTENSION])
  own = [k for k, v in evaluators.EVALUATORS.items() if v.__module__ == EXTENSION]
  monkeypatch.setattr(
      evaluators, 'EVALUATORS', {k: v for k, v in evaluators.EVALUATORS.items() if k not in own}
  )
  for name in own:  # `evaluator_registry` puts them back after the test.
    evaluator_settings.SECTION.pop(name)


def test_a_run_records_the_module_and_reads_it_back(extension, tmp_path, monkeypatch):
  config = config_lib.defaults()  # Its evaluators' fields among them, unset.
  config.model.attention, config.model.stem = 'cosine', 'pool'
  folder = str(tmp_path / 'ext')
  (record,) = extensions.recorded_imports(config)
  assert record == {
      'module': EXTENSION,
      'path': folder,
      'registers': [
          "attention='cosine'",
          "stem='pool'",
          'CosineSettings',
          'evaluators.ece',
          'evaluators.feature_norm',
      ],
  }
  run = tmp_path / 'run'
  run.mkdir()
  (run / run_files.CONFIG_FILE).write_text(run_files.config_json(config))
  fresh_process(monkeypatch, folder)
  extensions.define_allow_imports_flag()
  monkeypatch.setattr(flags.FLAGS[extensions.ALLOW_IMPORTS_FLAG], 'value', True)
  saved = reader.Workdir(str(run)).config()
  assert EXTENSION in sys.modules and extensions.IMPORTS not in saved
  assert saved.model.attention == 'cosine'
  # Moved away: one line naming the module, its folder and what it registered.
  fresh_process(monkeypatch, folder)
  os.rename(folder, str(tmp_path / 'moved'))
  with pytest.raises(ValueError) as refusal:
    reader.Workdir(str(run)).config()
  assert str(refusal.value).startswith(
      f"{run / run_files.CONFIG_FILE} records module '{EXTENSION}' (imported from {folder}), "
      "which registered attention='cosine', stem='pool', CosineSettings, "
      'evaluators.ece, evaluators.feature_norm, but it cannot be imported (ModuleNotFoundError'
  )
  assert '\n' not in str(refusal.value)


def test_a_config_file_imports_the_modules_beside_it(tmp_path, monkeypatch):

  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=values)
  monkeypatch.setattr(sys, 'path', list(sys.path))
  extensions.make_config_folders_importable(
      ['main', f'--config={tmp_path}/my_config.py:arg', '--workdir=/x'], values
  )
  assert sys.path[-1] == str(tmp_path)
  extensions.make_config_folders_importable(['main', f'--config={REPO}/configs/vit.py'], values)
  assert os.path.join(REPO, 'configs') not in sys.path  # vit_jax's own configs stay out.


def test_a_file_beside_a_config_hides_no_installed_module(tmp_path, monkeypatch):
  """A user's `statistics.py` or `flax.py` beside the config file is not what the libraries
  import; the user's own modules there still import."""

  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  for name in ('statistics', 'flax', 'my_own_module'):
    (tmp_path / f'{name}.py').write_text('raise ImportError("the user\'s file")\n')
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=values)
  monkeypatch.setattr(sys, 'path', list(sys.path))
  extensions.make_config_folders_importable(['main', f'--config={tmp_path}/my_config.py'], values)
  importlib.invalidate_caches()
  for name in ('statistics', 'flax'):
    assert not importlib.util.find_spec(name).origin.startswith(str(tmp_path)), name
  assert importlib.util.find_spec('my_own_module').origin == str(tmp_path / 'my_own_module.py')


def test_a_new_attention_kind_trains_and_is_analysed(extension, data_dir, tmp_path):
  from tests import tiny_runs  # pylint: disable=g-import-not-at-top

  config = tiny_runs.tiny_config(
      data_dir, total_steps=2, warmup_steps=0, log_every=1, **{'model.attention': 'cosine'}
  )
  workdir = str(tmp_path / 'run')
  result = train.train_and_evaluate(config, workdir)
  assert result.step == 2 and result.metrics['count'] > 0

  model = models.create_model(config, num_classes=10)
  variables = reader.Workdir(workdir).read_variables(use_ema=False).variables
  block = variables['params']['blocks_0']['attn']
  assert set(block) == {'qkv', 'temperature', 'proj'}
  assert not np.allclose(block['temperature'], 10.0)  # Trained.

  images = jax.random.uniform(jax.random.key(0), (3, 16, 16, 3))
  layers = maps.attention_maps(model, variables, images)
  assert [layer.name for layer in layers] == ['blocks_0/attn', 'blocks_1/attn']
  assert [layer.shape for layer in layers] == [(2, 17, 17)] * 2  # Heads, [cls] + 4 x 4 patches.
  np.testing.assert_allclose(layers[0].probs.sum(-1), 1.0, atol=1e-5)
  (relevance,) = rollout.token_relevance(layers, (16, 16))
  assert relevance.maps.shape == (3, 4, 4)


def _command(module: str, *args: str) -> subprocess.CompletedProcess:
  """`python -m vit_jax.MODULE ARGS` as a user runs it, which must succeed."""
  result = tiny_runs.run_command(module, *args)
  assert result.returncode == 0, f'{module}: {result.stderr[-3000:]}'
  return result


@pytest.mark.e2e
def test_every_command_reads_a_run_of_the_users_module(data_dir, tmp_path):
  from PIL import Image  # pylint: disable=g-import-not-at-top

  folder = tmp_path / 'experiments'
  folder.mkdir()
  config_file = write_extension(folder)
  for name in ('statistics', 'flax'):  # A user's scripts named like installed modules: unseen.
    (folder / f'{name}.py').write_text('raise ImportError("the user\'s own file")\n')
  workdir = str(tmp_path / 'run')
  train_flags = (f'--config={config_file}', f'--workdir={workdir}', f'--config.data_dir={data_dir}')
  _command('main', *train_flags)
  _command('main', *train_flags, '--config.total_steps=2')  # Resumed from step 1.
  with open(os.path.join(workdir, run_files.CONFIG_FILE)) as f:
    saved = json.load(f)
  assert saved[extensions.IMPORTS][0]['module'] == EXTENSION
  assert saved[extensions.IMPORTS][0]['path'] == str(folder)
  assert saved['model']['initial_temperature'] == 5.0
  assert reader.Workdir(workdir).steps()[-1] == 2
  with open(os.path.join(workdir, 'results.json')) as f:
    trained = json.load(f)
  assert 0 <= trained['ece'] <= 1 and trained['steps']['ece'] == 2  # Its final evaluation's.

  # Reading the run imports the user's module by the user's leave (`--import_run_modules`).
  read = (f'--workdir={workdir}', '--import_run_modules')
  _command('analyze', *read, '--num_images=4', '--batch_size=4', '--what=maps')
  with open(os.path.join(workdir, 'analysis', 'analysis.json')) as f:
    assert [layer['name'] for layer in json.load(f)['layers']] == ['blocks_0/attn', 'blocks_1/attn']

  evaluated = _command('evaluate', *read, '--evaluators=feature_norm,ece')
  assert 'digits/feature_norm' in evaluated.stdout and 'ece' in evaluated.stdout
  with open(os.path.join(workdir, 'results.json')) as f:
    results = json.load(f)
  assert results['digits/feature_norm'] > 0
  assert results['ece'] == pytest.approx(trained['ece'], abs=1e-6)  # The run's bins and weights.

  image = tmp_path / 'seven.png'
  Image.fromarray(np.full((16, 16, 3), 128, np.uint8)).save(image)
  predicted = _command('predict', *read, '--json', str(image))
  assert len(json.loads(predicted.stdout)['predictions']) == 1

  # timm has no layout for the user's attention and stem: export says so, and writes nothing.
  out = str(tmp_path / 'model.safetensors')
  refused = tiny_runs.run_command('export', *read, f'--out={out}')
  assert refused.returncode == 1 and 'Traceback' not in refused.stderr, refused.stderr[-3000:]
  assert refused.stderr.strip().splitlines()[-1] == (
      f"error: {workdir} uses parts of your own modules ({EXTENSION}: attention='cosine', "
      "stem='pool', CosineSettings), which timm has no layout for: export writes timm's; read "
      "the run's weights with vit_jax (vit_jax.workdir.reader.Workdir.read_variables) instead."
  )
  assert not os.path.exists(out)


def test_a_module_beside_a_config_named_like_an_installed_one_is_named(
    tmp_path, monkeypatch, capfd
):
  """A config file's `import random` finds the standard library's, never the user's `random.py`
  beside it: said in one warning line, where the run would otherwise stop on a kind it lacks."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  (tmp_path / 'random.py').write_text('')
  (tmp_path / 'my_own_module.py').write_text('')
  config_file = tmp_path / 'my_config.py'
  config_file.write_text('import random\nimport my_own_module\nimport numpy\n')
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=values)
  monkeypatch.setattr(sys, 'path', list(sys.path))
  lines = []
  monkeypatch.setattr(extensions.exits, 'write_line', lines.append)
  extensions.make_config_folders_importable(['main', f'--config={config_file}'], values)
  assert lines == [
      f"warning: {config_file} imports 'random': the installed module {random.__file__}, not "
      f'the random beside it in {tmp_path}, which a module named like an installed one never '
      'is; rename yours to import it.'
  ]
