r"""DeiT (Touvron et al., ICML 2021): ViT trained data-efficiently, with a distillation token.

Default — a small distilled DeiT on the embedded digits dataset (both heads learn the labels
when no teacher is given):

  python -m vit_jax.main --config=configs/deit.py --workdir=/tmp/deit

Hard distillation from any model trained by vit_jax.main (DeiT's recipe uses a RegNetY-16GF;
here, for example, the default ViT of configs/vit.py):

  python -m vit_jax.main --config=configs/vit.py --workdir=/tmp/teacher
  python -m vit_jax.main --config=configs/deit.py:teacher=/tmp/teacher --workdir=/tmp/deit_kd

ImageNet with the full DeiT recipe (configs/common.py `use_imagenet`, SPEC §7: AdamW lr 5e-4 ×
batch/512 at batch 1024, wd 0.05, 300 epochs, 5 warm-up, cosine to 1e-5; RandAugment, random
erasing 0.25, repeated augmentation ×3, mixup 0.8 / CutMix 1.0, label smoothing 0.1, drop path
0.1, EMA 0.99996, bfloat16); `distilled=false` for the plain model, `teacher=WORKDIR` for hard
distillation (DeiT's teacher is a RegNetY-16GF; here any model trained by vit_jax.main):

  python -m vit_jax.main --config=configs/deit.py:variant=S,dataset=imagenet2012 \
      --config.data_dir=gs://BUCKET/tfds --workdir=gs://BUCKET/deit_s

Published top-1 (ImageNet, 300 epochs; no distillation / hard distillation ⚗):
DeiT-Ti 72.2 / 74.5, DeiT-S 79.9 / 81.2, DeiT-B 81.8 / 83.4; DeiT-B↑384 82.9 / 85.2.
"""

import ml_collections

from configs import common

VARIANTS = {'Ti': 'ti', 'S': 's', 'B': 'b'}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """DeiT on digits by default; `variant=Ti|S|B`, `distilled=`, `teacher=WORKDIR`, `dataset=`."""
  args = common.parse_arg(arg, variant='', distilled=True, teacher='', distillation='hard',
                          dataset='digits', image_size=224)
  config = common.get_config()
  config.dataset = args.dataset
  suffix = '_distilled' if args.distilled else ''
  if args.variant:
    if args.variant not in VARIANTS:
      raise ValueError(f'Unknown DeiT variant {args.variant!r}; valid: {list(VARIANTS)}.')
    common.use_imagenet(config, args.image_size)
    config.model.name = f'deit_{VARIANTS[args.variant]}16{suffix}'
    config.model.drop_path_rate = 0.1
  else:
    common.quick_run(config)
    common.quick_model(config.model, f'deit_ti16{suffix}')
  if args.teacher:
    config.distillation.type = args.distillation
    config.distillation.teacher_workdir = args.teacher
  return config
