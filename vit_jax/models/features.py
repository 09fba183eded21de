"""Features of any registered model: its blocks' tokens, final tokens and pre-logits.

Every family sows what users ask for to the `features` collection (`layers.FEATURES`) of its one
model definition, so nothing here runs a second forward: `extract` applies the model with that
collection mutable and arranges what was sown the way timm's `forward_intermediates` does, with
the prefix tokens (class; distillation for distilled DeiT) apart from the patch tokens, which come
as an NHWC grid. It is a pure function of arrays, so it jits, and it reads runs that stack their
blocks with `nn.scan` (`scan_layers=True`) exactly as unrolled ones.

    from vit_jax import models
    from vit_jax.models import features
    model = models.create('deit_s16_distilled')
    variables = model.init(jax.random.key(0), images)
    out = jax.jit(lambda v, x: features.extract(model, v, x, blocks=[-4, -1]))(variables, images)
    out.pre_logits                     # (batch, 384): what the head reads
    out.prefix_tokens['blocks_11']     # (batch, 2, 384): class and distillation tokens
    out.patch_grid['blocks_11']        # (batch, 14, 14, 384)
    out.patch_grid['encoded']          # the final, normalised patch tokens
"""

import math
import re
from typing import Any, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import layers
from vit_jax.models import layouts

ENCODED = 'encoded'
_BLOCK = re.compile(r'(blocks_|layers_|s)(\d+)')  # ViTs, SA-conv, RegNet stages.


@flax.struct.dataclass
class Features:
  """What `extract` returns; both dicts are keyed by block name (`blocks_3`) and `encoded`.

  pre_logits: (batch, width), what the head reads (timm's `forward_head(pre_logits=True)`: the
    mean of the class and distillation tokens for a distilled DeiT, the grid mean for SA-conv).
  prefix_tokens: (batch, prefix, width) class/distillation tokens (prefix 0 where there are none).
  patch_grid: (batch, rows, cols, width) patch tokens on the image grid (RegNet: each stage's
    feature map).
  head_inputs: what each head reads (class, then distillation head of a distilled DeiT).
  """

  pre_logits: jax.Array
  prefix_tokens: dict[str, jax.Array]
  patch_grid: dict[str, jax.Array]
  head_inputs: tuple[jax.Array, ...]


def block_names(sown: dict[str, Any]) -> list[str]:
  """The main stage's block names in the `features` collection (unrolled layout), in order."""
  blocks = [found for found in map(_BLOCK.fullmatch, sown) if found]
  return [found.string for found in sorted(blocks, key=lambda found: int(found.group(2)))]


def _chosen(names: list[str], blocks: int | Sequence[int] | None) -> list[str]:
  """timm's `indices`: None for every block, n for the last n, or a sequence of indices."""
  count = len(names)
  if blocks is None:
    return names
  if isinstance(blocks, int):
    if not 0 <= blocks <= count:
      raise ValueError(f"blocks={blocks} must be between 0 and the model's {count} blocks.")
    return names[count - blocks :]
  bad = [i for i in blocks if not -count <= i < count]
  if bad:
    raise ValueError(
        f'Block indices {bad} are out of range for a model of {count} blocks; '
        f'valid: {-count}..{count - 1}.'
    )
  return [names[i] for i in blocks]


def _split(
    tokens: jax.Array, num_prefix: int, image_shape: tuple[int, int]
) -> tuple[jax.Array, jax.Array]:
  """(batch, prefix + rows * cols, width) or a (batch, rows, cols, width) grid -> (prefix, grid)."""
  if tokens.ndim == 4:
    return tokens[:, :0, 0, :], tokens
  batch, count, width = tokens.shape
  patches = count - num_prefix
  height, image_width = image_shape
  rows = round(math.sqrt(patches * height / image_width))
  if rows < 1 or patches % rows:
    raise ValueError(
        f'{patches} patch tokens do not form a grid on a {height}x{image_width} ' 'image.'
    )
  grid = tokens[:, num_prefix:].reshape(batch, rows, patches // rows, width)
  return tokens[:, :num_prefix], grid


def extract(
    model: nn.Module, variables: Any, images: jax.Array, *, blocks: int | Sequence[int] | None = 1
) -> Features:
  """The features of `model` on NHWC `images`: `blocks` (timm's `indices`; default the last
  block), the final normalised tokens and the pre-logits, in inference mode."""
  variables = {k: v for k, v in dict(variables).items() if k in ('params', 'batch_stats')}
  _, state = model.apply(variables, images, train=False, mutable=[layers.FEATURES])
  sown = layouts.unstack_layers(flax.core.unfreeze(state[layers.FEATURES]))
  names = block_names(sown)
  num_prefix = len(getattr(model, 'prefix_tokens', ()))
  image_shape = (images.shape[1], images.shape[2])
  prefix, grid = {}, {}
  for name in _chosen(names, blocks):
    prefix[name], grid[name] = _split(sown[name]['tokens'][0], num_prefix, image_shape)
  # CaiT's class token joins only after its blocks: the final tokens' prefix is what the last
  # block lacks.
  encoded = sown[ENCODED][0]
  last = sown[names[-1]]['tokens'][0]
  patches = math.prod(last.shape[1:3]) if last.ndim == 4 else last.shape[1] - num_prefix
  encoded_prefix = 0 if encoded.ndim == 4 else encoded.shape[1] - patches
  prefix[ENCODED], grid[ENCODED] = _split(encoded, encoded_prefix, image_shape)
  head_inputs = tuple(sown['head_input'])
  return Features(
      pre_logits=jnp.mean(jnp.stack(head_inputs), axis=0),
      prefix_tokens=prefix,
      patch_grid=grid,
      head_inputs=head_inputs,
  )
