"""Training recipes: mixing as steps.py applies it, gradient accumulation, EMA, stochastic-depth
schedules, and the published recipe configs against the papers' tables."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.tiny_runs import assert_trees_close, tiny_config
from vit_jax.configs import cait as cait_config
from vit_jax.configs import deepvit as deepvit_config
from vit_jax.configs import deit as deit_config
from vit_jax.configs import sa_conv as sa_conv_config
from vit_jax.configs import t2t as t2t_config
from vit_jax.data import mixing
from vit_jax import models
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.training import teacher
from vit_jax.loop import train
from vit_jax.models import layers
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings
from vit_jax.training import start as start_lib
from vit_jax.schema import step as step_settings
from vit_jax.schema import optim as optim_settings
from vit_jax.schema import data as data_settings

IMAGENET_TRAIN = 1_281_167


def _batch(size: int = 16, seed: int = 0) -> dict[str, jax.Array]:
  rng = np.random.default_rng(seed)
  return {
      'image': jnp.asarray(rng.normal(size=(size, 16, 16, 3)), jnp.float32),
      'label': jnp.asarray(rng.integers(0, 10, size=(size,)), jnp.int32),
  }


def _smoothed(labels: np.ndarray, smoothing: float, classes: int = 10) -> np.ndarray:
  return np.eye(classes)[labels] * (1 - smoothing) + smoothing / classes


# Mixing, as steps.py applies it.


@pytest.mark.parametrize('kind', ['mixup', 'cutmix'])
def test_mixed_targets_follow_the_pixels_within_each_group(kind):
  """Each image is mixed with its mirror inside its group; the targets carry the pixel weights."""
  config = tiny_config(
      'unused',
      label_smoothing=0.1,
      mixup_alpha=0.8 if kind == 'mixup' else 0.0,
      cutmix_alpha=1.0 if kind == 'cutmix' else 0.0,
  )
  batch, groups = _batch(16), 2
  out = jax.device_get(
      steps.training_batch(
          jax.random.key(3),
          batch,
          setting.build_unless_off(data_settings.MixSettings, config),
          0.1,
          10,
          groups,
      )
  )
  images, labels = np.asarray(batch['image']), np.asarray(batch['label'])
  lams = []
  for g in range(groups):
    rows = np.arange(g * 8, (g + 1) * 8)
    own, mirror = images[rows], images[rows[::-1]]
    mixed = out['image'][rows]
    if kind == 'mixup':  # mixed = lam * own + (1 - lam) * mirror, one lam per group.
      d = (own - mirror).ravel()
      lam = float(np.dot((mixed - mirror).ravel(), d) / np.dot(d, d))
      np.testing.assert_allclose(mixed, lam * own + (1 - lam) * mirror, atol=1e-5)
    else:  # Every pixel comes from one of the two; lam = the share of the image's own pixels.
      from_own = np.all(np.isclose(mixed, own), axis=-1)
      assert np.all(from_own | np.all(np.isclose(mixed, mirror), axis=-1))
      lam = float(from_own[0].mean())
      assert np.all(from_own.mean(axis=(1, 2)) == lam)  # One box for the whole group.
    lams.append(lam)
    expected = lam * _smoothed(labels[rows], 0.1) + (1 - lam) * _smoothed(labels[rows[::-1]], 0.1)
    np.testing.assert_allclose(out['targets'][rows], expected, atol=1e-5)
  assert lams[0] != lams[1]  # Each group draws its own lambda.
  np.testing.assert_array_equal(out['label'], out['targets'].argmax(-1))


def test_without_mixing_targets_are_smoothed_labels():
  config = tiny_config('unused', label_smoothing=0.1)
  batch = _batch(8)
  out = jax.device_get(steps.training_batch(jax.random.key(0), batch, None, 0.1, 10))
  np.testing.assert_array_equal(out['image'], batch['image'])
  np.testing.assert_array_equal(out['label'], batch['label'])
  np.testing.assert_allclose(out['targets'], _smoothed(np.asarray(batch['label']), 0.1), atol=1e-6)


def _log_softmax(x: np.ndarray) -> np.ndarray:
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_train_step_learns_from_the_mixed_batch(monkeypatch):
  """Loss: soft-target cross-entropy on the mixed images; accuracy: against argmax targets."""
  config = tiny_config(
      'unused',
      label_smoothing=0.1,
      mixup_alpha=0.8,
      cutmix_alpha=1.0,
      **{'model.init_scheme': 'timm'},
  )
  start = start_lib.for_run(setting.build(run_settings.Settings, config), 10, lambda _: 1e-3)
  model, tx = start.model, start.tx
  state = start.init()
  # The step's own mixing rng is replaced by a fixed one so that the test can redo the mixing.
  original = steps.training_batch
  fixed = lambda rng, *args, **kwargs: original(jax.random.key(6), *args, **kwargs)
  monkeypatch.setattr(steps, 'training_batch', fixed)
  batch = _batch(32)
  step = jax.jit(
      steps.make_train_step(
          model, tx, setting.build(step_settings.StepSettings, config), 10, mix_groups=2
      )
  )
  _, metrics = step(state, batch)
  used = jax.device_get(
      fixed(None, batch, setting.build_unless_off(data_settings.MixSettings, config), 0.1, 10, 2)
  )
  assert not np.allclose(used['targets'].max(-1), 0.91)  # Soft targets, not smoothed one-hots.
  # Some mixed images are dominated by their partner's class: the label scored is that class.
  assert np.any(used['label'] != np.asarray(batch['label']))

  logits = np.asarray(model.apply({'params': state.params}, used['image']), np.float64)
  loss = np.mean(-(used['targets'] * _log_softmax(logits)).sum(-1))
  np.testing.assert_allclose(float(metrics['loss']), loss, rtol=1e-5)
  accuracy = np.mean(logits.argmax(-1) == used['targets'].argmax(-1))
  np.testing.assert_allclose(float(metrics['accuracy']), accuracy)


# Gradient accumulation.


@pytest.mark.parametrize('mixing', [False, True])
def test_four_micro_batches_equal_one_big_batch(mixing):
  overrides = dict(
      batch_size=32,
      mixup_alpha=0.8 if mixing else 0.0,
      cutmix_alpha=1.0 if mixing else 0.0,
      label_smoothing=0.1,
      **{'model.init_scheme': 'timm'},
  )
  results = []
  for accumulate in (1, 4):
    config = tiny_config('unused', grad_accum_steps=accumulate, **overrides)
    start = start_lib.for_run(setting.build(run_settings.Settings, config), 10, lambda _: 1e-3)
    model, tx = start.model, start.tx
    state = start.init()
    step = jax.jit(
        steps.make_train_step(model, tx, setting.build(step_settings.StepSettings, config), 10)
    )
    for seed in range(2):
      state, metrics = step(state, _batch(32, seed))
    results.append((jax.device_get(state.params), float(metrics['loss'])))
  assert_trees_close(results[0][0], results[1][0], atol=1e-5)
  np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5)


def test_micro_batches_take_strided_rows():
  batch = {'x': jnp.arange(12)}
  np.testing.assert_array_equal(
      steps.micro_batches(batch, 3)['x'], [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
  )


@pytest.mark.parametrize(
    'overrides, message',
    [
        ({'grad_accum_steps': 3}, 'grad_accum_steps'),
        ({'grad_accum_steps': 0}, 'grad_accum_steps'),
        ({'ema_decay': 1.0}, 'ema_decay'),
        ({'mixup_alpha': -0.5}, 'mixup_alpha'),
        ({'mix_prob': 1.5}, 'mix_prob'),
    ],
)
def test_bad_recipe_settings_fail_before_touching_the_workdir(tmp_path, overrides, message):
  workdir = tmp_path / 'run'
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(tiny_config(str(tmp_path / 'tfds'), **overrides), str(workdir))
  assert not workdir.exists()


# EMA.


def test_ema_follows_the_parameters():
  config = tiny_config('unused', ema_decay=0.75)
  start = start_lib.for_run(setting.build(run_settings.Settings, config), 10, lambda _: 1e-2)
  model, tx = start.model, start.tx
  state = start.init()
  assert_trees_close(state.ema['params'], state.params, atol=0)
  step = jax.jit(
      steps.make_train_step(model, tx, setting.build(step_settings.StepSettings, config), 10)
  )
  expected = state.params
  for seed in range(3):
    state, _ = step(state, _batch(32, seed))
    expected = jax.tree.map(lambda e, p: 0.75 * e + 0.25 * p, expected, state.params)
  assert_trees_close(state.ema['params'], expected, atol=1e-6)
  assert _max_abs_diff(state.ema['params'], state.params) > 0


def _max_abs_diff(a, b) -> float:
  return max(
      float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


# Stochastic depth in every family.


def _drop_path_rates(model, images) -> dict[str, float]:
  """Rate of every DropPath the model calls in training, keyed by its module path."""
  rates = {}

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, layers.DropPath) and context.method_name == '__call__':
      rates['/'.join(context.module.scope.path)] = float(context.module.rate)
    return next_fun(*args, **kwargs)

  def init_and_apply():
    variables = model.init(jax.random.key(0), images)
    with nn.intercept_methods(record):
      model.apply(
          variables,
          images,
          train=True,
          rngs={'dropout': jax.random.key(1)},
          mutable=['batch_stats'],
      )

  jax.eval_shape(init_and_apply)  # Traced only: the rates are static.
  return rates


@pytest.mark.parametrize(
    'name, fields, schedule',
    [
        ('vit_ti4', {}, 'linear'),
        ('deit_ti16_distilled', {'patch_size': 4}, 'linear'),
        ('deepvit_ti4', {'re_attention_blocks': 2}, 'linear'),
        (
            't2t_vit_t_ti4',
            {'token_dim': 8, 'soft_splits': ((3, 1, 1), (3, 2, 1), (3, 2, 1))},
            'linear',
        ),
        ('cait_ti4', {}, 'constant'),
    ],
)
def test_stochastic_depth_schedule(name, fields, schedule):
  depth, rate = 4, 0.3
  model = models.create(
      name, num_classes=5, hidden_size=24, num_heads=3, depth=depth, drop_path_rate=rate, **fields
  )
  rates = _drop_path_rates(model, jnp.zeros((2, 16, 16, 3)))
  per_block = [
      sorted({v for k, v in rates.items() if k.startswith(f'blocks_{i}/')}) for i in range(depth)
  ]
  expected = np.linspace(0, rate, depth) if schedule == 'linear' else [rate] * depth
  assert per_block == [[pytest.approx(r)] for r in expected]
  # Nothing else drops paths (T2T's token blocks have rate 0, CaiT's class attention none).
  assert all(
      v == 0.0
      for k, v in rates.items()
      if not k.startswith('blocks_') or k.startswith('blocks_token_only')
  )


# Published recipes (DeiT Table 9, CaiT Section 4, T2T-ViT and DeepViT official scripts).


DEIT_RECIPE = dict(
    augment='inception_crop',
    randaugment='rand-m9-mstd0.5-inc1',
    random_erase_prob=0.25,
    mixup_alpha=0.8,
    cutmix_alpha=1.0,
    mix_switch_prob=0.5,
    mix_prob=1.0,
    label_smoothing=0.1,
    optimizer='adamw',
    eps=1e-8,
    weight_decay=0.05,
    warmup_lr=1e-6,
    min_lr=1e-5,
    grad_clip_norm=0.0,
    ema_decay=0.99996,
    dtype='bfloat16',
    normalization='imagenet',
)


def _check_fields(config, expected: dict) -> None:
  for key, value in expected.items():
    assert config[key] == value, (key, config[key], value)


@pytest.mark.parametrize(
    'variant, distilled',
    [('Ti', False), ('Ti', True), ('S', False), ('S', True), ('B', False), ('B', True)],
)
def test_deit_recipe(variant, distilled, tmp_path):
  arg = f'variant={variant},distilled={distilled},dataset=imagenet2012'
  if distilled:
    arg += f',teacher={tmp_path}'
  config = deit_config.get_config(arg)
  _check_fields(config, DEIT_RECIPE)
  _check_fields(
      config,
      dict(
          batch_size=1024,
          repeated_aug=3,
          num_epochs=300,
          warmup_epochs=5,
          eval_crop_ratio=0.875,
          image_size=224,
      ),
  )
  assert optim.peak_learning_rate(
      setting.build(optim_settings.ScheduleSettings, config)
  ) == pytest.approx(
      1e-3
  )  # 5e-4 × 1024 / 512.
  assert config.model.drop_path_rate == 0.1
  model = models.create_model(config, 10)
  assert model.drop_path_rate == 0.1 and model.dropout_rate == 0.0
  assert config.model.name == f'deit_{variant.lower()}16' + ('_distilled' if distilled else '')
  assert config.distillation.type == ('hard' if distilled else 'none')
  # An epoch is the dataset once, however many repeats a batch holds.
  total, warmup = optim.training_steps(
      setting.build(optim_settings.ScheduleSettings, config), IMAGENET_TRAIN
  )
  assert (total, warmup) == (
      math.ceil(300 * IMAGENET_TRAIN / 1024),
      math.ceil(5 * IMAGENET_TRAIN / 1024),
  )


def test_deit_b_distilled_from_regnety_160_recipe():
  """DeiT's headline recipe: DeiT-B⚗ taught by the RegNetY-16GF weights file (hard, α 0.5, τ 1)."""
  config = deit_config.get_config(
      'variant=B,dataset=imagenet2012,teacher=regnety_160:/weights/regnety_160-a5fe301d.pth'
  )
  assert config.model.name == 'deit_b16_distilled'
  assert (config.distillation.type, config.distillation.alpha, config.distillation.tau) == (
      'hard',
      0.5,
      1.0,
  )
  assert teacher.source(config.distillation.teacher) == (
      'regnety_160',
      '/weights/regnety_160-a5fe301d.pth',
  )
  assert config.distillation.teacher_normalization == '' and config.normalization == 'imagenet'


def test_cait_xxs24_recipe():
  config = cait_config.get_config('variant=XXS24,dataset=imagenet2012')
  _check_fields(config, DEIT_RECIPE)
  _check_fields(config, dict(num_epochs=400, eval_crop_ratio=1.0, image_size=224, repeated_aug=3))
  assert config.model.name == 'cait_xxs24'


@pytest.mark.parametrize('variant', ['16B', '24B', '32B'])
@pytest.mark.parametrize('baseline', [False, True])
def test_deepvit_recipe(variant, baseline):
  config = deepvit_config.get_config(
      f'variant={variant},baseline={baseline},' 'dataset=imagenet2012'
  )
  thirty_two = variant == '32B'
  _check_fields(
      config,
      {
          **DEIT_RECIPE,
          'normalization': 'inception',
          'mixup_alpha': 0.1 if thirty_two else 0.8,
          'cutmix_alpha': 0.0 if thirty_two else 1.0,
      },
  )
  _check_fields(config, dict(repeated_aug=1, num_epochs=300, warmup_epochs=5))
  assert (
      optim.peak_learning_rate(setting.build(optim_settings.ScheduleSettings, config)) == 5e-4
  )  # Not scaled with the batch.
  assert config.model.drop_path_rate == 0.2
  model = models.create(config.model.name, num_classes=1000)
  assert (model.re_attention_blocks == 0) == baseline and model.depth == int(variant[:2])


def test_t2t_vit_14_recipe():
  config = t2t_config.get_config('variant=14,dataset=imagenet2012')
  _check_fields(config, DEIT_RECIPE)
  _check_fields(config, dict(batch_size=512, repeated_aug=1, num_epochs=300, warmup_epochs=10))
  assert optim.peak_learning_rate(
      setting.build(optim_settings.ScheduleSettings, config)
  ) == pytest.approx(5e-4)
  assert config.model.name == 't2t_vit_14' and config.model.drop_path_rate == 0.1


@pytest.mark.parametrize(
    'variant, lr, weight_decay',
    [('7', 1e-3, 0.03), ('12', 1e-3, 0.03), ('24', 5e-4, 0.065), ('t-19', 5e-4, 0.065)],
)
def test_t2t_vit_sizes_follow_the_official_commands(variant, lr, weight_decay):
  config = t2t_config.get_config(f'variant={variant},dataset=imagenet2012')
  assert optim.peak_learning_rate(
      setting.build(optim_settings.ScheduleSettings, config)
  ) == pytest.approx(lr)
  _check_fields(config, dict(weight_decay=weight_decay, eval_crop_ratio=0.9, batch_size=512))


@pytest.mark.parametrize('attention', ['quadratic', 'gaussian', 'learned', 'learned_content'])
def test_sa_conv_cifar10_recipe(attention):
  config = sa_conv_config.get_config(f'attention={attention},dataset=cifar10')
  _check_fields(
      config,
      dict(
          optimizer='sgd',
          base_lr=0.1,
          momentum=0.9,
          weight_decay=1e-4,
          batch_size=100,
          num_epochs=300,
          lr_scaling_batch=0,
          min_lr=0.0,
          warmup_lr=0.0,
          label_smoothing=0.0,
          mixup_alpha=0.0,
          cutmix_alpha=0.0,
          randaugment='',
          repeated_aug=1,
          ema_decay=0.0,
          augment='crop_flip',
          crop_padding=4,
          flip=True,
          dtype='float32',
      ),
  )
  total, warmup = optim.training_steps(
      setting.build(optim_settings.ScheduleSettings, config), 50_000
  )
  assert (total, warmup) == (150_000, 7_500)  # 5 % linear warm-up.
  model = models.create(config.model.name, num_classes=10)
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))['params']
  mask = optim.weight_decay_mask(params, tuple(config.no_decay_names))
  flat = {
      '/'.join(str(k.key) for k in path): decays
      for path, decays in jax.tree_util.tree_flatten_with_path(mask)[0]
  }
  positional = [k for k in flat if k.endswith(('attention_centers', 'attention_spreads'))]
  assert (len(positional) > 0) == (attention in ('quadratic', 'gaussian'))
  assert not any(flat[k] for k in positional)
  assert any(flat[k] for k in flat if k.endswith('kernel'))
