r"""T2T-ViT (Yuan et al., ICCV 2021): tokens-to-token soft splits before a ViT backbone.

Default — a small T2T-ViT (transformer T2T; soft splits 16 → 16 → 8 → 4) on the embedded digits:

  python -m vit_jax.main --config=configs/t2t.py --workdir=/tmp/t2t

ImageNet with the T2T-ViT recipe (main.py defaults, SPEC §7): the DeiT recipe of
configs/common.py at batch 512 and lr 5e-4, 10 warm-up epochs, no repeated augmentation,
EMA 0.99996 (the README evaluates the EMA: results.json holds both). Not reproduced: timm's 10
cool-down epochs at min_lr after the 300, and its random train interpolation (bicubic here):

  python -m vit_jax.main --config=configs/t2t.py:variant=14,dataset=imagenet2012 \
      --config.data_dir=gs://BUCKET/tfds --workdir=gs://BUCKET/t2t_14

Published top-1 (T2T-ViT README): T2T-ViT-14 (Performer T2T) 81.5, ↑384 83.3; T2T-ViT_t-14
(Transformer T2T) 81.7.
"""

import ml_collections

from configs import common

VARIANTS = {'14': 't2t_vit_14', 't-14': 't2t_vit_t_14'}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """T2T-ViT on digits by default; `variant=14|t-14`, `dataset=`."""
  args = common.parse_arg(arg, variant='', dataset='digits', image_size=224)
  config = common.get_config()
  config.dataset = args.dataset
  # The Performer's frozen random features get no gradient; decoupled decay must not shrink them.
  config.no_decay_names = tuple(config.no_decay_names) + ('random_features',)
  if args.variant:
    if args.variant not in VARIANTS:
      raise ValueError(f'Unknown T2T-ViT variant {args.variant!r}; valid: {list(VARIANTS)}.')
    common.use_imagenet(config, args.image_size)
    config.batch_size = 512
    config.repeated_aug = 1
    config.warmup_epochs = 10
    config.model.name = VARIANTS[args.variant]
    config.model.drop_path_rate = 0.1
  else:
    common.quick_run(config)
    config.model.name = 't2t_vit_t_ti4'
    config.model.soft_splits = ((3, 1, 1), (3, 2, 1), (3, 2, 1))
    config.model.token_dim = 32
    config.model.hidden_size = 128
    config.model.depth = 4
    config.model.num_heads = 4
    config.model.mlp_dim = 256
  return config
