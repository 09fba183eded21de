"""Scan-over-layers and remat: the same variables, outputs and gradients as the unrolled model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models

SWITCHES = [dict(scan_layers=True), dict(remat=True), dict(scan_layers=True, remat=True)]

# Tiny members of every family with a deep block stack, at 16x16 inputs; timm init, so that the
# head is not zero.
TINY = {
    'vit': ('vit_ti4', dict(hidden_size=24, depth=3, num_heads=3, mlp_dim=48, init_scheme='timm')),
    'deit_distilled': ('deit_ti16_distilled', dict(patch_size=4, hidden_size=24, depth=3,
                                                   num_heads=3, mlp_dim=48)),
}


def _tiny(family: str, **switches):
  name, fields = TINY[family]
  return models.create(name, num_classes=5, drop_path_rate=0.2, **fields, **switches)


def _images(batch: int = 2):
  return jax.random.normal(jax.random.key(1), (batch, 16, 16, 3))


def _max_diff(a, b) -> float:
  assert jax.tree.structure(a) == jax.tree.structure(b)
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


CASES = [('vit', switches) for switches in SWITCHES] + [
    (family, SWITCHES[-1]) for family in sorted(TINY) if family != 'vit']


@pytest.mark.parametrize('family, switches', CASES, ids=str)
def test_same_variables_outputs_and_gradients_as_unrolled(family, switches):
  plain, switched = _tiny(family), _tiny(family, **switches)
  variables = plain.init(jax.random.key(0), _images())
  assert _max_diff(variables, switched.init(jax.random.key(0), _images())) == 0.0

  logits, state = plain.apply(variables, _images(), mutable=['intermediates'])
  logits_s, state_s = switched.apply(variables, _images(), mutable=['intermediates'])
  assert _max_diff(logits, logits_s) <= 1e-5
  # Sown attention maps keep the per-block layout blocks_i/attn/attention_probs.
  assert _max_diff(state['intermediates'], state_s['intermediates']) <= 1e-5

  def loss(model):
    return lambda params: jnp.sum(model.apply({**variables, 'params': params}, _images()) ** 2)
  grads = jax.grad(loss(plain))(variables['params'])
  grads_s = jax.grad(loss(switched))(variables['params'])
  assert _max_diff(grads, grads_s) <= 1e-5


@pytest.mark.parametrize('switches', SWITCHES, ids=str)
def test_training_mode_runs_with_per_layer_stochastic_depth(switches):
  model = _tiny('vit', **switches)
  variables = model.init(jax.random.key(0), _images())
  images = _images(batch=32)
  outputs = [model.apply(variables, images, train=True, rngs={'dropout': jax.random.key(k)})
             for k in (0, 1)]
  assert outputs[0].shape == (32, 5)
  # Some of the 64 drop-path draws of rates 0.1 and 0.2 differ between the two rngs.
  assert _max_diff(outputs[0], outputs[1]) > 0
