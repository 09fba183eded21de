r"""DeepViT (Zhou et al., 2021): Re-attention mixes the heads' maps to fight attention collapse.

Default — a small DeepViT (Re-attention in every block) on the embedded digits:

  python -m vit_jax.main --config=configs/deepvit.py --workdir=/tmp/deepvit

  Measured: test accuracy 0.964–0.975 over seeds 0, 1 and 2 (--config.seed), after its 1,200
  steps of 64 at lr 1e-3, in 83 s on 2 CPU cores, from a fresh clone.

Its plain-ViT twin (same blocks without Re-attention), to compare collapse with
`python -m vit_jax.analyze --workdir=… --what=collapse`:

  python -m vit_jax.main --config=configs/deepvit.py:baseline=true --workdir=/tmp/deepvit_vit

ImageNet with the official recipe (dvit_repo scripts/*.yaml): the DeiT recipe of
configs/common.py with AdamW lr 5e-4 not scaled by the batch (32 per GPU; 8 GPUs assumed, the
count is unconfirmed), drop path 0.2, no repeated augmentation, EMA 0.99996; DeepViT-32B and
ViT-32B use mixup 0.1 and no CutMix. Not reproduced: the 32B yaml's attention-similarity
regulariser (`cos_reg_component=12`) and ColorJitter 0.4 (off in timm when RandAugment is on):

  python -m vit_jax.main --config=configs/deepvit.py:variant=32B,dataset=imagenet2012 \
      --config.data_dir=gs://BUCKET/tfds --workdir=gs://BUCKET/deepvit_32b

Published top-1 (dvit_repo README): ViT-16B 78.88 / DeepViT-16B 79.10; ViT-24B 79.35 /
DeepViT-24B 79.99; ViT-32B 79.27 / DeepViT-32B 80.90 (similar blocks 15 → 0); DeepViT-S 82.3,
DeepViT-L 83.1 (CNN stem, tuned recipe).
"""

import ml_collections

from vit_jax.configs import common

FAMILY = 'deepvit'

VARIANTS = {
    '16B': 'deepvit_16b',
    '24B': 'deepvit_24b',
    '32B': 'deepvit_32b',
    'S': 'deepvit_s',
    'L': 'deepvit_l',
}
BASELINES = {'16B': 'deepvit_vit_16b', '24B': 'deepvit_vit_24b', '32B': 'deepvit_vit_32b'}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """DeepViT on digits by default; `variant=16B|24B|32B|S|L`, `baseline=true`, `dataset=`."""
  args = common.parse_arg(arg, variant='', baseline=False, dataset='digits')
  config = common.get_config()
  config.dataset = common.dataset(arg, args)
  if args.variant:
    table = BASELINES if args.baseline else VARIANTS
    if args.variant not in table:
      raise ValueError(
          f'Unknown DeepViT {"baseline " if args.baseline else ""}variant '
          f'{args.variant!r}; valid: {list(table)}.'
      )
    common.use_imagenet(config)
    config.lr_scaling_batch = 0  # The official recipe does not scale lr with the batch.
    config.batch_size = 256
    config.repeated_aug = 1
    if args.variant == '32B':
      config.mixup_alpha = 0.1
      config.cutmix_alpha = 0.0
    config.normalization = 'inception'  # DeepViT's default_cfg: mean = std = 0.5.
    config.model.name = table[args.variant]
    config.model.drop_path_rate = 0.2
  else:
    common.quick_run(config, VARIANTS)
    common.quick_model(config.model, 'deepvit_vit_ti4' if args.baseline else 'deepvit_ti4')
    config.total_steps = 1200  # Re-attention learns slower per step than self-attention,
    config.warmup_steps = 120
    config.base_lr = 1e-3  # and steadier at half the ViT's learning rate.
    config.eval_every = config.checkpoint_every = 600
  return config
