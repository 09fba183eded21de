"""DeiT III (Touvron et al. 2022, "DeiT III: Revenge of the ViT"): ViT with LayerScale.

The official deit `models_v2.py` (`vit_models` with `Layer_scale_init_Block`, the
`deit_*_patch16_LS` models): LayerScale on both residual branches from 1e-4 (`init_scale`), the
same drop-path rate in every block (`dpr_constant=True`), the position embedding added to the
patch tokens only and the class token prepended after it (timm's `no_embed_class=True`), qkv
bias, LayerNorm eps 1e-6, the head on the class token, timm/DeiT init. Its recipe (3-Augment,
binary cross-entropy, LAMB) is configs/deit3.py's.

Checkpoints load in the official layout (`blocks.i.gamma_1`, `gamma_2`, our names) and in timm's
(`blocks.i.ls1.gamma`, `ls2.gamma`; timm's `deit3_*` models); `to_timm` writes timm's.
"""

import functools
import re

import flax.linen as nn
import jax
import numpy as np

from vit_jax import models
from vit_jax.models import vit


class DeiT3(vit.VisionTransformer):
  """DeiT III's ViT: LayerScale 1e-4, constant drop path, position embedding on patches only."""

  init_scheme: str = 'timm'
  layer_scale_init: float | str | None = 1e-4

  @property
  def embedded_prefix_tokens(self) -> tuple[str, ...]:
    """None: the class token is prepended after the position embedding."""
    return ()

  def drop_path_rates(self) -> np.ndarray:
    """`drop_path_rate` in every block (models_v2.py `dpr_constant`)."""
    return np.full(self.depth, self.drop_path_rate)

  def embed(self, images: jax.Array, *, train: bool) -> tuple[jax.Array, tuple[int, int]]:
    """Patch tokens plus `pos_embed` (1, patches, width), then the prefix tokens prepended."""
    x = self.patch_tokens(images, train=train)
    batch, rows, cols, width = x.shape
    x = x.reshape(batch, -1, width)
    x = x + self.checked_position_embedding((x.shape[1], width), images.shape[1:3]).astype(x.dtype)
    x = self.with_prefix_tokens(x)
    return nn.Dropout(rate=self.dropout_rate, deterministic=not train)(x), (rows, cols)


_TIMM_LAYER_SCALE = re.compile(r'(blocks\.\d+)\.ls([12])\.gamma')
_GAMMA = re.compile(r'(blocks\.\d+)\.gamma_([12])')


def from_timm(state_dict: models.StateDict) -> dict[str, dict]:
  """Official deit (`gamma_1`) or timm (`ls1.gamma`) DeiT III state dict -> Flax variables."""
  renamed = {_TIMM_LAYER_SCALE.sub(r'\1.gamma_\2', key): value for key, value in state_dict.items()}
  gammas = {
      found.groups(): value for key, value in renamed.items() if (found := _GAMMA.fullmatch(key))
  }
  others = {key: value for key, value in renamed.items() if not _GAMMA.fullmatch(key)}
  variables = vit.from_timm(others)
  for (block, index), value in gammas.items():
    variables['params'][block.replace('.', '_')][f'gamma_{index}'] = np.asarray(value)
  return variables


def to_timm(variables: models.Variables) -> dict[str, np.ndarray]:
  """Flax variables -> timm's DeiT III state dict (`blocks.i.ls1.gamma`)."""
  return {_GAMMA.sub(r'\1.ls\2.gamma', key): value for key, value in vit.to_timm(variables).items()}


# (depth, hidden_size, num_heads): models_v2.py's sizes (ViT-M is DeiT III's own); MLP 4x wide.
SIZES = {**vit.SIZES, 'm': (12, 512, 8)}


def _deit3(size: str, patch_size: int) -> functools.partial:
  depth, hidden_size, num_heads = SIZES[size]
  return functools.partial(
      DeiT3, patch_size=patch_size, hidden_size=hidden_size, depth=depth, num_heads=num_heads
  )


# deit_{small,medium,base,large}_patch16_LS and deit_huge_patch14_LS; any input size.
MODELS = {
    **{f'deit3_{size}16': _deit3(size, 16) for size in ('s', 'm', 'b', 'l')},
    'deit3_h14': _deit3('h', 14),
}
TIMM_ARCHITECTURES = {
    **{
        f'deit3_{timm_size}_patch16_{resolution}': f'deit3_{size}16'
        for size, timm_size, resolutions in (
            ('s', 'small', (224, 384)),
            ('m', 'medium', (224,)),
            ('b', 'base', (224, 384)),
            ('l', 'large', (224, 384)),
        )
        for resolution in resolutions
    },
    'deit3_huge_patch14_224': 'deit3_h14',
}
FAMILY = models.Family(
    'deit3', DeiT3, MODELS, from_timm, to_timm, TIMM_ARCHITECTURES, vit.TIMM_ARGUMENTS
)
