"""Attention collapse: DeepViT's cross-layer similarity against a loop over its Eq. 2."""

import numpy as np
import pytest

from vit_jax.analysis import collapse


def _softmax(logits: np.ndarray) -> np.ndarray:
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _random_maps(seed: int, shape=(3, 4, 10, 10), scale=3.0) -> np.ndarray:
  return _softmax(scale * np.random.default_rng(seed).normal(size=shape))


def _eq2_reference(a: np.ndarray, b: np.ndarray) -> float:
  """mean over images, heads h and tokens t of cos(A_{h,:,t}, B_{h,:,t}), written out."""
  values = []
  for image in range(a.shape[0]):
    for head in range(a.shape[1]):
      for t in range(a.shape[3]):
        x, y = a[image, head, :, t], b[image, head, :, t]
        values.append(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))
  return float(np.mean(values))


def test_similarity_matches_equation_two():
  stage = [_random_maps(seed, scale=1.0) for seed in range(3)]
  similarity = collapse.cross_layer_similarity(stage)
  for p in range(3):
    for q in range(3):
      np.testing.assert_allclose(similarity[p, q], _eq2_reference(stage[p], stage[q]), atol=1e-12)


def test_identical_layers_have_similarity_one_and_are_collapsed():
  maps = _random_maps(0)
  result = collapse.measure([maps] * 5, [f'b{i}' for i in range(5)])
  np.testing.assert_allclose(result.similarity, np.ones((5, 5)), atol=1e-12)
  np.testing.assert_allclose(collapse.neighbour_similarity(result.similarity, 2)[:-1], 1.0)
  assert result.similar == [1, 2, 3, 4]
  assert result.to_json()['similar_block_count'] == 4


def test_independent_random_maps_are_not_collapsed():
  stage = [_random_maps(seed) for seed in range(5)]
  result = collapse.measure(stage, [f'b{i}' for i in range(5)])
  off_diagonal = result.similarity[~np.eye(5, dtype=bool)]
  assert off_diagonal.max() < 0.5
  assert result.similar == []
  assert np.all(result.inter_head < 0.5)


def test_collapse_starts_where_layers_start_repeating():
  """Blocks 0-2 independent, blocks 3-5 one map: blocks 4 and 5 are the similar ones."""
  repeated = _random_maps(10)
  stage = [_random_maps(seed) for seed in range(3)] + [repeated] * 3
  similarity = collapse.cross_layer_similarity(stage)
  assert collapse.similar_blocks(similarity) == [4, 5]
  assert collapse.similar_blocks(similarity, threshold=1.1) == []


def test_inter_head_similarity():
  maps = _random_maps(3)
  same_heads = np.repeat(maps[:, :1], 4, axis=1)
  assert collapse.inter_head_similarity(same_heads) == pytest.approx(1.0)
  reference = np.mean(
      [_eq2_reference(maps[:, [h]], maps[:, [g]]) for h in range(4) for g in range(4) if h != g]
  )
  assert collapse.inter_head_similarity(maps) == pytest.approx(reference, abs=1e-12)


def test_maps_of_different_shapes_raise():
  with pytest.raises(ValueError, match='one shape'):
    collapse.cross_layer_similarity([_random_maps(0), _random_maps(1, shape=(3, 4, 1, 10))])
