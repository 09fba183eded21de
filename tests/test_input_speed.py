"""The input benchmark's protocol: loaders of known speed are measured at their speed."""

import time

import numpy as np
import pytest
import tensorflow as tf

from vit_jax.benchmarks import input_speed
from vit_jax.benchmarks import photo_folder

_SLEEP_S = 0.02  # Per item, in every worker.
_WORKERS = 2
_BATCH = 4
_TRUE_BATCHES_PER_S = _WORKERS / (_SLEEP_S * _BATCH)


class _SleepingItems:
  """A map-style dataset whose every item takes `_SLEEP_S` to load."""

  def __len__(self) -> int:
    return 10_000

  def __getitem__(self, index: int) -> np.ndarray:
    time.sleep(_SLEEP_S)
    return np.full([4], index, np.float32)


def _sleeping_item(index: np.ndarray) -> np.ndarray:
  time.sleep(_SLEEP_S)
  return index


def _torch_pipeline() -> input_speed.Pipeline:
  torch = pytest.importorskip('torch')
  return input_speed.dataloader_pipeline(
      'sleeping DataLoader',
      _SleepingItems(),
      torch.utils.data.RandomSampler(_SleepingItems()),
      batch_size=_BATCH,
      workers=_WORKERS,
  )


def _tf_data_pipeline() -> input_speed.Pipeline:
  items = tf.data.Dataset.range(10**9).map(
      lambda i: tf.numpy_function(_sleeping_item, [i], tf.int64), num_parallel_calls=_WORKERS
  )
  batches = items.batch(_BATCH).prefetch(2).as_numpy_iterator()
  return input_speed.tf_data_pipeline('sleeping tf.data map', batches, buffered=3)


def test_loaders_of_known_speed_are_measured_at_their_speed():
  pipelines = [_tf_data_pipeline(), _torch_pipeline()]
  # The command's default flags: the protocol, not the flags, makes the window steady. Before each
  # block both loaders fill their buffers (sleeping workers do not show on a CPU clock).
  timings = input_speed.measure(
      pipelines, steps=5, warmup=2, repeats=3, settle=lambda: time.sleep(0.25)
  )
  for pipeline, timing in zip(pipelines, timings):
    assert 1 / timing.wall_s == pytest.approx(_TRUE_BATCHES_PER_S, rel=0.1), pipeline.name
  pipelines[1].close()


def test_steady_state_windows_outlast_every_buffer():
  pipelines = [
      input_speed.Pipeline(name, lambda n: None, buffered, time.process_time)
      for name, buffered in (('small', 3), ('large', 8))
  ]
  windows = input_speed.steady_state_windows(pipelines, steps=5, warmup=2)
  assert [w.warmup for w in windows] == [2 + 6, 2 + 16]
  assert all(w.timed == input_speed.TIMED_PER_BUFFERED * 8 for w in windows)
  assert input_speed.steady_state_windows(pipelines, steps=500, warmup=0)[0].timed == 500


def test_timm_reads_an_array_record_dataset_from_its_records(tmp_path):
  from vit_jax.configs import common  # pylint: disable=g-import-not-at-top
  from vit_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top

  config = common.get_config()
  config.data_dir = str(tmp_path)
  info = input_pipeline.get_dataset_info(config)  # Prepares the digits as ArrayRecord.
  images = input_speed._timm_images(config, lambda image: image)
  assert len(images) == info.num_train_examples  # The whole split, read by index.
  image, label = images[5]
  assert image.mode == 'RGB' and image.size == (8, 8) and 0 <= label < 10


@pytest.mark.parametrize('source', photo_folder.SOURCES)
def test_photo_folders_hold_imagenet_sized_jpeg_photographs(tmp_path, source):
  from PIL import Image  # pylint: disable=g-import-not-at-top

  root = photo_folder.write(str(tmp_path / source), source, classes=2, per_class=6)
  train = sorted((tmp_path / source / 'train').glob('*/*.jpg'))
  assert len(train) == 12 and len(list((tmp_path / source / 'test').glob('*/*.jpg'))) == 10
  sizes = set()
  for path in train:
    with Image.open(path) as image:
      assert image.format == 'JPEG' and image.mode == 'RGB'
      sizes.add(image.size)
      assert np.asarray(image).std() > 10  # A photograph, not a flat colour.
  assert sizes <= {photo_folder.SIZE, photo_folder.SIZE[::-1]}
  with pytest.raises(ValueError, match='not empty'):
    photo_folder.write(root, source)
