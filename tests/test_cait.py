"""CaiT: sizes, LayerScale inits, stage structure, timm conversion and logit parity, training."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.models import cait
from vit_jax.schema import parts

TINY = dict(num_classes=5, patch_size=4, hidden_size=24, depth=2, num_heads=4)


def _param_count(model, image_size: int) -> int:
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)))
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes['params']))


@pytest.mark.parametrize(
    'name, image_size, millions',
    [
        ('cait_xxs24', 224, 11.96),
        ('cait_xxs24', 384, 12.03),
        ('cait_xxs36', 224, 17.30),
        ('cait_xxs36', 384, 17.37),
        ('cait_xs24', 384, 26.67),
        ('cait_s24', 224, 46.92),
        ('cait_s24', 384, 47.06),
        ('cait_s36', 384, 68.37),
        ('cait_m36', 384, 271.22),
        ('cait_m48', 448, 356.46),
    ],
)
def test_param_counts_match_spec(name, image_size, millions):
  assert abs(_param_count(models.create(name), image_size) / 1e6 - millions) <= 0.01


@pytest.mark.parametrize(
    'name, official, paper',
    [
        ('cait_xxs24', 1e-5, 1e-5),
        ('cait_xxs36', 1e-5, 1e-6),
        ('cait_xs24', 1e-5, 1e-5),
        ('cait_s24', 1e-5, 1e-5),
        ('cait_s36', 1e-6, 1e-6),
        ('cait_m36', 1e-6, 1e-6),
        ('cait_m48', 1e-6, 1e-6),
        ('cait_ti4', 0.1, 0.1),
    ],
)
def test_layer_scale_init_official_values_and_paper_rule(name, official, paper):
  assert models.create(name).layer_scale == official
  assert models.create(name, layer_scale_init='paper').layer_scale == paper


@pytest.fixture(scope='module')
def tiny_variables():
  model = cait.CaiT(**TINY, layer_scale_init=0.3)
  return model, jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))


def test_structure_stages_and_sown_probabilities(tiny_variables):
  model, variables = tiny_variables
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  params = variables['params']
  assert params['pos_embed'].shape == (1, 16, 24)  # No class slot.
  assert params['cls_token'].shape == (1, 1, 24)
  assert set(params) == {
      'patch_embed',
      'pos_embed',
      'cls_token',
      'blocks_0',
      'blocks_1',
      'blocks_token_only_0',
      'blocks_token_only_1',
      'norm',
      'head',
  }
  for block in ('blocks_1', 'blocks_token_only_0'):
    np.testing.assert_array_equal(params[block]['gamma_2'], np.full(24, 0.3, np.float32))
  assert params['blocks_0']['attn']['proj_l']['kernel'].shape == (4, 4)
  assert set(params['blocks_token_only_1']['attn']) == {'q', 'k', 'v', 'proj'}
  apply = jax.jit(functools.partial(model.apply, mutable=['intermediates']))
  logits, state = apply(variables, images)
  assert logits.shape == (2, 5) and logits.dtype == jnp.float32
  (self_probs,) = state['intermediates']['blocks_1']['attn']['attention_probs']
  (class_probs,) = state['intermediates']['blocks_token_only_1']['attn']['attention_probs']
  assert self_probs.shape == (2, 4, 16, 16) and class_probs.shape == (2, 4, 1, 17)
  np.testing.assert_allclose(class_probs.sum(-1), 1.0, atol=1e-5)


def _randomised_timm_state(model, seed: int) -> dict[str, np.ndarray]:
  """timm's own init, with LayerScale, norms and biases moved off their constant values."""
  import torch  # pylint: disable=g-import-not-at-top

  generator = torch.Generator().manual_seed(seed)
  state = {}
  for key, value in model.state_dict().items():
    noise = torch.randn(value.shape, generator=generator)
    if 'gamma' in key:
      value = 0.1 + 0.05 * noise
    elif key.endswith('bias') or 'norm' in key:
      value = value + 0.05 * noise
    state[key] = value
  model.load_state_dict(state)
  return {key: value.numpy() for key, value in state.items()}


def test_logits_match_timm_cait_xxs24_224(timm):
  import torch  # pylint: disable=g-import-not-at-top

  reference = timm.create_model('cait_xxs24_224', pretrained=False).eval()
  state_dict = _randomised_timm_state(reference, seed=0)
  images = np.random.default_rng(0).normal(size=(2, 224, 224, 3)).astype(np.float32)
  with torch.no_grad():
    expected = reference(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
  variables = cait.from_timm(state_dict)
  model = models.create('cait_xxs24', num_classes=1000)
  logits = jax.jit(model.apply)(variables, jnp.asarray(images))
  assert np.abs(expected).max() > 0.1
  np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=0)


def test_from_timm_and_to_timm_are_inverses(tiny_variables):
  _, variables = tiny_variables
  state_dict = cait.to_timm(variables)
  assert state_dict['blocks.1.attn.proj_w.weight'].shape == (4, 4)
  assert state_dict['blocks_token_only.0.attn.q.weight'].shape == (24, 24)
  assert state_dict['blocks.0.gamma_1'].shape == (24,)
  assert state_dict['pos_embed'].shape == (1, 16, 24)
  restored = cait.from_timm(state_dict)
  jax.tree_util.tree_map(np.testing.assert_array_equal, restored, jax.device_get(variables))
  with pytest.raises(ValueError, match='blocks.0.attn.reatten_matrix.weight'):
    cait.from_timm({**state_dict, 'blocks.0.attn.reatten_matrix.weight': np.zeros((4, 4, 1, 1))})


def test_bad_configuration_raises_value_error():
  with pytest.raises(ValueError, match='class_attention_depth=0'):
    jax.eval_shape(
        cait.CaiT(
            **TINY, class_stage_settings=parts.ClassAttentionSettings(class_attention_depth=0)
        ).init,
        jax.random.key(0),
        jnp.zeros((1, 16, 16, 3)),
    )
  with pytest.raises(ValueError, match='num_heads=5'):
    jax.eval_shape(
        cait.CaiT(**dict(TINY, num_heads=5)).init, jax.random.key(0), jnp.zeros((1, 16, 16, 3))
    )


def test_tiny_model_trains(fit_one_batch):
  model = cait.CaiT(
      **dict(TINY, depth=1),
      class_stage_settings=parts.ClassAttentionSettings(class_attention_depth=1),
      layer_scale_init=0.1,
      dropout_rate=0.1,
      drop_path_rate=0.1,
  )
  images = jax.random.normal(jax.random.key(1), (8, 8, 8, 3))
  labels = jnp.arange(8) % 5
  losses = fit_one_batch(model, images, labels)
  assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])
