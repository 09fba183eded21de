"""Attention rollout (Abnar & Zuidema, 2020) and mean attention distance (Dosovitskiy et al.).

Rollout multiplies, layer after layer, the head-averaged attention with the residual added,
Â = ½·A + ½·I, rows renormalised, so that row i of Â_L ⋯ Â_1 says how much each input token
contributes to token i at the top. Maps mixed across heads (talking heads, Re-attention) need not
be distributions; their absolute values are renormalised per row first.

Mean attention distance of a head: Σ_k A_{q,k}·‖pos(q) − pos(k)‖ in pixels over the grid keys
(weights renormalised over them), averaged over grid queries and images — ViT's Figure 7.
"""

import dataclasses
from typing import Any, Sequence

from matplotlib import figure
import numpy as np

from vit_jax.analysis import maps as maps_lib

_EPS = 1e-12


def _row_distributions(a: np.ndarray) -> np.ndarray:
  a = np.abs(np.asarray(a, np.float64))
  return a / np.maximum(a.sum(-1, keepdims=True), _EPS)


def rollout(stage: Sequence[np.ndarray], residual: float = 0.5) -> np.ndarray:
  """(images, tokens, tokens) rollout of square maps (images, heads, tokens, tokens), in order."""
  result: np.ndarray | None = None
  for probs in stage:
    if probs.shape[-1] != probs.shape[-2]:
      raise ValueError(f'Rollout needs square maps; got (queries, keys) = {probs.shape[-2:]}.')
    mixed = _row_distributions(_row_distributions(probs).mean(1))
    mixed = residual * np.eye(mixed.shape[-1]) + (1 - residual) * mixed
    result = mixed if result is None else mixed @ result
  if result is None:
    raise ValueError('Rollout needs the maps of at least one layer.')
  return result


def class_rollout(
    tokens_rollout: np.ndarray, class_stage: Sequence[np.ndarray], residual: float = 0.5
) -> np.ndarray:
  """(images, 1 + tokens) contribution of [class token parameter; input tokens] to the class token
  after CaiT's class-attention stage.

  `tokens_rollout` (images, N, N) is the rollout of the self-attention stage; each class map is
  (images, heads, 1, 1 + N) over [class; tokens]; the tokens are frozen in that stage, so only the
  class row moves: r <- ½·r + ½·(a_0·r + Σ_i a_i·R_i).
  """
  images, tokens, _ = tokens_rollout.shape
  relevance = np.zeros((images, 1 + tokens))
  relevance[:, 0] = 1.0
  through_tokens = np.concatenate([np.zeros((images, tokens, 1)), tokens_rollout], axis=-1)
  for probs in class_stage:
    if probs.shape[-2:] != (1, 1 + tokens):
      raise ValueError(
          f'Class attention over 1 + {tokens} tokens expected; got (queries, keys) '
          f'= {probs.shape[-2:]}.'
      )
    a = _row_distributions(_row_distributions(probs[:, :, 0]).mean(1))
    attended = a[:, :1] * relevance + np.einsum('bi,bik->bk', a[:, 1:], through_tokens)
    relevance = residual * relevance + (1 - residual) * attended
  return relevance


@dataclasses.dataclass(frozen=True)
class Relevance:
  """Rollout of one output token over the input grid, per image: (images, rows, cols)."""

  token: str
  maps: np.ndarray


def concatenate(batches: Sequence[list[Relevance]]) -> list[Relevance]:
  """The relevance maps of several image batches joined along the image axis."""
  return [
      Relevance(parts[0].token, np.concatenate([p.maps for p in parts])) for parts in zip(*batches)
  ]


def token_relevance(
    layers: Sequence[maps_lib.LayerMaps],
    image_shape: tuple[int, int],
    prefix_names: Sequence[str] = (),
    residual: float = 0.5,
) -> list[Relevance]:
  """Rollout over the input patches of the tokens a model classifies from: the main stage's
  prefix tokens, else CaiT's class token through class attention, else (SA-conv) the centre."""
  stage = maps_lib.main_stage(layers)
  tokens = layers[stage[0]].shape[-1]
  grid = maps_lib.key_grid(tokens, image_shape)
  if grid is None:
    raise ValueError(
        f'The {tokens} tokens of {layers[stage[0]].name} do not form a grid on a '
        f'{image_shape} image.'
    )
  rolled = rollout([layers[i].probs for i in stage], residual)
  to_grid = lambda r: r[:, grid.prefix :].reshape(-1, grid.rows, grid.cols)
  if grid.prefix:
    names = list(prefix_names)
    if len(names) != grid.prefix:
      names = [f'prefix_{i}' for i in range(grid.prefix)]
    return [Relevance(name, to_grid(rolled[:, i])) for i, name in enumerate(names)]
  following = stage[-1] + 1
  class_stage = [layer.probs for layer in layers[following:] if layer.shape[1:] == (1, tokens + 1)]
  if class_stage:
    # The class token's own parameter (column 0) carries no image information.
    relevance = class_rollout(rolled, class_stage, residual)[:, 1:]
    return [Relevance('class (class attention)', relevance.reshape(-1, grid.rows, grid.cols))]
  row, col = grid.centre
  return [Relevance('centre', to_grid(rolled[:, row * grid.cols + col]))]


def final_attention(
    layers: Sequence[maps_lib.LayerMaps],
    image_shape: tuple[int, int],
    prefix_names: Sequence[str] = (),
) -> list[Relevance]:
  """The last layer's head-mean attention over the image grid, of the tokens the model classifies
  from: each prefix token (CaiT: the class token of its last class-attention layer), or the
  centre token when there is none (SA-conv)."""
  last = layers[-1]
  _, queries, keys = last.shape
  grid = maps_lib.key_grid(keys, image_shape)
  if grid is None:
    raise ValueError(
        f'The {keys} keys of {last.name} do not form a grid on a {image_shape} ' 'image.'
    )
  spatial = _row_distributions(_row_distributions(last.probs[..., grid.prefix :]).mean(1))
  to_grid = lambda a: a.reshape(-1, grid.rows, grid.cols)
  if grid.prefix:
    count = min(grid.prefix, queries)
    names = list(prefix_names)[:count] if len(prefix_names) >= count else ['class'][:count]
    return [Relevance(name, to_grid(spatial[:, i])) for i, name in enumerate(names)]
  row, col = grid.centre
  return [Relevance('centre', to_grid(spatial[:, row * grid.cols + col]))]


def plot_relevance(
    relevance: Sequence[Relevance],
    images: np.ndarray,
    path: str,
    examples: int = 4,
    attention: Sequence[Relevance] = (),
    alpha: float = 0.6,
) -> None:
  """Mean rollout over images, then a few images with their rollout maps (and the last layer's
  `attention`, when given) alpha-blended over them."""
  panels = [(f'rollout: {r.token}', r) for r in relevance]
  panels += [(f'last layer: {a.token}', a) for a in attention]
  examples = min(examples, len(images))
  fig = figure.Figure(figsize=(max(2.2 * (1 + len(panels)), 5.0), 2.2 * (1 + examples)))
  axes = fig.subplots(1 + examples, 1 + len(panels), squeeze=False)
  for ax in axes.ravel():
    ax.set(xticks=[], yticks=[])
  axes[0, 0].axis('off')
  axes[0, 0].text(0.5, 0.5, f'mean over\n{len(images)} images', ha='center', va='center')
  for j, (title, r) in enumerate(panels, start=1):
    axes[0, j].imshow(r.maps.mean(0), cmap='inferno')
    axes[0, j].set_title(title, fontsize=8)
  for i in range(examples):
    axes[1 + i, 0].imshow(maps_lib.display_image(images[i]))
    for j, (_, r) in enumerate(panels, start=1):
      axes[1 + i, j].imshow(maps_lib.overlay(images[i], r.maps[i], alpha))
  fig.suptitle(
      'Attention rollout (Abnar & Zuidema) and last-layer attention\nmean over images, '
      'then over single images',
      fontsize=9,
  )
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def mean_distance(probs: np.ndarray, grid: maps_lib.Grid) -> np.ndarray:
  """(heads,) mean attention distance in pixels of square maps (images, heads, tokens, tokens)."""
  spatial = _row_distributions(probs[:, :, grid.prefix :, grid.prefix :])
  positions = grid.positions()
  distances = np.linalg.norm(positions[:, None] - positions[None], axis=-1)
  return np.einsum('bhqk,qk->bhq', spatial, distances).mean(axis=(0, 2))


def uniform_distance(grid: maps_lib.Grid) -> float:
  """The mean attention distance of uniform attention over the grid, a reference level."""
  positions = grid.positions()
  return float(np.linalg.norm(positions[:, None] - positions[None], axis=-1).mean())


def attention_distances(
    layers: Sequence[maps_lib.LayerMaps], image_shape: tuple[int, int]
) -> dict[str, np.ndarray]:
  """Per square layer whose tokens lie on a grid: the mean attention distance of each head."""
  result = {}
  for layer in layers:
    _, queries, keys = layer.shape
    grid = maps_lib.key_grid(keys, image_shape)
    if grid is not None and queries == keys:
      result[layer.name] = mean_distance(layer.probs, grid)
  return result


def plot_distances(
    distances: dict[str, np.ndarray], uniform: dict[str, float], path: str, image_size: int
) -> None:
  """Mean attention distance of every head against the layer (ViT Figure 7); a gray dash marks
  uniform attention."""
  fig = figure.Figure(figsize=(max(5.0, 0.45 * len(distances) + 2), 4))
  ax = fig.subplots()
  labelled = 0
  for i, (name, values) in enumerate(distances.items()):
    for head, value in enumerate(values):
      label = f'head {head}' if head >= labelled else None  # Each head's colour once.
      ax.scatter([i], [value], s=16, color=f'C{head % 10}', label=label)
    labelled = max(labelled, len(values))
    ax.plot([i - 0.3, i + 0.3], [uniform[name]] * 2, color='gray', lw=1, ls='--')
  ax.set_xticks(range(len(distances)))
  ax.set_xticklabels(list(distances), rotation=60, ha='right', fontsize=7)
  ax.set(ylabel='mean attention distance (pixels)', ylim=(0, None))
  ax.legend(fontsize=6, loc='lower right', ncol=2)
  ax.set_title(
      f'Mean attention distance per head, {image_size}-pixel images\n'
      '(dashes: uniform attention over the grid)',
      fontsize=9,
  )
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def relevance_json(relevance: Sequence[Relevance]) -> dict[str, Any]:
  """Mean rollout map of each token, as nested lists."""
  return {r.token: np.round(r.maps.mean(0), 6).tolist() for r in relevance}
