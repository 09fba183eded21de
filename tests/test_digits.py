"""The embedded digits dataset: built offline, documented counts, stratified fixed split."""

import os
import subprocess
import sys

import numpy as np
import pytest
from sklearn import datasets as sk_datasets
import tensorflow_datasets as tfds

from vit_jax.data import digits


def _load(data_dir, split):
  return tfds.as_numpy(tfds.load('digits', split=split, data_dir=data_dir, batch_size=-1))


def test_counts_and_stratification(data_dir):
  train, test = _load(data_dir, 'train'), _load(data_dir, 'test')
  assert len(train['label']) == digits.NUM_TRAIN_EXAMPLES == 1437
  assert len(test['label']) == digits.NUM_TEST_EXAMPLES == 360
  assert tuple(np.bincount(test['label'], minlength=10)) == digits.TEST_COUNTS
  all_labels = sk_datasets.load_digits().target
  # Stratified: each class's test share is within one example of 20 %.
  per_class = np.bincount(all_labels, minlength=10)
  assert np.all(np.abs(np.bincount(test['label'], minlength=10) - 0.2 * per_class) <= 1)
  # Disjoint and complete.
  indices = np.concatenate([train['index'], test['index']])
  np.testing.assert_array_equal(np.sort(indices), np.arange(1797))


def test_images_are_sklearn_digits_scaled_to_uint8(data_dir):
  test = _load(data_dir, 'test')
  reference = sk_datasets.load_digits()
  assert test['image'].dtype == np.uint8 and test['image'].shape == (360, 8, 8, 1)
  expected = np.round(reference.images[test['index']] * 255 / 16).astype(np.uint8)[..., None]
  np.testing.assert_array_equal(test['image'], expected)
  np.testing.assert_array_equal(test['label'], reference.target[test['index']])
  assert test['image'].max() == 255 and test['image'].min() == 0


def test_split_is_pinned():
  # The split must not drift with library versions: these rows were recorded when it was made.
  test = digits.split_indices()['test']
  assert test[:8].tolist() == [21, 24, 28, 34, 35, 37, 39, 42]
  assert int(test.sum()) == 337944


def test_loads_in_a_fresh_process_without_the_builder(data_dir):
  code = (
      'import tensorflow_datasets as tfds; '
      f'ds = tfds.load("digits", split="test", data_dir={data_dir!r}); '
      'print(sum(1 for _ in ds))'
  )
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  result = subprocess.run(
      [sys.executable, '-c', code], capture_output=True, text=True, env=env, check=True, timeout=120
  )
  assert result.stdout.strip().splitlines()[-1] == '360'
