r"""SA-conv (Cordonnier et al., ICLR 2020): self-attention layers that learn to be convolutions.

Default — a small quadratic-encoding SA model (3 layers, 9 heads on an 8×8 grid) on digits:

  python -m vit_jax.main --config=configs/sa_conv.py --workdir=/tmp/sa_conv

  Measured: test accuracy 0.972–0.983 over seeds 0, 1 and 2 (--config.seed), after its 900
  steps of 64, in 97 s on 2 CPU cores, from a fresh clone.

The paper's CIFAR-10 runs (6 layers, 9 heads, hidden 400; SGD lr 0.1, momentum 0.9, wd 1e-4
without decay on centres and spreads, batch 100, 300 epochs, 5 % linear warm-up, cosine; crop
+ flip), one per positional encoding:

  python -m vit_jax.main --config=configs/sa_conv.py:attention=quadratic,dataset=cifar10 \
      --workdir=/tmp/sa_quadratic
  (attention=gaussian | learned | learned_content; heads=16 for the 4×4-kernel models)

Published CIFAR-10 accuracy (paper Tables 1 and 4): quadratic 0.938, Gaussian (non-isotropic)
0.934 (0.934 after pruning to 9.7M parameters), learned 0.918, learned + content 0.871;
ResNet18 0.938.
"""

import ml_collections

from vit_jax.configs import common

FAMILY = 'sa_conv'

KINDS = ('quadratic', 'gaussian', 'learned', 'learned_content')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """SA-conv on digits by default; `attention=`, `heads=9|16`, `dataset=cifar10` for the paper."""
  args = common.parse_arg(arg, attention='quadratic', heads=9, dataset='digits')
  if args.attention not in KINDS:
    raise ValueError(f'Unknown SA-conv attention {args.attention!r}; valid: {list(KINDS)}.')
  if args.heads not in (9, 16):
    raise ValueError(f'heads={args.heads} is not a registered SA-conv size; valid: 9, 16.')
  config = common.get_config()
  config.dataset = args.dataset
  config.model.name = f'sa_conv_{args.attention}' + ('_16h' if args.heads == 16 else '')
  config.no_decay_names = tuple(config.no_decay_names) + ('attention_centers', 'attention_spreads')
  if args.dataset == 'digits':
    common.quick_run(config)
    config.total_steps = 900
    config.warmup_steps = 90
    config.eval_every = config.checkpoint_every = 450
    config.model.num_layers = 3
    config.model.hidden_size = 64
    config.model.intermediate_size = 128
    return config
  # The paper's CIFAR-10 recipe (Table 2, runs/*.sh).
  config.image_size = 32
  config.normalization = 'cifar10'
  config.optimizer = 'sgd'
  config.base_lr = 0.1
  config.momentum = 0.9
  config.weight_decay = 1e-4
  config.batch_size = 100
  config.eval_batch_size = 100
  config.num_epochs = 300
  config.warmup_epochs = 15  # 5 % of 300 epochs.
  config.label_smoothing = 0.0
  config.log_every = 100
  config.eval_every = 5000
  config.checkpoint_every = 5000
  return config
