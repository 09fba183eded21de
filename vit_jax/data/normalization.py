"""The inputs' per-channel normalisations by name, and per-channel numbers read from a config,
without TensorFlow or JAX: a config's `normalization` is checked before the pipeline is imported."""

import math
from typing import Sequence

# Per-channel (mean, std) of pixel values in [0, 1].
NORMALIZATIONS = {
    'imagenet': ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    'inception': ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    'cifar10': ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    # The 1,437 train images of `digits` (8x8, 0..255), tiled to three channels.
    'digits': ((0.3054, 0.3054, 0.3054), (0.3760, 0.3760, 0.3760)),
    # OpenAI CLIP's, which timm's CLIP-trained ViTs and their fine-tunings keep.
    'clip': ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
}


def _close(values: Sequence[float], known: Sequence[float]) -> bool:
  """`np.allclose(values, known, atol=1e-4)` (its rtol of 1e-5 included), without NumPy."""
  return len(values) == len(known) and all(
      abs(v - k) <= 1e-4 + 1e-5 * abs(k) for v, k in zip(values, known)
  )


def mean_std(normalization: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """The per-channel (mean, std) of a `NORMALIZATIONS` name or of numbers 'R,G,B/R,G,B' (mean,
  then std: what published weights give, e.g. '0.5,0.5,0.5/0.25,0.25,0.25')."""
  if normalization in NORMALIZATIONS:
    return NORMALIZATIONS[normalization]
  try:
    mean, std = (tuple(float(v) for v in part.split(',')) for part in normalization.split('/'))
  except (AttributeError, ValueError):
    mean = std = ()
  if len(mean) != 3 or len(std) != 3 or not all(map(math.isfinite, mean + std)) or min(std) <= 0:
    raise ValueError(
        f'Unknown normalization {normalization!r}; valid: one of {list(NORMALIZATIONS)}, or '
        "three means and three positive stds as 'R,G,B/R,G,B', e.g. "
        "'0.5,0.5,0.5/0.25,0.25,0.25'."
    )
  return mean, std


def normalization_name(mean: Sequence[float], std: Sequence[float]) -> str:
  """The `NORMALIZATIONS` name of per-channel (mean, std) where one matches (to 1e-4), else the
  numbers as `mean_std` reads them."""
  for name, (known_mean, known_std) in NORMALIZATIONS.items():
    if _close(mean, known_mean) and _close(std, known_std):
      return name
  return '/'.join(','.join(repr(float(v)) for v in values) for values in (mean, std))
