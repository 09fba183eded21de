"""Attention collapse (Zhou et al., DeepViT): how alike the attention maps of successive blocks are.

Cross-layer similarity (DeepViT Eq. 2): M^{p,q}_{h,t} = cos(A^p_{h,:,t}, A^q_{h,:,t}), the cosine
between column t (how token t feeds every query) of head h's map in block p and in block q,
averaged over heads, tokens and images. Block p counts as "similar" (collapsed) when
M^{p-1,p} exceeds the threshold (0.9 in the paper). For Re-attention the map after head mixing is
the one compared, as that is the map the block applies.
"""

import dataclasses
from typing import Any, Sequence

from matplotlib import figure
from matplotlib import ticker
import numpy as np

SIMILARITY_THRESHOLD = 0.9
_EPS = 1e-12


def _unit_columns(probs: np.ndarray) -> np.ndarray:
  """(images, heads, queries, keys) maps with every key column scaled to unit length."""
  probs = np.asarray(probs, np.float64)
  return probs / np.maximum(np.linalg.norm(probs, axis=2, keepdims=True), _EPS)


def cross_layer_similarity(stage: Sequence[np.ndarray]) -> np.ndarray:
  """(layers, layers) M[p, q]: DeepViT's column cosine of the (images, heads, queries, keys) maps
  of `stage`, mean over images, heads and tokens."""
  shapes = {np.shape(a) for a in stage}
  if len(shapes) != 1:
    raise ValueError(f'Cross-layer similarity needs maps of one shape; got {sorted(shapes)}.')
  columns = [_unit_columns(a) for a in stage]
  size = len(stage)
  similarity = np.eye(size)
  for p in range(size):
    for q in range(p + 1, size):
      similarity[p, q] = similarity[q, p] = np.mean(np.sum(columns[p] * columns[q], axis=2))
  return similarity


def neighbour_similarity(similarity: np.ndarray, k: int) -> np.ndarray:
  """Per block p, the mean of M[p, q] over its next k blocks q = p+1..p+k (NaN for the last)."""
  size = len(similarity)
  return np.array([np.mean(similarity[p, p + 1 : p + 1 + k]) for p in range(size - 1)] + [np.nan])


def similar_blocks(similarity: np.ndarray, threshold: float = SIMILARITY_THRESHOLD) -> list[int]:
  """Blocks p >= 1 whose map matches the previous block's: M[p-1, p] > threshold."""
  return [p for p in range(1, len(similarity)) if similarity[p - 1, p] > threshold]


def inter_head_similarity(probs: np.ndarray) -> float:
  """Mean column cosine between the maps of two different heads of one layer (NaN for 1 head)."""
  columns = _unit_columns(probs)
  images, heads, _, keys = columns.shape
  if heads < 2:
    return float('nan')
  gram = np.einsum('bhqk,bgqk->hg', columns, columns) / (images * keys)
  return float((gram.sum() - np.trace(gram)) / (heads * (heads - 1)))


@dataclasses.dataclass(frozen=True)
class Collapse:
  """The collapse measurements of one stage of equally shaped attention layers."""

  layers: list[str]
  similarity: np.ndarray  # (layers, layers) M.
  inter_head: np.ndarray  # (layers,)
  threshold: float = SIMILARITY_THRESHOLD

  @property
  def similar(self) -> list[int]:
    return similar_blocks(self.similarity, self.threshold)

  def to_json(self, max_k: int = 3) -> dict[str, Any]:
    """The numbers, NaN as None."""
    clean = lambda a: [None if np.isnan(x) else float(x) for x in np.ravel(a)]
    return {
        'layers': self.layers,
        'similarity': [clean(row) for row in self.similarity],
        'neighbour_similarity': {
            str(k): clean(neighbour_similarity(self.similarity, k)) for k in range(1, max_k + 1)
        },
        'threshold': self.threshold,
        'similar_blocks': self.similar,
        'similar_block_count': len(self.similar),
        'inter_head_similarity': clean(self.inter_head),
    }


def measure(
    stage: Sequence[np.ndarray], names: Sequence[str], threshold: float = SIMILARITY_THRESHOLD
) -> Collapse:
  """Cross-layer and inter-head similarity of one stage of maps."""
  return Collapse(
      list(names),
      cross_layer_similarity(stage),
      np.array([inter_head_similarity(a) for a in stage]),
      threshold,
  )


def plot(collapse: Collapse, path: str, max_k: int = 3, title: str = '') -> None:
  """DeepViT-style figure: similarity to the k next blocks vs depth, similar-block count vs
  depth, the full M matrix and the inter-head similarity."""
  size = len(collapse.layers)
  blocks = np.arange(1, size + 1)
  fig = figure.Figure(figsize=(17, 3.8))
  axes = fig.subplots(1, 4)
  ax = axes[0]
  for k in range(1, min(max_k, size - 1) + 1):
    ax.plot(blocks, neighbour_similarity(collapse.similarity, k), marker='o', ms=3, label=f'k={k}')
  ax.axhline(collapse.threshold, color='gray', ls='--', lw=1)
  ax.set(xlabel='block index', ylabel='cross-layer similarity')
  ax.set_title('Similarity with the k next blocks', fontsize=9)
  # Maps mixed across heads may be negative, and so may their cosines.
  values = np.concatenate([collapse.similarity.ravel(), np.ravel(collapse.inter_head)])
  lowest = min(0.0, float(np.nanmin(values)))
  ax.set_ylim(lowest - 0.02, 1.02)
  ax.legend(fontsize=7)

  ax = axes[1]
  flags = np.zeros(size)
  flags[collapse.similar] = 1
  ax.step(blocks, np.cumsum(flags), where='mid', color='C3')
  ax.set(xlabel='depth (blocks)', ylabel=f'similar blocks (M > {collapse.threshold:g})')
  ax.set_title(f'Similar-block count: {len(collapse.similar)} of {size}', fontsize=9)
  ax.set_ylim(-0.2, max(size - 1, 1) + 0.2)

  ax = axes[2]
  extent = (0.5, size + 0.5, size + 0.5, 0.5)  # Blocks numbered from 1, block 1 at the top.
  image = ax.imshow(collapse.similarity, vmin=lowest, vmax=1, cmap='magma', extent=extent)
  ax.set(xlabel='block q', ylabel='block p')
  ax.set_title('M^{p,q}', fontsize=9)
  fig.colorbar(image, ax=ax, fraction=0.046)

  ax = axes[3]
  ax.plot(blocks, collapse.inter_head, marker='o', ms=3, color='C2')
  ax.set(xlabel='block index', ylabel='inter-head similarity', ylim=(lowest - 0.02, 1.02))
  ax.set_title('Similarity between heads of a block', fontsize=9)
  for axis in [ax.xaxis for ax in axes] + [axes[1].yaxis, axes[2].yaxis]:
    axis.set_major_locator(ticker.MaxNLocator(integer=True))
  fig.suptitle(title or 'Attention collapse', fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
