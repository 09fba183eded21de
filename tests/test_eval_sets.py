"""Test sets by name: each scoring against hand-computed metrics on known logits, the names'
checks, the ReaL label sets read from TFDS's real feature specs, and runs reporting several sets."""

import importlib.util
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from tests import tiny_runs
from vit_jax.configs import common
from vit_jax.schema import checks as config_checks
from vit_jax import models
from vit_jax.loop import setup
from vit_jax.evaluators import eval_sets
from vit_jax.evaluators import passes
from vit_jax.schema import data as data_settings
from vit_jax.loop import train
from vit_jax.schema import setting
from vit_jax.workdir import reader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Five examples over six classes, the last one padding (mask 0).
LOGITS = np.array(
    [
        [0.1, 2.0, 0.3, 0.0, 0.0, 0.5],
        [1.0, 0.2, 0.1, 3.0, 0.0, 0.4],
        [0.0, 0.0, 0.0, 0.1, 2.5, 0.2],
        [0.7, 0.3, 0.9, 0.0, 0.1, 0.0],
        [0.2, 0.2, 5.0, 0.1, 0.0, 0.0],
    ],
    np.float32,
)
MASK = np.array([1, 1, 1, 1, 0], np.float32)


def _log_softmax(row):
  row = np.asarray(row, np.float64)
  return row - row.max() - np.log(np.sum(np.exp(row - row.max())))


def test_top1_is_argmax_equal_to_label_over_real_examples():
  labels = np.array([1, 0, 4, 0, 2])
  sums = jax.device_get(
      passes.top1_sums(
          jnp.asarray(LOGITS), {'label': jnp.asarray(labels), 'mask': jnp.asarray(MASK)}
      )
  )
  # Argmaxes 1, 3, 4, 2 against labels 1, 0, 4, 0: two correct; the padding is not counted.
  assert (float(sums['correct']), float(sums['count'])) == (2.0, 4.0)
  expected_loss = -sum(_log_softmax(LOGITS[i])[labels[i]] for i in range(4))
  np.testing.assert_allclose(float(sums['loss']), expected_loss, rtol=1e-6)


def test_real_counts_a_prediction_among_the_labels_and_leaves_out_unlabelled_examples():
  label_set = np.zeros((5, 6), bool)
  label_set[0, [1, 5]] = True  # Argmax 1: correct.
  label_set[1, [0, 2]] = True  # Argmax 3: wrong.
  # Example 2 has no ReaL label: left out, whatever it predicts.
  label_set[3, [2]] = True  # Argmax 2: correct.
  label_set[4, [2]] = True  # Padding: left out though its argmax 2 is labelled.
  sums = jax.device_get(
      eval_sets.real_sums(
          jnp.asarray(LOGITS), {'label_set': jnp.asarray(label_set), 'mask': jnp.asarray(MASK)}
      )
  )
  assert set(sums) == {'correct', 'count'}
  assert (float(sums['correct']), float(sums['count'])) == (2.0, 3.0)


def test_subset_scores_the_argmax_over_the_subset_logits_only():
  classes = (0, 2, 4)
  labels = np.array([2, 0, 4, 3, 2])
  sums = jax.device_get(
      eval_sets.subset_sums(
          jnp.asarray(LOGITS), {'label': jnp.asarray(labels), 'mask': jnp.asarray(MASK)}, classes
      )
  )
  # Over classes 0, 2, 4 the argmaxes are 2 (0.3 > 0.1), 0, 4 and 2: examples 0 and 1 and 2 are
  # right (over all six logits only example 2 would be). Example 3 is labelled outside the subset.
  assert (float(sums['correct']), float(sums['count'])) == (3.0, 3.0)
  expected_loss = -sum(
      _log_softmax(LOGITS[i][list(classes)])[classes.index(labels[i])] for i in range(3)
  )
  np.testing.assert_allclose(float(sums['loss']), expected_loss, rtol=1e-6)


@pytest.mark.parametrize('name', ['imagenet_a', 'imagenet_r'])
def test_subset_classes_are_timms_indices_in_1k(name):
  info = os.path.join(os.path.dirname(importlib.util.find_spec('timm').origin), 'data', '_info')
  with open(os.path.join(info, f'{name}_indices.txt')) as f:
    timm_indices = tuple(int(line) for line in f if line.strip())
  with open(os.path.join(info, f'{name}_synsets.txt')) as f:
    assert tuple(line.strip() for line in f if line.strip()) == eval_sets.SUBSET_WNIDS[name]
  assert eval_sets.subset_classes(name) == timm_indices
  assert len(timm_indices) == 200


def test_names_take_the_published_or_the_runs_split():
  parsed = eval_sets.parse_all(
      [
          'imagenet2012:validation',
          'imagenet2012_real',
          'imagenet_v2/topimages',
          'imagenet_a',
          'imagenet_r:test[:10%]',
          'imagenet_sketch',
          'cifar10',
          'digits',
          'folder:/data/x:val',
      ],
      dataset='digits',
      eval_split='train[:100]',
  )
  assert [(s.dataset, s.split, s.scoring) for s in parsed] == [
      ('imagenet2012', 'validation', 'top1'),
      ('imagenet2012_real', 'validation', 'real'),
      ('imagenet_v2/topimages', 'test', 'top1'),
      ('imagenet_a', 'test', 'imagenet_a'),
      ('imagenet_r', 'test[:10%]', 'imagenet_r'),
      ('imagenet_sketch', 'test', 'top1'),
      ('cifar10', 'test', 'top1'),
      ('digits', 'train[:100]', 'top1'),
      ('folder:/data/x', 'val', 'top1'),
  ]
  assert (parsed[1].label_key, parsed[1].label_set_key) == ('original_label', 'real_label')


@pytest.mark.parametrize(
    'names, message',
    [
        (('imagenet_v2', 'imagenet_vv2'), "unknown dataset 'imagenet_vv2'; valid: .*'imagenet_a'"),
        (
            ('imagenet_a:validation',),
            "imagenet_a has no labelled split 'validation'; valid: " r"\['test'\]",
        ),
        (('imagenet2012_real:train',), r"no labelled split 'train'; valid: \['validation'\]"),
        (('digits', 'digits'), r"names \['digits'\] more than once"),
    ],
)
def test_bad_names_are_one_config_error_naming_them(names, message):
  config = common.get_config()
  config.eval_sets = names
  with pytest.raises(config_checks.ConfigError, match=r'--config\.eval_sets=.*' + message):
    setup.validate(config, devices=1, processes=1)


def test_default_config_has_no_test_sets():
  config = common.get_config()
  assert config.eval_sets == ()
  setup.validate(config, devices=1, processes=1)


def test_real_label_sets_are_read_from_the_mocked_dataset():
  config = common.get_config()
  config.update(dataset='imagenet2012', image_size=16, eval_batch_size=8)
  (real,) = eval_sets.parse_all(['imagenet2012_real'])
  with tfds.testing.mock_data(num_examples=12):
    raw = list(tfds.load('imagenet2012_real', split='validation').as_numpy_iterator())
    batches = list(real.batches(setting.build(data_settings.DataSettings, config)))
  assert len(batches) == 2
  label_set = np.concatenate([b['label_set'] for b in batches])
  mask = np.concatenate([b['mask'] for b in batches])
  labels = np.concatenate([b['label'] for b in batches])
  assert label_set.shape == (16, 1000) and label_set.dtype == bool
  np.testing.assert_array_equal(mask, [1] * 12 + [0] * 4)
  assert not label_set[12:].any()
  for i, example in enumerate(raw):
    np.testing.assert_array_equal(np.flatnonzero(label_set[i]), np.unique(example['real_label']))
    assert labels[i] == example['original_label']


def _tiny_config(**fields) -> ml_collections.ConfigDict:
  config = common.get_config()
  config.update(
      {
          'image_size': 16,
          'crop_padding': 2,
          'flip': False,
          'batch_size': 8,
          'eval_batch_size': 8,
          'total_steps': 2,
          'warmup_steps': 1,
          'log_every': 1,
          'eval_every': 1000,
          'checkpoint_every': 1000,
          'ema_decay': 0.5,
          'shuffle_buffer': 8,
          **fields,
      }
  )
  config.model.update(
      name='vit_ti4', patch_size=4, hidden_size=16, depth=1, num_heads=2, mlp_dim=32
  )
  return config


def _expected(logits: np.ndarray, example: dict, scoring: str) -> tuple[bool, bool]:
  """(scored, correct) of one example, written out per scoring."""
  predicted = int(np.argmax(logits))
  if scoring == 'real':
    labels = set(example['real_label'].tolist())
    return bool(labels), predicted in labels
  if scoring == 'imagenet_a':
    classes = list(eval_sets.subset_classes('imagenet_a'))
    if int(example['label']) not in classes:
      return False, False
    return True, classes[int(np.argmax(logits[classes]))] == int(example['label'])
  return True, predicted == int(example['label'])


@pytest.mark.e2e
def test_a_run_on_mocked_imagenet_reports_every_set_by_name(tmp_path):
  """Three test sets, on TFDS's mocks of the datasets: results.json and the returned metrics hold
  each set's metrics, raw and EMA, equal to the hand-scored logits of the final weights."""
  config = _tiny_config(
      dataset='imagenet2012',
      eval_split='validation',
      eval_sets=('imagenet2012:validation', 'imagenet2012_real', 'imagenet_a'),
  )
  workdir = str(tmp_path / 'run')
  scored_sets = eval_sets.parse_all(['imagenet2012_real', 'imagenet_a'])
  with tfds.testing.mock_data(num_examples=24):
    result = train.train_and_evaluate(config, workdir)
    raw = {
        s.dataset: list(tfds.load(s.dataset, split=s.split).as_numpy_iterator())
        for s in scored_sets
    }
    images = {
        s.dataset: np.concatenate(
            [b['image'] for b in s.batches(setting.build(data_settings.DataSettings, config))]
        )[:24]
        for s in scored_sets
    }
  results = reader.Workdir(workdir).results()
  for name in config.eval_sets:
    for key in ('accuracy', 'count', 'ema_accuracy'):
      assert results[f'{name}/{key}'] == result.metrics[f'{name}/{key}']
  assert 'imagenet2012_real/loss' not in results  # ReaL is scored on its label sets alone.
  assert results['imagenet2012:validation/accuracy'] == results['test_accuracy']
  assert results['imagenet2012:validation/count'] == 24
  apply = jax.jit(models.create_model(config, 1000).apply, static_argnames='train')
  saved = reader.Workdir(workdir).read_state()
  for weights, prefix in ((saved['params'], ''), (saved['ema']['params'], 'ema_')):
    for eval_set in scored_sets:
      name = eval_set.dataset
      logits = np.asarray(apply({'params': weights}, images[name], train=False))
      scored = [
          _expected(row, example, eval_set.scoring) for row, example in zip(logits, raw[name])
      ]
      count = sum(s for s, _ in scored)
      assert results[f'{name}/count'] == count
      if count:
        assert results[f'{name}/{prefix}accuracy'] == pytest.approx(
            sum(c for _, c in scored) / count, abs=1e-9
        )


def test_a_set_whose_classes_differ_is_refused_before_the_run_starts(tmp_path):
  config = _tiny_config(
      dataset='cifar10', normalization='cifar10', eval_sets=('cifar10:train', 'imagenet_v2')
  )
  with tfds.testing.mock_data(num_examples=4):
    with pytest.raises(
        ValueError, match="'imagenet_v2' has 1000 classes, but the model " 'predicts 10 '
    ):
      train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run' / 'config.json')


def test_an_empty_set_is_refused_before_anything_compiles(data_dir, tmp_path, monkeypatch):
  """A set that holds no examples is named at set-up, not after training."""

  def compile_steps(*args, **kwargs):
    raise AssertionError('compiled an evaluation of an empty set')

  monkeypatch.setattr(eval_sets, 'compile_steps', compile_steps)
  config = tiny_runs.tiny_config(data_dir, eval_sets=('digits:train[:0]',))
  with pytest.raises(ValueError, match=r'digits:train\[:0\] has no examples'):
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run')


@pytest.mark.e2e
def test_evaluate_command_scores_a_finished_runs_ema_on_the_listed_sets(tmp_path):
  """`python -m vit_jax.evaluate --config.eval_sets` on a digits run: its EMA weights' top-1 on
  each set, the run's own test split equal to the run's EMA accuracy; `eval_only` reports the
  same."""
  workdir = tmp_path / 'run'
  config = _tiny_config(normalization='digits', data_dir=str(tmp_path / 'tfds'), total_steps=3)
  run = train.train_and_evaluate(config, str(workdir))
  command = [sys.executable, '-m', 'vit_jax.evaluate', f'--workdir={workdir}']
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL='2')
  good = subprocess.run(
      command + ["--config.eval_sets=('digits', 'digits:train[:100]', 'digits:train[-50:]')"],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert good.returncode == 0, good.stderr[-3000:]
  results = json.loads((workdir / 'results.json').read_text())
  assert results['digits/accuracy'] == pytest.approx(run.metrics['ema_accuracy'], abs=1e-9)
  assert (
      results['digits/count'],
      results['digits:train[:100]/count'],
      results['digits:train[-50:]/count'],
  ) == (360, 100, 50)
  assert results['test_accuracy'] == run.metrics['accuracy']  # The run's own results are kept.
  assert not any(key.startswith(('fewshot/', 'linear_probe/')) for key in results)
  assert 'digits:train[:100]/accuracy' in good.stdout
  config.update(eval_only=True, eval_sets=('digits:train[:100]',))
  report = train.train_and_evaluate(config, str(workdir)).metrics  # The same EMA weights.
  assert report['digits:train[:100]/accuracy'] == results['digits:train[:100]/accuracy']
  assert report['accuracy'] == results['digits/accuracy']
