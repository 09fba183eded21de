"""Where SA-conv heads look (Cordonnier et al., Figures 3-5): attention of the centre query pixel.

For each layer, every head's probabilities over the key grid for the centre query are drawn as
contours enclosing 50 % (solid) and 90 % (dotted) of the probability mass (`mass_level`), one
colour per head, the query pixel a black square.
"""

import dataclasses
from typing import Any, Sequence, cast

import contourpy
from matplotlib import figure
from matplotlib import patches
import numpy as np

from vit_jax.analysis import maps as maps_lib

MASSES = (0.5, 0.9)
LINE_STYLES = {0.5: '-', 0.9: ':'}
NUM_COLOURS = 9
TIE_TOLERANCE = 1e-6  # Relative: symmetric heads give equal probabilities up to rounding.


def mass_level(probs: np.ndarray, mass: float) -> float:
  """The level l such that {probs > l} is the smallest set of cells holding `mass` of the total,
  taking in whole every group of (numerically) tied cells at its edge."""
  values = np.sort(np.asarray(probs, np.float64).ravel())[::-1]
  cumulative = np.cumsum(values) / values.sum()
  needed = min(int(np.searchsorted(cumulative, mass - 1e-12)) + 1, len(values))
  edge = values[needed - 1]
  below = values[values < edge * (1 - TIE_TOLERANCE)]
  return 0.5 * (edge + (below[0] if len(below) else 0.0))


@dataclasses.dataclass(frozen=True)
class HeadContours:
  """One head's probabilities on the key grid and its mass contours, in cells relative to the
  query: `lines[m]` is a list of (points, 2) arrays of (row offset, column offset)."""

  probs: np.ndarray
  query: tuple[int, int]
  levels: dict[float, float]
  lines: dict[float, list[np.ndarray]]

  def centre_of_mass(self) -> np.ndarray:
    """The expected (row, col) offset of the attended key from the query."""
    rows, cols = np.indices(self.probs.shape)
    weights = self.probs / self.probs.sum()
    return np.array([(weights * rows).sum(), (weights * cols).sum()]) - self.query

  def to_json(self) -> dict[str, Any]:
    """Centre of mass and argmax (offsets from the query), and the cells of each region."""
    peak = np.unravel_index(np.argmax(self.probs), self.probs.shape)
    return {
        'centre_of_mass': np.round(self.centre_of_mass(), 4).tolist(),
        'argmax': [int(peak[0] - self.query[0]), int(peak[1] - self.query[1])],
        **{
            f'cells_{int(round(m * 100))}': int((self.probs > level).sum())
            for m, level in self.levels.items()
        },
    }


def head_contours(
    probs: np.ndarray, query: tuple[int, int], masses: Sequence[float] = MASSES
) -> HeadContours:
  """The mass contours of one head's (rows, cols) probabilities for the query at `query`."""
  probs = np.asarray(probs, np.float64)
  rows, cols = probs.shape
  generator = contourpy.contour_generator(
      np.arange(cols) - query[1], np.arange(rows) - query[0], probs, line_type='Separate'
  )
  levels = {mass: mass_level(probs, mass) for mass in masses}
  # `lines` returns the layout of the generator's line_type, which its signature cannot say.
  lines = {
      mass: [line[:, ::-1] for line in cast(list[np.ndarray], generator.lines(level))]
      for mass, level in levels.items()
  }
  return HeadContours(probs, query, levels, lines)


def layer_contours(
    query_maps: maps_lib.QueryMaps, masses: Sequence[float] = MASSES
) -> list[HeadContours]:
  """Contours of every head of one layer's centre-query maps over the full key grid."""
  grid = query_maps.grid
  if query_maps.query_cell is None or query_maps.maps.shape[1:] != (grid.rows, grid.cols):
    raise ValueError(f'{query_maps.layer}: contours need the centre query over the full grid.')
  return [head_contours(m, query_maps.query_cell, masses) for m in query_maps.maps]


def plot(
    layers: Sequence[tuple[str, list[HeadContours]]],
    path: str,
    window: int = 11,
    centres: Sequence[np.ndarray | None] | None = None,
) -> None:
  """One panel per layer: each head's 50 % / 90 % contours within `window` cells of the query
  (cut to the grid); learned centres mu as crosses."""
  columns = min(len(layers), 3)
  rows = -(-len(layers) // columns)
  fig = figure.Figure(figsize=(3.3 * columns, 3.3 * rows))
  axes = fig.subplots(rows, columns, squeeze=False)
  half = window // 2
  for index, (name, heads) in enumerate(layers):
    ax = axes.ravel()[index]
    layer_centres = centres[index] if centres is not None else None
    for head, contours in enumerate(heads):
      colour = f'C{head % NUM_COLOURS}'
      for mass, lines in contours.lines.items():
        for line in lines:
          ax.plot(line[:, 1], line[:, 0], color=colour, ls=LINE_STYLES.get(mass, '--'), lw=1.3)
      if layer_centres is not None:
        mu = layer_centres[head]
        ax.plot(mu[1], mu[0], marker='x', ms=4, color=colour)
    ax.add_patch(patches.Rectangle((-0.5, -0.5), 1, 1, color='black', zorder=3))
    # The window around the query, cut to the key grid.
    (rows, cols), (row, col) = heads[0].probs.shape, heads[0].query
    top, bottom = max(-half, -row), min(half, rows - 1 - row)
    left, right = max(-half, -col), min(half, cols - 1 - col)
    ax.set_xlim(left - 0.5, right + 0.5)
    ax.set_ylim(bottom + 0.5, top - 0.5)
    ax.set_xticks(np.arange(left, right) + 0.5, minor=True)
    ax.set_yticks(np.arange(top, bottom) + 0.5, minor=True)
    ax.set(xticks=[], yticks=[])
    ax.grid(True, which='minor', alpha=0.3)
    ax.set_aspect(1)
    ax.set_title(name, fontsize=9)
  for ax in axes.ravel()[len(layers) :]:
    ax.axis('off')
  fig.suptitle(
      'Attention of the centre query pixel (black): 50 % (solid) and 90 % (dotted) of '
      'the mass per head',
      fontsize=9,
  )
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def contours_json(layers: Sequence[tuple[str, list[HeadContours]]]) -> dict[str, Any]:
  """Per layer and head: centre of mass and argmax (offsets from the query), region sizes."""
  return {name: [contours.to_json() for contours in heads] for name, heads in layers}
