"""The training step's batch augmentation (`batch_augment`) against timm/PIL and timm's draws."""

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.schema import augment_spec
from vit_jax.data import batch_augment
from vit_jax.schema import normalization
from vit_jax.schema import setting
from vit_jax.schema import step as step_settings

FILL = (124, 116, 104)  # timm's img_mean for ImageNet normalisation.
ALL_OPS = tuple(sorted(set(augment_spec.RAND_OPS + augment_spec.RAND_INCREASING_OPS)))
SPEC = augment_spec.parse_randaugment('rand-m9-mstd0.5-inc1')


def _test_image(height=20, width=24):
  rng = np.random.default_rng(0)
  noise = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
  rows, cols = np.mgrid[0:height, 0:width]
  ramps = np.stack([cols * 10 % 256, rows * 12 % 256, cols * rows % 256], -1).astype(np.uint8)
  return np.concatenate([noise[: height // 2], ramps[height // 2 :]])


def _photo(size=224):
  """A crop of a photograph: the pixels the approximation is measured on."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top

  return datasets.load_sample_images().images[0][100 : 100 + size, 200 : 200 + size]


def _timm_cases(timm, image, interpolation, monkeypatch):
  """(op index, argument, timm's output) for every op at magnitudes 3, 9, 10, either sign."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from timm.data import auto_augment  # pylint: disable=g-import-not-at-top

  resample = Image.BICUBIC if interpolation == 'bicubic' else Image.BILINEAR
  cases = []
  for index, name in enumerate(ALL_OPS):
    for magnitude, negate in ((3.0, False), (9.0, True), (10.0, False)):
      monkeypatch.setattr(random, 'random', (lambda: 0.9) if negate else (lambda: 0.1))
      level_fn = auto_augment.LEVEL_TO_ARG[name]
      timm_args = level_fn(magnitude, {}) if level_fn else ()
      if name.startswith('Posterize') and timm_args == (0,):
        continue  # Pillow >= 10 refuses 0 bits (`test_augment` checks ours gives black).
      expected = auto_augment.NAME_TO_OP[name](
          Image.fromarray(image), *timm_args, fillcolor=FILL, resample=resample
      )
      cases.append((index, timm_args[0] if timm_args else 0.0, np.asarray(expected)))
  return cases


@pytest.mark.parametrize('interpolation', ['bicubic', 'bilinear'])
def test_ops_match_timm_within_one_level(timm, interpolation, monkeypatch):
  for image, bound in ((_test_image(), 0.15), (_photo(), 0.06)):
    cases = _timm_cases(timm, image, interpolation, monkeypatch)
    choice = jnp.array([c[0] for c in cases])
    args = jnp.array([c[1] for c in cases], jnp.float32)
    images = jnp.broadcast_to(image, (len(cases),) + image.shape)
    ours = jax.jit(batch_augment.apply_ops, static_argnums=(1, 5))(
        images, ALL_OPS, choice, args, jnp.array(FILL, jnp.uint8), interpolation == 'bicubic'
    )
    for (index, _, expected), actual in zip(cases, np.asarray(ours)):
      difference = np.abs(expected.astype(int) - actual.astype(int))
      # float32 where PIL computes in double: one level on a few pixels of a geometric op
      # (as many as `augment`'s ops differ by on some), never more.
      assert difference.max() <= 1, (ALL_OPS[index], difference.max())
      assert difference.mean() < bound, (ALL_OPS[index], difference.mean())


def test_no_op_leaves_images_as_they_are():
  image = jnp.asarray(_test_image())[None]
  out = batch_augment.apply_ops(
      image, ALL_OPS, jnp.array([-1]), jnp.array([5.0]), jnp.array(FILL, jnp.uint8)
  )
  np.testing.assert_array_equal(out, image)


def test_draws_follow_timm():
  keys = jax.random.split(jax.random.key(0), 6000)
  choices, magnitudes, negates = (np.asarray(v) for v in batch_augment.layer_draws(keys, SPEC))
  assert choices.shape == magnitudes.shape == negates.shape == (6000, SPEC.num_layers)
  assert abs((choices >= 0).mean() - SPEC.prob) < 0.02
  counts = np.bincount(choices[choices >= 0], minlength=len(SPEC.ops))
  assert len(counts) == len(SPEC.ops) and counts.min() > 0.8 * counts.mean()
  assert magnitudes.min() >= 0 and magnitudes.max() <= 10
  assert abs(magnitudes.mean() - 9) < 0.05 and abs(magnitudes.std() - 0.5) < 0.05
  assert abs(negates.mean() - 0.5) < 0.02


def test_randaugment_is_deterministic_per_image_and_changes_images():
  ramp = jnp.broadcast_to(jnp.asarray(_test_image()), (400, 20, 24, 3))
  keys = jax.random.split(jax.random.key(3), 400)
  run = jax.jit(batch_augment.randaugment, static_argnums=(2, 3))
  out = np.asarray(run(ramp, keys, SPEC, FILL))
  # Each of 2 layers applies with p = 0.5, so about 3/4 of images change.
  changed = np.any(out != np.asarray(ramp), axis=(1, 2, 3))
  assert 0.68 < changed.mean() < 0.82, changed.mean()
  assert len({o.tobytes() for o in out}) > 0.5 * len(out)
  # An image's augmentation depends on its key alone, not on the batch around it.
  np.testing.assert_array_equal(run(ramp[:8], keys[:8], SPEC, FILL), out[:8])


def test_erase_boxes_follow_timm_bounds():
  keys = jax.random.split(jax.random.key(1), 300)
  top, left, height, width = (np.asarray(v) for v in batch_augment.erase_boxes(keys, 32, 32))
  assert (height > 0).all() and (width > 0).all()
  assert (top >= 0).all() and (top + height <= 32).all()
  assert (left >= 0).all() and (left + width <= 32).all()
  areas, aspects = height * width / 1024, height / width
  assert 0.02 * 0.7 <= areas.min() and areas.max() <= 1 / 3 * 1.2
  assert areas.min() < 0.05 and areas.max() > 0.25
  assert 0.3 / 1.5 <= aspects.min() and aspects.max() <= 3.3 * 1.5
  assert aspects.min() < 0.6 and aspects.max() > 2


def test_random_erase_replaces_one_box_with_noise():
  images = jnp.full((400, 32, 32, 3), 7.0)
  keys = jax.random.split(jax.random.key(2), 400)
  out = np.asarray(batch_augment.random_erase(images, keys, 0.25))
  changed = np.any(out != 7.0, axis=-1)
  fractions, noise = [], []
  for image, mask in zip(out, changed):
    if mask.any():
      rows, cols = np.nonzero(mask)
      box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
      assert mask.sum() == box  # One axis-aligned box.
      fractions.append(box / 1024)
      noise.append(image[mask])
  assert 0.2 < len(fractions) / 400 < 0.3
  assert 0.01 < min(fractions) and max(fractions) < 0.41
  noise = np.concatenate(noise)
  assert abs(noise.mean()) < 0.05 and abs(noise.std() - 1) < 0.05


def test_normalisation_is_the_hosts():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from vit_jax.data import image_ops  # pylint: disable=g-import-not-at-top

  image = _test_image()
  for name in ('imagenet', 'inception', '0.1,0.2,0.3/0.4,0.5,0.6'):
    host = image_ops.normalize(tf.constant(image), *normalization.mean_std(name)).numpy()
    np.testing.assert_array_equal(batch_augment.normalize(jnp.asarray(image), name), host)


def test_the_training_step_augments_the_hosts_batch(data_dir):
  from vit_jax.configs import common  # pylint: disable=g-import-not-at-top
  from vit_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from vit_jax.schema import data as data_settings  # pylint: disable=g-import-not-at-top
  from vit_jax.loop import setup  # pylint: disable=g-import-not-at-top
  from vit_jax.training import steps  # pylint: disable=g-import-not-at-top

  config = common.get_config()
  config.update(
      data_dir=data_dir,
      normalization='digits',
      batch_size=8,
      image_size=16,
      randaugment='rand-m9-mstd0.5-inc1',
      random_erase_prob=0.25,
  )
  # Unset, a run decides by its backend: the host's ops on a CPU.
  assert setup.resolved(config).augment_on_device is (jax.default_backend() != 'cpu')
  assert setting.build(step_settings.StepSettings, config).augment is None
  config.augment_on_device = True
  settings = setting.build(step_settings.StepSettings, config)
  assert settings.augment == setting.build_unless_off(data_settings.BatchAugment, config)
  data = setting.build(data_settings.DataSettings, config)
  batch = next(input_pipeline.train_iterator(data, process_index=0, process_count=1))
  learned = steps.training_batch(jax.random.key(0), batch, None, 0.0, 10, augment=settings.augment)
  expected = batch_augment.augment(batch['image'], batch['augment_key'], settings.augment)
  np.testing.assert_array_equal(learned['image'], expected)
  assert learned['image'].dtype == jnp.float32 and 'augment_key' not in learned
  # Off (or with a host op that timm runs after RandAugment), the host does it all.
  for off in (dict(augment_on_device=False), dict(color_jitter=0.3), dict(three_augment=True)):
    changed = config.copy_and_resolve_references()
    changed.update(off)
    assert setting.build(step_settings.StepSettings, changed).augment is None
    assert not setting.build(data_settings.DataSettings, changed).train_transform.on_device


def test_a_run_augmenting_on_device_resumes_exactly(data_dir, tmp_path, monkeypatch):
  """The DeiT recipe's augmentations in the training step: preempted and resumed, the run ends
  with the parameters of an uninterrupted one, and its config.json records the choice."""
  from tests.tiny_runs import assert_trees_close  # pylint: disable=g-import-not-at-top
  from tests.tiny_runs import tiny_config  # pylint: disable=g-import-not-at-top
  from tests.tiny_runs import train_with_preemption  # pylint: disable=g-import-not-at-top
  from vit_jax.loop import train  # pylint: disable=g-import-not-at-top
  from vit_jax.workdir import reader  # pylint: disable=g-import-not-at-top

  config = tiny_config(
      data_dir,
      augment='inception_crop',
      randaugment='rand-m9-mstd0.5-inc1',
      random_erase_prob=0.25,
      repeated_aug=2,
      augment_on_device=True,
  )
  straight = str(tmp_path / 'straight')
  metrics = train.train_and_evaluate(config, straight).metrics
  assert np.isfinite(metrics['loss'])
  assert reader.Workdir(straight).config().augment_on_device is True
  interrupted = str(tmp_path / 'interrupted')
  resumed = train_with_preemption(config, interrupted, monkeypatch)
  a, b = reader.Workdir(straight).read_state(), reader.Workdir(interrupted).read_state()
  assert_trees_close(a['params'], b['params'], atol=0)
  assert resumed.metrics == metrics
