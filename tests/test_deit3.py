"""DeiT III: the model against timm's, 3-Augment, colour jitter and the simple random crop against
deit's augment.py on the same images, the BCE loss against deit's, LAMB against timm's port of
apex FusedLAMB, and the config's checks."""

import collections
import random

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image, ImageFilter, ImageOps
import pytest
from scipy import stats
import tensorflow as tf

from vit_jax.data import augment
from vit_jax.data import mixing
from vit_jax.schema import config as config_lib
from vit_jax.schema import checks as config_checks
from vit_jax.loop import setup
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.data import image_ops
from vit_jax import models
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.models import deit3
from vit_jax.schema import setting
from vit_jax.schema import optim as optim_settings

SAMPLES = 600


@pytest.fixture(scope='module')
def reference(timm):
  """deit's augment.py pieces and BCE (tests/reference/deit3_augment.py)."""
  del timm  # Imported first: it makes torchvision importable.
  from tests.reference import deit3_augment  # pylint: disable=g-import-not-at-top

  return deit3_augment


@pytest.fixture(scope='module')
def photo():
  """A 24 x 24 colour image with smooth structure and noise (uint8)."""
  rng = np.random.RandomState(0)
  rows, cols = np.mgrid[0:24, 0:24]
  smooth = np.stack([rows * 10, cols * 10, (rows + cols) * 5], -1)
  return np.clip(smooth + rng.randint(-40, 40, smooth.shape), 0, 255).astype(np.uint8)


def _seed(i: int) -> tf.Tensor:
  return tf.constant([7, i], tf.int64)


def test_model_matches_timm_deit3(timm):
  import torch  # pylint: disable=g-import-not-at-top

  reference = timm.create_model(
      'deit3_small_patch16_224',
      pretrained=False,
      num_classes=10,
      img_size=32,
      patch_size=8,
      embed_dim=64,
      depth=2,
      num_heads=4,
      init_values=1e-4,
  ).eval()
  torch.manual_seed(0)
  for p in reference.parameters():
    p.data.normal_(0, 0.1)
  state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
  ours = models.create(
      'deit3_s16', num_classes=10, patch_size=8, hidden_size=64, depth=2, num_heads=4, mlp_dim=256
  )
  variables = deit3.from_timm(state)
  images = np.random.RandomState(0).randn(2, 32, 32, 3).astype(np.float32)
  expected = reference(torch.from_numpy(images).permute(0, 3, 1, 2)).detach().numpy()
  np.testing.assert_allclose(ours.apply(variables, images), expected, atol=1e-5)
  assert set(deit3.to_timm(variables)) == set(state)
  official = {
      k.replace('.ls1.gamma', '.gamma_1').replace('.ls2.gamma', '.gamma_2'): v
      for k, v in state.items()
  }  # models_v2.py's names.
  np.testing.assert_allclose(ours.apply(deit3.from_timm(official), images), expected, atol=1e-5)


def test_model_layer_scale_and_constant_drop_path():
  model = models.create('deit3_b16', num_classes=10, drop_path_rate=0.2)
  assert model.layer_scale == 1e-4  # models_v2.py `init_scale`.
  np.testing.assert_array_equal(model.drop_path_rates(), np.full(12, 0.2))


def test_three_augment_ops_equal_deits(reference, photo):
  """Given the op and sigma drawn, our output equals deit's op on the PIL image bit for bit."""
  pil = Image.fromarray(photo)
  ops = {
      'grayscale': lambda sigma: reference.gray_scale(p=1.0)(pil),
      'solarize': lambda sigma: reference.Solarization(p=1.0)(pil),
      'gaussian_blur': lambda sigma: pil.filter(ImageFilter.GaussianBlur(radius=sigma)),
  }
  seen = set()
  for i in range(30):
    choice, sigma = augment.three_augment_params(_seed(i))
    op = augment.THREE_AUGMENT_OPS[int(choice)]
    seen.add(op)
    np.testing.assert_array_equal(
        augment.three_augment(tf.constant(photo), _seed(i)).numpy(),
        np.asarray(ops[op](float(sigma))),
        err_msg=op,
    )
  assert seen == set(augment.THREE_AUGMENT_OPS)


def test_gaussian_blur_equals_pil(photo):
  """PIL's GaussianBlur (three box blurs each way, fixed point) reproduced over the whole range
  of sigma, on an image of odd shape."""
  image = photo[:, :19]
  for sigma in np.linspace(*augment.BLUR_SIGMA, 25).astype(np.float32):
    np.testing.assert_array_equal(
        augment.gaussian_blur(tf.constant(image), sigma).numpy(),
        np.asarray(Image.fromarray(image).filter(ImageFilter.GaussianBlur(radius=float(sigma)))),
        err_msg=str(sigma),
    )


def _which(out: np.ndarray, pil: Image.Image, reference) -> str:
  """Which 3-Augment op made `out` from `pil`: the two that leave no doubt, else the blur."""
  if np.array_equal(out, np.asarray(reference.gray_scale(p=1.0)(pil))):
    return 'grayscale'
  if np.array_equal(out, np.asarray(ImageOps.solarize(pil))):
    return 'solarize'
  return 'gaussian_blur'


def test_three_augment_choice_frequencies_match_deit(reference, photo):
  """Each op is chosen as often as deit's RandomChoice chooses it (chi-square on the counts)."""
  import torch  # pylint: disable=g-import-not-at-top

  ours = collections.Counter(
      augment.THREE_AUGMENT_OPS[int(augment.three_augment_params(_seed(i))[0])]
      for i in range(SAMPLES)
  )
  _, secondary = reference.new_data_aug_generator(24, src=False, color_jitter=0)
  pil = Image.fromarray(photo)
  random.seed(0)
  torch.manual_seed(0)
  theirs = collections.Counter(
      _which(np.asarray(secondary(pil)), pil, reference) for _ in range(SAMPLES)
  )
  table = np.array([[ours[op], theirs[op]] for op in augment.THREE_AUGMENT_OPS])
  assert table.min() > SAMPLES / 5, table
  assert stats.chi2_contingency(table).pvalue > 1e-3, table


def test_gaussian_blur_sigma_distribution_matches_deit(reference, monkeypatch):
  """Our blur's sigma and deit's GaussianBlur radius come from one distribution (KS test)."""
  ours = [float(augment.three_augment_params(_seed(i))[1]) for i in range(SAMPLES)]
  drawn = []
  uniform = random.uniform
  monkeypatch.setattr(
      reference.random, 'uniform', lambda a, b: drawn.append(uniform(a, b)) or drawn[-1]
  )
  blur = reference.GaussianBlur(p=1.0)
  image = Image.fromarray(np.zeros((4, 4, 3), np.uint8))
  random.seed(0)
  for _ in range(SAMPLES):
    blur(image)
  assert min(ours) >= augment.BLUR_SIGMA[0] and max(ours) <= augment.BLUR_SIGMA[1]
  assert stats.ks_2samp(ours, drawn).pvalue > 1e-3


def test_color_jitter_matches_torchvision(reference, photo):
  """Given the order and factors, our adjustments equal torchvision's on the PIL image exactly;
  the orders and factors are drawn as torchvision's ColorJitter draws them."""
  from torchvision.transforms import functional  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  adjust = [functional.adjust_brightness, functional.adjust_contrast, functional.adjust_saturation]
  for i in range(12):
    order, factors = (t.numpy() for t in augment.color_jitter_params(_seed(i), 0.3))
    pil = Image.fromarray(photo)
    for op in order:
      pil = adjust[op](pil, float(factors[op]))
    np.testing.assert_array_equal(
        augment.color_jitter(tf.constant(photo), _seed(i), 0.3).numpy(), np.asarray(pil)
    )
  ours = [augment.color_jitter_params(_seed(i), 0.3) for i in range(SAMPLES)]
  jitter = reference.transforms.ColorJitter(0.3, 0.3, 0.3)
  torch.manual_seed(0)
  theirs = [
      jitter.get_params(jitter.brightness, jitter.contrast, jitter.saturation, None)
      for _ in range(SAMPLES)
  ]
  for op in range(3):
    ks = stats.ks_2samp([float(f[op]) for _, f in ours], [float(t[1 + op]) for t in theirs])
    assert ks.pvalue > 1e-3, op
  our_orders = collections.Counter(tuple(int(k) for k in o.numpy()) for o, _ in ours)
  their_orders = collections.Counter(tuple(int(k) for k in t[0] if k < 3) for t in theirs)
  assert len(our_orders) == len(their_orders) == 6
  table = np.array([[our_orders[k], their_orders[k]] for k in our_orders])
  assert stats.chi2_contingency(table).pvalue > 1e-3, table


@pytest.mark.parametrize('shape', [(16, 16), (16, 20)])
def test_simple_random_crop_matches_torchvision(reference, shape):
  """Each crop is torchvision's RandomCrop(16, padding=4, reflect) window at some offset (the
  image's shorter side is already 16, so Resize keeps it); the offsets are uniform as
  torchvision's `get_params` draws them."""
  from torchvision.transforms import functional  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  size, pad = 16, 4
  image = np.random.RandomState(1).randint(0, 256, shape + (3,)).astype(np.uint8)
  padded = np.asarray(functional.pad(Image.fromarray(image), pad, padding_mode='reflect'))
  windows = {
      (i, j): padded[i : i + size, j : j + size]
      for i in range(padded.shape[0] - size + 1)
      for j in range(padded.shape[1] - size + 1)
  }
  offsets = []
  for k in range(300):
    out = image_ops.simple_random_crop(tf.constant(image), _seed(k), size, pad).numpy()
    found = [ij for ij, window in windows.items() if np.array_equal(out, window)]
    assert found, k
    offsets.append(found[0])
  crop = reference.transforms.RandomCrop(size, padding=pad, padding_mode='reflect')
  torch.manual_seed(0)
  theirs = [crop.get_params(Image.fromarray(padded), (size, size))[:2] for _ in range(300)]
  for axis in (0, 1):
    ours_axis = [o[axis] for o in offsets]
    theirs_axis = [t[axis] for t in theirs]
    assert set(ours_axis) == set(theirs_axis) == set(range(padded.shape[axis] - size + 1))
    assert stats.ks_2samp(ours_axis, theirs_axis).pvalue > 1e-3


def test_bce_matches_deit_on_mixed_targets(reference):
  """Our BCE on mixup / CutMix targets equals deit's (thresholded targets, BCEWithLogitsLoss),
  for one head and for the two heads of a distilled model."""
  import torch  # pylint: disable=g-import-not-at-top

  rng = np.random.RandomState(0)
  images = jnp.asarray(rng.rand(8, 8, 8, 3), jnp.float32)
  onehot = jax.nn.one_hot(rng.randint(0, 10, 8), 10)
  for key, (mixup, cutmix) in enumerate([(0.8, 0.0), (0.0, 1.0)]):
    _, targets = mixing.mix_batch(
        jax.random.PRNGKey(key),
        images,
        onehot,
        mixup_alpha=mixup,
        cutmix_alpha=cutmix,
        switch_prob=0.5,
        mix_prob=1.0,
        label_smoothing=0.0,
    )
    targets = np.array(targets)
    assert np.all(np.sum(targets > 0, -1) == 2)  # Mixed: two classes each.
    logits = rng.randn(8, 10).astype(np.float32) * 3
    expected = float(reference.bce_loss(torch.from_numpy(logits), torch.from_numpy(targets)))
    assert float(steps.classification_loss(jnp.asarray(logits), targets, 'bce')) == (
        pytest.approx(expected, rel=1e-6)
    )
    heads = (jnp.asarray(logits), jnp.asarray(logits[::-1]))
    both = (
        expected
        + float(
            reference.bce_loss(torch.from_numpy(logits[::-1].copy()), torch.from_numpy(targets))
        )
    ) / 2
    assert float(steps.classification_loss(heads, targets, 'bce')) == pytest.approx(both, rel=1e-6)


def test_lamb_matches_timm(timm):
  """`optimizer='lamb'` follows timm's Lamb (apex FusedLAMB's port) step for step: clipping to
  global norm 1, trust ratio on the decayed parameters only, Adam steps on the others; a
  scanned stack of two blocks (`blocks_0_to_1`) takes a trust ratio per block, and its
  LayerScale-like vectors are not decayed, as timm does with each block's own tensors."""
  import torch  # pylint: disable=g-import-not-at-top

  rng = np.random.RandomState(0)
  params = {
      'kernel': rng.randn(6, 4).astype(np.float32),
      'bias': rng.randn(4).astype(np.float32),
      # Blocks of different norms: one trust ratio for the stack would step them alike.
      'blocks_0_to_1': {
          'kernel': (rng.randn(2, 6, 4) * [[[1.0]], [[10.0]]]).astype(np.float32),
          'gamma': rng.randn(2, 4).astype(np.float32),
      },
  }
  grads = [
      jax.tree.map(lambda v, scale=scale: (rng.randn(*v.shape) * scale).astype(np.float32), params)
      for scale in (0.01, 5.0, 0.1, 1.0)
  ]
  config = config_lib.defaults()
  config.optimizer, config.weight_decay, config.eps = 'lamb', 0.05, 1e-8
  tx = optim.create_optimizer(
      setting.build(optim_settings.OptimizerSettings, config),
      lambda _: 2e-2,
      models.create('vit_ti4', num_classes=10),
  )
  ours = jax.tree.map(jnp.asarray, params)
  state = tx.init(ours)

  def per_tensor(tree):  # timm's tensors: each block's own.
    return {
        'kernel': tree['kernel'],
        'bias': tree['bias'],
        **{
            f'{name}_{i}': tree['blocks_0_to_1'][name][i]
            for name in ('kernel', 'gamma')
            for i in (0, 1)
        },
    }

  torch_params = {
      k: torch.nn.Parameter(torch.from_numpy(np.array(v))) for k, v in per_tensor(params).items()
  }
  from timm.optim import Lamb  # pylint: disable=g-import-not-at-top

  decayed = ('kernel', 'kernel_0', 'kernel_1')
  lamb = Lamb(
      [
          {'params': [torch_params[k] for k in decayed], 'weight_decay': 0.05},
          {
              'params': [p for k, p in torch_params.items() if k not in decayed],
              'weight_decay': 0.0,
          },
      ],
      lr=2e-2,
      eps=1e-8,
  )
  for grad in grads:
    updates, state = tx.update(jax.tree.map(jnp.asarray, grad), state, ours)
    ours = jax.tree.map(lambda p, u: p + u, ours, updates)
    for k, g in per_tensor(grad).items():
      torch_params[k].grad = torch.from_numpy(np.array(g))
    lamb.step()
  for k, value in per_tensor(ours).items():
    np.testing.assert_allclose(
        value, torch_params[k].detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=k
    )


def test_pipeline_applies_three_augment_and_jitter(tmp_path):
  """A DeiT III batch differs from the same batch without 3-Augment and jitter, and only there."""
  config = config_lib.defaults()
  config.data_dir = str(tmp_path)
  config.batch_size, config.image_size, config.normalization = 16, 16, 'digits'
  config.augment, config.crop_padding, config.flip = 'simple_random_crop', 2, False
  plain = next(input_pipeline.train_iterator(setting.build(data_settings.DataSettings, config)))
  config.three_augment, config.color_jitter = True, 0.3
  recipe = next(input_pipeline.train_iterator(setting.build(data_settings.DataSettings, config)))
  np.testing.assert_array_equal(plain['label'], recipe['label'])
  assert not np.allclose(plain['image'], recipe['image'])
  assert recipe['image'].shape == (16, 16, 16, 3)


@pytest.mark.parametrize(
    'fields, message',
    [
        ({'three_augment': True, 'randaugment': 'rand-m9-mstd0.5-inc1'}, 'replaces RandAugment'),
        ({'loss': 'bce', 'label_smoothing': 0.1}, 'smoothing gives every class'),
        ({'loss': 'focal'}, "'softmax_xent', 'bce'"),
        ({'optimizer': 'lars'}, "'lamb'"),
        ({'augment': 'src'}, 'simple_random_crop'),
    ],
)
def test_config_rejects(fields, message):
  config = config_lib.defaults()
  config.update(fields)
  with pytest.raises(config_checks.ConfigError, match=message):
    setup.validate(config, devices=1, processes=1)


def test_weights_load_at_a_new_resolution(tmp_path):
  """Fine-tuning at another resolution (B/L: 192 -> 224): the patches' position embedding is
  resized, the class token (outside it) kept."""
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  from vit_jax.weights import pretrained  # pylint: disable=g-import-not-at-top

  small = dict(num_classes=10, patch_size=4, hidden_size=32, depth=1, num_heads=2, mlp_dim=64)
  variables = models.create('deit3_s16', **small).init(
      jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 3))
  )
  path = str(tmp_path / 'deit3.safetensors')
  safetensors.numpy.save_file(deit3.to_timm(variables), path)
  model = models.create('deit3_s16', **small)
  loaded = pretrained.load(path, model, image_size=16)
  assert loaded['params']['pos_embed'].shape == (1, 16, 32)
  np.testing.assert_array_equal(loaded['params']['cls_token'], variables['params']['cls_token'])
  expected = pretrained.resize_pos_embed(np.asarray(variables['params']['pos_embed']), (4, 4), 0)
  np.testing.assert_allclose(loaded['params']['pos_embed'], expected)
  assert model.apply(loaded, jnp.zeros((1, 16, 16, 3))).shape == (1, 10)
