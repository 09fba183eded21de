"""Fine-tuning (`init_from`), evaluation only (`eval_only`) and export, through the train loop."""

import glob
import json
import os
import subprocess
import sys

import jax
import numpy as np
from PIL import Image
import pytest
from sklearn import datasets as sk_datasets

from vit_jax.configs import common
from vit_jax import models
from vit_jax.loop import train
from vit_jax.data import digits
from vit_jax.workdir import reader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def digits_config(data_dir: str, **overrides):
  """A 2-block, 64-wide ViT on 8x8 digits (patch 4): about 97 % test accuracy in 150 steps."""
  config = common.get_config()
  config.data_dir = data_dir
  config.image_size = 8
  config.augment = 'none'
  config.flip = False
  config.normalization = 'digits'
  config.batch_size = 64
  config.eval_batch_size = 360
  config.total_steps = 150
  config.warmup_steps = 20
  config.base_lr = 3e-3
  config.log_every = 1000
  config.eval_every = 1000
  config.checkpoint_every = 1000
  config.model.name = 'vit_ti4'
  config.model.patch_size = 4
  config.model.hidden_size = 64
  config.model.depth = 2
  config.model.num_heads = 4
  config.model.mlp_dim = 128
  config.update(overrides)
  return config


def _digit_images() -> tuple[np.ndarray, np.ndarray]:
  loaded = sk_datasets.load_digits()
  return np.round(loaded.images * (255.0 / 16.0)).astype(np.uint8), loaded.target


def write_digit_folder(root: str, label_of, rows_of: dict[str, np.ndarray], scale: int = 1) -> None:
  """The digits of `rows_of[split]` as PNGs under root/split/label_of(digit)/."""
  images, targets = _digit_images()
  for split, rows in rows_of.items():
    for row in rows:
      directory = os.path.join(root, split, label_of(int(targets[row])))
      os.makedirs(directory, exist_ok=True)
      pixels = np.kron(images[row], np.ones((scale, scale), np.uint8))
      Image.fromarray(pixels, mode='L').save(os.path.join(directory, f'{row}.png'))


def eval_curve(workdir: str) -> dict[int, float]:
  """Step -> eval accuracy, from the run's TensorBoard summaries."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  curve = {}
  for path in glob.glob(os.path.join(workdir, 'events.out.tfevents*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == 'eval/accuracy':
          curve[event.step] = float(tf.make_ndarray(value.tensor))
  return dict(sorted(curve.items()))


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
  """A work directory of the tiny ViT trained on digits, and its final test metrics."""
  data_dir = str(tmp_path_factory.mktemp('tfds'))
  workdir = str(tmp_path_factory.mktemp('pretrained'))
  metrics = train.train_and_evaluate(digits_config(data_dir), workdir).metrics
  assert metrics['accuracy'] >= 0.95
  return workdir, data_dir, metrics


@pytest.mark.e2e
def test_fine_tuning_reaches_95_percent_in_fewer_steps_than_scratch(pretrained, tmp_path):
  """A new task on the same images (digit mod 3, unseen test images), new 3-class head.

  Same config, seed and schedule for both runs; only `init_from` differs. Evaluated every 10 steps.
  """
  workdir, _, _ = pretrained
  root = str(tmp_path / 'mod3')
  write_digit_folder(root, lambda digit: f'mod{digit % 3}', digits.split_indices())
  config = dict(dataset=f'folder:{root}', total_steps=60, base_lr=1e-3, eval_every=10)
  steps_to_95 = {}
  for name, extra in (('scratch', {}), ('fine_tuned', {'init_from': workdir})):
    run = str(tmp_path / name)
    train.train_and_evaluate(digits_config(str(tmp_path / 'tfds'), **config, **extra), run)
    curve = eval_curve(run)
    assert sorted(curve) == list(range(10, 61, 10)), curve
    steps_to_95[name] = next((step for step, accuracy in curve.items() if accuracy >= 0.95), None)
    print(name, curve)
  assert steps_to_95['fine_tuned'] is not None and steps_to_95['fine_tuned'] <= 20, steps_to_95
  assert steps_to_95['scratch'] is None or steps_to_95['scratch'] > steps_to_95['fine_tuned']


def test_image_folder_fine_tunes_at_a_new_resolution_and_evaluates(pretrained, tmp_path):
  """30 images of three classes at 16x16 (pre-trained at 8x8): new head, resized pos_embed."""
  workdir, _, _ = pretrained
  root = str(tmp_path / 'images')
  _, targets = _digit_images()
  rows = {digit: np.flatnonzero(targets == digit)[:10] for digit in (0, 1, 2)}
  split_rows = {
      'train': np.concatenate([r[:7] for r in rows.values()]),
      'test': np.concatenate([r[7:] for r in rows.values()]),
  }
  names = {0: 'zero', 1: 'one', 2: 'two'}
  write_digit_folder(root, names.__getitem__, split_rows, scale=2)
  config = digits_config(
      str(tmp_path / 'tfds'),
      dataset=f'folder:{root}',
      image_size=16,
      batch_size=21,
      eval_batch_size=9,
      total_steps=30,
      warmup_steps=5,
      base_lr=1e-3,
      init_from=workdir,
  )
  run = str(tmp_path / 'fine_tuned')
  metrics = train.train_and_evaluate(config, run).metrics
  assert metrics['count'] == 9
  params = reader.Workdir.open(run).read_variables(unrolled=True).variables['params']
  assert params['pos_embed'].shape == (1, 1 + 16, 64)
  assert params['head']['kernel'].shape == (64, 3)

  evaluation = config.copy_and_resolve_references()
  evaluation.eval_only = True
  evaluation.init_from = ''
  files_before = sorted(os.listdir(run))
  report = train.train_and_evaluate(evaluation, run).metrics
  assert report['accuracy'] == metrics['accuracy'] and report['count'] == 9
  assert sorted(os.listdir(run)) == sorted(files_before + ['eval_report.json'])
  with open(os.path.join(run, 'eval_report.json')) as f:
    assert json.load(f)['accuracy'] == metrics['accuracy']

  # The digits checkpoint has 10 classes; evaluating it on 3 classes cannot re-use its head.
  evaluation.init_from = workdir
  with pytest.raises(
      ValueError, match=r'class count(.|\n)*params/head/kernel \(64, 10\) vs ' r'\(64, 3\)'
  ):
    train.train_and_evaluate(evaluation, str(tmp_path / 'eval_elsewhere'))


def test_eval_only_reproduces_the_final_test_accuracy(pretrained, tmp_path):
  workdir, data_dir, metrics = pretrained
  config = digits_config(data_dir, eval_only=True, init_from=workdir)
  report = train.train_and_evaluate(config, str(tmp_path / 'report')).metrics
  assert report['accuracy'] == metrics['accuracy'] and report['count'] == 360
  assert os.listdir(tmp_path / 'report') == ['eval_report.json']
  with pytest.raises(ValueError, match='eval_only needs'):
    train.train_and_evaluate(digits_config(data_dir, eval_only=True), str(tmp_path / 'empty'))


def test_export_cli_writes_what_timm_runs(pretrained, timm, tmp_path):
  from safetensors import torch as safetensors_torch  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  workdir, _, _ = pretrained
  out = str(tmp_path / 'vit.safetensors')
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.export', f'--workdir={workdir}', f'--out={out}'],
      cwd=REPO,
      capture_output=True,
      text=True,
      check=False,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  model = timm.models.VisionTransformer(
      img_size=8, patch_size=4, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=10
  ).eval()
  model.load_state_dict(safetensors_torch.load_file(out), strict=True)
  variables = reader.Workdir.open(workdir).read_variables(unrolled=True).variables
  ours = models.create(
      'vit_ti4', num_classes=10, patch_size=4, hidden_size=64, depth=2, num_heads=4, mlp_dim=128
  )
  images = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype(np.float32)
  expected = np.asarray(jax.jit(ours.apply)(variables, images))
  with torch.no_grad():
    logits = model(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
  assert np.abs(logits - expected).max() <= 1e-5
