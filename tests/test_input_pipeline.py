"""Input pipeline: shapes, normalisation, per-process splits, padded eval, exact resume, errors."""

import collections
import itertools
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax.schema import normalization
from vit_jax.configs import common
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.data import image_ops
from vit_jax.data import reading
from vit_jax.data import sources
from vit_jax.data import digits
from vit_jax.schema import setting


def _config(data_dir, **overrides):
  config = common.get_config()
  config.data_dir = data_dir
  config.normalization = 'digits'
  config.batch_size = 32
  config.eval_batch_size = 64
  config.update(overrides)
  return config


def _raw_digits(data_dir, split):
  arrays = tfds.as_numpy(tfds.load('digits', split=split, data_dir=data_dir, batch_size=-1))
  return arrays['image'], arrays['label'], arrays['index']


def _unnormalize(images, name):
  """Back to uint8 pixel values; exact for unresized images."""
  mean, std = (np.array(v, np.float32) for v in normalization.NORMALIZATIONS[name])
  pixels = (images * std + mean) * 255.0
  np.testing.assert_allclose(pixels, np.round(pixels), atol=1e-3)
  return np.round(pixels).astype(np.uint8)


def _multiset(images, labels):
  return collections.Counter((image.tobytes(), int(label)) for image, label in zip(images, labels))


def test_dataset_info(data_dir):
  info = input_pipeline.get_dataset_info(
      setting.build(data_settings.DataSettings, _config(data_dir, image_size=16))
  )
  assert info == input_pipeline.DatasetInfo(
      name='digits',
      num_classes=10,
      num_train_examples=1437,
      num_eval_examples=360,
      image_size=16,
      class_names=tuple(str(i) for i in range(10)),
  )


def test_digits_statistics_are_the_train_split_statistics(data_dir):
  images, _, _ = _raw_digits(data_dir, 'train')
  mean, std = normalization.NORMALIZATIONS['digits']
  pixels = images.astype(np.float64) / 255.0
  np.testing.assert_allclose(mean, pixels.mean(), atol=5e-5)
  np.testing.assert_allclose(std, pixels.std(), atol=5e-5)


def test_one_digits_epoch_is_standardised(data_dir):
  # One batch of 1,437 = one whole epoch; unaugmented 8x8 images normalised by digits' stats.
  config = _config(data_dir, batch_size=1437, image_size=8, augment='none')
  batch = next(
      input_pipeline.train_iterator(
          setting.build(data_settings.DataSettings, config), process_index=0, process_count=1
      )
  )
  assert batch['image'].shape == (1437, 8, 8, 3) and batch['image'].dtype == np.float32
  assert abs(batch['image'].mean()) < 2e-4 and abs(batch['image'].std() - 1) < 2e-4
  images, labels, _ = _raw_digits(data_dir, 'train')
  pixels = _unnormalize(batch['image'], 'digits')
  np.testing.assert_array_equal(pixels[..., 0], pixels[..., 2])  # Grayscale tiled.
  assert _multiset(pixels[..., :1], batch['label']) == _multiset(images, labels)


@pytest.mark.parametrize('name', sorted(normalization.NORMALIZATIONS))
def test_normalisation_of_constant_images(name):
  mean, std = (np.array(v, np.float32) for v in normalization.NORMALIZATIONS[name])
  at_mean = image_ops.normalize(tf.fill([4, 4, 3], 1.0) * 255.0 * mean, mean, std)
  one_std_up = image_ops.normalize(tf.fill([4, 4, 3], 1.0) * 255.0 * (mean + std), mean, std)
  np.testing.assert_allclose(at_mean, 0.0, atol=1e-5)
  np.testing.assert_allclose(one_std_up, 1.0, atol=1e-5)
  white = image_ops.normalize(tf.fill([2, 2, 3], 255.0), mean, std).numpy()
  np.testing.assert_allclose(white[0, 0], (1 - mean) / std, rtol=1e-5)


@pytest.mark.parametrize('size', [8, 224])  # TensorFlow's kernels, then the fused XLA loop.
def test_whole_pixels_clip_and_round_half_to_even(size):
  rng = np.random.default_rng(0)
  image = rng.uniform(-40.0, 300.0, (size, size, 3)).astype(np.float32)
  image[0, 0] = [0.5, 1.5, 254.5]  # Ties go to the even neighbour, as PIL's 8-bit output.
  pixels = image_ops.whole_pixels(tf.constant(image)).numpy()
  assert pixels.dtype == np.uint8
  np.testing.assert_array_equal(pixels[0, 0], [0, 2, 254])
  np.testing.assert_array_equal(pixels, np.round(np.clip(image, 0.0, 255.0)).astype(np.uint8))


@pytest.mark.parametrize('whole', [True, False])
def test_crop_resize_is_tensorflows_antialiased_resize_bit_for_bit(whole):
  """`_resize_crop` (two vertical passes, transposed by XLA) equals `_resize` then
  `_whole_pixels` (or the clipped floats) byte for byte: shrinking, enlarging, thin crops, widths
  on both sides of the padded widths."""
  rng = np.random.default_rng(0)
  spec = [tf.TensorSpec([None, None, 3], tf.uint8)]

  @tf.function(input_signature=spec)
  def reference(crop):
    resized = tf.ensure_shape(image_ops.resize(crop, 96, 96, clip=not whole), [96, 96, 3])
    return image_ops.whole_pixels(resized) if whole else resized

  resize_crop = tf.function(
      lambda crop: image_ops.resize_crop(crop, 96, whole), input_signature=spec
  )
  for shape in [(1, 1), (5, 3), (60, 97), (96, 96), (97, 95), (375, 500), (2, 540), (700, 31)]:
    crop = tf.constant(rng.integers(0, 256, shape + (3,), dtype=np.uint8))
    expected, actual = reference(crop).numpy(), resize_crop(crop).numpy()
    assert actual.dtype == expected.dtype == (np.uint8 if whole else np.float32)
    assert actual.tobytes() == expected.tobytes(), shape


def test_imagenet_and_inception_constants():
  assert normalization.NORMALIZATIONS['imagenet'] == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
  black = image_ops.normalize(tf.zeros([1, 1, 3]), *normalization.mean_std('inception')).numpy()
  np.testing.assert_allclose(black, -1.0)


@pytest.mark.parametrize('augment', ['crop_flip', 'inception_crop', 'none'])
def test_mock_cifar10_train_batches(augment):
  config = _config(
      None,
      dataset='cifar10',
      normalization='cifar10',
      image_size=24,
      augment=augment,
      batch_size=16,
  )
  with tfds.testing.mock_data(num_examples=40):
    batches = list(
        itertools.islice(
            input_pipeline.train_iterator(
                setting.build(data_settings.DataSettings, config), process_index=0, process_count=1
            ),
            4,
        )
    )
  for batch in batches:
    assert set(batch) == {'image', 'label'}
    assert batch['image'].shape == (16, 24, 24, 3) and batch['image'].dtype == np.float32
    assert batch['label'].shape == (16,) and batch['label'].dtype == np.int32
    assert batch['label'].min() >= 0 and batch['label'].max() < 10
    assert np.all(np.isfinite(batch['image']))
  mean, std = normalization.NORMALIZATIONS['cifar10']
  lowest = (0 - np.array(mean)) / np.array(std)
  highest = (1 - np.array(mean)) / np.array(std)
  images = np.concatenate([b['image'] for b in batches])
  assert np.all(images >= lowest - 1e-4) and np.all(images <= highest + 1e-4)


def test_mock_cifar10_unaugmented_batches_are_normalised_dataset_images():
  config = _config(
      None, dataset='cifar10', normalization='cifar10', image_size=32, augment='none', batch_size=10
  )
  with tfds.testing.mock_data(num_examples=20):
    raw = next(tfds.load('cifar10', split='train').batch(20).as_numpy_iterator())
    batches = list(
        itertools.islice(
            input_pipeline.train_iterator(
                setting.build(data_settings.DataSettings, config), process_index=0, process_count=1
            ),
            2,
        )
    )
    info = input_pipeline.get_dataset_info(setting.build(data_settings.DataSettings, config))
  assert (info.num_classes, info.num_train_examples, info.num_eval_examples) == (10, 20, 20)
  pixels = _unnormalize(np.concatenate([b['image'] for b in batches]), 'cifar10')
  labels = np.concatenate([b['label'] for b in batches])
  assert _multiset(pixels, labels) == _multiset(raw['image'], raw['label'])  # One epoch.


def test_mock_cifar10_eval_batches():
  config = _config(
      None,
      dataset='cifar10',
      normalization='cifar10',
      image_size=28,
      eval_crop_ratio=0.875,
      eval_batch_size=16,
  )
  with tfds.testing.mock_data(num_examples=20):
    batches = list(
        input_pipeline.eval_iterator(
            setting.build(data_settings.DataSettings, config), process_index=0, process_count=1
        )
    )
  assert len(batches) == 2
  for batch in batches:
    assert batch['image'].shape == (16, 28, 28, 3) and batch['image'].dtype == np.float32
    assert batch['mask'].dtype == np.float32 and batch['label'].dtype == np.int32
  np.testing.assert_array_equal(batches[1]['mask'], [1] * 4 + [0] * 12)


def test_process_splits_are_disjoint_and_cover_the_split(data_dir):
  _, _, all_indices = _raw_digits(data_dir, 'train')
  parts = [_raw_digits(data_dir, sources.process_split('train', p, 3))[2] for p in range(3)]
  assert sorted(len(part) for part in parts) == [479, 479, 479]
  union = np.concatenate(parts)
  assert len(np.unique(union)) == len(union)
  np.testing.assert_array_equal(np.sort(union), np.sort(all_indices))


def test_train_epoch_of_each_process_is_its_own_split(data_dir):
  config = _config(
      data_dir, batch_size=3 * 479, image_size=8, augment='none', normalization='inception'
  )
  seen = collections.Counter()
  for process in range(3):
    batch = next(
        input_pipeline.train_iterator(
            setting.build(data_settings.DataSettings, config),
            process_index=process,
            process_count=3,
        )
    )
    assert batch['image'].shape == (479, 8, 8, 3)
    images, labels, _ = _raw_digits(data_dir, sources.process_split('train', process, 3))
    local = _multiset(_unnormalize(batch['image'], 'inception')[..., :1], batch['label'])
    assert local == _multiset(images, labels)
    seen += local
  images, labels, _ = _raw_digits(data_dir, 'train')
  assert seen == _multiset(images, labels)


@pytest.mark.parametrize('process_count,local_batch', [(1, 64), (3, 32), (7, 17)])
def test_eval_counts_every_example_once(data_dir, process_count, local_batch):
  # With 7 processes the shards hold 52 or 51 examples: 4 batches of 17 vs 3, so some pad more.
  config = _config(data_dir, eval_batch_size=process_count * local_batch, image_size=8)
  per_process = [
      list(
          input_pipeline.eval_iterator(
              setting.build(data_settings.DataSettings, config),
              process_index=p,
              process_count=process_count,
          )
      )
      for p in range(process_count)
  ]
  assert len({len(batches) for batches in per_process}) == 1
  real_images, real_labels = [], []
  for batches in per_process:
    for batch in batches:
      assert batch['image'].shape == (local_batch, 8, 8, 3)
      mask = batch['mask'].astype(bool)
      assert set(np.unique(batch['mask'])) <= {0.0, 1.0}
      # Padding only at the end of a process's stream.
      assert np.all(mask[: mask.sum()])
      real_images.append(batch['image'][mask])
      real_labels.append(batch['label'][mask])
  pixels = _unnormalize(np.concatenate(real_images), 'digits')[..., :1]
  images, labels, _ = _raw_digits(data_dir, 'test')
  assert len(pixels) == 360
  assert _multiset(pixels, np.concatenate(real_labels)) == _multiset(images, labels)


def _batches(config, start_step, count):
  iterator = input_pipeline.train_iterator(
      setting.build(data_settings.DataSettings, config),
      start_step=start_step,
      process_index=1,
      process_count=2,
  )
  return list(itertools.islice(iterator, count))


@pytest.mark.parametrize('in_memory', [None, False])
def test_resume_is_exact(data_dir, in_memory):
  # 718 train examples per process, batch 64: an epoch boundary falls inside step 11.
  config = _config(
      data_dir,
      batch_size=128,
      image_size=16,
      augment='crop_flip',
      in_memory=in_memory,
      shuffle_buffer=256,
  )
  uninterrupted = _batches(config, 0, 14)
  resumed = _batches(config, 9, 5)
  for expected, actual in zip(uninterrupted[9:], resumed):
    np.testing.assert_array_equal(expected['image'], actual['image'])
    np.testing.assert_array_equal(expected['label'], actual['label'])
  other_seed = _batches(
      _config(
          data_dir, batch_size=128, image_size=16, seed=1, in_memory=in_memory, shuffle_buffer=256
      ),
      9,
      1,
  )
  assert not np.array_equal(other_seed[0]['image'], resumed[0]['image'])


def test_epochs_are_reshuffled(data_dir):
  config = _config(data_dir, batch_size=1436, image_size=8, augment='none')
  first, second = _batches(config, 0, 2)  # Process 1 of 2 holds 718 examples: one epoch a batch.
  assert _multiset(first['image'], first['label']) == _multiset(second['image'], second['label'])
  assert not np.array_equal(first['label'], second['label'])


@pytest.mark.parametrize('repeated_aug', [1, 3])
def test_a_split_held_in_memory_gives_the_batches_read_from_array_record(
    data_dir, monkeypatch, repeated_aug
):
  config = _config(data_dir, image_size=16, augment='crop_flip', repeated_aug=repeated_aug)
  in_memory = _batches(config, 3, 2)
  monkeypatch.setattr(input_pipeline, 'IN_MEMORY_MAX_BYTES', 0)  # Too big: read from ArrayRecord.
  from_array_record = _batches(config, 3, 2)
  for expected, actual in zip(from_array_record, in_memory):
    np.testing.assert_array_equal(expected['image'], actual['image'])
    np.testing.assert_array_equal(expected['label'], actual['label'])


def test_in_memory_rule(data_dir):
  # The digits (ArrayRecord, and a TFRecord copy) fit in memory.
  config = _config(data_dir)
  source = sources.resolve(config)
  assert source.random_access and source.streamable
  assert input_pipeline._fits_in_memory(config, source, 'train')
  config.in_memory = False
  assert not input_pipeline._fits_in_memory(config, source, 'train')


def test_inception_crop_boxes_follow_timm_ranges():
  areas, ratios = [], []
  for i in range(200):
    top, left, height, width = (
        int(v)
        for v in image_ops.inception_crop_box(
            tf.constant([180, 240]), tf.constant([i, 7], tf.int64)
        )
    )
    assert 0 <= top and top + height <= 180 and 0 <= left and left + width <= 240
    areas.append(height * width / (180 * 240))
    ratios.append(width / height)
  assert 0.08 - 0.01 <= min(areas) and max(areas) <= 1.0
  assert 3 / 4 - 0.02 <= min(ratios) and max(ratios) <= 4 / 3 + 0.02
  assert max(areas) - min(areas) > 0.5  # The range is actually explored.


def _photo_like(height=60, width=80):
  rows, cols = np.mgrid[0:height, 0:width]
  noise = np.random.default_rng(3).integers(0, 40, (height, width, 3))
  return (np.stack([cols * 3, rows * 4, cols + rows], -1) % 200 + noise).astype(np.uint8)


@pytest.mark.parametrize('augment', ['inception_crop', 'crop_flip'])
def test_train_image_from_encoded_bytes_is_the_decoded_images(augment):
  pixels = _photo_like()
  config = _config(
      None, image_size=24, augment=augment, normalization='imagenet', random_erase_prob=0.5
  )
  transform = setting.build(data_settings.TrainTransform, config)
  train = tf.function(
      lambda image, seed: input_pipeline._train_image(image, seed, transform)['image']
  )
  png, jpeg = tf.io.encode_png(pixels), tf.io.encode_jpeg(pixels, quality=95)
  decoded_jpeg = tf.io.decode_jpeg(jpeg)
  for i in range(6):
    seed = tf.constant([i, 2], tf.int64)
    # The same pixels, up to the float rounding of resizing an image of static or dynamic shape.
    np.testing.assert_allclose(train(png, seed), train(pixels, seed), atol=1e-5)
    if augment == 'crop_flip':  # Decoded whole, as tf.io.decode_jpeg does.
      np.testing.assert_allclose(train(jpeg, seed), train(decoded_jpeg, seed), atol=1e-5)


def test_inception_crop_of_a_jpeg_decodes_the_same_window():
  jpeg = tf.io.encode_jpeg(_photo_like(), quality=95)
  decoded = tf.io.decode_jpeg(jpeg)
  for i in range(20):
    seed = tf.constant([i, 5], tf.int64)
    window = image_ops.inception_crop(jpeg, seed).numpy().astype(int)
    expected = image_ops.inception_crop(decoded, seed).numpy().astype(int)
    assert window.shape == expected.shape
    # Chroma upsampling differs only along the window's edges.
    assert np.abs(window - expected)[1:-1, 1:-1].max() <= 1
    assert np.abs(window - expected).mean() < 0.5


def test_bad_dataset_name_raises():
  with pytest.raises(ValueError, match=r"'no_such_dataset'.*'digits'.*'cifar10'"):
    input_pipeline.get_dataset_info(
        setting.build(data_settings.DataSettings, _config(None, dataset='no_such_dataset'))
    )


def test_bad_split_raises(data_dir):
  with pytest.raises(ValueError, match=r"no split 'validation'.*'train', 'test'"):
    input_pipeline.get_dataset_info(
        setting.build(data_settings.DataSettings, _config(data_dir, eval_split='validation'))
    )
  with pytest.raises(ValueError, match="no split 'tset'"):
    next(
        input_pipeline.eval_iterator(
            setting.build(data_settings.DataSettings, _config(data_dir)), split='train[:10]+tset'
        )
    )


@pytest.mark.parametrize(
    'field, split', [('eval_split', 'test[:0]'), ('train_split', 'train[5:2]')]
)
def test_an_empty_or_reversed_slice_is_refused_before_training(data_dir, field, split):
  """Found with the dataset's sizes, before anything compiles or trains (not at the final
  evaluation, or in TFDS's reader)."""
  with pytest.raises(ValueError, match=rf"--config.{field}='{re.escape(split)}' holds no exa"):
    input_pipeline.get_dataset_info(
        setting.build(data_settings.DataSettings, _config(data_dir, **{field: split}))
    )


def test_indivisible_batch_raises_before_touching_the_dataset():
  config = _config('/nonexistent', dataset='no_such_dataset', batch_size=128)
  with pytest.raises(ValueError, match='batch_size=128.*process count 3'):
    input_pipeline.train_iterator(
        setting.build(data_settings.DataSettings, config), process_index=0, process_count=3
    )
  with pytest.raises(ValueError, match='eval_batch_size=64.*process count 3'):
    input_pipeline.eval_iterator(
        setting.build(data_settings.DataSettings, config), process_index=0, process_count=3
    )


# Random access on a dataset that is not held in memory: a folder of JPEGs of varied sizes.


def _folder_config(jpeg_folder, **overrides):
  root, data_dir = jpeg_folder
  config = common.get_config()
  config.dataset = f'folder:{root}'
  config.data_dir = data_dir
  config.normalization = 'inception'
  config.image_size = 16
  config.update(overrides)
  return config


def _deit_recipe(jpeg_folder, **overrides):
  """DeiT's per-example augmentations (RandAugment left out: it only slows the tests down)."""
  # Two examples per batch, three copies each; 30 train examples: an epoch is 15 batches.
  recipe = dict(augment='inception_crop', random_erase_prob=0.25, repeated_aug=3, batch_size=6)
  return _folder_config(jpeg_folder, **{**recipe, **overrides})


def _islice(config, start_step, count, process_index=0, process_count=1):
  iterator = input_pipeline.train_iterator(
      setting.build(data_settings.DataSettings, config),
      start_step=start_step,
      process_index=process_index,
      process_count=process_count,
  )
  return list(itertools.islice(iterator, count))


def test_folder_is_read_by_index(jpeg_folder):
  source = sources.resolve(_folder_config(jpeg_folder))
  assert source.random_access and not source.streamable
  assert source.image_feature().shape == (None, None, 3)
  with pytest.raises(ValueError, match='in_memory=False.*ArrayRecord only.*unset'):
    input_pipeline.train_iterator(
        setting.build(data_settings.DataSettings, _folder_config(jpeg_folder, in_memory=False))
    )


def test_resume_from_any_step_is_exact_across_epochs(jpeg_folder):
  config = _deit_recipe(jpeg_folder)
  uninterrupted = _islice(config, 0, 17)
  # From step 13 the batches run into the second epoch (step 15).
  for expected, actual in zip(uninterrupted[13:], _islice(config, 13, 4)):
    np.testing.assert_array_equal(expected['image'], actual['image'])
    np.testing.assert_array_equal(expected['label'], actual['label'])
  # Repeated augmentation: three consecutive copies of one example, each augmented differently.
  for batch in uninterrupted:
    copies = batch['image'].reshape((2, 3) + batch['image'].shape[1:])
    assert np.all(batch['label'].reshape(2, 3) == batch['label'][::3, None])
    assert not np.array_equal(copies[:, 0], copies[:, 1])
  other_seed = _islice(_deit_recipe(jpeg_folder, seed=1), 13, 1)[0]
  assert not np.array_equal(other_seed['image'], uninterrupted[13]['image'])


def test_two_processes_read_every_example_once_per_epoch(jpeg_folder):
  # Unaugmented training images are the eval view (resize and centre crop at ratio 1) before the
  # eval transform rounds pixels to whole values: each matches one eval image within half a level.
  config = _folder_config(jpeg_folder, augment='none', batch_size=30, eval_batch_size=30)
  everything = next(
      input_pipeline.eval_iterator(
          setting.build(data_settings.DataSettings, config),
          split='train',
          process_index=0,
          process_count=1,
      )
  )
  assert everything['mask'].sum() == 30
  half_level = 0.5 / 255 / 0.5 + 1e-5  # inception normalisation: (x / 255 - 0.5) / 0.5
  for process_epochs in zip(*(_islice(config, 0, 2, process, 2) for process in range(2))):
    matched = collections.Counter()
    for batch in process_epochs:  # 15 examples each: one batch is one epoch of this process.
      assert batch['image'].shape == (15, 16, 16, 3)
      distance = np.abs(batch['image'][:, None] - everything['image'][None]).max(axis=(2, 3, 4))
      nearest = distance.argmin(axis=1)
      assert (distance.min(axis=1) <= half_level).all()
      np.testing.assert_array_equal(batch['label'], everything['label'][nearest])
      matched.update(nearest.tolist())
    assert matched == collections.Counter(range(30))


def test_records_read_for_the_first_batch_do_not_depend_on_the_step(jpeg_folder, monkeypatch):
  from array_record.python import array_record_data_source  # pylint: disable=g-import-not-at-top

  reads = []
  original = array_record_data_source.ArrayRecordDataSource.__getitems__

  def counted(self, keys):
    reads.append(len(keys))
    return original(self, keys)

  monkeypatch.setattr(array_record_data_source.ArrayRecordDataSource, '__getitems__', counted)
  config = _deit_recipe(jpeg_folder, prefetch=1)
  read_at = {}
  for start_step in (0, 17_000):  # 17,000 steps of 6: 102,000 examples consumed before.
    reads.clear()
    batch = next(
        input_pipeline.train_iterator(
            setting.build(data_settings.DataSettings, config),
            start_step=start_step,
            process_index=0,
            process_count=1,
        )
    )
    assert batch['image'].shape == (6, 16, 16, 3)
    read_at[start_step] = sum(reads)
  # A batch needs 2 records; reading ahead (prefetch, parallel reads) adds a bounded amount.
  assert all(2 <= n <= 8 * reading._READ_CHUNK for n in read_at.values()), read_at


def _one_image_folder(root, encoded: bytes, extension: str) -> str:
  """A folder whose 2 classes x 3 train images (and 1 test image each) are all `encoded`."""
  for split, count in (('train', 3), ('test', 1)):
    for c in range(2):
      (root / split / f'class{c}').mkdir(parents=True)
      for i in range(count):
        (root / split / f'class{c}' / f'{i}.{extension}').write_bytes(encoded)
  return str(root)


@pytest.mark.parametrize(
    'image_format,repeated_aug,window',
    [
        ('jpeg', 1, True),  # Only the crop window is decoded...
        ('jpeg', 3, False),  # ...unless the image is decoded once for its three copies.
        ('png', 1, False),  # Not a JPEG: decoded whole.
    ],
)
def test_train_iterator_decodes_what_the_recipe_needs(tmp_path, image_format, repeated_aug, window):
  pixels = _photo_like(48, 64)
  encoded = (
      tf.io.encode_jpeg(pixels, quality=90) if image_format == 'jpeg' else tf.io.encode_png(pixels)
  ).numpy()
  root = _one_image_folder(tmp_path / 'images', encoded, image_format)
  config = common.get_config()
  config.update(
      dataset=f'folder:{root}',
      data_dir=str(tmp_path / 'tfds'),
      image_size=16,
      normalization='inception',
      augment='inception_crop',
      flip=False,
      random_erase_prob=0.0,
      repeated_aug=repeated_aug,
      batch_size=6,
  )
  data = setting.build(data_settings.DataSettings, config)
  assert reading.decodes_crop_window(data.train_transform, repeated_aug) == (repeated_aug == 1)
  batches = list(
      itertools.islice(input_pipeline.train_iterator(data, process_index=0, process_count=1), 2)
  )
  augment_seed = reading.stream_seed(data, 0, reading.AUGMENT_SALT)

  @tf.function(input_signature=[tf.TensorSpec([None, None, 3], tf.uint8)])
  def finish(crop):  # The rest of `_train_image` for this recipe, on a crop of dynamic shape.
    return image_ops.normalize(image_ops.resize(crop, 16, 16), *normalization.mean_std('inception'))

  whole = tf.io.decode_image(encoded, channels=3)
  differs = []
  for position in range(12):
    seed = tf.random.experimental.stateless_fold_in(augment_seed, tf.constant(position, tf.int64))
    crop_seed = tf.random.experimental.stateless_split(seed, 4)[0]
    top, left, height, width = image_ops.inception_crop_box(tf.shape(whole), crop_seed)
    from_whole = finish(whole[top : top + height, left : left + width])
    expected = from_whole
    if image_format == 'jpeg':
      from_window = finish(
          tf.io.decode_and_crop_jpeg(encoded, [top, left, height, width], channels=3)
      )
      expected, other = (from_window, from_whole) if window else (from_whole, from_window)
      differs.append(np.abs(other - expected).max())
    np.testing.assert_allclose(batches[position // 6]['image'][position % 6], expected, atol=1e-5)
  if image_format == 'jpeg':  # Full and windowed decodes differ along the window's edges.
    assert max(differs) > 1e-3
