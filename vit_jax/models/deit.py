"""DeiT (Touvron et al.): ViT with timm/DeiT init, optionally with a distillation token.

The distilled model reads [cls, dist, patches] + pos_embed (1, N + 2, D) and has two heads,
`head` on the class token and `head_dist` on the distillation token. With train=True it returns
(cls_logits, dist_logits); at inference it returns (cls_logits + dist_logits) / 2 (the official
code and timm, inference_mode='average_logits'), or with inference_mode='sum_softmax' the paper's
sum of the two softmax outputs, as log of their mean so that it stays a valid logit vector.
The distillation token is a part of the shared backbone (`vit.VisionTransformer.distilled`);
DeiT's checkpoints are in timm's ViT layout, so the family converts with `vit.from_timm`.
"""

import functools

from vit_jax import models
from vit_jax.models import vit


class DeiT(vit.VisionTransformer):
  """DeiT: `VisionTransformer` with the timm/DeiT init (and `distilled` for the ⚗ models)."""

  init_scheme: str = 'timm'


def _deit(size: str, distilled: bool) -> functools.partial:
  depth, hidden_size, num_heads = vit.SIZES[size]
  return functools.partial(
      DeiT,
      patch_size=16,
      hidden_size=hidden_size,
      depth=depth,
      num_heads=num_heads,
      distilled=distilled,
  )


# The 384 fine-tuned models share these modules; the position embedding follows the input size.
MODELS = {
    **{f'deit_{size}16': _deit(size, False) for size in ('ti', 's', 'b')},
    **{f'deit_{size}16_distilled': _deit(size, True) for size in ('ti', 's', 'b')},
}
TIMM_ARCHITECTURES = {
    **{
        f'deit_{timm_size}{kind}_patch16_224': f'deit_{size}16{suffix}'
        for size, timm_size in (('ti', 'tiny'), ('s', 'small'), ('b', 'base'))
        for kind, suffix in (('', ''), ('_distilled', '_distilled'))
    },
    'deit_base_patch16_384': 'deit_b16',
    'deit_base_distilled_patch16_384': 'deit_b16_distilled',
}
FAMILY = models.Family(
    'deit', DeiT, MODELS, vit.from_timm, vit.to_timm, TIMM_ARCHITECTURES, vit.TIMM_ARGUMENTS
)
