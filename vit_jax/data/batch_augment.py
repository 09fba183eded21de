"""RandAugment, normalisation and random erasing of a whole training batch, traced inside the
training step on the accelerator (`--config.augment_on_device`), so that the host's cores only
decode, crop, resize and flip: it sends whole-pixel uint8 images and one key per image.

Each image draws timm's distributions from its own key, derived from (seed, process, position).
Every op is computed for every image and selected per image (XLA's shapes are static): point ops as
one lookup table per image and channel, Color and Sharpness as blends, the geometric ops as one
affine resampling. They compute in float32 where PIL computes in double: a few in a hundred of a
resampled image's pixels differ from PIL's by one level (`tests/test_batch_augment.py` bounds it).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.schema import augment_spec
from vit_jax.schema import normalization as normalization_lib
from vit_jax.schema import data as data_settings

_LUT_OPS = ('AutoContrast', 'Equalize', 'Invert', 'Posterize', 'Solarize', 'Contrast', 'Brightness')
_GEOMETRIC_OPS = ('Rotate', 'ShearX', 'ShearY', 'TranslateXRel', 'TranslateYRel')


def _kind(name: str) -> str:
  """Which of the three programs computes op `name`: 'lut', 'blend' or 'affine'."""
  if name in _GEOMETRIC_OPS:
    return 'affine'
  if name.startswith(('Color', 'Sharpness')):
    return 'blend'
  if name.startswith(_LUT_OPS):  # SolarizeAdd and the Increasing variants included.
    return 'lut'
  raise ValueError(f'Unknown RandAugment op {name!r}.')


def _luma(images: jax.Array) -> jax.Array:
  """PIL's RGB -> L conversion (ITU-R 601-2 luma, 16-bit fixed point), (B, H, W) int32."""
  rgb = images.astype(jnp.int32)
  return (rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + 0x8000) >> 16


def _per_image(values: jax.Array, rank: int) -> jax.Array:
  """(B,) values shaped to broadcast against arrays of `rank` dimensions."""
  return values.reshape(values.shape + (1,) * (rank - 1))


def _blend(degenerate: jax.Array, images: jax.Array, factor: jax.Array) -> jax.Array:
  """PIL's Image.blend(degenerate, image, factor) per image, truncated to uint8."""
  degenerate = degenerate.astype(jnp.float32)
  factor = _per_image(factor.astype(jnp.float32), images.ndim)
  mixed = degenerate + factor * (images.astype(jnp.float32) - degenerate)
  return jnp.clip(mixed, 0.0, 255.0).astype(jnp.uint8)


def _smooth(images: jax.Array) -> jax.Array:
  """ImageFilter.SMOOTH: 3x3 kernel [[1,1,1],[1,5,1],[1,1,1]] / 13, border pixels kept."""
  height, width = images.shape[1:3]
  if height < 3 or width < 3:
    return images
  values = images.astype(jnp.int32)
  window = 4 * values[:, 1:-1, 1:-1]
  for dy in range(3):
    for dx in range(3):
      window += values[:, dy : dy + height - 2, dx : dx + width - 2]
  smoothed = ((2 * window + 13) // 26).astype(jnp.uint8)  # round(window / 13), exactly.
  return images.at[:, 1:-1, 1:-1].set(smoothed)


def _lut(name: str, images: jax.Array, arg: jax.Array) -> jax.Array:
  """Op `name` as per-image, per-channel lookup tables (B, 3, 256) int32 (`augment`'s ops)."""
  batch = images.shape[0]
  values = jnp.arange(256, dtype=jnp.float32)
  arg = _per_image(arg.astype(jnp.float32), 3)
  if name == 'Invert':
    table = 255.0 - values[None, None]
  elif name.startswith('Posterize'):
    bits = jnp.minimum(arg.astype(jnp.int32), 8)
    mask = ~((1 << (8 - bits)) - 1)
    table = jnp.where(bits >= 8, values, jnp.arange(256) & mask)
  elif name.startswith('SolarizeAdd'):
    table = jnp.where(values < 128.0, jnp.minimum(255.0, values + arg), values)
  elif name.startswith('Solarize'):
    table = jnp.where(values < arg, values, 255.0 - values)
  elif name.startswith('Brightness'):
    table = jnp.clip(arg * values, 0.0, 255.0)
  elif name.startswith('Contrast'):
    luma = _luma(images).reshape(batch, -1)
    mean = jnp.floor(jnp.sum(luma, 1) / luma.shape[1] + 0.5)
    mean = _per_image(mean.astype(jnp.float32), 3)
    table = jnp.clip(mean + arg * (values - mean), 0.0, 255.0)
  elif name == 'AutoContrast':
    flat = images.reshape(batch, -1, 3).astype(jnp.float32)
    lo, hi = jnp.min(flat, 1)[..., None], jnp.max(flat, 1)[..., None]
    scale = 255.0 / jnp.maximum(hi - lo, 1.0)
    stretched = jnp.clip(jnp.floor(values * scale - lo * scale), 0.0, 255.0)
    table = jnp.where(hi > lo, stretched, values)
  else:
    assert name == 'Equalize', name
    table = _equalize_table(images)
  return jnp.broadcast_to(table, (batch, 3, 256)).astype(jnp.int32)


def _equalize_table(images: jax.Array) -> jax.Array:
  """ImageOps.equalize's tables: each channel through its normalised cumulative histogram."""
  batch = images.shape[0]
  bins = (images.reshape(batch, -1, 3).astype(jnp.int32) + jnp.array([0, 256, 512])).reshape(
      batch, -1
  )
  histogram = jax.vmap(lambda b: jnp.zeros(768, jnp.int32).at[b].add(1))(bins)
  histogram = histogram.reshape(batch, 3, 256)
  nonzero = histogram > 0
  last = 255 - jnp.argmax(nonzero[..., ::-1], axis=-1)
  last_nonzero = jnp.take_along_axis(histogram, last[..., None], -1)[..., 0]
  step = (jnp.sum(histogram, -1) - last_nonzero) // 255
  before = jnp.cumsum(histogram, -1) - histogram
  table = (step[..., None] // 2 + before) // jnp.maximum(step[..., None], 1)
  keep = (jnp.sum(nonzero, -1) <= 1) | (step == 0)
  return jnp.where(keep[..., None], jnp.arange(256), table)


def _apply_luts(images: jax.Array, tables: jax.Array) -> jax.Array:
  """images[b, y, x, c] -> tables[b, c, images[b, y, x, c]], clipped to uint8."""
  batch = images.shape[0]
  index = images.astype(jnp.int32) + jnp.array([0, 256, 512])
  flat = jnp.clip(tables, 0, 255).astype(jnp.uint8).reshape(batch, 768)
  return jnp.take_along_axis(flat, index.reshape(batch, -1), 1).reshape(images.shape)


def _cubic_weights(t: jax.Array) -> jax.Array:
  """PIL's affine bicubic: cubic convolution with a = -1, taps at offsets -1, 0, 1, 2 from floor."""
  a = -1.0
  near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1  # |x| <= 1
  far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # 1 < |x| < 2
  return jnp.stack([far(1 + t), near(t), near(1 - t), far(2 - t)], -1)


def _affine(images: jax.Array, matrix: jax.Array, fill: jax.Array, bicubic: bool) -> jax.Array:
  """PIL's Image.transform(AFFINE, matrix[b]) of each image: output pixel (x, y) samples the input
  at (a x + b y + c, d x + e y + f), measured at pixel centres; outside the image is `fill`."""
  batch, height, width, _ = images.shape
  ys, xs = jnp.meshgrid(
      jnp.arange(height, dtype=jnp.float32) + 0.5,
      jnp.arange(width, dtype=jnp.float32) + 0.5,
      indexing='ij',
  )
  a, b, c, d, e, f = (_per_image(matrix[:, i], 3) for i in range(6))
  x_in, y_in = a * xs + b * ys + c, d * xs + e * ys + f  # (B, H, W)
  inside = (x_in >= 0) & (x_in < width) & (y_in >= 0) & (y_in < height)
  x_in, y_in = x_in - 0.5, y_in - 0.5
  x0, y0 = jnp.floor(x_in), jnp.floor(y_in)
  offsets = jnp.array([-1, 0, 1, 2] if bicubic else [0, 1])

  def taps(start, t, size):
    index = jnp.clip(start.astype(jnp.int32)[..., None] + offsets, 0, size - 1)
    weights = _cubic_weights(t) if bicubic else jnp.stack([1 - t, t], -1)
    return index, weights

  xi, wx = taps(x0, x_in - x0, width)
  yi, wy = taps(y0, y_in - y0, height)
  index = (yi[..., :, None] * width + xi[..., None, :]).reshape(batch, -1, 1)  # (B, H W ky kx, 1)
  flat = images.reshape(batch, -1, 3).astype(jnp.float32)
  pixels = jnp.take_along_axis(flat, index, 1).reshape(xi.shape[:3] + (len(offsets),) * 2 + (3,))
  result = jnp.sum(jnp.sum(pixels * wx[..., None, :, None], -2) * wy[..., None], -2)
  result = jnp.clip(result, 0.0, 255.0).astype(jnp.uint8)  # PIL truncates.
  return jnp.where(inside[..., None], result, fill)


def _matrix(name: str, arg: jax.Array, height: int, width: int) -> jax.Array:
  """The (B, 6) inverse affine maps of geometric op `name` (PIL's `rotate` about the centre)."""
  one, zero = jnp.ones_like(arg), jnp.zeros_like(arg)
  if name == 'Rotate':
    angle = -arg * math.pi / 180.0
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    cx, cy = width / 2.0, height / 2.0
    rows = (cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy)
  elif name == 'ShearX':
    rows = (one, arg, zero, zero, one, zero)
  elif name == 'ShearY':
    rows = (one, zero, zero, arg, one, zero)
  elif name == 'TranslateXRel':
    rows = (one, zero, arg * width, zero, one, zero)
  else:
    assert name == 'TranslateYRel', name
    rows = (one, zero, zero, zero, one, arg * height)
  return jnp.stack(rows, -1)


def apply_ops(
    images: jax.Array,
    names: tuple[str, ...],
    choice: jax.Array,
    args: jax.Array,
    fill: jax.Array,
    bicubic: bool = True,
) -> jax.Array:
  """Op `names[choice[b]]` with argument `args[b]` on each uint8 image b of (B, H, W, 3);
  choice -1 leaves an image as it is."""
  images = jnp.asarray(images)
  height, width = images.shape[1:3]
  kinds = [_kind(name) for name in names]
  chosen = lambda i: choice == i
  out = images
  if 'lut' in kinds:
    tables = jnp.broadcast_to(jnp.arange(256), (images.shape[0], 3, 256))
    for i, name in enumerate(names):
      if kinds[i] == 'lut':
        tables = jnp.where(_per_image(chosen(i), 3), _lut(name, images, args), tables)
    out = _apply_luts(images, tables)
  for i, name in enumerate(names):
    if kinds[i] == 'blend':
      smooth = name.startswith('Sharpness')
      degenerate = _smooth(images) if smooth else jnp.repeat(_luma(images)[..., None], 3, -1)
      out = jnp.where(_per_image(chosen(i), 4), _blend(degenerate, images, args), out)
  if 'affine' in kinds:
    identity = jnp.broadcast_to(jnp.array([1.0, 0, 0, 0, 1, 0]), (images.shape[0], 6))
    matrix, geometric = identity, jnp.zeros_like(choice, bool)
    for i, name in enumerate(names):
      if kinds[i] == 'affine':
        matrix = jnp.where(chosen(i)[:, None], _matrix(name, args, height, width), matrix)
        geometric |= chosen(i)
    out = jnp.where(_per_image(geometric, 4), _affine(images, matrix, fill, bicubic), out)
  return out


def sample_magnitudes(key: jax.Array, spec: augment_spec.RandAugmentSpec, shape) -> jax.Array:
  """Op magnitudes: N(m, mstd) (or U(0, m) if mstd is inf), clipped to [0, mmax]."""
  if spec.magnitude_std == math.inf:
    magnitude = jax.random.uniform(key, shape, maxval=spec.magnitude)
  elif spec.magnitude_std > 0:
    magnitude = spec.magnitude + spec.magnitude_std * jax.random.normal(key, shape)
  else:
    magnitude = jnp.full(shape, spec.magnitude, jnp.float32)
  return jnp.clip(magnitude, 0.0, spec.magnitude_max)


def layer_draws(
    keys: jax.Array, spec: augment_spec.RandAugmentSpec
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Each image's RandAugment draws, (B, num_layers) each: the op's index in `spec.ops` (-1 where
  the layer is skipped, probability 1 - `prob`), its magnitude, and whether its sign flips
  (probability 1/2, timm's `_randomly_negate`)."""
  layers = (spec.num_layers,)

  def draws(key):
    choice_key, apply_key, magnitude_key, sign_key = jax.random.split(key, 4)
    choice = jax.random.randint(choice_key, layers, 0, len(spec.ops))
    apply = jax.random.uniform(apply_key, layers) < spec.prob
    magnitude = sample_magnitudes(magnitude_key, spec, layers)
    negate = jax.random.uniform(sign_key, layers) > 0.5
    return jnp.where(apply, choice, -1), magnitude, negate

  return jax.vmap(draws)(keys)


def randaugment(
    images: jax.Array,
    keys: jax.Array,
    spec: augment_spec.RandAugmentSpec,
    fill: tuple[int, int, int],
    bicubic: bool = True,
) -> jax.Array:
  """timm's RandAugment on uint8 (B, H, W, 3) images, image b by `keys[b]` (`layer_draws`): ops
  drawn with replacement, each applied with probability `prob` at a freshly sampled magnitude."""
  names = spec.ops
  choices, magnitudes, negates = layer_draws(keys, spec)
  for layer in range(spec.num_layers):
    level = magnitudes[:, layer] / augment_spec.LEVEL_DENOM
    sign = jnp.where(negates[:, layer], -1.0, 1.0)
    choice = choices[:, layer]
    args = jnp.zeros_like(level)  # Each image's argument for the op it drew.
    for i, name in enumerate(names):
      args = jnp.where(choice == i, augment_spec.level_to_arg(name, level, sign, jnp), args)
    images = apply_ops(images, names, choice, args, jnp.array(fill, jnp.uint8), bicubic)
  return images


def erase_boxes(keys: jax.Array, height: int, width: int) -> tuple[jax.Array, ...]:
  """timm's RandomErasing boxes (top, left, h, w) per key; h = w = 0 if none of the 10 attempts
  fits."""

  def box(key):
    area_key, aspect_key, top_key, left_key = jax.random.split(key, 4)
    n = augment_spec.ERASE_ATTEMPTS
    lo, hi = augment_spec.ERASE_AREA
    area = jax.random.uniform(area_key, (n,), minval=lo, maxval=hi) * float(height * width)
    log_lo, log_hi = (math.log(a) for a in augment_spec.ERASE_ASPECT)
    aspect = jnp.exp(jax.random.uniform(aspect_key, (n,), minval=log_lo, maxval=log_hi))
    box_h, box_w = jnp.round(jnp.sqrt(area * aspect)), jnp.round(jnp.sqrt(area / aspect))
    fits = (box_w < width) & (box_h < height)
    first = jnp.argmax(fits)
    box_h = jnp.where(fits.any(), box_h[first], 0.0)
    box_w = jnp.where(fits.any(), box_w[first], 0.0)
    top = jnp.floor(jax.random.uniform(top_key) * (height - box_h + 1))
    left = jnp.floor(jax.random.uniform(left_key) * (width - box_w + 1))
    return tuple(v.astype(jnp.int32) for v in (top, left, box_h, box_w))

  return jax.vmap(box)(keys)


def random_erase(images: jax.Array, keys: jax.Array, probability: float) -> jax.Array:
  """timm's RandomErasing(mode='pixel', max_count=1) on normalised (B, H, W, C) float images:
  with `probability`, one box (area 2-33 %, log-uniform aspect 0.3-3.3) becomes N(0, 1) noise."""
  batch, height, width, _ = images.shape
  split = jax.vmap(lambda key: jax.random.split(key, 3))(keys)
  apply = jax.vmap(jax.random.uniform)(split[:, 0]) < probability
  top, left, box_h, box_w = erase_boxes(split[:, 1], height, width)
  noise = jax.vmap(lambda key: jax.random.normal(key, images.shape[1:], images.dtype))(split[:, 2])
  rows = jnp.arange(height)[None, :, None]
  cols = jnp.arange(width)[None, None, :]
  in_box = (
      (rows >= _per_image(top, 3))
      & (rows < _per_image(top + box_h, 3))
      & (cols >= _per_image(left, 3))
      & (cols < _per_image(left + box_w, 3))
      & _per_image(apply, 3)
  )
  return jnp.where(in_box[..., None], noise, images)


def normalize(images: jax.Array, normalization: str) -> jax.Array:
  """(image / 255 - mean) / std as one multiply-add per value, float32, as the host normalises
  (`image_ops.normalize`)."""
  mean, std = (np.array(v, np.float64) for v in normalization_lib.mean_std(normalization))
  scale = (1.0 / (255.0 * std)).astype(np.float32)
  offset = (-mean / std).astype(np.float32)
  return images.astype(jnp.float32) * scale + offset


def augment(
    images: jax.Array, key_data: jax.Array, settings: data_settings.BatchAugment
) -> jax.Array:
  """The training batch the model sees from the host's uint8 (B, H, W, 3) crops and their
  (B, 2) uint32 keys: RandAugment, normalisation and random erasing, in timm's order."""
  keys = jax.random.wrap_key_data(key_data, impl='threefry2x32')
  split = jax.vmap(lambda key: jax.random.split(key, 2))(keys)
  if settings.randaugment is not None:
    images = randaugment(
        images,
        split[:, 0],
        settings.randaugment,
        normalization_lib.fill_colour(settings.normalization),
    )
  images = normalize(images, settings.normalization)
  if settings.random_erase_prob > 0:
    images = random_erase(images, split[:, 1], settings.random_erase_prob)
  return images
