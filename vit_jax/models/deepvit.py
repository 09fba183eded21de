"""DeepViT (Zhou et al., "DeepViT: Towards Deeper Vision Transformer"): Re-attention.

Re-attention mixes the softmax maps of the heads with a learned H x H matrix Theta followed by a
norm over heads (BatchNorm in the official code, `re_attention_norm='batch'`; the LayerNorm form
of lucidrains/vit-pytorch with `'layer'`), in the last `re_attention_blocks` blocks (all blocks
when None, none for the ViT baselines). Every block applies the official `scale_adjustment` s:
x + Attn(LN(s x)) / s, then x + MLP(LN(s x)) / s. DeepViT-S/L replace the patch embedding by the
CNN stem (`stem='cnn'`: conv7x7/2 + BN + ReLU, conv3x3 + BN + ReLU and a (patch/2)-strided conv).
`DeepViT` is a preset of the shared backbone's parts (`vit.VisionTransformer`).
"""

import functools
import re
from typing import Any

import numpy as np

from vit_jax import models
from vit_jax.models import layouts
from vit_jax.models import vit


class DeepViT(vit.VisionTransformer):
  """DeepViT: ViT whose last `re_attention_blocks` blocks use Re-attention (all when None).

  The MLP is 3 times the width by default; `transform_scale` multiplies the re-attended map by
  hd^-1/2.
  """

  num_classes: int = 1000
  hidden_size: int = 384
  depth: int = 16
  num_heads: int = 12
  init_scheme: str = 'timm'
  attention: str = 're_attention'
  re_attention_blocks: int | None = None
  transform_scale: bool = False
  scale_adjustment: float = 1.0

  default_mlp_ratio = 3.0

  def check_fields(self) -> None:
    super().check_fields()
    if self.re_attention_blocks is not None and not 0 <= self.re_attention_blocks <= self.depth:
      raise ValueError(
          f're_attention_blocks={self.re_attention_blocks} must be None (all) or '
          f'in [0, depth={self.depth}].'
      )
    if self.scale_adjustment <= 0:
      raise ValueError(f'scale_adjustment={self.scale_adjustment} must be > 0.')

  @property
  def first_re_attention_block(self) -> int:
    """Index of the first block with Re-attention (`depth` when there is none)."""
    if self.re_attention_blocks is None:
      return 0
    return self.depth - self.re_attention_blocks

  def block_attention(self, index: int) -> str:
    """`attention` in the last `re_attention_blocks` blocks, standard attention before them."""
    return self.attention if index >= self.first_re_attention_block else 'standard'

  def attention_module(self, kind: str, grid: tuple[int, int]) -> models.ModuleDef:
    """The shared attention, with the official `transform_scale` for Re-attention."""
    attention = super().attention_module(kind, grid)
    if kind == 're_attention':
      return functools.partial(attention, re_attention_scale=self.transform_scale)
    return attention

  def block_fields(self) -> dict[str, Any]:
    """The shared block fields and the official scale adjustment."""
    return {**super().block_fields(), 'scale_adjustment': self.scale_adjustment}


# zhoudaquan/dvit_repo keys (models/deep_vision_transformer.py): the ViT layout, the CNN stem, and
# per Re-attention block the 1x1 conv `reatten_matrix` (H, H, 1, 1) and BatchNorm2d `var_norm`
# over heads.
_DVIT_REPO_KEY = re.compile(
    r'cls_token|pos_embed|(norm|head|patch_embed\.proj)\.(weight|bias)'
    r'|patch_embed\.(conv[12]\.weight|bn[12]\.(weight|bias|running_mean|running_var'
    r'|num_batches_tracked))'
    r'|blocks\.\d+\.((norm[12]|attn\.(qkv|proj|reatten_matrix)|mlp\.fc[12])\.(weight|bias)'
    r'|attn\.var_norm\.(weight|bias|running_mean|running_var|num_batches_tracked))'
)
_THETA = '.attn.reatten_matrix.weight'


def from_dvit_repo(state_dict: models.StateDict) -> dict[str, dict]:
  """Official DeepViT state dict (zhoudaquan/dvit_repo) -> Flax variables {'params', 'batch_stats'}.

  Theta (H, H, 1, 1) becomes the Dense kernel over heads W[:, :, 0, 0]^T; BatchNorm running
  statistics go to `batch_stats`.
  """
  layouts.checked_keys(state_dict, _DVIT_REPO_KEY, 'DeepViT of zhoudaquan/dvit_repo')
  return layouts.variables_from_torch(
      {
          key: np.asarray(value)[:, :, 0, 0] if key.endswith(_THETA) else value
          for key, value in state_dict.items()
      }
  )


def to_dvit_repo(variables: models.Variables) -> dict[str, np.ndarray]:
  """Flax variables -> official DeepViT state dict, loadable with `strict=True`.

  Only the official BatchNorm form of Re-attention has a released layout.
  """
  state_dict = layouts.variables_to_torch(variables)
  lucidrains = [key for key in state_dict if '.reattn_' in key]
  if lucidrains:
    raise ValueError(
        f"{lucidrains[0]} belongs to re_attention_norm='layer', which has no "
        "official checkpoint layout; only re_attention_norm='batch' converts."
    )
  for key in list(state_dict):
    if key.endswith(_THETA):
      state_dict[key] = state_dict[key][:, :, None, None]
    elif key.endswith('.running_mean'):
      state_dict[key.replace('running_mean', 'num_batches_tracked')] = np.array(0, np.int64)
  return state_dict


def _deepvit(depth: int, hidden_size: int = 384, **fields) -> functools.partial:
  return functools.partial(DeepViT, depth=depth, hidden_size=hidden_size, **fields)


# Official configurations (dvit_repo deep_vision_transformer.py): 12 heads, MLP 3x, qkv bias.
# `deepvit_vit_*` are the matching ViT baselines (same blocks, no Re-attention).
# `deepvit_ti4`/`deepvit_vit_ti4` are for 32x32 inputs: width 192, 12 blocks, 12 heads, patch 4.
MODELS = {
    **{f'deepvit_{d}b': _deepvit(d) for d in (16, 24, 32)},
    **{f'deepvit_vit_{d}b': _deepvit(d, re_attention_blocks=0) for d in (16, 24, 32)},
    'deepvit_s': _deepvit(
        16, 396, re_attention_blocks=5, transform_scale=True, scale_adjustment=0.5, stem='cnn'
    ),
    'deepvit_l': _deepvit(32, 420, re_attention_blocks=12, scale_adjustment=0.5, stem='cnn'),
    'deepvit_ti4': _deepvit(12, 192, patch_size=4),
    'deepvit_vit_ti4': _deepvit(12, 192, patch_size=4, re_attention_blocks=0),
}
FAMILY = models.Family('deepvit', DeepViT, MODELS, from_dvit_repo, to_dvit_repo)
