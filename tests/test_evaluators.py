"""The evaluators' one protocol (registering either kind, settings from the config), few-shot
ridge regression and linear probes on frozen features (the closed form, trained against untrained
features), the training loop's periodic runs and `python -m vit_jax.evaluate`."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special
import tensorflow as tf

from vit_jax.schema import config as config_lib
from vit_jax import evaluators
from vit_jax import models
from vit_jax.data import input_pipeline
from vit_jax.evaluators import evaluator
from vit_jax.evaluators import fewshot
from vit_jax.evaluators import frozen
from vit_jax.evaluators import linear_probe
from vit_jax.evaluators import predictions
from vit_jax.parallel import sharding
from vit_jax.schema import data as data_settings
from vit_jax.schema import setting
from vit_jax.weights import inference

from tests import tiny_runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class MeanConfidence(predictions.Evaluator):
  """The mean top-1 probability of the logits divided by `temperature`."""

  temperature: float = 1.0

  def evaluate(self, predictions):
    probabilities = special.softmax(predictions.logits / self.temperature, axis=-1)
    return {'confidence': float(probabilities.max(-1).mean())}


@dataclasses.dataclass(frozen=True)
class FeatureMean(frozen.Evaluator):
  """The mean of the test split's frozen features, times `scale`."""

  scale: float = 1.0

  def evaluate(self, data):
    return {f'{data.name}/feature_mean': self.scale * float(data.test.features.mean())}


def test_both_kinds_register_alike_and_their_fields_are_the_configs(evaluator_registry):
  evaluators.register('confidence', MeanConfidence)
  evaluators.register('feature_mean', FeatureMean)
  config = config_lib.defaults()
  assert config.evaluators.confidence.to_dict() == {'every': None, 'temperature': None}
  assert set(config.evaluators.feature_mean) == {
      'datasets',
      'train_split',
      'test_split',
      'every',
      'scale',
  }
  config.evaluators.confidence.update(every=5, temperature=2.0)
  config.evaluators.feature_mean.scale = 3.0
  periodic = evaluators.periodic(config.evaluators.to_dict())
  assert periodic == {'confidence': MeanConfidence(every=5, temperature=2.0)}
  assert evaluators.create('feature_mean', config.evaluators.feature_mean) == FeatureMean(scale=3.0)
  assert (MeanConfidence.name, FeatureMean.name) == ('confidence', 'feature_mean')  # Log lines'.


def test_every_field_of_the_built_in_evaluators_is_set_from_the_config():
  config = config_lib.defaults()
  for name in ('fewshot', 'linear_probe'):
    fields = {field.name for field in dataclasses.fields(evaluators.EVALUATORS[name])}
    assert set(config.evaluators[name]) == fields, name
    assert set(config.evaluators[name].to_dict().values()) == {None}, name  # Their defaults.
  config.evaluators.fewshot.update(
      every=7,
      l2_regs=(1.0,),
      validation_per_class=2,
      train_split='train[:50%]',
      test_split='train[50%:]',
  )
  (few_shot,) = evaluators.periodic(config.evaluators.to_dict()).values()
  assert (
      few_shot.every,
      few_shot.l2_regs,
      few_shot.validation_per_class,
      few_shot.train_split,
      few_shot.test_split,
  ) == (7, (1.0,), 2, 'train[:50%]', 'train[50%:]')
  # The test sets' settings are the run's own eval_sets and eval_every.
  assert 'test_sets' not in config.evaluators
  config.eval_sets, config.eval_every = ('digits:train[:10]',), 9
  test_sets = evaluators.periodic(config.evaluators.to_dict(), config)['test_sets']
  assert (test_sets.sets, test_sets.every, test_sets.own_split) == (('digits:train[:10]',), 9, True)


def test_registrations_and_unknown_fields_are_refused_naming_what_is_valid(evaluator_registry):
  with pytest.raises(ValueError, match="'fewshot' is registered already"):
    evaluators.register('fewshot', MeanConfidence)
  with pytest.raises(ValueError, match='is not a dataclass of its settings'):
    evaluators.register('plain', object)
  without_evaluate = dataclasses.dataclass(frozen=True)(
      type('WithoutEvaluate', (predictions.Evaluator,), {})
  )
  with pytest.raises(ValueError, match=r"WithoutEvaluate lacks \['evaluate'\]"):
    evaluators.register('without_evaluate', without_evaluate)
  evaluators.register('confidence', MeanConfidence)
  with pytest.raises(
      ValueError,
      match=r"Unknown settings \['temprature'\] of evaluator 'confidence'; "
      r"valid: \['every', 'temperature'\]",
  ):
    evaluators.create('confidence', {'temprature': 2.0})
  with pytest.raises(ValueError, match=r'MeanConfidence needs every >= 0; got every=-1'):
    evaluators.create('confidence', {'every': -1})
  with pytest.raises(ValueError, match=r"Unknown evaluator 'confidance'; valid: \[.*'confidence'"):
    evaluators.periodic({'confidance': {'every': 1}})


def test_a_prediction_evaluator_scores_the_eval_splits_logits_read_once(data_dir):
  config = tiny_runs.tiny_config(data_dir)
  data = setting.build(data_settings.DataSettings, config)
  model = models.create_model(config, num_classes=10)
  variables = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))
  subject = evaluator.Subject(model, data, variables=variables, mesh=sharding.make_mesh(1))
  metrics = MeanConfidence(temperature=2.0).run(subject)
  scored = subject.predictions()
  assert subject.predictions() is scored  # One pass, for every evaluator of the round.
  assert scored.logits.shape == (360, 10) and scored.labels.shape == (360,)
  first = next(input_pipeline.eval_iterator(data))
  np.testing.assert_allclose(
      scored.logits[: len(first['image'])], model.apply(variables, first['image']), atol=1e-5
  )
  np.testing.assert_array_equal(scored.labels[: len(first['label'])], first['label'])
  expected = special.softmax(scored.logits / 2.0, axis=-1).max(-1).mean()
  assert metrics == {'confidence': pytest.approx(expected)}
  with pytest.raises(ValueError, match='scores predictions, and the model has no classifier'):
    MeanConfidence().check(data, num_classes=0, class_names=None)


def test_evaluate_reads_a_runs_settings_and_the_command_lines_over_them():
  from vit_jax import evaluate  # pylint: disable=g-import-not-at-top

  run = config_lib.defaults()
  run.evaluators.fewshot.update(shots=(10,), seeds=2)
  run.eval_sets = ('digits',)
  given = evaluate.given_settings({'evaluators.fewshot.seeds': 1, 'evaluators.ece.bins': 5})
  sections, run_fields = evaluate.settings(run, *given)
  assert (sections['fewshot']['shots'], sections['fewshot']['seeds']) == ((10,), 1)
  assert sections['ece'] == {'bins': 5}  # A run's own evaluator, checked once imported.
  assert run_fields.eval_sets == ('digits',)
  _, run_fields = evaluate.settings(run, *evaluate.given_settings({'eval_sets': ('digits:test',)}))
  assert run_fields.eval_sets == ('digits:test',)
  with pytest.raises(ValueError, match=r'--config.dataset: evaluate reads --config.evaluators'):
    evaluate.given_settings({'dataset': 'cifar10'})
  assert 'ece' in evaluate.overridable(['evaluate', '--config.evaluators.ece.bins=5']).evaluators


@pytest.mark.parametrize('examples, dim', [(40, 6), (5, 12)])  # Primal and dual forms.
def test_ridge_solutions_equal_the_normal_equations(examples, dim):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(examples, dim)).astype(np.float32) * 3 + 1
  y = 2.0 * np.eye(3, dtype=np.float32)[rng.integers(0, 3, examples)] - 1
  l2_regs = (0.5, 64.0)
  solutions = fewshot._ridge_solutions(jnp.asarray(x), jnp.asarray(y), jnp.asarray(l2_regs))
  z = (x.astype(np.float64) - x.mean(0)) / (x.std(0) + 1e-5)
  z = np.concatenate([z, np.full((examples, 1), fewshot.BIAS_FEATURE)], axis=1)
  for l2, weights in zip(l2_regs, np.asarray(solutions['weights'])):
    expected = np.linalg.solve(z.T @ z + l2 * np.eye(dim + 1), z.T @ y)
    np.testing.assert_allclose(weights, expected, rtol=2e-3, atol=2e-3)


def test_settings_are_checked_by_name():
  with pytest.raises(
      ValueError, match="Unknown evaluator 'fewshots'; valid: .'fewshot', " "'linear_probe'."
  ):
    evaluators.create('fewshots')
  with pytest.raises(ValueError, match=r"Unknown settings \['shot'\].*valid: \[.*'shots'"):
    evaluators.create('fewshot', {'shot': (5,)})
  with pytest.raises(ValueError, match='needs shots >= 1'):
    evaluators.create('fewshot', {'shots': (0, 5)})
  with pytest.raises(ValueError, match='inverse_l2s=.* must be positive'):
    evaluators.create('linear_probe', {'inverse_l2s': (-1.0,)})


@pytest.mark.e2e
def test_fewshot_of_a_trained_vit_is_far_above_an_untrained_one(trained_digits_run):
  """The loop's 10-shot accuracy of its final weights against its evaluator's (the run's
  config: 10 shots, 2 seeds) on untrained weights."""
  with open(os.path.join(trained_digits_run, 'results.json')) as f:
    trained = json.load(f)['fewshot/digits_10shot']
  run = inference.load_run(trained_digits_run)
  data = setting.build(data_settings.DataSettings, run.config)
  ten_shot = evaluators.create('fewshot', run.config.evaluators.fewshot)
  untrained_variables = run.model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))
  untrained = ten_shot.run(evaluator.Subject(run.model, data, variables=untrained_variables))[
      'fewshot/digits_10shot'
  ]
  assert trained >= 0.8 and trained >= untrained + 0.2, (trained, untrained)
  probe = linear_probe.LinearProbe(inverse_l2s=(1.0,)).run(
      evaluator.Subject(run.model, data, variables=run.variables)
  )
  assert probe['linear_probe/digits'] >= 0.85


@pytest.mark.e2e
def test_training_writes_periodic_evaluator_metrics(trained_digits_run):
  with open(os.path.join(trained_digits_run, 'results.json')) as f:
    results = json.load(f)
  assert results['fewshot/digits_10shot'] >= 0.8
  assert results['linear_probe/digits'] >= 0.85
  assert results['linear_probe/digits_C'] in linear_probe.LinearProbe().inverse_l2s
  steps = {}
  for name in os.listdir(trained_digits_run):
    if name.startswith('events.out.tfevents'):
      for event in tf.compat.v1.train.summary_iterator(os.path.join(trained_digits_run, name)):
        for value in event.summary.value:
          steps.setdefault(value.tag, []).append(event.step)
  assert steps['fewshot/digits_10shot'] == [400, 800]
  assert steps['linear_probe/digits'] == [800]


@pytest.mark.e2e
def test_cli_on_a_run_writes_results(trained_digits_run, tmp_path):
  result = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.evaluate',
          f'--workdir={trained_digits_run}',
          '--config.evaluators.fewshot.shots=1,5',  # Over the run's 10 shots, 2 seeds.
          '--config.evaluators.fewshot.seeds=1',
          f'--out_dir={tmp_path}',
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=600,
      env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL='2'),
  )
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / 'results.json') as f:
    results = json.load(f)
  metrics = {
      'fewshot/digits_1shot',
      'fewshot/digits_1shot_l2',
      'fewshot/digits_5shot',
      'fewshot/digits_5shot_l2',
      'linear_probe/digits',
      'linear_probe/digits_C',
  }
  assert set(results) == metrics | {'steps'}
  assert results['steps'] == dict.fromkeys(metrics, 800)  # The step of the checkpoint scored.
  assert results['fewshot/digits_5shot'] > results['fewshot/digits_1shot'] - 0.05
  assert 'fewshot/digits_5shot' in result.stdout and 'step 800' in result.stdout
