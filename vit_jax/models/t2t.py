"""T2T-ViT (Yuan et al., "Tokens-to-Token ViT"): soft splits and token transformers, then a ViT.

The Tokens-to-Token module re-structurises the image progressively: a soft split (overlapping
patches, `torch.nn.Unfold`'s (C, kh, kw) feature order) makes tokens, a one-head token transformer
reduces each to `token_dim` features, the tokens are laid back on their grid and split again; a
final soft split and a Linear (`project`) give the backbone tokens (`stems.TokensToToken`, the
shared backbone's `stem='t2t'`, so it also goes in front of any other family's blocks).

`parts.T2TSettings(tokens_type='performer')` is T2T-ViT-n (7, 10, 12, 14, 19, 24):
`Token_performer` with a frozen orthogonal random-feature kernel. `'transformer'` is T2T-ViT_t-n
(14, 19, 24): token attention with a V skip. Every published size is registered (`SIZES`, `MODELS`).

Fixed, untrained parameters live in `params` and are read through `stop_gradient`, so they reach
checkpoints and `to_timm` like the official `requires_grad=False` Parameters but get zero gradient:
`pos_embed` (the sinusoid table) and, per Performer, `random_features` (the official `w`).
`FIXED_PARAMS` names them; an optimizer that decays weights must exclude them.
"""

import functools
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.models import layouts
from vit_jax.schema import parts
from vit_jax.models import vit

FIXED_PARAMS = ('pos_embed', 'random_features')


def sinusoid_table(num_positions: int, width: int) -> np.ndarray:
  """The fixed Transformer position table: sin on even features, cos on odd, (1, N, width)."""
  positions = np.arange(num_positions, dtype=np.float64)[:, None]
  rates = np.power(10000.0, 2 * (np.arange(width) // 2) / width)
  angles = positions / rates
  angles[:, 0::2] = np.sin(angles[:, 0::2])
  angles[:, 1::2] = np.cos(angles[:, 1::2])
  return angles[None].astype(np.float32)


class T2TViT(vit.VisionTransformer):
  """T2T-ViT: Tokens-to-Token stem, [cls] + fixed sinusoid positions, pre-norm ViT blocks.

  A preset of the shared backbone's parts (`vit.VisionTransformer`, `stem='t2t'`). Backbone
  blocks have no qkv bias and LayerNorm eps 1e-5 (official `nn.LayerNorm`); the MLP is 3 times
  the width by default. `stem_settings` (`parts.T2TSettings`) names the token block and its width
  and lists (kernel, stride, padding) of each soft split.
  """

  num_classes: int = 1000
  hidden_size: int = 384
  depth: int = 14
  num_heads: int = 6
  qkv_bias: bool = False
  layer_norm_eps: float = 1e-5
  init_scheme: str = 'timm'
  stem: str = 't2t'

  default_mlp_ratio = 3.0

  def position_embedding(self, tokens: tuple[int, int]) -> jax.Array:
    """The fixed sinusoid table `pos_embed`, read through `stop_gradient`."""
    table = sinusoid_table(*tokens)
    pos_embed = self.param('pos_embed', lambda *_: jnp.asarray(table, self.param_dtype))
    return jax.lax.stop_gradient(pos_embed)


# Official T2T-ViT keys (models/t2t_vit.py): ViT backbone without qkv bias, Transformer-T2T
# `attention{i}.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}`, Performer-T2T
# `attention{i}.{kqv,proj,norm1,norm2,mlp.0,mlp.2,w}`, `project`, fixed `pos_embed`.
_T2T_REPO_KEY = re.compile(
    r'cls_token|pos_embed|(norm|head)\.(weight|bias)'
    r'|blocks\.\d+\.(norm[12]|attn\.(qkv|proj)|mlp\.fc[12])\.(weight|bias)'
    r'|tokens_to_token\.(project\.(weight|bias)|attention\d+\.(w|(norm[12]|attn\.(qkv|proj)'
    r'|mlp\.fc[12]|kqv|proj|mlp\.[02])\.(weight|bias)))'
)
_PERFORMER_FEATURES = re.compile(r'(tokens_to_token\.attention\d+)\.(w|random_features)$')


def from_t2t_repo(state_dict: models.StateDict) -> dict[str, dict]:
  """Official T2T-ViT state dict (`state_dict_ema`, no `module.` prefix) -> Flax variables."""
  layouts.checked_keys(
      state_dict, _T2T_REPO_KEY, 'official T2T-ViT (yitu-opensource/T2T-ViT, models/t2t_vit.py)'
  )
  return layouts.variables_from_torch(
      {
          _PERFORMER_FEATURES.sub(r'\1.random_features', key): value
          for key, value in state_dict.items()
      }
  )


def to_t2t_repo(variables: models.Variables) -> dict[str, np.ndarray]:
  """Flax variables -> official T2T-ViT state dict (inverse of `from_t2t_repo`)."""
  return {
      _PERFORMER_FEATURES.sub(r'\1.w', key): value
      for key, value in layouts.variables_to_torch(variables).items()
  }


# The published sizes for 224x224 inputs (official `models/t2t_vit.py`): (width, depth, heads,
# MLP ratio) of the backbone; all take token_dim 64 and soft splits (7, 4, 2), (3, 2, 1), (3, 2, 1).
# T2T-ViT-n uses the Performer T2T module, T2T-ViT_t-n the Transformer one. The released weights
# were trained and evaluated with the default qk scale, head_dim^-0.5 (their `pretrained=True`
# branch, which sets width^-0.5, loads timm-hosted weights that were never published).
SIZES = {
    '7': (256, 7, 4, 2),
    '10': (256, 10, 4, 2),
    '12': (256, 12, 4, 2),
    '14': (384, 14, 6, 3),
    '19': (448, 19, 7, 3),
    '24': (512, 24, 8, 3),
}
TRANSFORMER_T2T_SIZES = ('14', '19', '24')


def _t2t(size: str, tokens_type: str, **stem_settings: Any) -> functools.partial:
  width, depth, heads, mlp_ratio = SIZES[size]
  return functools.partial(
      T2TViT,
      stem_settings=parts.T2TSettings(tokens_type=tokens_type, **stem_settings),
      hidden_size=width,
      depth=depth,
      num_heads=heads,
      mlp_dim=int(mlp_ratio * width),
  )


# The `_ti4` pair is for 32x32 inputs: soft splits (7, 2, 3), (3, 2, 1), (3, 1, 1) take
# 32 -> 16 -> 8 -> 8 (64 tokens, stride 4) into the T2T-ViT-7 backbone.
_SPLITS_32 = ((7, 2, 3), (3, 2, 1), (3, 1, 1))
MODELS = {
    **{f't2t_vit_{size}': _t2t(size, 'performer') for size in SIZES},
    **{f't2t_vit_t_{size}': _t2t(size, 'transformer') for size in TRANSFORMER_T2T_SIZES},
    **{
        name: _t2t('7', tokens_type, soft_splits=_SPLITS_32)
        for name, tokens_type in (('t2t_vit_ti4', 'performer'), ('t2t_vit_t_ti4', 'transformer'))
    },
}
FAMILY = models.Family('t2t', T2TViT, MODELS, from_t2t_repo, to_t2t_repo)
