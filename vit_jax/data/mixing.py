"""Mixup and CutMix (timm's `Mixup`, mode 'batch') on a batch on device: traced inside the training
step, so this module imports JAX alone (the per-image augmentations, `augment`, are TensorFlow's).
"""

import dataclasses

import jax
import jax.numpy as jnp

from vit_jax.schema import data as data_settings


def mix_batch(
    rng: jax.Array,
    images: jax.Array,
    labels_onehot: jax.Array,
    *,
    mixup_alpha: float,
    cutmix_alpha: float,
    switch_prob: float,
    mix_prob: float,
    label_smoothing: float,
    correct_lam: bool = True,
) -> tuple[jax.Array, jax.Array]:
  """timm's Mixup(mode='batch'): one λ per batch, each image mixed with its mirror in the batch.

  images: (B, H, W, C); labels_onehot: (B, K). With probability `mix_prob` the batch is mixed:
  CutMix (λ ~ Beta(cutmix_alpha)) with probability `switch_prob` when both alphas are > 0,
  otherwise mixup (λ ~ Beta(mixup_alpha)). CutMix pastes a box of area ≈ (1 - λ) from the
  mirrored image and, with `correct_lam`, sets λ to 1 - (clipped box area) / (H W). Returns the
  mixed images and soft targets λ y + (1 - λ) y[::-1], y smoothed to (1 - s) y + s / K.
  """
  if mixup_alpha <= 0 and cutmix_alpha <= 0:
    raise ValueError(
        f'mix_batch needs mixup_alpha > 0 or cutmix_alpha > 0, got {mixup_alpha} '
        f'and {cutmix_alpha}.'
    )
  num_classes = labels_onehot.shape[-1]
  targets = labels_onehot.astype(jnp.float32) * (1.0 - label_smoothing) + (
      label_smoothing / num_classes
  )
  apply_rng, switch_rng, lam_rng, y_rng, x_rng = jax.random.split(rng, 5)
  apply = jax.random.uniform(apply_rng) < mix_prob
  if mixup_alpha > 0 and cutmix_alpha > 0:
    use_cutmix = jax.random.uniform(switch_rng) < switch_prob
  else:
    use_cutmix = jnp.asarray(cutmix_alpha > 0)
  alpha = jnp.where(use_cutmix, cutmix_alpha, mixup_alpha)
  lam = jax.random.beta(lam_rng, alpha, alpha)

  height, width = images.shape[1], images.shape[2]
  ratio = jnp.sqrt(1.0 - lam)
  cut_h = jnp.floor(height * ratio).astype(jnp.int32)
  cut_w = jnp.floor(width * ratio).astype(jnp.int32)
  centre_y = jax.random.randint(y_rng, (), 0, height)
  centre_x = jax.random.randint(x_rng, (), 0, width)
  top = jnp.clip(centre_y - cut_h // 2, 0, height)
  bottom = jnp.clip(centre_y + (cut_h + 1) // 2, 0, height)
  left = jnp.clip(centre_x - cut_w // 2, 0, width)
  right = jnp.clip(centre_x + (cut_w + 1) // 2, 0, width)
  rows = jnp.arange(height)[:, None]
  cols = jnp.arange(width)[None, :]
  box = (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)
  box_lam = 1.0 - (bottom - top) * (right - left) / (height * width) if correct_lam else lam

  mirrored = images[::-1]
  cut = jnp.where(box[None, :, :, None], mirrored, images)
  weight = jnp.asarray(lam, images.dtype)
  mixed = images * weight + mirrored * (1 - weight)
  images = jnp.where(apply, jnp.where(use_cutmix, cut, mixed), images)
  lam = jnp.where(apply, jnp.where(use_cutmix, box_lam, lam), 1.0).astype(jnp.float32)
  return images, lam * targets + (1.0 - lam) * targets[::-1]


def mix(
    settings: data_settings.MixSettings,
    rng: jax.Array,
    images: jax.Array,
    labels_onehot: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """`mix_batch` with `settings`."""
  return mix_batch(rng, images, labels_onehot, **dataclasses.asdict(settings))
