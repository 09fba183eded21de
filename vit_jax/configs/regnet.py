r"""RegNetY (Radosavovic et al., CVPR 2020): the CNN that teaches DeiT.

Default — a small RegNetY (timm's layout; 3 stages of 32-128 channels) on the embedded digits, the
teacher of the distillation example in configs/deit.py:

  python -m vit_jax.main --config=configs/regnet.py --workdir=/tmp/regnet
  python -m vit_jax.main --config=configs/deit.py:teacher=/tmp/regnet --workdir=/tmp/deit_kd

  Measured: the teacher's test accuracy 0.983 with each of seeds 0, 1 and 2 (--config.seed), after
  its 500 steps of 128, in 116 s on 2 CPU cores, from a fresh clone.

Any RegNetY size (`variant=` the timm suffix: 002, 004, 006, 008, 016, 032, 040, 064, 080, 120,
160, 320; the digits are GFLOPs × 10) on ImageNet with the DeiT recipe of configs/common.py, or
evaluating released timm / DeiT weights, e.g. DeiT's RegNetY-16GF teacher
(https://dl.fbaipublicfiles.com/deit/regnety_160-a5fe301d.pth, 82.9 top-1 in the DeiT paper;
timm's `regnety_160.deit_in1k`, evaluated there at crop 0.95):

  python -m vit_jax.main --config=configs/regnet.py:variant=160,dataset=imagenet2012 \
      --config.data_dir=gs://BUCKET/tfds --config.eval_only=True \
      --config.init_from=regnety_160-a5fe301d.pth --workdir=/tmp/eval_regnety_160

To distil DeiT from such a file directly, see configs/deit.py (`teacher=regnety_160:FILE`).
"""

import ml_collections

from vit_jax.configs import common

FAMILY = 'regnet'

VARIANTS = ('002', '004', '006', '008', '016', '032', '040', '064', '080', '120', '160', '320')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """A small RegNetY on digits by default; `variant=160,dataset=imagenet2012` for the others."""
  args = common.parse_arg(arg, variant='', dataset='digits', image_size=224)
  config = common.get_config()
  config.dataset = common.dataset(arg, args)
  if args.variant:
    if args.variant not in VARIANTS:
      raise ValueError(f'Unknown RegNetY variant {args.variant!r}; valid: {list(VARIANTS)}.')
    common.use_imagenet(config, args.image_size)
    config.model.name = f'regnety_{args.variant}'
    config.model.drop_path_rate = 0.05
    config.no_decay_names = ('bias', 'scale')
  else:
    common.quick_run(config, VARIANTS)
    # A RegNetY of the paper's design space sized for 16×16 digits: stages of 32, 64 and 128
    # channels (1, 2, 3 blocks), group width 16, SE 0.25 (stride 16: 1×1 after the last stage).
    config.model.name = 'regnety_002'
    config.model.w0 = 32
    config.model.wa = 24.0
    config.model.wm = 2.0
    config.model.depth = 6
    config.model.group_width = 16
    config.batch_size = 128  # Fewer, larger steps than the ViT's quick default.
    config.total_steps = 500
    config.warmup_steps = 50
    config.eval_every = config.checkpoint_every = 250
  return config
