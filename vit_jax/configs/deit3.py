r"""DeiT III (Touvron et al. 2022, "DeiT III: Revenge of the ViT"): ViT with LayerScale, trained
with 3-Augment, binary cross-entropy and LAMB.

Default — a small DeiT III (4 blocks, 128 wide, LayerScale 1e-4) on the embedded digits with the
recipe's pieces: 3-Augment (grayscale, solarization or Gaussian blur), colour jitter 0.3, the
simple random crop (reflect padding), binary cross-entropy and LAMB at lr 1e-2, no drop path,
1,600 steps of 64:

  python -m vit_jax.main --config=configs/deit3.py --workdir=/tmp/deit3

  Measured: test accuracy 0.958–0.969 over seeds 0, 1 and 2 (--config.seed), after its 1,600
  steps of 64, in 157 s on 2 CPU cores, from a fresh clone.

ImageNet-1k pre-training (`variant=S|B|L|H`), as deit/README_revenge.md's commands (per-GPU
batch × GPUs; `--unscale-lr`, so lr does not scale with the batch): LAMB at lr 4e-3 (S) or 3e-3
(B, L, H), batch 2048, weight decay 0.05, 800 epochs (`epochs=400` for the paper's shorter
schedule), 5 warm-up epochs from 1e-6, cosine to 1e-5; inception crop + flip, 3-Augment, colour
jitter 0.3, no RandAugment and no random erasing, repeated augmentation ×3; mixup 0.8 / CutMix
1.0, no label smoothing, binary cross-entropy; drop path 0.05 (S), 0.2 (B), 0.45 (L), 0.6 (H);
trained at 224 (S), 192 (B, L) or 160 (H) and evaluated with crop ratio 1.0; EMA 0.99996 (deit
main.py's default). deit's ViT-H/14 at 160 sees 11 x 11 patches, its patch convolution dropping
the last 6 pixels of each side; here H trains at 154 = 11 x 14, the same patch grid. `crop=src` takes the simple random crop instead of the inception crop (the
README's ImageNet-21k commands, `--src`):

  python -m vit_jax.main --config=configs/deit3.py:variant=S,dataset=imagenet2012 \
      --config.data_dir=gs://BUCKET/tfds --workdir=gs://BUCKET/deit3_s

Fine-tuning at 224 (B, L, H) or 384 (S, B, L) from such a run (`finetune=224|384`): AdamW at lr
1e-5, batch 512, weight decay 0.1, 20 epochs (5 warm-up), label smoothing 0.1, mixup 0.8 / CutMix
1.0, RandAugment rand-m9-mstd0.5-inc1, softmax cross-entropy, no repeated augmentation; drop path
0.2 / 0.45 / 0.55 (B / L / H at 224), 0.0 / 0.15 / 0.4 (S / B / L at 384). The position
embedding is resized to the new grid when the weights load:

  python -m vit_jax.main --config=configs/deit3.py:variant=B,finetune=224,dataset=imagenet2012 \
      --config.init_from=gs://BUCKET/deit3_b --config.data_dir=gs://BUCKET/tfds \
      --workdir=gs://BUCKET/deit3_b_ft224

Published top-1 (ImageNet-1k only, deit/README_revenge.md's model table; each matches the last
epoch of the README's logs of the 800-epoch commands above): ViT-S 81.4 (224) / 83.4 (384),
ViT-M 83.0 (224), ViT-B 83.8 (224) / 85.0 (384), ViT-L 84.9 (224) / 85.8 (384), ViT-H 85.2 (224).
The README gives no ViT-M command; `deit3_m16` is registered for its weights.
"""

import ml_collections

from vit_jax.configs import common

FAMILY = 'deit3'

# Variant -> (registry name, pre-training resolution, LAMB lr, drop path) of README_revenge.md.
VARIANTS = {
    'S': ('deit3_s16', 224, 4e-3, 0.05),
    'B': ('deit3_b16', 192, 3e-3, 0.2),
    'L': ('deit3_l16', 192, 3e-3, 0.45),
    'H': ('deit3_h14', 154, 3e-3, 0.6),
}
# (resolution, variant) -> drop path of README_revenge.md's fine-tuning commands.
FINETUNE_DROP_PATH = {
    (224, 'B'): 0.2,
    (224, 'L'): 0.45,
    (224, 'H'): 0.55,
    (384, 'S'): 0.0,
    (384, 'B'): 0.15,
    (384, 'L'): 0.4,
}
CROPS = {'rrc': 'inception_crop', 'src': 'simple_random_crop'}


def use_recipe(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """DeiT III's training pieces on top of a run's data settings (deit main.py with
  `--ThreeAugment --color-jitter 0.3 --bce-loss --opt fusedlamb --smoothing 0.0 --reprob 0.0`)."""
  config.randaugment = ''
  config.three_augment = True
  config.color_jitter = 0.3
  config.random_erase_prob = 0.0
  config.label_smoothing = 0.0
  config.loss = 'bce'
  config.optimizer = 'lamb'
  return config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """DeiT III on digits by default; `variant=S|B|L|H`, `finetune=224|384`, `epochs=`, `crop=`,
  `dataset=`."""
  args = common.parse_arg(arg, variant='', finetune=0, epochs=800, crop='rrc', dataset='digits')
  config = common.get_config()
  config.dataset = common.dataset(arg, args)
  if args.crop not in CROPS:
    raise ValueError(f'Unknown crop {args.crop!r}; valid: {list(CROPS)}.')
  if not args.variant:
    if args.finetune:
      raise ValueError(f'finetune={args.finetune} needs a variant= (one of {list(VARIANTS)}).')
    common.quick_run(config, VARIANTS)
    common.quick_model(config.model, 'deit3_s16')
    use_recipe(config)
    config.augment = 'simple_random_crop'
    config.base_lr = 1e-2
    config.total_steps = 1600  # 3-Augment and colour jitter: more steps than the ViT's.
    config.warmup_steps = 160
    config.eval_every = config.checkpoint_every = 800
    return config
  if args.variant not in VARIANTS:
    raise ValueError(f'Unknown DeiT III variant {args.variant!r}; valid: {list(VARIANTS)}.')
  name, resolution, lr, drop_path = VARIANTS[args.variant]
  config.model.name = name
  if args.finetune:
    if (args.finetune, args.variant) not in FINETUNE_DROP_PATH:
      published = sorted(f'variant={v},finetune={r}' for r, v in FINETUNE_DROP_PATH)
      raise ValueError(
          f'No published DeiT III fine-tuning of {args.variant} at {args.finetune}; '
          f'published: {published}.'
      )
    common.use_imagenet(config, args.finetune)
    config.eval_crop_ratio = 1.0
    config.random_erase_prob = 0.0
    config.repeated_aug = 1
    config.batch_size = 512
    config.base_lr = 1e-5
    config.lr_scaling_batch = 0
    config.weight_decay = 0.1
    config.num_epochs = 20
    config.model.drop_path_rate = FINETUNE_DROP_PATH[args.finetune, args.variant]
    return config
  common.use_imagenet(config, resolution)
  use_recipe(config)
  config.augment = CROPS[args.crop]
  config.eval_crop_ratio = 1.0
  config.batch_size = 2048
  config.base_lr = lr
  config.lr_scaling_batch = 0
  config.num_epochs = args.epochs
  config.model.drop_path_rate = drop_path
  return config
