"""What every family config shares: the defaults, its `key=value` arguments, the quick digits run
and the ImageNet recipe.

A family config calls `get_config()` here (every field at the default that vit_jax/schema/ declares
for it; `python -m vit_jax.config` lists them), then sets its model and recipe. Every
field can be overridden on the command line with `--config.FIELD=VALUE`.
"""

from typing import Iterable

import ml_collections

from vit_jax.schema import config as config_lib
from vit_jax.schema import checks as config_checks
from vit_jax.schema import dataset_names


def get_config() -> ml_collections.ConfigDict:
  """Every field at its default (vit_jax/schema/ declares them): the embedded digits dataset,
  AdamW, warm-up + cosine, a 4×4-patch ViT."""
  return config_lib.defaults()


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses the `key=value,key=value` string after the config path's colon.

  Only keys present in `defaults` are accepted; values are converted to the type of the default.
  Numbers are sizes, counts and rates: positive, or where the default is 0 (unset), not negative.
  """
  parsed = ml_collections.ConfigDict(defaults)
  if not arg:
    return parsed
  for item in arg.split(','):
    key, sep, value = item.partition('=')
    key = key.strip()
    if not sep:
      raise ValueError(
          f'Config argument {item!r} is not of the form key=value; '
          f'valid keys: {sorted(defaults)}.'
      )
    if key not in defaults:
      raise ValueError(f'Unknown config argument {key!r}; valid keys: {sorted(defaults)}.')
    default = defaults[key]
    if isinstance(default, bool):
      if value.lower() not in ('true', 'false', '1', '0'):
        raise ValueError(f'Config argument {key}={value!r} must be true or false.')
      parsed[key] = value.lower() in ('true', '1')
    elif default is None or isinstance(default, str):
      parsed[key] = value
    else:
      try:
        number = type(default)(value)
      except ValueError:
        number = None
      # Raised outside the handler: the command line's one-line error reads this, not the cause.
      if number is None:
        kind = {int: 'an integer', float: 'a number'}.get(type(default), type(default).__name__)
        raise ValueError(f'Config argument {key}={value!r} must be {kind}, e.g. {key}={default!r}.')
      if not (number >= 0 if default == 0 else number > 0):  # A default of 0: unset.
        bound = '>= 0 (0: unset)' if default == 0 else '> 0'
        raise ValueError(
            f'Config argument {key}={value!r} must be {bound}, e.g. {key}={default!r}.'
        )
      parsed[key] = number
  return parsed


def dataset(arg: str | None, args: ml_collections.ConfigDict) -> str:
  """The `dataset=` argument; none chosen (refused when the config is checked, naming the one to
  add) where a published size, `variant=`, came without it: the quick default's digits do not
  fit it. Benchmarks and model sizing, which read no data, take such a config as it is."""
  given = {item.partition('=')[0].strip() for item in (arg or '').split(',')}
  if args.get('variant') and 'dataset' not in given:
    return dataset_names.NONE_CHOSEN
  return args.dataset


def quick_run(
    config: ml_collections.ConfigDict, variants: Iterable[str] = ()
) -> ml_collections.ConfigDict:
  """The quick default of every family config: digits upsampled to 16×16, 1,000 steps of 64.

  Upsampling lets the pad-2 random crop shift by half pixels of the original 8×8 digits, which
  regularises far better than whole-pixel shifts (98 % vs 92 % test accuracy at 600 steps).
  Raises ValueError when `config.dataset` is another named dataset, which this model does not
  fit, naming the family's published `variants` to pick instead.
  """
  config.image_size = 16
  config.crop_padding = 2
  config.flip = False  # Mirrored digits are other digits.
  config.normalization = 'digits'
  config.batch_size = 64  # More updates per image seen than at 128: as accurate for less compute.
  config.total_steps = 1000
  config.warmup_steps = 100
  config.base_lr = 2e-3
  config.weight_decay = 0.05
  config.label_smoothing = 0.1
  config.log_every = 100
  config.eval_every = 500
  config.checkpoint_every = 500
  config_checks.require_fit(config, list(variants))
  return config


def quick_model(model: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """A 4-block, 128-wide, 4-head member of a ViT-like family, 4×4 patches: the quick default."""
  model.name = name
  model.patch_size = 4
  model.hidden_size = 128
  model.depth = 4
  model.num_heads = 4
  model.mlp_dim = 256
  return model


def use_imagenet(
    config: ml_collections.ConfigDict, image_size: int = 224
) -> ml_collections.ConfigDict:
  """ImageNet at `image_size` with the full DeiT recipe (DeiT Table 9), the base of every family's.

  deit/main.py defaults: AdamW (eps 1e-8) at lr 5e-4 × batch / 512 (1e-3 at batch 1024), weight
  decay 0.05 (not on 1-D parameters, pos_embed, cls_token), 300 epochs, 5 warm-up epochs from
  1e-6, cosine to 1e-5; bicubic inception crop + flip, RandAugment rand-m9-mstd0.5-inc1, random
  erasing 0.25, repeated augmentation ×3; mixup 0.8 / CutMix 1.0 (switch 0.5) with label
  smoothing 0.1; no dropout or clipping (drop path is the family config's); EMA 0.99996; mixed
  precision (AMP there, bfloat16 here). Eval: resize to 224 / 0.875 and centre crop.
  Differences: the lr changes every step (timm: every epoch); ColorJitter is off, as it is in
  DeiT whenever RandAugment is on.
  """
  config.image_size = image_size
  config.augment = 'inception_crop'
  config.flip = True
  config.eval_crop_ratio = 0.875 if image_size == 224 else 1.0
  config.normalization = 'imagenet'
  config.randaugment = 'rand-m9-mstd0.5-inc1'
  config.random_erase_prob = 0.25
  config.repeated_aug = 3
  config.mixup_alpha = 0.8
  config.cutmix_alpha = 1.0
  config.mix_switch_prob = 0.5
  config.mix_prob = 1.0
  config.label_smoothing = 0.1
  config.optimizer = 'adamw'
  config.batch_size = 1024
  config.base_lr = 5e-4
  config.lr_scaling_batch = 512
  config.warmup_lr = 1e-6
  config.min_lr = 1e-5
  config.num_epochs = 300
  config.warmup_epochs = 5
  config.weight_decay = 0.05
  config.grad_clip_norm = 0.0
  config.ema_decay = 0.99996
  config.dtype = 'bfloat16'
  config.log_every = 100
  config.eval_every = 5000
  config.checkpoint_every = 2000
  return config
