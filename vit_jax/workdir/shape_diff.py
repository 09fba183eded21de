"""How the variables saved in a checkpoint differ from those a model wants, by path and shape."""

import dataclasses
from typing import Any, Mapping

import jax
import numpy as np


def flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """Maps every leaf's path ('params/blocks_0/attn/qkv/kernel') to its shape; leaves are arrays,
  `jax.ShapeDtypeStruct`s or orbax's `ArrayMetadata`."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  name = lambda k: getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k)))  # dict, list, attr
  return {
      '/'.join(str(name(k)) for k in path): tuple(getattr(leaf, 'shape', np.shape(leaf)))
      for path, leaf in flat
  }


@dataclasses.dataclass(frozen=True)
class ShapeDiff:
  """How the variables found (in a checkpoint) differ from those wanted (by a model), by path."""

  missing: list[str]
  unexpected: list[str]
  reshaped: list[str]  # 'path (found shape) vs (wanted shape)'

  @classmethod
  def between(
      cls, found: Mapping[str, tuple[int, ...]], wanted: Mapping[str, tuple[int, ...]]
  ) -> 'ShapeDiff':
    return cls(
        sorted(set(wanted) - set(found)),
        sorted(set(found) - set(wanted)),
        sorted(
            f'{k} {tuple(found[k])} vs {tuple(wanted[k])}'
            for k in set(found) & set(wanted)
            if tuple(found[k]) != tuple(wanted[k])
        ),
    )

  def __bool__(self) -> bool:
    return bool(self.missing or self.unexpected or self.reshaped)

  def listing(self, limit: int = 12) -> str:
    """One indented line per kind of difference, each naming up to `limit` paths."""

    def line(title, items):
      shown = ', '.join(items[:limit]) + (
          f', … ({len(items) - limit} more)' if len(items) > limit else ''
      )
      return f'\n  {title} ({len(items)}): {shown}' if items else ''

    return (
        line('missing from the checkpoint', self.missing)
        + line('unexpected in the checkpoint', self.unexpected)
        + line('wrong shape, checkpoint vs model', self.reshaped)
    )
