"""DeiT (Touvron et al.): ViT with timm/DeiT init, optionally with a distillation token.

The distilled model reads [cls, dist, patches] + pos_embed (1, N + 2, D) and has two heads,
`head` on the class token and `head_dist` on the distillation token. With train=True it returns
(cls_logits, dist_logits); at inference it returns (cls_logits + dist_logits) / 2 (the official
code and timm, inference_mode='average_logits'), or with inference_mode='sum_softmax' the paper's
sum of the two softmax outputs, as log of their mean so that it stays a valid logit vector.
"""

import functools
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import vit

INFERENCE_MODES = ('average_logits', 'sum_softmax')


class DeiT(vit.VisionTransformer):
  """DeiT: `VisionTransformer` with the timm/DeiT init and an optional distillation token."""
  init_scheme: str = 'timm'
  distilled: bool = False
  inference_mode: str = 'average_logits'

  @property
  def prefix_tokens(self) -> tuple[str, ...]:
    return ('cls_token', 'dist_token') if self.distilled else ('cls_token',)

  def check_fields(self) -> None:
    super().check_fields()
    if self.inference_mode not in INFERENCE_MODES:
      raise ValueError(f'inference_mode={self.inference_mode!r} is not valid; '
                       f'choose from {list(INFERENCE_MODES)}.')
    if self.distilled and self.representation_size is not None:
      raise ValueError(f'representation_size={self.representation_size} is not supported with '
                       'distilled=True; use representation_size=None.')

  @nn.compact
  def __call__(self, images: jax.Array, *,
               train: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
    self.check_fields()
    x = self.encode(self.embed(images, train=train), train=train)
    vit.sow_feature(self, 'encoded', x)
    cls_logits = self.classify(x[:, 0], 'head')
    if not self.distilled:
      return cls_logits
    dist_logits = self.classify(x[:, 1], 'head_dist')
    if train:
      return cls_logits, dist_logits
    if self.inference_mode == 'average_logits':
      return (cls_logits + dist_logits) / 2
    probs = (jax.nn.softmax(cls_logits) + jax.nn.softmax(dist_logits)) / 2
    return jnp.log(probs)


def from_timm(state_dict: Mapping[str, Any]) -> dict[str, dict]:
  """timm/deit `VisionTransformer(Distilled)` state dict -> Flax variables {'params': ...}."""
  return vit.from_timm(state_dict)


def to_timm(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Flax variables -> timm/deit state dict (inverse of `from_timm`)."""
  return vit.to_timm(variables)


def _deit(size: str, distilled: bool) -> functools.partial:
  depth, hidden_size, num_heads, mlp_dim = vit.SIZES[size]
  return functools.partial(DeiT, patch_size=16, hidden_size=hidden_size, depth=depth,
                           num_heads=num_heads, mlp_dim=mlp_dim, distilled=distilled)


# The 384 fine-tuned models share these modules; the position embedding follows the input size.
MODELS = {
    **{f'deit_{size}16': _deit(size, False) for size in ('ti', 's', 'b')},
    **{f'deit_{size}16_distilled': _deit(size, True) for size in ('ti', 's', 'b')},
}
