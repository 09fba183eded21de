"""DeiT: distillation token, heads, inference modes, parameter counts and timm parity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.models import deit


def _param_count(model, image_size: int) -> int:
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)))
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes['params']))


@pytest.mark.parametrize(
    'name, image_size, millions',
    [
        ('deit_ti16', 224, 5.72),
        ('deit_s16', 224, 22.05),
        ('deit_b16', 224, 86.57),
        ('deit_ti16_distilled', 224, 5.91),
        ('deit_s16_distilled', 224, 22.44),
        ('deit_b16_distilled', 224, 87.34),
        ('deit_b16', 384, 86.86),
    ],
)
def test_param_counts_match_spec_table(name, image_size, millions):
  assert abs(_param_count(models.create(name), image_size) / 1e6 - millions) <= 0.01


def _tiny(**overrides):
  fields = dict(num_classes=7, patch_size=4, hidden_size=24, depth=2, num_heads=3, distilled=True)
  fields.update(overrides)
  return deit.DeiT(**fields)


def test_distilled_outputs_and_inference_modes():
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  model = _tiny()
  variables = model.init(jax.random.key(0), images)
  params = variables['params']
  assert params['pos_embed'].shape == (1, 16 + 2, 24) and params['dist_token'].shape == (1, 1, 24)
  assert {'head', 'head_dist'} <= params.keys()
  cls_logits, dist_logits = model.apply(variables, images, train=True)
  assert cls_logits.shape == dist_logits.shape == (2, 7)
  assert not np.allclose(cls_logits, dist_logits)
  np.testing.assert_allclose(
      model.apply(variables, images), (cls_logits + dist_logits) / 2, atol=1e-6
  )
  fused = model.clone(inference_mode='sum_softmax').apply(variables, images)
  expected = (jax.nn.softmax(cls_logits) + jax.nn.softmax(dist_logits)) / 2
  np.testing.assert_allclose(jax.nn.softmax(fused), expected, atol=1e-6)


def test_undistilled_deit_is_vit_with_timm_init():
  images = jnp.zeros((1, 16, 16, 3))
  params = _tiny(distilled=False).init(jax.random.key(0), images)['params']
  assert 'dist_token' not in params and params['pos_embed'].shape == (1, 17, 24)
  assert abs(np.std(params['head']['kernel']) - 0.02) < 0.01  # timm init: the head is not zero.


@pytest.mark.parametrize(
    'overrides, message',
    [
        (dict(inference_mode='mean'), 'average_logits'),
        (dict(representation_size=8), 'representation_size=8'),
    ],
)
def test_bad_fields_raise_value_error(overrides, message):
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(_tiny(**overrides).init, jax.random.key(0), jnp.zeros((1, 16, 16, 3)))


def test_logit_parity_with_timm_deit_tiny_distilled(timm_model):
  import torch  # pylint: disable=g-import-not-at-top

  model, state_dict = timm_model('deit_tiny_distilled_patch16_224')
  images = np.random.default_rng(0).normal(size=(2, 224, 224, 3)).astype(np.float32)
  torch_images = torch.from_numpy(images.transpose(0, 3, 1, 2))
  with torch.no_grad():
    expected_average = model(torch_images).numpy()
    model.set_distilled_training(True)
    expected_cls, expected_dist = (t.numpy() for t in model.train()(torch_images))
  ours = models.create('deit_ti16_distilled')
  variables = models.family(ours).from_torch(state_dict)
  ours_average = np.asarray(ours.apply(variables, images))
  ours_cls, ours_dist = ours.apply(variables, images, train=True)
  assert np.abs(ours_average - expected_average).max() <= 1e-5
  assert np.abs(np.asarray(ours_cls) - expected_cls).max() <= 1e-5
  assert np.abs(np.asarray(ours_dist) - expected_dist).max() <= 1e-5
  assert models.family(ours).to_torch(variables).keys() == state_dict.keys()
