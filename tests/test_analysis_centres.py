"""SA-conv attention centres: heads set to known centres give contours around those centres."""

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib import path as mpath
import pytest

from vit_jax import models
from vit_jax.analysis import centres
from vit_jax.analysis import maps

CENTRES = np.array([[0, 2], [-3, 0], [2, -2], [-1, -1]], np.float32)


def test_heads_with_known_centres_have_contours_at_those_centres(tmp_path):
  model = models.create(
      'sa_conv_quadratic',
      num_layers=1,
      hidden_size=8,
      intermediate_size=8,
      num_heads=4,
      num_classes=2,
  )
  images = jax.random.normal(jax.random.key(1), (2, 22, 22, 3))  # An 11 x 11 grid.
  params = jax.jit(model.init)(jax.random.key(0), images)['params']
  params['layers_0']['attention']['attention_centers'] = jnp.asarray(CENTRES)
  params['layers_0']['attention']['attention_spreads'] = jnp.full((4,), 1.3)
  (query,) = maps.query_maps(maps.attention_maps(model, {'params': params}, images), (22, 22))
  assert query.query_cell == (5, 5)
  heads = centres.layer_contours(query)
  for head, mu in zip(heads, CENTRES):
    np.testing.assert_allclose(head.centre_of_mass(), mu, atol=0.05)
    for mass in centres.MASSES:
      (line,) = head.lines[mass]  # One closed contour per mass, around the centre.
      np.testing.assert_allclose(line[0], line[-1], atol=1e-9)
      assert mpath.Path(line).contains_point(mu)
      np.testing.assert_allclose(line.mean(0), mu, atol=0.35)
      inside = head.probs[head.probs > head.levels[mass]]
      edge = np.isclose(inside, inside.min(), rtol=1e-5)
      assert inside.sum() >= mass > inside[~edge].sum()  # Smallest, ties at the edge kept.
  assert len(heads[0].lines[0.9][0]) > 0
  centres.plot([('layer 0', heads)], str(tmp_path / 'centres.png'), 11, [CENTRES])
  assert (tmp_path / 'centres.png').stat().st_size > 0


def test_mass_level_keeps_the_smallest_set_of_cells():
  probs = np.array([[0.4, 0.3], [0.2, 0.1]])
  assert centres.mass_level(probs, 0.5) == pytest.approx(0.25)  # 0.3 in, 0.2 out.
  assert centres.mass_level(probs, 0.9) == pytest.approx(0.15)
  assert centres.mass_level(probs, 1.0) == pytest.approx(0.05)
  tied = np.array([0.4, 0.2, 0.2, 0.1, 0.1])
  assert centres.mass_level(tied, 0.5) == pytest.approx(0.15)  # Both 0.2 cells, not one of them.
