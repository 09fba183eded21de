"""Attention maps of any model, read from the probabilities its attention modules sow.

`attention_maps` gives one `LayerMaps` per attention module, in call order: its maps after any
head mixing. `stages` groups consecutive layers of equal shape (CaiT's self- and class-attention
stages, T2T's token layers and backbone); `key_grid` finds where the keys sit on the image.
"""

import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import flax
import flax.linen as nn
import jax
import matplotlib
from matplotlib import figure
from matplotlib import patches
import numpy as np

SOWN_NAME = 'attention_probs'
MAX_PREFIX_TOKENS = 2  # Class and distillation tokens.


@dataclasses.dataclass(frozen=True)
class LayerMaps:
  """The sown maps of one attention module: (images, heads, queries, keys), float32."""

  name: str
  probs: np.ndarray

  @property
  def shape(self) -> tuple[int, int, int]:
    """(heads, queries, keys)."""
    return self.probs.shape[1:]


@dataclasses.dataclass(frozen=True)
class Grid:
  """Keys = `prefix` non-spatial tokens, then a row-major rows x cols grid of `cell` pixels."""

  prefix: int
  rows: int
  cols: int
  cell: float

  def positions(self) -> np.ndarray:
    """(rows * cols, 2) pixel coordinates (row, col) of the grid tokens' centres."""
    rows, cols = np.meshgrid(np.arange(self.rows), np.arange(self.cols), indexing='ij')
    return np.stack([rows.ravel(), cols.ravel()], -1) * self.cell

  @property
  def centre(self) -> tuple[int, int]:
    return self.rows // 2, self.cols // 2


def _forward_variables(variables: Any) -> dict[str, Any]:
  """The collections a forward pass reads (no stale `intermediates`)."""
  return {k: v for k, v in dict(variables).items() if k in ('params', 'batch_stats')}


@functools.cache
def _sown_maps(model: nn.Module) -> tuple[Callable[..., list[jax.Array]], list[tuple[str, ...]]]:
  """A jitted function returning the sown maps as a list, and their paths in call order (read
  from the traced `intermediates`: jit returns dicts with sorted keys, 'blocks_10' first)."""
  paths: list[tuple[str, ...]] = []

  @jax.jit
  def run(variables: dict[str, Any], images: jax.Array) -> list[jax.Array]:
    _, state = model.apply(variables, images, train=False, mutable=['intermediates'])
    flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(state.get('intermediates', {})))
    paths[:] = [path for path in flat if path[-1] == SOWN_NAME]
    return [flat[path] for path in paths]

  return run, paths


def attention_maps(model: nn.Module, variables: Any, images: Any) -> list[LayerMaps]:
  """Every sown attention map of `model` on `images` (NHWC), in the order the layers ran."""
  run, paths = _sown_maps(model)
  sown = run(_forward_variables(variables), jax.numpy.asarray(images))
  layers = []
  for path, values in zip(paths, sown):
    name = '/'.join(path[:-1])
    for i, value in enumerate(values):
      suffix = f'#{i}' if len(values) > 1 else ''
      layers.append(LayerMaps(name + suffix, np.asarray(value, np.float32)))
  if not layers:
    raise ValueError(
        f'{type(model).__name__} sowed no {SOWN_NAME!r}; every attention module '
        "must sow its probabilities to 'intermediates'."
    )
  return layers


def is_square(layer: LayerMaps) -> bool:
  """Whether every token both queries and is a key (self-attention, not class attention)."""
  return layer.shape[1] == layer.shape[2]


def stages(layers: Sequence[LayerMaps]) -> list[list[int]]:
  """Indices of consecutive layers whose maps have the same (heads, queries, keys)."""
  groups: list[list[int]] = []
  for i, layer in enumerate(layers):
    if groups and layers[groups[-1][-1]].shape == layer.shape:
      groups[-1].append(i)
    else:
      groups.append([i])
  return groups


def main_stage(layers: Sequence[LayerMaps]) -> list[int]:
  """The longest stage of square maps (the self-attention backbone); the last one on ties."""
  square = [g for g in stages(layers) if is_square(layers[g[0]])]
  if not square:
    raise ValueError(
        'No self-attention stage: no layer has as many queries as keys; shapes: '
        f'{[layer.shape for layer in layers]}.'
    )
  return max(reversed(square), key=len)


def key_grid(keys: int, image_shape: tuple[int, int]) -> Grid | None:
  """The layout of `keys` tokens on an image of (height, width) pixels, or None: the fewest
  prefix tokens that leave a grid of the image's aspect ratio, a whole number of pixels a cell."""
  height, width = image_shape
  for prefix in range(min(MAX_PREFIX_TOKENS, keys - 1) + 1):
    tokens = keys - prefix
    rows = round(math.sqrt(tokens * height / width))
    if rows < 1 or tokens % rows:
      continue
    cols = tokens // rows
    if rows * width == cols * height and height % rows == 0:
      return Grid(prefix, rows, cols, height / rows)
  return None


def window(grid_maps: np.ndarray, centre: tuple[int, int], size: int) -> np.ndarray:
  """The size x size window of (..., rows, cols) maps around `centre`, NaN outside the grid."""
  rows, cols = grid_maps.shape[-2:]
  half = size // 2
  out = np.full(grid_maps.shape[:-2] + (size, size), np.nan, np.float64)
  r0, c0 = centre[0] - half, centre[1] - half
  rs, re = max(r0, 0), min(r0 + size, rows)
  cs, ce = max(c0, 0), min(c0 + size, cols)
  out[..., rs - r0 : re - r0, cs - c0 : ce - c0] = grid_maps[..., rs:re, cs:ce]
  return out


@dataclasses.dataclass(frozen=True)
class QueryMaps:
  """Mean over images of one query's attention over the key grid, per head."""

  layer: str
  query: str  # 'centre' (the centre grid token) or 'class' (a single class-token query).
  maps: np.ndarray  # (heads, rows, cols) over the grid keys, or a window of them.
  grid: Grid
  query_cell: tuple[int, int] | None  # Where the query sits in `maps`; None for 'class'.


def query_maps(
    layers: Sequence[LayerMaps], image_shape: tuple[int, int], window_size: int | None = None
) -> list[QueryMaps]:
  """Per layer whose keys lie on a grid, each head's attention of the centre grid token (cropped
  to `window_size` cells around it) or of the single class query (CaiT), over the whole grid."""
  result = []
  for layer in layers:
    _, queries, keys = layer.shape
    grid = key_grid(keys, image_shape)
    if grid is None or queries not in (1, keys):
      continue
    spatial = layer.probs[..., grid.prefix :].reshape(
        layer.probs.shape[:3] + (grid.rows, grid.cols)
    )
    if queries == 1:
      result.append(QueryMaps(layer.name, 'class', spatial[:, :, 0].mean(0), grid, None))
      continue
    row, col = grid.centre
    maps, cell = spatial[:, :, grid.prefix + row * grid.cols + col].mean(0), grid.centre
    if window_size is not None and max(grid.rows, grid.cols) > window_size:
      maps, cell = window(maps, grid.centre, window_size), (window_size // 2, window_size // 2)
    result.append(QueryMaps(layer.name, 'centre', maps, grid, cell))
  return result


def plot_query_maps(maps: Sequence[QueryMaps], path: str, title: str = '') -> None:
  """A layers x heads grid of images, the query (centre token) marked by a black square."""
  num_heads = max(m.maps.shape[0] for m in maps)
  fig = figure.Figure(figsize=(1.6 * num_heads + 1.2, 1.6 * len(maps) + 0.6))
  axes = fig.subplots(len(maps), num_heads, squeeze=False)
  for row, layer in enumerate(maps):
    for head in range(num_heads):
      ax = axes[row, head]
      ax.set(xticks=[], yticks=[])
      if head >= layer.maps.shape[0]:
        ax.axis('off')
        continue
      image = layer.maps[head]
      # Maps mixed across heads (talking heads, Re-attention) may be negative.
      ax.imshow(
          np.ma.masked_invalid(image),
          cmap='viridis',
          vmin=min(np.nanmin(image), 0.0),
          vmax=max(np.nanmax(image), 1e-12),
      )
      if layer.query_cell is not None:
        r, c = layer.query_cell
        ax.add_patch(patches.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, ec='black', lw=1.5))
      if row == 0:
        ax.set_title(f'head {head}', fontsize=8)
      if head == 0:
        ax.set_ylabel(f'{layer.layer}\n({layer.query})', fontsize=6)
  fig.suptitle(
      title
      or 'Attention of the centre token (class token for class attention), ' 'mean over images',
      fontsize=9,
  )
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def display_image(image: np.ndarray) -> np.ndarray:
  """(H, W, 3) RGB in [0, 1] of an image in any range (a normalised model input) or grayscale."""
  image = np.asarray(image, np.float64)
  if image.ndim == 2 or image.shape[-1] == 1:
    image = np.repeat(image.reshape(image.shape[:2] + (1,)), 3, axis=-1)
  return (image - image.min()) / max(image.max() - image.min(), 1e-12)


def overlay(
    image: np.ndarray, heatmap: np.ndarray, alpha: float = 0.6, cmap: str = 'inferno'
) -> np.ndarray:
  """(H, W, 3) RGB in [0, 1]: `image` (any range) alpha-blended with `heatmap` (rows, cols),
  upsampled to it (nearest), scaled to [0, 1] and coloured by `cmap`."""
  if not 0 <= alpha <= 1:
    raise ValueError(f'alpha={alpha} must be in [0, 1].')
  image = display_image(image)
  heat = np.asarray(jax.image.resize(np.asarray(heatmap, np.float32), image.shape[:2], 'nearest'))
  heat = (heat - heat.min()) / max(heat.max() - heat.min(), 1e-12)
  colours = matplotlib.colormaps[cmap](heat)[..., :3]
  return (1 - alpha) * image + alpha * colours
