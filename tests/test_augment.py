"""Recipe augmentations against timm/PIL: RandAugment ops, erasing, repeated aug, Mixup/CutMix."""

import collections
import functools
import itertools
import math
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from vit_jax.schema import augment_spec
from vit_jax.configs import common
from vit_jax.data import augment
from vit_jax.data import mixing
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.data import digits
from vit_jax.schema import setting

FILL = (124, 116, 104)  # timm's img_mean for ImageNet normalisation.
ALL_OPS = sorted(set(augment_spec.RAND_OPS + augment_spec.RAND_INCREASING_OPS))


def _test_image():
  rng = np.random.default_rng(0)
  noise = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
  rows, cols = np.mgrid[0:20, 0:24]
  ramps = np.stack([cols * 10 % 256, rows * 12 % 256, cols * rows % 256], -1).astype(np.uint8)
  return np.concatenate([noise[:10], ramps[10:]])


def test_parse_randaugment():
  spec = augment_spec.parse_randaugment('rand-m9-mstd0.5-inc1')
  assert spec == augment_spec.RandAugmentSpec(
      magnitude=9.0, num_layers=2, prob=0.5, magnitude_std=0.5, magnitude_max=10.0, increasing=True
  )
  assert spec.ops == augment_spec.RAND_INCREASING_OPS and len(spec.ops) == 15
  assert augment_spec.parse_randaugment('rand-n3-m7-p0.7').ops == augment_spec.RAND_OPS
  assert augment_spec.parse_randaugment('rand-mstd101').magnitude_std == math.inf
  for bad in ('auto-m9', 'rand-m9-x1', 'rand-mfoo'):
    with pytest.raises(ValueError, match='RandAugment spec'):
      augment_spec.parse_randaugment(bad)


@pytest.mark.parametrize('interpolation', ['bicubic', 'bilinear'])
def test_ops_match_timm(timm, interpolation, monkeypatch):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from timm.data import auto_augment  # pylint: disable=g-import-not-at-top

  image = _test_image()
  resample = Image.BICUBIC if interpolation == 'bicubic' else Image.BILINEAR
  for name in ALL_OPS:
    for magnitude, negate in ((3.0, False), (9.0, True), (10.0, False)):
      # timm's _randomly_negate negates when random.random() > 0.5.
      monkeypatch.setattr(random, 'random', (lambda: 0.9) if negate else (lambda: 0.1))
      level_fn = auto_augment.LEVEL_TO_ARG[name]
      timm_args = level_fn(magnitude, {}) if level_fn else ()
      arg = augment.level_to_arg(name, tf.constant(magnitude), tf.constant(negate))
      if timm_args:
        np.testing.assert_allclose(float(arg), timm_args[0], atol=1e-9, err_msg=name)
      if name.startswith('Posterize') and timm_args == (0,):
        # Pillow >= 10 refuses 0 bits (timm then fails); older Pillow, like us, gives black.
        assert not np.any(augment.apply_op(name, tf.constant(image), arg, FILL, True))
        continue
      expected = np.asarray(
          auto_augment.NAME_TO_OP[name](
              Image.fromarray(image), *timm_args, fillcolor=FILL, resample=resample
          )
      ).astype(int)
      actual = (
          augment.apply_op(
              name, tf.constant(image), arg, tf.constant(FILL, tf.uint8), interpolation == 'bicubic'
          )
          .numpy()
          .astype(int)
      )
      difference = np.abs(expected - actual)
      # PIL's float rounding differs from ours by at most one level on a few pixels.
      assert difference.max() <= 1, (name, magnitude, negate, difference.max())
      assert difference.mean() < 0.15, (name, magnitude, negate, difference.mean())


def test_every_op_compiles_once_per_image_shape():
  # An op whose program needed the image's or argument's values at compile time (as
  # tf.math.bincount's output size does) would be compiled afresh for every image. A traced
  # `bicubic` compiles both interpolations.
  image = tf.TensorSpec([20, 24, 3], tf.uint8)
  arg, fill = tf.TensorSpec([], tf.float64), tf.TensorSpec([3], tf.uint8)
  bicubic = tf.TensorSpec([], tf.bool)
  for name in ALL_OPS:
    hlo = augment._COMPILED_OPS[name].experimental_get_compiler_ir(image, arg, fill, bicubic)(
        stage='hlo'
    )
    assert 'u8[20,24,3]' in hlo, name


def test_op_arguments_stay_in_their_ranges():
  ranges = {
      'Rotate': (-30, 30),
      'ShearX': (-0.3, 0.3),
      'ShearY': (-0.3, 0.3),
      'TranslateXRel': (-0.45, 0.45),
      'TranslateYRel': (-0.45, 0.45),
      'PosterizeIncreasing': (0, 4),
      'SolarizeIncreasing': (0, 256),
      'SolarizeAdd': (0, 110),
      'ColorIncreasing': (0.1, 1.9),
      'ContrastIncreasing': (0.1, 1.9),
      'BrightnessIncreasing': (0.1, 1.9),
      'SharpnessIncreasing': (0.1, 1.9),
  }
  spec = augment_spec.parse_randaugment('rand-m9-mstd0.5-inc1')
  sample = tf.function(lambda seed: augment.sample_magnitude(seed, spec))
  magnitudes = np.array([float(sample(tf.constant([i, 3], tf.int64))) for i in range(300)])
  assert magnitudes.min() >= 0 and magnitudes.max() <= 10
  assert abs(magnitudes.mean() - 9) < 0.1 and abs(magnitudes.std() - 0.5) < 0.1
  for name, (lo, hi) in ranges.items():
    args = [
        float(augment.level_to_arg(name, tf.constant(m), tf.constant(n)))
        for m in np.concatenate([magnitudes[:20], [0.0, 10.0]])
        for n in (False, True)
    ]
    assert lo <= min(args) and max(args) <= hi, name
  # At magnitude ~9 the severity is near the top of each range.
  nine, yes, no = tf.constant(9.0), tf.constant(True), tf.constant(False)
  assert abs(float(augment.level_to_arg('Rotate', nine, yes)) + 27) < 1e-9
  assert float(augment.level_to_arg('PosterizeIncreasing', nine, no)) == 1
  assert float(augment.level_to_arg('SolarizeIncreasing', nine, no)) == 256 - 230


def test_randaugment_is_deterministic_and_changes_images():
  spec = augment_spec.parse_randaugment('rand-m9-mstd0.5-inc1')
  image = tf.constant(_test_image())
  traced = tf.function(lambda seed: augment.randaugment(image, seed, spec, fill=FILL))
  run = lambda i: traced(tf.constant([i, 1], tf.int64)).numpy()
  outputs = [run(i) for i in range(12)]
  np.testing.assert_array_equal(outputs[5], run(5))
  assert all(o.dtype == np.uint8 and o.shape == (20, 24, 3) for o in outputs)
  changed = sum(not np.array_equal(o, image.numpy()) for o in outputs)
  # Each of 2 layers applies with p = 0.5, so about 3/4 of images change.
  assert 5 <= changed < 12
  assert len({o.tobytes() for o in outputs}) >= changed


def test_erase_boxes_follow_timm_bounds():
  areas, aspects = [], []
  box = tf.function(lambda seed: augment.erase_box(seed, 32, 32))
  for i in range(300):
    top, left, height, width = (int(v) for v in box(tf.constant([i, 9], tf.int64)))
    assert height > 0 and width > 0  # A 32x32 image always fits within 10 attempts.
    assert 0 <= top and top + height <= 32 and 0 <= left and left + width <= 32
    areas.append(height * width / 1024)
    aspects.append(height / width)
  # Rounding h and w to pixels can move the area a little outside [0.02, 1/3].
  assert 0.02 * 0.7 <= min(areas) and max(areas) <= 1 / 3 * 1.2
  assert min(areas) < 0.05 and max(areas) > 0.25
  assert 0.3 / 1.5 <= min(aspects) and max(aspects) <= 3.3 * 1.5
  assert min(aspects) < 0.6 and max(aspects) > 2


def test_random_erase_replaces_one_box_with_noise():
  image = tf.fill([32, 32, 3], 7.0)
  erased_fraction, noise = [], []
  erase = tf.function(lambda seed: augment.random_erase(image, seed, 0.25))
  for i in range(200):
    out = erase(tf.constant([i, 4], tf.int64)).numpy()
    changed = np.any(out != 7.0, axis=-1)
    if changed.any():
      rows, cols = np.nonzero(changed)
      box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
      assert changed.sum() == box  # One axis-aligned box.
      erased_fraction.append(box / 1024)
      noise.append(out[changed])
  assert 0.15 < len(erased_fraction) / 200 < 0.35
  assert 0.01 < min(erased_fraction) and max(erased_fraction) < 0.41
  noise = np.concatenate(noise)
  assert abs(noise.mean()) < 0.05 and abs(noise.std() - 1) < 0.05


def _onehot(labels, num_classes=10):
  return jax.nn.one_hot(jnp.asarray(labels), num_classes)


def test_mixup_weight_is_the_label_weight():
  images = jnp.asarray(np.random.default_rng(0).normal(size=(6, 8, 8, 3)), jnp.float32)
  labels = jnp.arange(6)
  mix = jax.jit(
      functools.partial(
          mixing.mix_batch,
          mixup_alpha=0.8,
          cutmix_alpha=0.0,
          switch_prob=0.5,
          mix_prob=1.0,
          label_smoothing=0.0,
      )
  )
  for i in range(20):
    mixed, targets = mix(jax.random.PRNGKey(i), images, _onehot(labels))
    lam = float(targets[0, 0])
    np.testing.assert_allclose(targets[0, 5], 1 - lam, atol=1e-6)
    np.testing.assert_allclose(mixed, lam * images + (1 - lam) * images[::-1], atol=1e-5)
    np.testing.assert_allclose(targets.sum(-1), 1.0, atol=1e-6)


def test_cutmix_box_area_is_the_label_weight():
  images = jnp.asarray(np.random.default_rng(1).normal(size=(4, 16, 12, 3)), jnp.float32)
  labels = jnp.array([0, 1, 2, 3])
  areas = []
  mix = jax.jit(
      functools.partial(
          mixing.mix_batch,
          mixup_alpha=0.0,
          cutmix_alpha=1.0,
          switch_prob=0.5,
          mix_prob=1.0,
          label_smoothing=0.0,
      )
  )
  for i in range(40):
    mixed, targets = mix(jax.random.PRNGKey(i), images, _onehot(labels))
    pasted = np.all(np.asarray(mixed[0]) == np.asarray(images[3]), -1)
    kept = np.all(np.asarray(mixed[0]) == np.asarray(images[0]), -1)
    assert np.all(pasted ^ kept)
    rows, cols = np.nonzero(pasted)
    if len(rows):
      assert pasted.sum() == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)  # A rectangle.
    area = pasted.mean()
    np.testing.assert_allclose(targets[0, 0], 1 - area, atol=1e-6)
    np.testing.assert_allclose(targets[0, 3], area, atol=1e-6)
    areas.append(area)
  assert min(areas) < 0.2 and max(areas) > 0.5  # λ ~ Beta(1, 1) explores the range.


def test_mix_switch_probability_smoothing_and_mix_prob():
  images = jnp.asarray(np.random.default_rng(2).normal(size=(4, 8, 8, 3)), jnp.float32)
  labels = _onehot(jnp.array([0, 1, 2, 3]))

  @jax.jit
  @functools.partial(jax.vmap, in_axes=(0, None))
  def mix(rng, mix_prob):
    return mixing.mix_batch(
        rng,
        images,
        labels,
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        switch_prob=0.5,
        mix_prob=mix_prob,
        label_smoothing=0.1,
    )

  mixed, targets = mix(jax.random.split(jax.random.PRNGKey(0), 200), 1.0)
  is_cut = np.all((mixed[:, 0] == images[0]) | (mixed[:, 0] == images[3]), axis=(1, 2, 3))
  assert 70 < is_cut.sum() < 130
  # timm folds label smoothing in: off = s / K, on = 1 - s + s / K, then mixes.
  lam = np.asarray(targets[:, 0, 0] - 0.01) / 0.9
  np.testing.assert_allclose(targets[:, 0, 3], (1 - lam) * 0.9 + 0.01, atol=1e-5)
  unmixed, targets = mix(jax.random.split(jax.random.PRNGKey(1), 200), 0.0)  # Same compilation.
  np.testing.assert_array_equal(unmixed, np.broadcast_to(images, unmixed.shape))
  np.testing.assert_allclose(targets[0, 0], [0.9 + 0.1 / 10] + [0.1 / 10] * 9, atol=1e-6)
  with pytest.raises(ValueError, match='mixup_alpha > 0 or cutmix_alpha > 0'):
    mixing.mix_batch(
        jax.random.PRNGKey(0),
        images,
        labels,
        mixup_alpha=0.0,
        cutmix_alpha=0.0,
        switch_prob=0.5,
        mix_prob=1.0,
        label_smoothing=0.1,
    )


def test_mix_settings_from_config():
  config = common.get_config()
  assert setting.build_unless_off(data_settings.MixSettings, config) is None
  config.mixup_alpha, config.cutmix_alpha, config.label_smoothing = 0.8, 1.0, 0.1
  settings = setting.build_unless_off(data_settings.MixSettings, config)
  assert settings == data_settings.MixSettings(
      mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, mix_prob=1.0, label_smoothing=0.1
  )
  images = jnp.arange(4 * 8 * 8 * 3, dtype=jnp.float32).reshape(4, 8, 8, 3)
  labels = jax.nn.one_hot(jnp.arange(4), 10)
  rng = jax.random.PRNGKey(3)
  for ours, theirs in zip(
      mixing.mix(settings, rng, images, labels),
      mixing.mix_batch(
          rng,
          images,
          labels,
          mixup_alpha=0.8,
          cutmix_alpha=1.0,
          switch_prob=0.5,
          mix_prob=1.0,
          label_smoothing=0.1,
      ),
  ):
    np.testing.assert_array_equal(ours, theirs)


# Inside the input pipeline.


def _config(data_dir, **overrides):
  config = common.get_config()
  config.update(data_dir=data_dir, normalization='digits', batch_size=12, image_size=16)
  config.update(overrides)
  return config


def _batches(config, count, start_step=0):
  iterator = input_pipeline.train_iterator(
      setting.build(data_settings.DataSettings, config),
      start_step=start_step,
      process_index=0,
      process_count=1,
  )
  return list(itertools.islice(iterator, count))


@pytest.mark.parametrize('on_device', [True, False])
def test_recipe_pipeline_repeats_examples_and_resumes_exactly(data_dir, on_device):
  plain = _batches(_config(data_dir, repeated_aug=3, augment='none'), 2)
  config = _config(
      data_dir,
      repeated_aug=3,
      randaugment='rand-m9-mstd0.5-inc1',
      random_erase_prob=0.25,
      augment_on_device=on_device,
  )
  augmented = _batches(config, 3)
  for plain_batch, batch in zip(plain, augmented):
    assert batch['image'].shape == (12, 16, 16, 3) and np.all(np.isfinite(batch['image']))
    # On device: the host's uint8 crops and one key per image, every copy its own.
    assert batch['image'].dtype == (np.uint8 if on_device else np.float32)
    assert ('augment_key' in batch) == on_device
    if on_device:
      assert batch['augment_key'].shape == (12, 2) and batch['augment_key'].dtype == np.uint32
      assert len({key.tobytes() for key in batch['augment_key']}) == 12
    for group in range(4):
      copies = slice(3 * group, 3 * group + 3)
      assert len(set(batch['label'][copies])) == 1
      np.testing.assert_array_equal(batch['label'][copies], plain_batch['label'][copies])
      same = plain_batch['image'][copies]
      np.testing.assert_array_equal(same[0], same[1])
      np.testing.assert_array_equal(same[0], same[2])
      different = batch['image'][copies]
      assert not np.array_equal(different[0], different[1])
      assert not np.array_equal(different[1], different[2])
  # 4 distinct examples per batch of 12: the batch counts the repeats.
  labels = collections.Counter(plain[0]['label'].tolist())
  assert sum(labels.values()) == 12 and all(count % 3 == 0 for count in labels.values())
  resumed = _batches(config, 1, start_step=2)
  for key in augmented[2]:
    np.testing.assert_array_equal(augmented[2][key], resumed[0][key])


def test_copies_of_an_example_may_span_two_batches(data_dir):
  config = _config(data_dir, repeated_aug=3, augment='none', batch_size=10)
  batches = _batches(config, 3)  # 30 positions: 10 examples, 3 copies each, in a row.
  images = np.concatenate([b['image'] for b in batches]).reshape(10, 3, -1)
  labels = np.concatenate([b['label'] for b in batches]).reshape(10, 3)
  assert (labels == labels[:, :1]).all() and (images == images[:, :1]).all()
  assert len({image.tobytes() for image in images[:, 0]}) == 10
  np.testing.assert_array_equal(_batches(config, 1, start_step=2)[0]['image'], batches[2]['image'])
