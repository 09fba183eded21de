"""Sown attention maps of real models, their grids, rollout and mean attention distance."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.analysis import maps
from vit_jax.analysis import rollout


def _softmax(logits: np.ndarray) -> np.ndarray:
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _model_maps(name: str, **fields):
  model = models.create(
      name, num_classes=3, patch_size=2, hidden_size=16, num_heads=2, mlp_dim=32, **fields
  )
  images = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
  variables = jax.jit(model.init)(jax.random.key(0), images)
  return model, maps.attention_maps(model, variables, images)


def test_cait_maps_stages_and_class_rollout():
  _, layers = _model_maps('cait_ti4', depth=11, class_attention_depth=2)
  assert [layer.name for layer in layers] == [f'blocks_{i}/attn' for i in range(11)] + [
      'blocks_token_only_0/attn',
      'blocks_token_only_1/attn',
  ]  # Call order, not sorted.
  assert [layer.shape for layer in layers] == [(2, 16, 16)] * 11 + [(2, 1, 17)] * 2
  np.testing.assert_allclose(layers[11].probs.sum(-1), 1.0, atol=1e-5)
  assert maps.stages(layers) == [list(range(11)), [11, 12]]
  assert maps.main_stage(layers) == list(range(11))
  assert maps.key_grid(16, (8, 8)) == maps.Grid(0, 4, 4, 2.0)
  assert maps.key_grid(17, (8, 8)) == maps.Grid(1, 4, 4, 2.0)
  (relevance,) = rollout.token_relevance(layers, (8, 8))
  assert relevance.token.startswith('class') and relevance.maps.shape == (2, 4, 4)
  queries = maps.query_maps(layers, (8, 8), window_size=3)
  assert [q.query for q in queries] == ['centre'] * 11 + ['class'] * 2
  assert queries[0].maps.shape == (2, 3, 3) and queries[11].maps.shape == (2, 4, 4)
  assert queries[0].query_cell == (1, 1) and queries[11].query_cell is None
  np.testing.assert_allclose(
      queries[0].maps, layers[0].probs[:, :, 10].mean(0).reshape(2, 4, 4)[:, 1:4, 1:4], atol=1e-7
  )  # Centre token (2, 2) = 10; its 3 x 3 neighbourhood.
  (whole,) = maps.query_maps(layers[:1], (8, 8), window_size=5)
  assert whole.maps.shape == (2, 4, 4) and whole.query_cell == (2, 2)


def test_deit_distilled_rollout_of_class_and_distillation_tokens():
  model, layers = _model_maps('deit_ti16_distilled', depth=2)
  assert [layer.shape for layer in layers] == [(2, 18, 18)] * 2
  names = [p.removesuffix('_token') for p in model.prefix_tokens]
  relevance = rollout.token_relevance(layers, (8, 8), names)
  assert [r.token for r in relevance] == ['cls', 'dist']
  full = rollout.rollout([layer.probs for layer in layers])
  np.testing.assert_allclose(relevance[1].maps, full[:, 1, 2:].reshape(2, 4, 4))


def test_rollout_is_the_product_of_residual_averaged_maps():
  stage = [_softmax(np.random.default_rng(s).normal(size=(2, 3, 5, 5))) for s in range(3)]
  steps = [0.5 * a.mean(1) + 0.5 * np.eye(5) for a in stage]
  expected = np.einsum('bij,bjk,bkl->bil', steps[2], steps[1], steps[0])
  np.testing.assert_allclose(rollout.rollout(stage), expected, atol=1e-12)


def test_class_rollout_equals_the_product_over_all_tokens():
  """Embedding every layer in the (1 + N)-token space gives the same class-token row."""
  rng = np.random.default_rng(0)
  tokens = 4
  stage = [_softmax(rng.normal(size=(2, 3, tokens, tokens))) for _ in range(2)]
  class_stage = [_softmax(rng.normal(size=(2, 3, 1, 1 + tokens))) for _ in range(2)]
  product = np.broadcast_to(np.eye(1 + tokens), (2, 1 + tokens, 1 + tokens)).copy()
  for a in stage:
    step = np.broadcast_to(np.eye(1 + tokens), product.shape).copy()
    step[:, 1:, 1:] = 0.5 * a.mean(1) + 0.5 * np.eye(tokens)
    product = step @ product
  for a in class_stage:
    step = np.broadcast_to(np.eye(1 + tokens), product.shape).copy()
    step[:, 0] = 0.5 * np.eye(1 + tokens)[0] + 0.5 * a[:, :, 0].mean(1)
    product = step @ product
  got = rollout.class_rollout(rollout.rollout(stage), class_stage)
  np.testing.assert_allclose(got, product[:, 0], atol=1e-12)


def test_mean_distance_of_a_head_attending_to_one_key():
  grid = maps.Grid(prefix=1, rows=3, cols=4, cell=8.0)
  tokens = 1 + 12
  probs = np.zeros((1, 2, tokens, tokens))
  probs[:, 0, :, 1] = 1.0  # Head 0: every query looks at grid cell (0, 0).
  probs[:, 1, np.arange(tokens), np.arange(tokens)] = 1.0  # Head 1: every query at itself.
  expected = np.mean([8.0 * np.hypot(r, c) for r in range(3) for c in range(4)])
  np.testing.assert_allclose(rollout.mean_distance(probs, grid), [expected, 0.0], atol=1e-12)


def test_window_marks_cells_outside_the_grid():
  grid_maps = np.arange(16.0).reshape(1, 4, 4)
  cropped = maps.window(grid_maps, (0, 3), 3)
  assert np.isnan(cropped[0, 0]).all() and np.isnan(cropped[0, :, 2]).all()
  np.testing.assert_array_equal(cropped[0, 1:, :2], [[2, 3], [6, 7]])


def test_model_without_sown_maps_raises():
  class Plain(nn.Module):

    @nn.compact
    def __call__(self, x, *, train=False):
      return nn.Dense(2)(x.reshape(x.shape[0], -1))

  model = Plain()
  images = jnp.zeros((1, 4, 4, 3))
  with pytest.raises(ValueError, match='attention_probs'):
    maps.attention_maps(model, model.init(jax.random.key(0), images), images)


def test_overlay_blends_the_upsampled_heatmap_over_the_image():
  image = np.random.default_rng(0).normal(size=(8, 12, 3))
  heatmap = np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])  # A 2x3 grid: cells of 4x4 pixels.
  shown = maps.display_image(image)
  assert shown.min() == 0.0 and shown.max() == 1.0
  np.testing.assert_allclose(maps.overlay(image, heatmap, alpha=0.0), shown)
  coloured = maps.overlay(image, heatmap, alpha=1.0)
  assert coloured.shape == (8, 12, 3)
  np.testing.assert_allclose(coloured[:4, 4:8], np.broadcast_to(coloured[0, 4], (4, 4, 3)))
  np.testing.assert_allclose(
      maps.overlay(image, heatmap, alpha=0.25), 0.75 * shown + 0.25 * coloured
  )
  with pytest.raises(ValueError, match='alpha=1.5 must be in'):
    maps.overlay(image, heatmap, alpha=1.5)
