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


def numbers(normalization: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
  """The (mean, std) of `normalization` written as numbers 'R,G,B/R,G,B', whatever their values;
  None if it is not in that form."""
  try:
    mean, std = (tuple(float(v) for v in part.split(',')) for part in normalization.split('/'))
  except (AttributeError, ValueError):
    return None
  return (mean, std) if len(mean) == 3 and len(std) == 3 else None


def mean_std(normalization: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """The per-channel (mean, std) of a `NORMALIZATIONS` name or of numbers 'R,G,B/R,G,B' (mean,
  then std: what published weights give, e.g. '0.5,0.5,0.5/0.25,0.25,0.25')."""
  if normalization in NORMALIZATIONS:
    return NORMALIZATIONS[normalization]
  given = numbers(normalization)
  if given is None:
    raise ValueError(
        f'Unknown normalization {normalization!r}; valid: one of {list(NORMALIZATIONS)}, or '
        "three means and three positive stds as 'R,G,B/R,G,B', e.g. "
        "'0.5,0.5,0.5/0.25,0.25,0.25'."
    )
  mean, std = given
  not_finite = [v for v in mean + std if not math.isfinite(v)]
  if not_finite:
    raise ValueError(
        f'normalization {normalization!r} holds {not_finite[0]!r}: its means and stds must be '
        "finite numbers, e.g. '0.5,0.5,0.5/0.25,0.25,0.25'."
    )
  if min(std) <= 0:
    raise ValueError(
        f'normalization {normalization!r} has the std {min(std)!r}: each std must be > 0 (pixels '
        "are divided by it), e.g. '0.5,0.5,0.5/0.25,0.25,0.25'."
    )
  return mean, std


def normalization_name(mean: Sequence[float], std: Sequence[float]) -> str:
  """The `NORMALIZATIONS` name of per-channel (mean, std) where one matches (to 1e-4), else the
  numbers as `mean_std` reads them."""
  for name, (known_mean, known_std) in NORMALIZATIONS.items():
    if _close(mean, known_mean) and _close(std, known_std):
      return name
  return '/'.join(','.join(repr(float(v)) for v in values) for values in (mean, std))


def fill_colour(normalization: str) -> tuple[int, int, int]:
  """RandAugment's fill where a moved image leaves the frame: the mean colour in whole values
  (timm's `img_mean`)."""
  red, green, blue = (min(255, round(255 * m)) for m in mean_std(normalization)[0])
  return red, green, blue
