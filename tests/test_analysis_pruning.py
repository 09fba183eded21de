"""Pruning degenerate SA-conv heads: exactly those heads go, and the rest computes as before."""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.analysis import pruning

WIDTH = 8
TINY = dict(num_layers=2, hidden_size=WIDTH, intermediate_size=12, num_heads=4, num_classes=3)


@functools.cache
def _initial(name: str):
  model = models.create(name, **TINY)
  images = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
  return model, model.init(jax.random.key(0), images)['params'], images


def _init(name: str):
  """The model, a writable copy of its initial parameters, and images."""
  model, params, images = _initial(name)
  return model, jax.tree.map(np.array, params), images


def _masked(params, heads):
  """The original parameters with the value rows of `heads[layer]` set to zero."""
  params = jax.tree.map(np.array, params)
  for layer, drop in enumerate(heads):
    kernel = params[f'layers_{layer}']['attention']['value']['kernel']
    for head in drop:
      kernel[head * WIDTH : (head + 1) * WIDTH] = 0.0
  return params


def _degenerate_gaussian(params):
  """Layer 0: head 1 has condition number 1e4, head 3 largest eigenvalue 1e-6. Layer 1: head 0
  has condition number 1e6. Every other head keeps its near-identity initial spread."""
  spreads = [params[f'layers_{i}']['attention']['attention_spreads'] for i in range(2)]
  spreads[0][1] = np.diag([1.0, 1e-2])
  spreads[0][3] = 1e-3 * np.eye(2)
  spreads[1][0] = np.array([[0.6, 0.8], [-0.8e-3, 0.6e-3]])  # Rotated diag(1, 1e-3).
  return params


def test_gaussian_pruning_rules_official_and_paper():
  _, params, _ = _init('sa_conv_gaussian')
  params = _degenerate_gaussian(params)
  assert pruning.degenerate_heads(params, 'gaussian') == [[1, 3], [0]]
  assert pruning.degenerate_heads(params, 'gaussian', rule='paper') == [[3], [0]]
  with pytest.raises(ValueError, match='rule'):
    pruning.degenerate_heads(params, 'gaussian', rule='loose')


def test_isotropic_heads_prune_on_small_spread():
  _, params, _ = _init('sa_conv_quadratic')
  params['layers_1']['attention']['attention_spreads'][2] = 3e-3  # s^2 = 9e-6 < 1e-5.
  params['layers_1']['attention']['attention_spreads'][3] = 4e-3  # s^2 = 1.6e-5: kept.
  assert pruning.degenerate_heads(params, 'quadratic') == [[], [2]]
  with pytest.raises(ValueError, match='learned'):
    pruning.degenerate_heads(params, 'learned')


def test_pruned_model_equals_original_with_heads_masked():
  model, params, images = _init('sa_conv_gaussian')
  params = _degenerate_gaussian(params)
  heads = pruning.degenerate_heads(params, 'gaussian')
  pruned_params, layer_heads = pruning.prune(params, heads)
  assert layer_heads == (2, 3)
  pruned_model = models.create('sa_conv_gaussian', layer_heads=layer_heads, **TINY)
  shapes = jax.eval_shape(pruned_model.init, jax.random.key(0), images)['params']
  assert jax.tree.map(np.shape, shapes) == jax.tree.map(np.shape, pruned_params)
  pruned = pruned_model.apply({'params': pruned_params}, images)
  masked = model.apply({'params': _masked(params, heads)}, images)
  np.testing.assert_allclose(pruned, masked, atol=1e-5, rtol=0)
  assert np.abs(model.apply({'params': params}, images) - masked).max() > 1e-3
  kept = pruned_params['layers_0']['attention']['attention_centers']
  np.testing.assert_array_equal(kept, params['layers_0']['attention']['attention_centers'][[0, 2]])

  before = pruning.forward_cost(model, params, 8)
  after = pruning.forward_cost(pruned_model, pruned_params, 8)
  per_head = 2 + 4 + WIDTH * WIDTH  # Centre, spread and value rows.
  assert before['parameters'] - after['parameters'] == 3 * per_head
  assert after['flops'] < before['flops']


def test_a_layer_cannot_lose_every_head():
  _, params, _ = _init('sa_conv_quadratic')
  with pytest.raises(ValueError, match='layers_0'):
    pruning.prune(params, [[0, 1, 2, 3], []])


def test_bad_layer_heads_raise():
  with pytest.raises(ValueError, match='layer_heads'):
    models.create('sa_conv_gaussian', layer_heads=(2,), **TINY).init(
        jax.random.key(0), jnp.zeros((1, 8, 8, 3))
    )
