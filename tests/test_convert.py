"""`vit_jax.data.convert`: an ArrayRecord copy of a TFRecord dataset, seen by every later opener."""

import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from vit_jax.data import convert
from vit_jax.data import digits


def test_a_converted_dataset_is_read_by_index_after_reopening(tmp_path):
  builder = digits.Digits(data_dir=str(tmp_path))
  builder.download_and_prepare()  # TFRecord only, as most existing TFDS installs are.
  assert not convert.has_array_record(builder)
  convert.add_array_record(builder)
  info_file = os.path.join(builder.data_dir, 'dataset_info.json')
  written = os.stat(info_file).st_mtime_ns

  # A fresh builder (another process, a later run) sees the copy; nothing is written again, so
  # processes that open the dataset at once never read a half-written dataset_info.json.
  reopened = digits.Digits(data_dir=str(tmp_path))
  assert convert.has_array_record(reopened)
  convert.add_array_record(reopened)
  digits.prepare(str(tmp_path))
  assert os.stat(info_file).st_mtime_ns == written

  streamed = list(tfds.as_numpy(builder.as_dataset(split='test', shuffle_files=False)))
  source = reopened.as_data_source(split='test')  # (TFDS switches this builder to ArrayRecord.)
  assert len(source) == len(streamed) == digits.NUM_TEST_EXAMPLES
  by_index = {int(e['index']): e for e in streamed}
  for position in (0, 7, len(source) - 1):
    example = source[position]
    expected = by_index[int(example['index'])]
    np.testing.assert_array_equal(example['image'], expected['image'])
    assert int(example['label']) == int(expected['label'])


def test_an_unknown_or_unprepared_dataset_is_refused_in_one_line(tmp_path):
  with pytest.raises(
      ValueError, match=r"^--dataset='cifar100000': no such dataset\. .*list_builders"
  ) as e:
    convert.prepared_builder('cifar100000', str(tmp_path))
  assert '\n' not in str(e.value)
  with pytest.raises(ValueError, match=r"^Dataset 'cifar10' is not prepared in .*prepare it first"):
    convert.prepared_builder('cifar10', str(tmp_path))
