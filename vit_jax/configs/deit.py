r"""DeiT (Touvron et al., ICML 2021): ViT trained data-efficiently, with a distillation token.

Default — a small distilled DeiT on the embedded digits dataset (both heads learn the labels
when no teacher is given):

  python -m vit_jax.main --config=configs/deit.py --workdir=/tmp/deit

  Measured: test accuracy 0.972–0.981 over seeds 0, 1 and 2 (--config.seed), after its 1,000
  steps of 64, in 101 s on 2 CPU cores, from a fresh clone.

Hard distillation (DeiT's "⚗" models) from a CNN teacher trained first on the digits
(configs/regnet.py, a small RegNetY) or from any other run of vit_jax.main:

  python -m vit_jax.main --config=configs/regnet.py --workdir=/tmp/regnet
  python -m vit_jax.main --config=configs/deit.py:teacher=/tmp/regnet --workdir=/tmp/deit_kd

ImageNet with the full DeiT recipe (configs/common.py `use_imagenet`: AdamW lr 5e-4 × batch/512
at batch 1024, wd 0.05, 300 epochs, 5 warm-up, cosine to 1e-5; RandAugment, random erasing 0.25,
repeated augmentation ×3, mixup 0.8 / CutMix 1.0, label smoothing 0.1, drop path 0.1, EMA
0.99996, bfloat16); `distilled=false` for the plain model:

  python -m vit_jax.main --config=configs/deit.py:variant=S,dataset=imagenet2012 \
      --config.data_dir=gs://BUCKET/tfds --workdir=gs://BUCKET/deit_s

DeiT's distillation recipe (Touvron et al. 2021, Table 5; the official deit
`main.py --model deit_base_distilled_patch16_224 --teacher-model regnety_160 --teacher-path
https://dl.fbaipublicfiles.com/deit/regnety_160-a5fe301d.pth --distillation-type hard`, alpha
0.5, tau 1.0): the RegNetY-16GF teacher (82.9 top-1) given as MODEL:FILE, running in inference
mode on the student's augmented batch. It was trained on the same ImageNet normalisation as
DeiT, so `distillation.teacher_normalization` stays '' (the student's); a teacher trained with
another would be given it, and the step converts the batch for the teacher:

  python -m vit_jax.main --config=configs/deit.py:variant=B,dataset=imagenet2012,teacher=regnety_160:/path/regnety_160-a5fe301d.pth \
      --config.data_dir=gs://BUCKET/tfds --workdir=gs://BUCKET/deit_b_distilled

or the same teacher by its Hub name, fetched once into the Hugging Face cache (model and
normalisation from its config.json): `teacher=hf-hub:timm/regnety_160.deit_in1k`. A DeiT-S
fine-tuned from the published weights (on CIFAR-10 here) is configs/finetune.py's:

  python -m vit_jax.main \
      --config='configs/finetune.py:init_from=hf-hub:timm/deit_small_patch16_224.fb_in1k,dataset=cifar10' \
      --workdir=/tmp/deit_s_cifar10

Published top-1 (ImageNet, 300 epochs at 224; no distillation / hard distillation ⚗ from the
RegNetY-16GF): DeiT-Ti 72.2 / 74.5, DeiT-S 79.9 / 81.2, DeiT-B 81.8 / 83.4; DeiT-B↑384 82.9 /
85.2.
"""

import ml_collections

from vit_jax.configs import common

FAMILY = 'deit'

VARIANTS = {'Ti': 'ti', 'S': 's', 'B': 'b'}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """DeiT on digits by default; `variant=Ti|S|B`, `distilled=`, `dataset=`, and `teacher=` a
  work directory or MODEL:FILE (`distillation.teacher`)."""
  args = common.parse_arg(
      arg,
      variant='',
      distilled=True,
      teacher='',
      distillation='hard',
      dataset='digits',
      image_size=224,
  )
  config = common.get_config()
  config.dataset = common.dataset(arg, args)
  suffix = '_distilled' if args.distilled else ''
  if args.variant:
    if args.variant not in VARIANTS:
      raise ValueError(f'Unknown DeiT variant {args.variant!r}; valid: {list(VARIANTS)}.')
    common.use_imagenet(config, args.image_size)
    config.model.name = f'deit_{VARIANTS[args.variant]}16{suffix}'
    config.model.drop_path_rate = 0.1
  else:
    common.quick_run(config, VARIANTS)
    common.quick_model(config.model, f'deit_ti16{suffix}')
  if args.teacher:
    config.distillation.type = args.distillation
    config.distillation.teacher = args.teacher
  return config
