r"""T2T-ViT (Yuan et al., ICCV 2021): tokens-to-token soft splits before a ViT backbone.

Default — a small T2T-ViT (transformer T2T; soft splits 16 → 8 → 4 → 4) on the embedded digits:

  python -m vit_jax.main --config=configs/t2t.py --workdir=/tmp/t2t

  Measured: test accuracy 0.972–0.978 over seeds 0, 1 and 2 (--config.seed), after its 800
  steps of 64, in 133 s on 2 CPU cores, from a fresh clone.

ImageNet with the official recipe (yitu-opensource/T2T-ViT `main.py` defaults and README commands):
the DeiT recipe of configs/common.py at batch 512, 10 warm-up epochs, no repeated augmentation,
EMA 0.99996 (results.json holds both; eval_only of the run reads the EMA), lr 1e-3 and weight
decay 0.03 for T2T-ViT-7/10/12, lr 5e-4 and 0.05 for -14, 5e-4 and 0.065 for -19/-24; evaluation
at crop ratio 0.9 (the official `default_cfg`). Not reproduced: timm's 10 cool-down epochs at
min_lr after the 300, and its random train interpolation (bicubic here):

  python -m vit_jax.main --config=configs/t2t.py:variant=14,dataset=imagenet2012 \
      --config.data_dir=gs://BUCKET/tfds --workdir=gs://BUCKET/t2t_14

Evaluate a released checkpoint (its `state_dict_ema` is read):

  python -m vit_jax.main --config=configs/t2t.py:variant=7,dataset=imagenet2012 \
      --config.data_dir=... --config.eval_only=True \
      --config.init_from=71.7_T2T_ViT_7.pth.tar --workdir=/tmp/eval_t2t_7

Published top-1 on ImageNet at 224 (T2T-ViT README; parameters as its code counts them):

  variant  T2T module   top-1  params      variant  T2T module   top-1  params
  7        Performer    71.7   4.3M        t-14     Transformer  81.7   21.5M
  10       Performer    75.2   5.9M        t-19     Transformer  82.4   39.2M
  12       Performer    76.5   6.9M        t-24     Transformer  82.6   64.1M
  14       Performer    81.5   21.5M       (14 at 384 px: 83.3)
  19       Performer    81.9   39.2M
  24       Performer    82.3   64.1M
"""

import ml_collections

from vit_jax.configs import common

FAMILY = 't2t'

VARIANTS = {
    '7': 't2t_vit_7',
    '10': 't2t_vit_10',
    '12': 't2t_vit_12',
    '14': 't2t_vit_14',
    '19': 't2t_vit_19',
    '24': 't2t_vit_24',
    't-14': 't2t_vit_t_14',
    't-19': 't2t_vit_t_19',
    't-24': 't2t_vit_t_24',
}
# (base_lr at batch 512, weight decay) of the official README's training commands.
_RECIPES = {
    '7': (1e-3, 0.03),
    '10': (1e-3, 0.03),
    '12': (1e-3, 0.03),
    '14': (5e-4, 0.05),
    '19': (5e-4, 0.065),
    '24': (5e-4, 0.065),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """T2T-ViT on digits by default; `variant=7|10|12|14|19|24|t-14|t-19|t-24`, `dataset=`."""
  args = common.parse_arg(arg, variant='', dataset='digits', image_size=224)
  config = common.get_config()
  config.dataset = common.dataset(arg, args)
  # The Performer's frozen random features get no gradient; decoupled decay must not shrink them.
  config.no_decay_names = tuple(config.no_decay_names) + ('random_features',)
  if args.variant:
    if args.variant not in VARIANTS:
      raise ValueError(f'Unknown T2T-ViT variant {args.variant!r}; valid: {list(VARIANTS)}.')
    common.use_imagenet(config, args.image_size)
    config.batch_size = 512
    config.repeated_aug = 1
    config.warmup_epochs = 10
    config.base_lr, config.weight_decay = _RECIPES[args.variant.removeprefix('t-')]
    if args.image_size == 224:
      config.eval_crop_ratio = 0.9
    config.model.name = VARIANTS[args.variant]
    config.model.drop_path_rate = 0.1
  else:
    common.quick_run(config, VARIANTS)
    config.total_steps = 800  # The token transformers cost more per step than a ViT's stem.
    config.warmup_steps = 80
    config.eval_every = config.checkpoint_every = 400
    config.model.name = 't2t_vit_t_ti4'
    # Strides 2, 2, 1: 64 tokens in the first token transformer (256 with stride 1 first), at
    # little more than a ViT's FLOPs per step.
    config.model.soft_splits = ((3, 2, 1), (3, 2, 1), (3, 1, 1))
    config.model.token_dim = 32
    config.model.hidden_size = 128
    config.model.depth = 4
    config.model.num_heads = 4
    config.model.mlp_dim = 256
  return config
