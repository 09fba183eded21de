"""CaiT (Touvron et al., "Going deeper with Image Transformers"): LayerScale and class attention.

Patches + position embedding (no class slot) go through `depth` LayerScale blocks with
talking-heads attention and the same drop-path rate in every block; then the class token alone is
updated by `class_attention_depth` class-attention blocks (queries from the class token, keys and
values from [class; patches], patches frozen, no drop-path); the head reads LN([cls; x])[:, 0].

LayerScale starts at the official per-variant value (`layer_scale_init`); `layer_scale_init='paper'`
uses the paper's depth rule instead (`layers.paper_layer_scale_init`: 0.1 up to depth 18, 1e-5
up to 24, 1e-6 deeper). Every part is a field of the shared backbone (`vit.VisionTransformer`):
`CaiT` is its preset with talking heads, LayerScale and the class-attention stage.
"""

import functools
import re

import numpy as np

from vit_jax import models
from vit_jax.models import layouts
from vit_jax.models import vit


class CaiT(vit.VisionTransformer):
  """CaiT: LayerScale talking-heads blocks, then class-attention blocks on the class token.

  A preset of the shared backbone's parts (`vit.VisionTransformer`). `dropout_rate` acts after
  the position embedding, the attention projection and inside the MLP of the self-attention
  stage (timm 0.3.2's single rate); the class stage has no dropout. Every self-attention block
  has the same drop-path rate (deit's cait_models.py).
  """

  num_classes: int = 1000
  hidden_size: int = 192
  depth: int = 24
  num_heads: int = 4
  init_scheme: str = 'timm'
  attention: str = 'talking_heads'
  class_stage: str = 'class_attention'
  layer_scale_init: float | str | None = 1e-5

  def drop_path_rates(self) -> np.ndarray:
    """CaiT's schedule: `drop_path_rate` in every self-attention block."""
    return np.full(self.depth, self.drop_path_rate)


# timm/deit CaiT keys (facebookresearch/deit cait_models.py); the talking-heads `proj_l`/`proj_w`
# (H, H) are Linears over heads.
_TIMM_KEY = re.compile(
    r'cls_token|pos_embed|(patch_embed\.proj|norm|head)\.(weight|bias)'
    r'|blocks\.\d+\.(gamma_[12]|(norm[12]|attn\.(qkv|proj|proj_l|proj_w)|mlp\.fc[12])'
    r'\.(weight|bias))'
    r'|blocks_token_only\.\d+\.(gamma_[12]|(norm[12]|attn\.[qkv]|attn\.proj|mlp\.fc[12])'
    r'\.(weight|bias))'
)


def from_timm(state_dict: models.StateDict) -> dict[str, dict]:
  """timm/deit `Cait` state dict (without the `module.` prefix) -> Flax variables {'params'}."""
  return layouts.variables_from_torch(
      layouts.checked_keys(state_dict, _TIMM_KEY, 'CaiT of timm/deit (cait_models.py)')
  )


def to_timm(variables: models.Variables) -> dict[str, np.ndarray]:
  """Flax variables -> timm/deit `Cait` state dict (inverse of `from_timm`)."""
  return layouts.variables_to_torch(variables)


def _cait(
    hidden_size: int, depth: int, num_heads: int, layer_scale_init: float, patch_size: int = 16
) -> functools.partial:
  return functools.partial(
      CaiT,
      patch_size=patch_size,
      hidden_size=hidden_size,
      depth=depth,
      num_heads=num_heads,
      layer_scale_init=layer_scale_init,
  )


# Official sizes and LayerScale inits (deit/cait_models.py); the image size is set by the input
# at init (224, 384 or 448 for the released weights). `cait_ti4` is for 32x32 inputs: XXS width,
# 12 self-attention blocks with patch 4 (64 tokens), LayerScale 0.1 (the paper's rule, depth 12).
MODELS = {
    'cait_xxs24': _cait(192, 24, 4, 1e-5),
    'cait_xxs36': _cait(192, 36, 4, 1e-5),
    'cait_xs24': _cait(288, 24, 6, 1e-5),
    'cait_s24': _cait(384, 24, 8, 1e-5),
    'cait_s36': _cait(384, 36, 8, 1e-6),
    'cait_m36': _cait(768, 36, 16, 1e-6),
    'cait_m48': _cait(768, 48, 16, 1e-6),
    'cait_ti4': _cait(192, 12, 4, 0.1, patch_size=4),
}
TIMM_ARCHITECTURES = {
    f'{name}_{resolution}': name
    for name, resolutions in (
        ('cait_xxs24', (224, 384)),
        ('cait_xxs36', (224, 384)),
        ('cait_xs24', (384,)),
        ('cait_s24', (224, 384)),
        ('cait_s36', (384,)),
        ('cait_m36', (384,)),
        ('cait_m48', (448,)),
    )
    for resolution in resolutions
}
FAMILY = models.Family(
    'cait', CaiT, MODELS, from_timm, to_timm, TIMM_ARCHITECTURES, vit.TIMM_ARGUMENTS
)
