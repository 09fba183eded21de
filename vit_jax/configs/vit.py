r"""ViT (Dosovitskiy et al., ICLR 2021): the plain Vision Transformer.

Default — a small ViT on the embedded digits dataset (nothing to download):

  python -m vit_jax.main --config=configs/vit.py --workdir=/tmp/vit

  Measured: test accuracy 0.972–0.992 over seeds 0, 1 and 2 (--config.seed), after its 1,000
  steps of 64, in 99 s on 2 CPU cores, from a fresh clone.

Any published size on any TFDS dataset, e.g. ViT-S/4 from scratch on CIFAR-10 or ViT-B/16 on
ImageNet (data prepared in --config.data_dir beforehand):

  python -m vit_jax.main --config=configs/vit.py:variant=S/4,dataset=cifar10 --workdir=/tmp/vit_s4
  python -m vit_jax.main --config=configs/vit.py:variant=B/16,dataset=imagenet2012 \
      --config.data_dir=gs://BUCKET/tfds --workdir=gs://BUCKET/vit_b16

Published (ViT paper, ImageNet-1k only, 300 epochs): ViT-B/16 77.9, ViT-L/16 76.5 top-1 —
ImageNet-21k pre-training is what makes ViT shine; the DeiT recipe (configs/deit.py) reaches 81.8
with ViT-B/16 on ImageNet-1k alone. ViT-H/14 (632M parameters) is published only after JFT-300M
pre-training: 88.55 top-1 on ImageNet fine-tuned at 518 px (paper Table 2); fine-tune such weights
with --config.init_from=FILE.npz --config.image_size=518, or train it here from scratch:

  python -m vit_jax.main --config=configs/vit.py:variant=H/14,dataset=imagenet2012 \
      --config.data_dir=gs://BUCKET/tfds --config.model.scan_layers=true --workdir=gs://BUCKET/h14

Variants: Ti, S, B, L at /16 and /32, and H/14, for 224-pixel inputs; /4 for 32-pixel inputs.
"""

import ml_collections

from vit_jax.configs import common

FAMILY = 'vit'

VARIANTS = (
    'Ti/16',
    'S/16',
    'B/16',
    'L/16',
    'H/14',
    'Ti/32',
    'S/32',
    'B/32',
    'L/32',
    'Ti/4',
    'S/4',
    'B/4',
)


def model_name(variant: str) -> str:
  """'S/16' -> 'vit_s16', the registry name."""
  if variant not in VARIANTS:
    raise ValueError(f'Unknown ViT variant {variant!r}; valid: {", ".join(VARIANTS)}.')
  size, patch = variant.split('/')
  return f'vit_{size.lower()}{patch}'


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """ViT on digits by default; `variant=B/16,dataset=imagenet2012` for the published sizes."""
  args = common.parse_arg(arg, variant='', dataset='digits')
  config = common.get_config()
  config.dataset = common.dataset(arg, args)

  if not args.variant:  # The quick default: a 4-layer, 128-wide ViT, 16 patches of 4×4.
    common.quick_run(config, VARIANTS)
    common.quick_model(config.model, 'vit_ti4')
    return config

  config.model.name = model_name(args.variant)
  patch = int(args.variant.split('/')[1])
  if patch <= 8:  # CIFAR-sized: 32×32 inputs, pad-and-crop augmentation.
    config.image_size = 32
    config.normalization = 'cifar10' if args.dataset.startswith('cifar') else 'imagenet'
    config.num_epochs = 200
    config.warmup_epochs = 5
    config.batch_size = 256
  else:  # ImageNet-sized.
    config.image_size = 224
    config.augment = 'inception_crop'
    config.eval_crop_ratio = 0.875
    config.normalization = 'inception'
    config.num_epochs = 300
    config.warmup_epochs = 5
    config.batch_size = 1024
    config.base_lr = 3e-3
    config.weight_decay = 0.3
    config.grad_clip_norm = 1.0
  config.model.drop_path_rate = 0.1
  config.label_smoothing = 0.1
  config.log_every = 100
  config.eval_every = 2000
  config.checkpoint_every = 2000
  return config
