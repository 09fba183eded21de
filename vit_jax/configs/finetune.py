r"""Fine-tuning published weights on a dataset of your own, with layer-wise lr decay.

The weights name everything a user would otherwise pick by hand: Hub weights (`hf-hub:ORG/NAME`,
fetched once into the Hugging Face cache, `vit_jax.weights.hub`) give the model and its fields, the input
size, the normalisation and the evaluation crop ratio from their config.json. The head is
initialised afresh for the dataset's classes. DeiT-S (ImageNet-1k) fine-tuned on CIFAR-10, and on
a folder of images (one sub-folder per class, `train/` and `test/` inside):

  python -m vit_jax.main \
      --config='configs/finetune.py:init_from=hf-hub:timm/deit_small_patch16_224.fb_in1k,dataset=cifar10' \
      --workdir=/tmp/deit_s_cifar10
  python -m vit_jax.main \
      --config='configs/finetune.py:init_from=hf-hub:timm/deit_small_patch16_224.fb_in1k,dataset=folder:/data/flowers' \
      --workdir=/tmp/deit_s_flowers

Other weights work the same way (`hf-hub:timm/cait_xxs24_224.fb_dist_in1k`,
`hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k`, ...), headless ones too (DINO, MAE,
in21k backbones: `hf-hub:timm/vit_base_patch16_224.dino`); a weights file or a run's work
directory needs `model=` (and the ImageNet preprocessing, 224 px, crop 0.875, is assumed).
Only the config.json is read here; the weights are fetched when training starts.

The evaluation crop is the weights' (timm's `crop_pct`: 0.9 for the DeiT and DeiT III 224 tags);
the papers' is one flag away: `--config.eval_crop_ratio=0.875` (DeiT) or `=1.0` (DeiT III).

The recipe is MAE's end-to-end fine-tuning (He et al. 2022, Table 9; BEiT Section 2.5's layer-wise
decay): AdamW (0.9, 0.999), lr 5e-4 × batch / 256 at batch 512, weight decay 0.05, layer-wise lr
decay 0.65 (`layer_decay=`; 0.75 for large models), 5 warm-up epochs then cosine, drop path 0.1,
RandAugment rand-m9-mstd0.5-inc1, random erasing 0.25, mixup 0.8 / CutMix 1.0, label smoothing
0.1, `epochs=` 100, bfloat16. Any field can still be set with `--config.FIELD=VALUE`
(`--config.image_size=384` fine-tunes at 384, the position embedding resized).
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.weights import hub


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """`init_from=` weights (hf-hub:ORG/NAME, or a file / work directory with `model=`) fine-tuned
  on `dataset=`; `layer_decay=`, `epochs=`, `image_size=` (default: the weights')."""
  args = common.parse_arg(
      arg, init_from='', model='', dataset='', layer_decay=0.65, epochs=100.0, image_size=0
  )
  if not args.init_from or not args.dataset:
    raise ValueError(
        'configs/finetune.py needs init_from= (hf-hub:ORG/NAME, e.g. '
        'hf-hub:timm/deit_small_patch16_224.fb_in1k) and dataset= (a TFDS name or '
        "folder:/path), e.g. --config='configs/finetune.py:init_from=hf-hub:timm/"
        "deit_small_patch16_224.fb_in1k,dataset=cifar10'."
    )
  if hub.is_hub_name(args.init_from):
    weights = hub.describe(args.init_from)  # The weights are fetched when training starts.
    image_size, crop_ratio = weights.image_size, weights.crop_ratio
    normalization, model_name = weights.normalization, args.model or weights.model
    fields = weights.model_fields if model_name == weights.model else {}
  elif args.model:
    image_size, crop_ratio, normalization = 224, 0.875, 'imagenet'
    model_name, fields = args.model, {}
  else:
    raise ValueError(
        f'init_from={args.init_from!r} is not a Hub name (hf-hub:ORG/NAME): give its '
        'model= too (a registry name, e.g. deit_s16).'
    )
  config = common.get_config()
  common.use_imagenet(config, args.image_size or image_size)
  config.normalization = normalization
  if args.image_size in (0, image_size):
    config.eval_crop_ratio = crop_ratio
  config.model.name = model_name
  for field, value in fields.items():
    config.model[field] = value
  config.dataset = args.dataset
  config.init_from = args.init_from
  config.layer_decay = args.layer_decay
  config.num_epochs = args.epochs
  config.warmup_epochs = min(5.0, args.epochs)
  config.batch_size = 512
  config.base_lr = 5e-4
  config.lr_scaling_batch = 256
  config.min_lr = 1e-6
  config.warmup_lr = 0.0
  config.repeated_aug = 1
  config.ema_decay = 0.0
  config.model.drop_path_rate = 0.1
  config.eval_every = 1000
  return config
