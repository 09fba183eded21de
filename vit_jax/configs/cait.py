r"""CaiT (Touvron et al., ICCV 2021): LayerScale, talking-heads attention, class attention.

Default — a small CaiT (4 self-attention + 2 class-attention blocks) on the embedded digits:

  python -m vit_jax.main --config=configs/cait.py --workdir=/tmp/cait

  Measured: test accuracy 0.969–0.983 over seeds 0, 1 and 2 (--config.seed), after its 650
  steps of 128, in 101 s on 2 CPU cores, from a fresh clone.

The published sizes on ImageNet at their released resolutions: the DeiT recipe of
configs/common.py for 400 epochs, crop ratio 1.0 at evaluation; add
`teacher=regnety_160:/path/regnety_160-a5fe301d.pth` for hard distillation from the RegNetY-16GF
as the paper does (or `teacher=WORKDIR`, any model trained by vit_jax.main). The paper tunes drop
path per model (0.05 to 0.4); 0.1 here:

  python -m vit_jax.main --config=configs/cait.py:variant=XXS24,dataset=imagenet2012 \
      --config.data_dir=gs://BUCKET/tfds --workdir=gs://BUCKET/cait_xxs24

Published top-1 (ImageNet, distilled; CaiT paper, Table 5): XXS24 78.4 (224) / 81.0 (384),
XXS36 79.75 / 82.2, XS24-384 84.1, S24 83.5 (224) / 85.1 (384), S36-384 85.4, M36-384 86.1,
M48-448 86.5.
"""

import ml_collections

from vit_jax.configs import common

FAMILY = 'cait'

# Variant -> (registry name, released resolution).
VARIANTS = {
    'XXS24': ('cait_xxs24', 224),
    'XXS36': ('cait_xxs36', 224),
    'XS24': ('cait_xs24', 384),
    'S24': ('cait_s24', 224),
    'S36': ('cait_s36', 384),
    'M36': ('cait_m36', 384),
    'M48': ('cait_m48', 448),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """CaiT on digits by default; `variant=XXS24|…|M48`, `image_size=`, `teacher=`, `dataset=`."""
  args = common.parse_arg(arg, variant='', dataset='digits', image_size=0, teacher='')
  config = common.get_config()
  config.dataset = common.dataset(arg, args)
  if args.variant:
    if args.variant not in VARIANTS:
      raise ValueError(f'Unknown CaiT variant {args.variant!r}; valid: {list(VARIANTS)}.')
    name, resolution = VARIANTS[args.variant]
    common.use_imagenet(config, args.image_size or resolution)
    config.eval_crop_ratio = 1.0  # CaiT evaluates with crop ratio 1.0, bicubic.
    config.num_epochs = 400
    config.model.name = name
    config.model.drop_path_rate = 0.1
  else:
    common.quick_run(config, VARIANTS)
    common.quick_model(config.model, 'cait_ti4')
    config.model.layer_scale_init = 0.1
    config.batch_size = 128  # Fewer, larger steps than the ViT's quick default.
    config.total_steps = 650
    config.warmup_steps = 65
    config.eval_every = config.checkpoint_every = 325
  if args.teacher:
    config.distillation.type = 'hard'
    config.distillation.teacher = args.teacher
  return config
