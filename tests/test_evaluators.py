"""Few-shot ridge regression and linear probes on frozen features: the closed form, trained
against untrained features, the training loop's periodic runs and `python -m vit_jax.evaluate`."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from vit_jax import evaluators
from vit_jax.data import settings as data_settings
from vit_jax.weights import inference
from vit_jax.evaluators import evaluator
from vit_jax.evaluators import fewshot
from vit_jax.evaluators import linear_probe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
  data = data_settings.DataSettings.from_config(run.config)
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
          '--shots=1,5',
          '--seeds=1',
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
