"""`python -m vit_jax.analyze` on trained runs: every output is written; pruned runs fine-tune."""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests.tiny_runs import CHECKPOINTED_STEPS
from tests.tiny_runs import tiny_config
from vit_jax import models
from vit_jax.analysis import pruning
from vit_jax.analysis import report as report_lib
from vit_jax.workdir import reader
from vit_jax.workdir import run_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cli_writes_every_file_for_a_trained_vit(checkpointed_run, tmp_path):
  workdir = str(tmp_path / 'vit')
  shutil.copytree(checkpointed_run, workdir)
  result = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.analyze',
          f'--workdir={workdir}',
          '--num_images=12',
          '--batch_size=8',
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=600,
      env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL='2'),
  )
  assert result.returncode == 0, result.stderr[-3000:]
  out = os.path.join(workdir, 'analysis')
  expected = ['collapse.png', 'maps.png', 'rollout.png', 'distance.png']
  for name in expected + ['analysis.json']:
    assert os.path.getsize(os.path.join(out, name)) > 1000, name
  with open(os.path.join(out, 'analysis.json')) as f:
    report = json.load(f)
  assert (
      report['files'] == expected
      and report['step'] == CHECKPOINTED_STEPS[-1]
      and report['num_images'] == 12
  )
  assert [layer['name'] for layer in report['layers']] == ['blocks_0/attn', 'blocks_1/attn']
  similarity = np.array(report['collapse']['main']['similarity'])
  assert similarity.shape == (2, 2) and np.allclose(np.diag(similarity), 1.0)
  assert list(report['rollout']) == ['cls']
  assert len(report['distance']['blocks_1/attn']['heads']) == 2  # One distance per head.

  with pytest.raises(ValueError, match='centres.*VisionTransformer'):
    report_lib.analyze(workdir, ['centres'])


def _sa_conv_config(data_dir: str) -> ml_collections.ConfigDict:
  config = tiny_config(data_dir, image_size=16, total_steps=2, batch_size=16)
  config.model = ml_collections.ConfigDict(
      dict(name='sa_conv_gaussian', num_layers=2, hidden_size=8, intermediate_size=12, num_heads=4)
  )
  return config


@pytest.mark.e2e  # About 30 s: eight small compilations and a short fine-tuning run.
def test_sa_conv_run_gets_centres_and_a_pruned_run_that_fine_tunes(data_dir, tmp_path):
  config = _sa_conv_config(data_dir)
  model = models.create_model(config, 10)
  params = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))['params']
  params = jax.tree.map(np.array, params)
  params['layers_1']['attention']['attention_spreads'][2] = np.diag([1.0, 1e-3])  # Degenerate.
  workdir = str(tmp_path / 'sa')
  pruning.write_run(config, params, workdir, 10)

  report = report_lib.analyze(workdir, num_images=8, batch_size=8, finetune_steps=2)
  assert report['files'] == [
      'collapse.png',
      'maps.png',
      'rollout.png',
      'distance.png',
      'centres.png',
  ]
  for name in report['files']:
    assert os.path.getsize(os.path.join(workdir, 'analysis', name)) > 1000, name
  assert len(report['centres']['layer 1']) == 4
  np.testing.assert_allclose(
      [h['mu'] for h in report['centres']['layer 0']],
      params['layers_0']['attention']['attention_centers'],
      atol=1e-4,
  )
  result = report['pruning']
  assert result['pruned_heads'] == [[], [2]] and result['layer_heads'] == [4, 3]
  assert result['parameters'][0] - result['parameters'][1] == 2 + 4 + 8 * 8
  assert result['flops'][1] < result['flops'][0]

  pruned_dir = result['pruned_workdir']
  assert os.path.exists(os.path.join(pruned_dir, 'results.json'))  # Fine-tuned by train.py.
  assert reader.Workdir(pruned_dir).steps()[-1] == 2
  pruned_report = report_lib.analyze(pruned_dir, 'centres', num_images=4, batch_size=4)
  assert [len(pruned_report['centres'][f'layer {i}']) for i in range(2)] == [4, 3]
  assert models.create('sa_conv_gaussian', layer_heads=(4, 3)).layer_heads == (4, 3)


def test_a_cnn_run_is_refused_with_the_families_that_have_attention():
  cnn = models.create('regnety_002', num_classes=10)
  assert report_lib.model_analyses(cnn) == []
  with pytest.raises(ValueError, match=r'RegNet has no attention layers.*vit.*sa_conv'):
    report_lib._resolve('all', cnn)  # pylint: disable=protected-access
  assert 'collapse' in report_lib.model_analyses(models.create('vit_ti4', num_classes=10))


def test_a_run_whose_analysis_cannot_be_written_is_one_line_before_loading(
    checkpointed_run, tmp_path
):
  workdir = str(tmp_path / 'run')
  shutil.copytree(checkpointed_run, workdir)
  with open(os.path.join(workdir, run_files.ANALYSIS_DIR), 'w') as f:
    f.write('mine')
  with pytest.raises(ValueError) as refusal:
    report_lib.analyze(workdir, 'maps')
  assert str(refusal.value) == (
      f'cannot write {workdir}/{run_files.ANALYSIS_DIR}: it is a file, not a directory; it '
      f'needs {report_lib.ANALYSIS_ROOM}.'
  )
