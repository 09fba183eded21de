"""The DeiT recipes' augmentations (Touvron et al. 2021, Table 9; DeiT III 2022, Section 3), with
timm's and deit's semantics, seeded and stateless.

RandAugment, random erasing, DeiT III's 3-Augment and colour jitter act on one image in the
tf.data pipeline, keyed by a stateless seed (Mixup / CutMix: `vit_jax.data.mixing`). RandAugment
ops work on uint8 RGB images of static shape with PIL's conventions (what timm runs):
affine ops sample at output pixel centres, fill outside the image with the mean colour, and
interpolate bicubically (cubic convolution, a = -1) or bilinearly with edge clamping. Each op is
one XLA program per image shape, compiled on first use; the random draws stay TensorFlow kernels,
whose values XLA would not reproduce.
"""

import functools
import math
import os

import tensorflow as tf

from vit_jax.schema import augment_spec

INTERPOLATIONS = ('bicubic', 'bilinear', 'random')


def level_to_arg(name: str, magnitude: tf.Tensor, negate: tf.Tensor) -> tf.Tensor:
  """timm's LEVEL_TO_ARG: the op argument for `magnitude` in [0, 10]; `negate` flips its sign."""
  # Double, as timm's Python floats.
  level = tf.cast(magnitude, tf.float64) / augment_spec.LEVEL_DENOM
  sign = tf.where(negate, tf.constant(-1.0, tf.float64), tf.constant(1.0, tf.float64))
  return tf.convert_to_tensor(augment_spec.level_to_arg(name, level, sign, tf.experimental.numpy))


# Pixel ops on uint8 (H, W, 3) images, as PIL computes them.


def _grayscale(image: tf.Tensor) -> tf.Tensor:
  """PIL's RGB -> L conversion (ITU-R 601-2 luma, 16-bit fixed point)."""
  rgb = tf.cast(image, tf.int32)
  luma = tf.bitwise.right_shift(
      rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + 0x8000, 16
  )
  return luma[..., None]


def _blend(degenerate: tf.Tensor, image: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
  """PIL's Image.blend(degenerate, image, factor), the core of every ImageEnhance op."""
  # As PIL: computed in double, stored as float, truncated.
  degenerate = tf.cast(degenerate, tf.float64)
  mixed = degenerate + tf.cast(factor, tf.float64) * (tf.cast(image, tf.float64) - degenerate)
  return tf.cast(tf.clip_by_value(tf.cast(mixed, tf.float32), 0.0, 255.0), tf.uint8)


def _lut(image: tf.Tensor, table: tf.Tensor) -> tf.Tensor:
  """Applies a per-channel lookup table of shape (256,) or (3, 256)."""
  table = tf.cast(tf.clip_by_value(table, 0, 255), tf.uint8)
  if table.shape.rank == 1:
    return tf.gather(table, tf.cast(image, tf.int32))
  return tf.stack([tf.gather(table[c], tf.cast(image[..., c], tf.int32)) for c in range(3)], -1)


def _histograms(image: tf.Tensor) -> tf.Tensor:
  """(3, 256) per-channel histograms."""
  # A segment sum of fixed size: XLA would compile tf.math.bincount afresh for every image.
  bins = tf.cast(image, tf.int32) + tf.constant([0, 256, 512])
  counts = tf.math.unsorted_segment_sum(tf.ones_like(bins), bins, 3 * 256)
  return tf.reshape(counts, [3, 256])


def _auto_contrast(image: tf.Tensor) -> tf.Tensor:
  """ImageOps.autocontrast (cutoff 0): stretch each channel's [min, max] to [0, 255]."""
  flat = tf.reshape(tf.cast(image, tf.float32), [-1, 3])
  lo, hi = tf.reduce_min(flat, 0)[:, None], tf.reduce_max(flat, 0)[:, None]
  scale = 255.0 / tf.maximum(hi - lo, 1.0)
  values = tf.range(256, dtype=tf.float32)[None]
  stretched = tf.clip_by_value(tf.floor(values * scale - lo * scale), 0.0, 255.0)
  return _lut(image, tf.where(hi > lo, stretched, values))


def _equalize(image: tf.Tensor) -> tf.Tensor:
  """ImageOps.equalize: per channel, map values through the normalised cumulative histogram."""
  histogram = _histograms(image)
  nonzero = histogram > 0
  last_nonzero = tf.gather(
      histogram,
      255 - tf.argmax(tf.reverse(tf.cast(nonzero, tf.int32), [1]), axis=1, output_type=tf.int32),
      batch_dims=1,
  )
  step = (tf.reduce_sum(histogram, 1) - last_nonzero) // 255
  before = tf.cumsum(histogram, axis=1, exclusive=True)
  table = (step[:, None] // 2 + before) // tf.maximum(step[:, None], 1)
  identity = tf.broadcast_to(tf.range(256), [3, 256])
  keep = (tf.reduce_sum(tf.cast(nonzero, tf.int32), 1) <= 1) | (step == 0)
  return _lut(image, tf.where(keep[:, None], identity, table))


def _posterize(image: tf.Tensor, bits: tf.Tensor) -> tf.Tensor:
  """ImageOps.posterize: keep the `bits` most significant bits (8 or more: unchanged)."""
  bits = tf.cast(bits, tf.int32)
  mask = tf.bitwise.invert(tf.bitwise.left_shift(1, 8 - tf.minimum(bits, 8)) - 1)
  return tf.where(
      bits >= 8, image, tf.cast(tf.bitwise.bitwise_and(tf.cast(image, tf.int32), mask), tf.uint8)
  )


def _solarize(image: tf.Tensor, threshold: tf.Tensor) -> tf.Tensor:
  values, threshold = tf.cast(image, tf.float32), tf.cast(threshold, tf.float32)
  return tf.cast(tf.where(values < threshold, values, 255.0 - values), tf.uint8)


def _solarize_add(image: tf.Tensor, add: tf.Tensor) -> tf.Tensor:
  values, add = tf.cast(image, tf.float32), tf.cast(add, tf.float32)
  return tf.cast(tf.where(values < 128.0, tf.minimum(255.0, values + add), values), tf.uint8)


def _smooth(image: tf.Tensor) -> tf.Tensor:
  """ImageFilter.SMOOTH: 3x3 kernel [[1,1,1],[1,5,1],[1,1,1]] / 13, border pixels kept."""
  height, width = image.shape[0], image.shape[1]
  if height < 3 or width < 3:
    return image
  values = tf.cast(image, tf.int32)
  window = 4 * values[1:-1, 1:-1]
  for dy in range(3):
    for dx in range(3):
      window += values[dy : dy + height - 2, dx : dx + width - 2]
  # round(window / 13), in integers: the sum is exact and no quotient is a tie.
  smoothed = tf.cast((2 * window + 13) // 26, tf.uint8)
  rows, cols = tf.range(height)[:, None], tf.range(width)[None, :]
  interior = (rows > 0) & (rows < height - 1) & (cols > 0) & (cols < width - 1)
  return tf.where(interior[..., None], tf.pad(smoothed, [[1, 1], [1, 1], [0, 0]]), image)


def _cubic_weights(t: tf.Tensor) -> tf.Tensor:
  """PIL's affine bicubic: cubic convolution with a = -1, taps at offsets -1, 0, 1, 2 from floor."""
  a = -1.0

  def near(x):  # |x| <= 1
    return ((a + 2) * x - (a + 3)) * x * x + 1

  def far(x):  # 1 < |x| < 2
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

  return tf.stack([far(1 + t), near(t), near(1 - t), far(2 - t)], -1)


def _affine(
    image: tf.Tensor,
    matrix: tuple[tf.Tensor, ...],
    fill: tf.Tensor,
    bicubic: bool | tf.Tensor,
    along: str = 'xy',
) -> tf.Tensor:
  """PIL's Image.transform(AFFINE, matrix) at pixel centres, `fill` outside the image; `along` =
  'x' ('y'): the map keeps every row (column), so only that axis is interpolated."""
  a, b, c, d, e, f = (tf.cast(v, tf.float64) for v in matrix)  # PIL works in double.
  shape = tf.shape(image)
  height, width = shape[0], shape[1]
  ys, xs = tf.meshgrid(
      tf.range(height, dtype=tf.float64) + 0.5,
      tf.range(width, dtype=tf.float64) + 0.5,
      indexing='ij',
  )
  x_in = a * xs + b * ys + c
  y_in = d * xs + e * ys + f
  w_f, h_f = tf.cast(width, tf.float64), tf.cast(height, tf.float64)
  inside = (x_in >= 0) & (x_in < w_f) & (y_in >= 0) & (y_in < h_f)
  x_in, y_in = x_in - 0.5, y_in - 0.5
  x0, y0 = tf.floor(x_in), tf.floor(y_in)
  tx, ty = x_in - x0, y_in - y0
  flat = tf.reshape(tf.cast(image, tf.float32), [-1, 3])

  def taps(start, t, size, cubic, interpolate):
    """Tap indices (H, W, k) and weights (H, W, k) along one axis."""
    if not interpolate:
      return tf.cast(start, tf.int32)[..., None], tf.ones_like(t, tf.float32)[..., None]
    offsets = tf.constant([-1, 0, 1, 2] if cubic else [0, 1])
    index = tf.clip_by_value(tf.cast(start, tf.int32)[..., None] + offsets, 0, size - 1)
    weights = _cubic_weights(t) if cubic else tf.stack([1 - t, t], -1)
    return index, tf.cast(weights, tf.float32)

  def sample(cubic):
    xi, wx = taps(x0, tx, width, cubic, 'x' in along)
    yi, wy = taps(y0, ty, height, cubic, 'y' in along)
    pixels = tf.gather(flat, yi[..., :, None] * width + xi[..., None, :])  # (H, W, ky, kx, 3)
    return tf.reduce_sum(tf.reduce_sum(pixels * wx[..., None, :, None], 3) * wy[..., None], 2)

  if isinstance(bicubic, bool):
    result = sample(bicubic)
  else:
    result = tf.cond(bicubic, lambda: sample(True), lambda: sample(False))
  result = tf.cast(tf.clip_by_value(result, 0.0, 255.0), tf.uint8)  # PIL truncates.
  return tf.where(inside[..., None], result, tf.broadcast_to(fill, tf.shape(result)))


def _rotate_matrix(degrees: tf.Tensor, height: tf.Tensor, width: tf.Tensor):
  """Inverse map of PIL's Image.rotate(degrees) about the image centre (counter-clockwise)."""
  angle = -degrees * math.pi / 180.0
  cos, sin = tf.cos(angle), tf.sin(angle)
  cx, cy = tf.cast(width, tf.float64) / 2.0, tf.cast(height, tf.float64) / 2.0
  return (cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy)


def _pixel_op(
    name: str, image: tf.Tensor, arg: tf.Tensor, fill: tf.Tensor, bicubic: bool | tf.Tensor
) -> tf.Tensor:
  """The pixel work of `apply_op`, on an image of static shape."""
  height, width = image.shape[0], image.shape[1]
  one, zero = tf.constant(1.0, tf.float64), tf.constant(0.0, tf.float64)
  if name == 'AutoContrast':
    return _auto_contrast(image)
  if name == 'Equalize':
    return _equalize(image)
  if name == 'Invert':
    return 255 - image
  if name.startswith('Posterize'):
    return _posterize(image, arg)
  if name.startswith('SolarizeAdd'):
    return _solarize_add(image, arg)
  if name.startswith('Solarize'):
    return _solarize(image, arg)
  if name.startswith('Color'):
    return _blend(tf.tile(_grayscale(image), [1, 1, 3]), image, arg)
  if name.startswith('Contrast'):
    gray = tf.cast(_grayscale(image), tf.float64)
    mean = tf.floor(tf.reduce_mean(gray) + 0.5)
    return _blend(tf.fill(tf.shape(image), mean), image, arg)
  if name.startswith('Brightness'):
    return _blend(tf.zeros_like(image), image, arg)
  if name.startswith('Sharpness'):
    return _blend(_smooth(image), image, arg)
  if name == 'Rotate':
    return _affine(image, _rotate_matrix(arg, height, width), fill, bicubic)
  if name == 'ShearX':
    return _affine(image, (one, arg, zero, zero, one, zero), fill, bicubic, along='x')
  if name == 'ShearY':
    return _affine(image, (one, zero, zero, arg, one, zero), fill, bicubic, along='y')
  if name == 'TranslateXRel':
    return _affine(image, (one, zero, arg * width, zero, one, zero), fill, bicubic, along='x')
  assert name == 'TranslateYRel', name
  return _affine(image, (one, zero, zero, zero, one, arg * height), fill, bicubic, along='y')


# One XLA program per op and image shape: fused, the per-pixel work of the geometric ops costs a
# fifth of what TensorFlow's kernels spend on it, one op at a time, and every op gets cheaper.
_COMPILED_OPS = {
    name: tf.function(functools.partial(_pixel_op, name), jit_compile=True, autograph=False)
    for name in sorted(set(augment_spec.RAND_OPS + augment_spec.RAND_INCREASING_OPS))
}


@functools.cache
def ignore_jax_xla_flags() -> None:
  """Has TensorFlow's XLA, which aborts on JAX's XLA_FLAGS it does not know, read its flags (once,
  at its first compilation, triggered here) while XLA_FLAGS is unset."""
  jax_flags = os.environ.pop('XLA_FLAGS', None)
  try:
    tf.function(lambda: tf.zeros([]), jit_compile=True)()
  finally:
    if jax_flags is not None:
      os.environ['XLA_FLAGS'] = jax_flags


def apply_op(
    name: str,
    image: tf.Tensor,
    arg: tf.Tensor,
    fill: tf.Tensor | tuple[int, int, int],
    bicubic: bool | tf.Tensor,
) -> tf.Tensor:
  """timm's NAME_TO_OP[name](image, arg) on a uint8 (H, W, 3) image of static shape."""
  if name not in _COMPILED_OPS:
    raise ValueError(f'Unknown RandAugment op {name!r}; valid: {sorted(_COMPILED_OPS)}.')
  if not image.shape.is_fully_defined():
    raise ValueError(
        f'RandAugment needs an image of static shape, got {image.shape}; resize or '
        'crop to a fixed size first.'
    )
  ignore_jax_xla_flags()
  return _COMPILED_OPS[name](image, tf.cast(arg, tf.float64), tf.cast(fill, tf.uint8), bicubic)


def sample_magnitude(seed: tf.Tensor, spec: augment_spec.RandAugmentSpec) -> tf.Tensor:
  """One op's magnitude: N(m, mstd) (or U(0, m) if mstd is inf), clipped to [0, mmax]."""
  if spec.magnitude_std == math.inf:
    magnitude = tf.random.stateless_uniform([], seed, 0.0, spec.magnitude)
  elif spec.magnitude_std > 0:
    magnitude = spec.magnitude + spec.magnitude_std * tf.random.stateless_normal([], seed)
  else:
    magnitude = tf.constant(spec.magnitude, tf.float32)
  return tf.clip_by_value(magnitude, 0.0, spec.magnitude_max)


@tf.autograph.experimental.do_not_convert
def randaugment(
    image: tf.Tensor,
    seed: tf.Tensor,
    spec: augment_spec.RandAugmentSpec,
    *,
    fill: tuple[int, int, int],
    interpolation: str = 'bicubic',
) -> tf.Tensor:
  """timm's RandAugment on one uint8 (H, W, 3) image of static shape: `num_layers` ops drawn with
  replacement, each applied with probability `prob`; `interpolation` 'random' is timm's default."""
  if interpolation not in INTERPOLATIONS:
    raise ValueError(f'Unknown interpolation {interpolation!r}; valid: {INTERPOLATIONS}.')
  fill = tf.constant(fill, tf.uint8)
  ops = spec.ops

  def layer(index, image):
    choice_seed, apply_seed, magnitude_seed, sign_seed, resample_seed = tf.unstack(
        tf.random.experimental.stateless_split(
            tf.random.experimental.stateless_fold_in(seed, index), 5
        )
    )
    choice = tf.random.stateless_uniform([], choice_seed, 0, len(ops), dtype=tf.int32)
    apply = tf.random.stateless_uniform([], apply_seed) < spec.prob
    magnitude = sample_magnitude(magnitude_seed, spec)
    negate = tf.random.stateless_uniform([], sign_seed) > 0.5
    if interpolation == 'random':
      bicubic = tf.random.stateless_uniform([], resample_seed) < 0.5
    else:
      bicubic = interpolation == 'bicubic'
    branches = [
        (
            lambda name=name: apply_op(
                name, image, level_to_arg(name, magnitude, negate), fill, bicubic
            )
        )
        for name in ops
    ]
    augmented = tf.cond(apply, lambda: tf.switch_case(choice, branches), lambda: image)
    return index + 1, tf.ensure_shape(augmented, image.shape)

  # One traced layer, looped: the graph holds each op once however many layers there are.
  _, image = tf.while_loop(lambda index, _: index < spec.num_layers, layer, (tf.constant(0), image))
  return image


# DeiT III's 3-Augment and colour jitter (deit augment.py `new_data_aug_generator`), on one uint8
# (H, W, 3) image of static shape, after the crop and flip.

# torchvision's RandomChoice over deit's gray_scale, Solarization and GaussianBlur (each p=1).
THREE_AUGMENT_OPS = ('grayscale', 'solarize', 'gaussian_blur')
SOLARIZE_THRESHOLD = 128  # ImageOps.solarize's default: values >= 128 are inverted.
BLUR_SIGMA = (0.1, 2.0)  # deit GaussianBlur's radius range; PIL's radius is the Gaussian's sigma.
_BLUR_PASSES = 3  # PIL approximates a Gaussian by three box blurs along each axis.


def _box_radius(sigma: tf.Tensor) -> tf.Tensor:
  """Pillow's `_gaussian_blur_radius` (BoxBlur.c): the fractional box radius whose three passes
  have the variance sigma^2, in C's float32."""
  sigma2 = tf.square(tf.cast(sigma, tf.float32)) / _BLUR_PASSES
  length = tf.sqrt(12.0 * sigma2 + 1.0)
  whole = tf.floor((length - 1.0) / 2.0)
  part = (2 * whole + 1) * (whole * (whole + 1) - 3 * sigma2)
  return whole + part / (6 * (sigma2 - (whole + 1) * (whole + 1)))


# Taps each side: a box's whole radius r stays below sigma (three passes: r (r + 1) <= sigma^2),
# plus the one fractionally weighted pixel beyond it.
_BLUR_HALF_WIDTH = math.floor(BLUR_SIGMA[1]) + 1


def gaussian_blur(image: tf.Tensor, sigma: tf.Tensor) -> tf.Tensor:
  """PIL's `ImageFilter.GaussianBlur(radius=sigma)` on a uint8 image, bit for bit (Pillow's
  BoxBlur.c): three box blurs of fractional radius along the rows, then three along the columns,
  edge pixels extended, in 8.24 fixed point, rounded to uint8 after every pass."""
  radius = _box_radius(sigma)
  whole = tf.cast(tf.floor(radius), tf.int64)
  inner = tf.floor(tf.constant(float(1 << 24)) / (radius * 2 + 1))  # `ww`, float32 as in C.
  inner = tf.cast(inner, tf.int64)
  outer = ((1 << 24) - (whole * 2 + 1) * inner) // 2  # `fw`: the two pixels just outside.
  offsets = tf.range(-_BLUR_HALF_WIDTH, _BLUR_HALF_WIDTH + 1, dtype=tf.int64)
  distance = tf.abs(offsets)
  weights = tf.where(distance <= whole, inner, tf.where(distance == whole + 1, outer, 0))
  values = tf.cast(image, tf.int64)
  for axis in (1, 0):
    size = image.shape[axis]
    taps = tf.clip_by_value(tf.range(size, dtype=tf.int64)[:, None] + offsets[None], 0, size - 1)
    shape = [1, 1, 1, 1]
    shape[axis + 1] = -1
    for _ in range(_BLUR_PASSES):
      gathered = tf.gather(values, taps, axis=axis)  # Axis `axis` becomes (size, taps).
      bulk = tf.reduce_sum(gathered * tf.reshape(weights, shape), axis=axis + 1)
      values = tf.bitwise.right_shift(bulk + (1 << 23), 24)
  return tf.cast(values, tf.uint8)


def three_augment_params(seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """The op (`THREE_AUGMENT_OPS` index, uniform) and the blur's sigma (uniform in BLUR_SIGMA)."""
  choice_seed, sigma_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  choice = tf.random.stateless_uniform([], choice_seed, 0, len(THREE_AUGMENT_OPS), dtype=tf.int32)
  return choice, tf.random.stateless_uniform([], sigma_seed, *BLUR_SIGMA)


@tf.autograph.experimental.do_not_convert
def three_augment(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """3-Augment (DeiT III Section 3): one of grayscale (PIL's luma, tiled to RGB), solarization
  (threshold 128) or Gaussian blur (sigma uniform in [0.1, 2]), chosen uniformly."""
  choice, sigma = three_augment_params(seed)
  branches = [
      lambda: tf.tile(tf.cast(_grayscale(image), tf.uint8), [1, 1, 3]),
      lambda: _solarize(image, SOLARIZE_THRESHOLD),
      lambda: gaussian_blur(image, sigma),
  ]
  return tf.ensure_shape(tf.switch_case(choice, branches), image.shape)


# torchvision ColorJitter's adjustments of a PIL image: ImageEnhance Brightness, Contrast, Color.
COLOR_JITTER_OPS = ('Brightness', 'Contrast', 'Color')


def color_jitter_params(seed: tf.Tensor, strength: float) -> tuple[tf.Tensor, tf.Tensor]:
  """torchvision ColorJitter(strength, strength, strength).get_params: a random order of the
  three adjustments (`COLOR_JITTER_OPS` indices) and each one's factor, uniform in
  [max(0, 1 - strength), 1 + strength]."""
  order_seed, factor_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  keys = tf.random.stateless_uniform([len(COLOR_JITTER_OPS)], order_seed)
  order = tf.argsort(keys)
  factors = tf.random.stateless_uniform(
      [len(COLOR_JITTER_OPS)], factor_seed, max(0.0, 1.0 - strength), 1.0 + strength
  )
  return order, factors


def enhance(image: tf.Tensor, op: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
  """Adjustment `COLOR_JITTER_OPS[op]` of a uint8 image by `factor`, as PIL's ImageEnhance."""
  branches = [
      lambda name=name: apply_op(name, image, factor, (0, 0, 0), False) for name in COLOR_JITTER_OPS
  ]
  return tf.ensure_shape(tf.switch_case(op, branches), image.shape)


@tf.autograph.experimental.do_not_convert
def color_jitter(image: tf.Tensor, seed: tf.Tensor, strength: float) -> tf.Tensor:
  """torchvision ColorJitter(brightness=strength, contrast=strength, saturation=strength) on a
  uint8 (H, W, 3) image: the three adjustments in a random order (`color_jitter_params`)."""
  order, factors = color_jitter_params(seed, strength)
  for position in range(len(COLOR_JITTER_OPS)):
    image = enhance(image, order[position], factors[order[position]])
  return image


# Random erasing, on one normalised float image.


def erase_box(seed: tf.Tensor, height: int, width: int) -> tuple[tf.Tensor, ...]:
  """timm's RandomErasing box (top, left, h, w); h = w = 0 if none of the 10 attempts fits."""
  area_seed, aspect_seed, top_seed, left_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 4)
  )
  n = augment_spec.ERASE_ATTEMPTS
  area = tf.random.stateless_uniform([n], area_seed, *augment_spec.ERASE_AREA)
  area = area * float(height * width)
  log_lo, log_hi = (math.log(a) for a in augment_spec.ERASE_ASPECT)
  aspect = tf.exp(tf.random.stateless_uniform([n], aspect_seed, log_lo, log_hi))
  box_h = tf.round(tf.sqrt(area * aspect))
  box_w = tf.round(tf.sqrt(area / aspect))
  fits = (box_w < width) & (box_h < height)
  first = tf.argmax(tf.cast(fits, tf.int32))
  any_fits = tf.reduce_any(fits)
  box_h = tf.where(any_fits, box_h[first], 0.0)
  box_w = tf.where(any_fits, box_w[first], 0.0)
  top = tf.floor(tf.random.stateless_uniform([], top_seed) * (height - box_h + 1))
  left = tf.floor(tf.random.stateless_uniform([], left_seed) * (width - box_w + 1))
  return tuple(tf.cast(v, tf.int32) for v in (top, left, box_h, box_w))


@tf.autograph.experimental.do_not_convert
def random_erase(image: tf.Tensor, seed: tf.Tensor, probability: float) -> tf.Tensor:
  """timm's RandomErasing(mode='pixel', max_count=1) on a normalised (H, W, C) float image:
  with `probability`, one box (area 2-33 %, log-uniform aspect 0.3-3.3) becomes N(0, 1) noise,
  drawn for the box alone (as timm draws it)."""
  apply_seed, box_seed, noise_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
  height, width, channels = image.shape

  def erase():
    top, left, box_h, box_w = erase_box(box_seed, height, width)
    noise = tf.random.stateless_normal([box_h, box_w, channels], noise_seed, dtype=image.dtype)
    # Assembled around the box: one copy of the image, no full-size mask or padded noise.
    band = image[top : top + box_h]
    band = tf.concat([band[:, :left], noise, band[:, left + box_w :]], 1)
    return tf.ensure_shape(tf.concat([image[:top], band, image[top + box_h :]], 0), image.shape)

  return tf.cond(tf.random.stateless_uniform([], apply_seed) < probability, erase, lambda: image)
