"""What a config's augmentation fields name, without TensorFlow: the training crops (`AUGMENTS`)
and timm's RandAugment strings (`parse_randaugment`), so that a config is checked before the
pipeline (`input_pipeline`, `augment`) is imported."""

import dataclasses
import math
import re
from typing import Any

# 'simple_random_crop': DeiT III's (deit `--src`): shorter side to image_size, reflect padding,
# a random image_size crop.
AUGMENTS = ('crop_flip', 'inception_crop', 'simple_random_crop', 'none')

# timm's _RAND_TRANSFORMS ('inc0') and _RAND_INCREASING_TRANSFORMS ('inc1').
RAND_OPS = (
    'AutoContrast',
    'Equalize',
    'Invert',
    'Rotate',
    'Posterize',
    'Solarize',
    'SolarizeAdd',
    'Color',
    'Contrast',
    'Brightness',
    'Sharpness',
    'ShearX',
    'ShearY',
    'TranslateXRel',
    'TranslateYRel',
)
RAND_INCREASING_OPS = (
    'AutoContrast',
    'Equalize',
    'Invert',
    'Rotate',
    'PosterizeIncreasing',
    'SolarizeIncreasing',
    'SolarizeAdd',
    'ColorIncreasing',
    'ContrastIncreasing',
    'BrightnessIncreasing',
    'SharpnessIncreasing',
    'ShearX',
    'ShearY',
    'TranslateXRel',
    'TranslateYRel',
)
LEVEL_DENOM = 10.0  # timm's _LEVEL_DENOM: magnitudes are in [0, LEVEL_DENOM].


_TRANSLATE_PCT = 0.45
# timm RandomErasing's defaults: a box of 2-33 % of the image, log-uniform aspect, 10 attempts.
ERASE_AREA = (0.02, 1 / 3)
ERASE_ASPECT = (0.3, 1 / 0.3)
ERASE_ATTEMPTS = 10


def level_to_arg(name: str, level: Any, sign: Any, xp: Any) -> Any:
  """timm's LEVEL_TO_ARG[name] at `level` = magnitude / LEVEL_DENOM, `sign` (+1 or -1) applied
  where timm negates at random; arrays of any shape, `xp` their array module (numpy's API:
  `jax.numpy`, `tf.experimental.numpy`)."""
  if name == 'Rotate':
    return sign * level * 30.0
  if name in ('ShearX', 'ShearY'):
    return sign * level * 0.3
  if name in ('TranslateXRel', 'TranslateYRel'):
    return sign * level * _TRANSLATE_PCT
  if name == 'Posterize':
    return xp.floor(level * 4.0)
  if name == 'PosterizeIncreasing':
    return 4.0 - xp.floor(level * 4.0)
  if name == 'Solarize':
    return xp.minimum(xp.floor(level * 256.0), 256.0)
  if name == 'SolarizeIncreasing':
    return 256.0 - xp.minimum(xp.floor(level * 256.0), 256.0)
  if name == 'SolarizeAdd':
    return xp.minimum(xp.floor(level * 110.0), 128.0)
  if name in ('Color', 'Contrast', 'Brightness', 'Sharpness'):
    return level * 1.8 + 0.1
  if name.endswith('Increasing'):  # Color/Contrast/Brightness/Sharpness, severity grows with level.
    return xp.maximum(1.0 + sign * level * 0.9, 0.1)
  return xp.zeros_like(level)  # AutoContrast, Equalize, Invert take no argument.


@dataclasses.dataclass(frozen=True)
class RandAugmentSpec:
  """A parsed timm RandAugment string such as 'rand-m9-mstd0.5-inc1'."""

  magnitude: float = 10.0
  num_layers: int = 2
  prob: float = 0.5
  magnitude_std: float = 0.0  # inf: magnitude uniform in [0, magnitude].
  magnitude_max: float = LEVEL_DENOM
  increasing: bool = False

  @property
  def ops(self) -> tuple[str, ...]:
    return RAND_INCREASING_OPS if self.increasing else RAND_OPS


def parse_randaugment(spec: str) -> RandAugmentSpec:
  """Parses timm's 'rand-m{M}-n{N}-p{P}-mstd{S}-mmax{X}-inc{0|1}' (sections in any order)."""
  sections = spec.split('-')
  if sections[0] != 'rand':
    raise ValueError(
        f"RandAugment spec {spec!r} must start with 'rand-', e.g. " "'rand-m9-mstd0.5-inc1'."
    )
  values = {}
  for section in sections[1:]:
    match = re.fullmatch(r'(mstd|mmax|inc|m|n|p)(\d+(?:\.\d*)?)', section)
    if not match:
      raise ValueError(
          f'Unknown section {section!r} in RandAugment spec {spec!r}; valid: '
          'm<magnitude>, n<layers>, p<prob>, mstd<std>, mmax<max>, inc<0|1>.'
      )
    values[match.group(1)] = float(match.group(2))
  magnitude_std = values.get('mstd', 0.0)
  return RandAugmentSpec(
      magnitude=values.get('m', LEVEL_DENOM),
      num_layers=int(values.get('n', 2)),
      prob=values.get('p', 0.5),
      magnitude_std=math.inf if magnitude_std > 100 else magnitude_std,
      magnitude_max=values.get('mmax', LEVEL_DENOM),
      increasing=bool(values.get('inc', 0)),
  )


def augments_on_device(
    augment_on_device: bool | None,
    randaugment: object,
    random_erase_prob: float,
    three_augment: bool,
    color_jitter: float,
) -> bool:
  """Whether a run's RandAugment, normalisation and erasing run in the training step
  (`batch_augment`): asked for, something to do, and no host op that timm runs after RandAugment
  (3-Augment, colour jitter). None, not yet resolved for a backend (`training.setup.resolved`),
  is the host."""
  wanted = bool(randaugment) or random_erase_prob > 0
  return bool(augment_on_device) and wanted and not three_augment and not color_jitter
