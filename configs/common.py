"""Defaults shared by every config: data, optimisation, schedule, logging, checkpoints.

A family config calls `get_config()` here, then sets its model and recipe. Every field can be
overridden on the command line with `--config.FIELD=VALUE`.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """The shared defaults: the embedded digits dataset, AdamW, warm-up + cosine."""
  config = ml_collections.ConfigDict()
  config.seed = 0

  # Data: any TFDS image-classification dataset by name, or 'digits' (embedded, the default).
  config.dataset = 'digits'
  config.data_dir = ml_collections.FieldReference(None, field_type=str)  # TFDS data dir.
  config.train_split = 'train'
  config.eval_split = 'test'
  config.image_size = 32            # Model input resolution; the pipeline resizes to it.
  config.augment = 'crop_flip'      # 'crop_flip' | 'inception_crop' | 'none'.
  config.crop_padding = 4           # Pixels of zero padding before the random crop ('crop_flip').
  config.flip = True                # Random horizontal flips during training.
  config.eval_crop_ratio = 1.0      # Eval: resize to image_size / ratio, then centre crop.
  config.normalization = 'imagenet'  # 'imagenet' | 'inception' (0.5/0.5) | 'cifar10' | 'digits'.
  config.shuffle_buffer = 10_000
  config.prefetch = 2
  # Image folders ('folder:/path'): skip, with a warning naming each, the files that do not decode,
  # instead of refusing the folder.
  config.skip_unreadable_images = False
  # Recipe augmentations (vit_jax.augment). In the tf.data pipeline, per example:
  config.randaugment = ''           # timm spec, e.g. 'rand-m9-mstd0.5-inc1'; '' = off.
  config.random_erase_prob = 0.0    # Random erasing (one box, per-pixel normal noise).
  config.repeated_aug = 1           # Copies of each example per batch (DeiT: 3); batch_size counts
                                    # the copies and an epoch stays num_train_examples long.
  # On device, per device's share of the batch (timm Mixup, mode 'batch'; label smoothing folded
  # into the mixed targets):
  config.mixup_alpha = 0.0          # 0 = no mixup (DeiT: 0.8).
  config.cutmix_alpha = 0.0         # 0 = no CutMix (DeiT: 1.0).
  config.mix_switch_prob = 0.5      # P(CutMix) when both are on.
  config.mix_prob = 1.0             # P(a batch is mixed at all).

  # Optimisation.
  config.batch_size = 128           # Global batch, summed over every device of every process.
  config.eval_batch_size = 256
  config.optimizer = 'adamw'        # 'adamw' | 'sgd' (with momentum).
  config.base_lr = 1e-3
  config.lr_scaling_batch = 0       # If > 0, lr = base_lr * batch_size / lr_scaling_batch.
  config.min_lr = 0.0
  config.warmup_lr = 0.0            # lr at the first warm-up step (DeiT: 1e-6).
  config.warmup_steps = 100
  config.total_steps = 1000
  # Epochs, when set, override the step counts.
  config.num_epochs = ml_collections.FieldReference(None, field_type=float)
  config.warmup_epochs = ml_collections.FieldReference(None, field_type=float)
  config.weight_decay = 0.05
  config.momentum = 0.9             # SGD momentum.
  config.b1 = 0.9
  config.b2 = 0.999
  config.eps = 1e-8
  config.grad_clip_norm = 0.0       # 0 disables clipping.
  config.label_smoothing = 0.0
  config.grad_accum_steps = 1       # Micro-batches per optimizer step (batch_size is per step).
  config.ema_decay = 0.0            # Per-step EMA of the variables, evaluated beside them; 0 = off.

  # Precision. Parameters, softmax, norms and the loss stay float32.
  config.dtype = 'float32'          # Compute dtype of the model: 'float32' | 'bfloat16'.
  config.mu_dtype = ''              # Adam first moment / SGD momentum dtype; '' = the parameters'.
  # Never decayed (besides every 1-D parameter). DeiT's official code does decay dist_token.
  config.no_decay_names = ('bias', 'scale', 'pos_embed', 'cls_token')

  # Devices: a (data × fsdp) mesh over every device (vit_jax.sharding). Parameters, gradients,
  # optimizer state and EMA are split over `fsdp` devices (1 = replicated: data parallelism);
  # the batch over all of them.
  config.mesh = ml_collections.ConfigDict()
  config.mesh.fsdp = 1              # Must divide the number of devices.
  config.mesh.fsdp_min_size = 2**18  # Arrays with fewer elements (1 MiB in float32) stay replicated.

  # Logging, evaluation and checkpoints.
  config.log_every = 50
  config.eval_every = 500
  config.checkpoint_every = 500
  config.keep_checkpoints = 3

  # DeiT distillation from a teacher: a run of vit_jax.main, or any registered model's weights.
  config.distillation = ml_collections.ConfigDict()
  config.distillation.type = 'none'       # 'none' | 'hard' | 'soft'.
  config.distillation.alpha = 0.5         # Weight of the distillation term.
  config.distillation.tau = 1.0           # Temperature of 'soft'.
  config.distillation.teacher = ''        # The teacher's --workdir, or MODEL:FILE (e.g.
                                          # regnety_160:/path/regnety_160.pth).
  config.distillation.teacher_normalization = ''  # Inputs the teacher was trained on; '' = the
                                                  # student's (a work directory's: its own).

  # Pretrained weights (vit_jax.checkpoints.load): a timm/DeiT/CaiT/DeepViT/T2T .pth or
  # .safetensors file, a Google ViT .npz, or a vit_jax work directory. Training starts from these
  # weights (position embedding resized to image_size; the head re-initialised if the class count
  # differs); a work directory that already holds a checkpoint resumes from it instead.
  config.init_from = ''
  # Only evaluate (init_from, else --workdir's newest checkpoint) on eval_split: logs top-1, writes
  # nothing but workdir/eval_report.json.
  config.eval_only = False
  # Where a run's or a checkpoint's weights are read (eval_only, init_from, the teacher): its EMA
  # where it kept one (DeiT's and CaiT's published numbers are the EMA model's); False: the raw.
  config.use_ema = True

  # Evaluators of frozen pre-logits (vit_jax/evaluators), run every `every` steps and at the end
  # when `every` > 0; their metrics go to TensorBoard and results.json. `python -m
  # vit_jax.evaluate` runs them on any run or weights. Datasets: 'digits', TFDS names, 'folder:…'.
  config.evaluators = ml_collections.ConfigDict()
  config.evaluators.fewshot = ml_collections.ConfigDict(dict(  # big_vision's few-shot ridge.
      every=0, datasets=('digits',), shots=(1, 5, 10, 25), seeds=3))
  config.evaluators.linear_probe = ml_collections.ConfigDict(dict(  # Logistic regression.
      every=0, datasets=('digits',)))

  # Model: `name` is a key of the registry (vit_jax.models.names()); every other field is passed
  # to vit_jax.models.create() as an override.
  config.model = ml_collections.ConfigDict()
  config.model.name = 'vit_ti4'
  # Fields of every family: one traced block run by nn.scan (fast compiles of deep models), and
  # activations recomputed in the backward pass (memory).
  config.model.scan_layers = False
  config.model.remat = False
  return config


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses the `key=value,key=value` string after the config path's colon.

  Only keys present in `defaults` are accepted; values are converted to the type of the default.
  """
  parsed = ml_collections.ConfigDict(defaults)
  if not arg:
    return parsed
  for item in arg.split(','):
    key, sep, value = item.partition('=')
    key = key.strip()
    if not sep:
      raise ValueError(f'Config argument {item!r} is not of the form key=value; '
                       f'valid keys: {sorted(defaults)}.')
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
      parsed[key] = type(default)(value)
  return parsed


def require_variant(variant: str, dataset: str, variants) -> None:
  """Raises unless a dataset other than digits comes with a published size (`variant=`).

  The quick default of every family config is a small model for the embedded 8×8 digits.
  """
  if dataset != 'digits' and not variant:
    raise ValueError(f'dataset={dataset} needs a published model size: add variant= with one of '
                     f'{", ".join(variants)} after the colon, e.g. '
                     f'variant={list(variants)[0]},dataset={dataset}.')


def quick_run(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The quick default of every family config: digits upsampled to 16×16, 800 steps of 128.

  Upsampling lets the pad-2 random crop shift by half pixels of the original 8×8 digits, which
  regularises far better than whole-pixel shifts (98 % vs 92 % test accuracy at 600 steps).
  """
  config.image_size = 16
  config.crop_padding = 2
  config.flip = False  # Mirrored digits are other digits.
  config.normalization = 'digits'
  config.batch_size = 128
  config.total_steps = 800
  config.warmup_steps = 80
  config.base_lr = 2e-3
  config.weight_decay = 0.05
  config.label_smoothing = 0.1
  config.log_every = 100
  config.eval_every = 400
  config.checkpoint_every = 400
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


def use_imagenet(config: ml_collections.ConfigDict, image_size: int = 224
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
