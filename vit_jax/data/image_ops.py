"""Image geometry and pixel kernels of preprocessing: RGB, resizes, timm's centre and inception
crops, DeiT III's simple random crop, rounding and normalisation, the large images' as fused XLA
programs (`tf.function(jit_compile=True)`). Images enter as uint8 (H, W, C) and leave as float32."""

import math
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from vit_jax.data import augment

# timm's RandomResizedCrop: area fraction and aspect-ratio ranges, and its number of attempts.
INCEPTION_CROP_AREA = (0.08, 1.0)
INCEPTION_CROP_RATIO = (3 / 4, 4 / 3)
_INCEPTION_CROP_ATTEMPTS = 10


def to_rgb(image: tf.Tensor) -> tf.Tensor:
  """Grayscale is tiled to three channels; an alpha channel is dropped."""
  channels = image.shape[-1]
  if channels == 1:
    return tf.tile(image, [1, 1, 3])
  if channels == 4:
    return image[..., :3]
  return image


def resize(image: tf.Tensor, height: Any, width: Any, clip: bool = True) -> tf.Tensor:
  """Bicubic, antialiased resize to float32 in [0, 255] (a no-op at the same static size);
  `clip=False` leaves the overshoot to the caller. A uint8 image is converted by the kernel."""
  if image.shape[0] == height and image.shape[1] == width:
    return tf.cast(image, tf.float32)
  # Antialiasing changes nothing when upsampling, and the plain kernel is faster.
  upsampling = (
      isinstance(height, int)
      and isinstance(width, int)
      and image.shape[0] is not None
      and image.shape[1] is not None
      and image.shape[0] <= height
      and image.shape[1] <= width
  )
  resized = tf.image.resize(image, [height, width], method='bicubic', antialias=not upsampling)
  return tf.clip_by_value(resized, 0.0, 255.0) if clip else resized


def centre_crop_window(
    height: Any, width: Any, size: int, crop_ratio: float
) -> tuple[Any, Any, Any, Any]:
  """(resized height, resized width, top, left) of timm's eval transform of a height x width image
  (Python ints or int32 tensors): torchvision's `Resize(floor(size / crop_ratio))`, long side
  truncated, then `CenterCrop(size)` at offsets round((resized - size) / 2), halves to even."""
  short = math.floor(size / crop_ratio)
  if isinstance(height, int) and isinstance(width, int):
    long_side = short * max(height, width) // min(height, width)
    resized = (short, long_side) if height <= width else (long_side, short)
    top, left = (round((side - size) / 2) for side in resized)
    return resized[0], resized[1], top, left
  shorter = tf.minimum(height, width)
  long_side = tf.cast(
      short * tf.cast(tf.maximum(height, width), tf.int64) // tf.cast(shorter, tf.int64), tf.int32
  )
  resized_h = tf.where(height <= width, short, long_side)
  resized_w = tf.where(height <= width, long_side, short)
  offset = lambda side: tf.cast(tf.round(tf.cast(side - size, tf.float64) / 2), tf.int32)
  return resized_h, resized_w, offset(resized_h), offset(resized_w)


def _height_width(image: tf.Tensor) -> tuple[Any, Any]:
  """The image's height and width: Python ints where its shape says them, int32 tensors if not."""
  if image.shape[0] is not None and image.shape[1] is not None:
    return image.shape[0], image.shape[1]
  height, width = tf.unstack(tf.shape(image)[:2])
  return height, width


def resize_centre_crop(image: tf.Tensor, size: int, crop_ratio: float) -> tf.Tensor:
  """timm's eval transform (`centre_crop_window`): shorter side to floor(size / crop_ratio), then
  the central size x size."""
  height, width, top, left = centre_crop_window(*_height_width(image), size, crop_ratio)
  image = resize(image, height, width)
  return image[top : top + size, left : left + size]


def inception_crop_box(image_shape: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, ...]:
  """timm's RandomResizedCrop box: (top, left, height, width)."""
  height, width = tf.cast(image_shape[0], tf.float32), tf.cast(image_shape[1], tf.float32)
  area_seed, ratio_seed, top_seed, left_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 4)
  )
  n = _INCEPTION_CROP_ATTEMPTS
  area = height * width * tf.random.stateless_uniform([n], area_seed, *INCEPTION_CROP_AREA)
  log_ratio = tf.random.stateless_uniform(
      [n], ratio_seed, math.log(INCEPTION_CROP_RATIO[0]), math.log(INCEPTION_CROP_RATIO[1])
  )
  ratio = tf.exp(log_ratio)
  crop_w = tf.round(tf.sqrt(area * ratio))
  crop_h = tf.round(tf.sqrt(area / ratio))
  fits = (crop_w > 0) & (crop_h > 0) & (crop_w <= width) & (crop_h <= height)
  # Fallback when no attempt fits: the whole image's centre, aspect clamped to the ratio range.
  in_ratio = width / height
  lo, hi = INCEPTION_CROP_RATIO
  fallback_w = tf.where(in_ratio < lo, width, tf.where(in_ratio > hi, tf.round(height * hi), width))
  fallback_h = tf.where(in_ratio < lo, tf.round(width / lo), height)
  first = tf.argmax(tf.cast(fits, tf.int32))
  any_fits = tf.reduce_any(fits)
  crop_h = tf.where(any_fits, crop_h[first], fallback_h)
  crop_w = tf.where(any_fits, crop_w[first], fallback_w)
  top_u = tf.random.stateless_uniform([], top_seed)
  left_u = tf.random.stateless_uniform([], left_seed)
  top = tf.where(any_fits, tf.floor(top_u * (height - crop_h + 1)), tf.floor((height - crop_h) / 2))
  left = tf.where(any_fits, tf.floor(left_u * (width - crop_w + 1)), tf.floor((width - crop_w) / 2))
  return tuple(tf.cast(v, tf.int32) for v in (top, left, crop_h, crop_w))


def _normalize_pixels(image: tf.Tensor, scale: tf.Tensor, offset: tf.Tensor) -> tf.Tensor:
  return tf.cast(image, tf.float32) * scale + offset


def _round_pixels(image: tf.Tensor) -> tf.Tensor:
  return tf.cast(tf.round(tf.clip_by_value(image, 0.0, 255.0)), tf.uint8)


# One fused XLA loop per image shape: TensorFlow's kernels would write the image once per op.
_COMPILED_NORMALIZE = tf.function(_normalize_pixels, jit_compile=True, autograph=False)
_COMPILED_ROUND = tf.function(_round_pixels, jit_compile=True, autograph=False)
# Below this many pixels TensorFlow's kernels do it: calling an XLA program costs more than their
# extra passes over a small image (the digits are 16x16).
_COMPILED_MIN_PIXELS = 96 * 96


def _compiled(image: tf.Tensor) -> bool:
  """True if `image` is large enough for the fused XLA programs (`_COMPILED_MIN_PIXELS`)."""
  return image.shape.is_fully_defined() and image.shape[0] * image.shape[1] >= _COMPILED_MIN_PIXELS


def whole_pixels(image: tf.Tensor) -> tf.Tensor:
  """A float image as whole uint8 values: clipped to [0, 255], rounded half to even."""
  if not _compiled(image):
    return _round_pixels(image)
  augment.ignore_jax_xla_flags()
  return _COMPILED_ROUND(image)


def _transpose_pixels(image: tf.Tensor) -> tf.Tensor:
  return tf.transpose(image, [1, 0, 2])


def _mirrored(image: tf.Tensor, flip: tf.Tensor) -> tf.Tensor:
  """`image` mirrored left-right where the scalar `flip` is true."""
  return tf.where(flip, tf.reverse(image, [1]), image)


def _transpose_whole_pixels(image: tf.Tensor, flip: tf.Tensor) -> tf.Tensor:
  return _mirrored(_round_pixels(_transpose_pixels(image)), flip)


def _transpose_clipped(image: tf.Tensor, flip: tf.Tensor) -> tf.Tensor:
  return _mirrored(tf.clip_by_value(_transpose_pixels(image), 0.0, 255.0), flip)


# Transpositions of (H, W, 3) float images: XLA's loops beat TensorFlow's generic transpose kernel.
_COMPILED_TRANSPOSE = tf.function(_transpose_pixels, jit_compile=True, autograph=False)
_COMPILED_TRANSPOSE_WHOLE = tf.function(_transpose_whole_pixels, jit_compile=True, autograph=False)
_COMPILED_TRANSPOSE_CLIPPED = tf.function(_transpose_clipped, jit_compile=True, autograph=False)
# A crop's width is padded up to a multiple of this (from 512 pixels on, of an eighth of its power
# of two), so that its transposition compiles for a few widths rather than for every one.
_TRANSPOSE_WIDTH_STEP = 32


def _transpose_width(width: tf.Tensor) -> tf.Tensor:
  """`width` rounded up to the next padded width (`_TRANSPOSE_WIDTH_STEP`)."""
  octave = tf.cast(tf.math.floor(tf.math.log(tf.cast(width, tf.float32)) / math.log(2.0)), tf.int32)
  step = tf.maximum(_TRANSPOSE_WIDTH_STEP, tf.bitwise.left_shift(1, tf.maximum(octave - 3, 0)))
  return (width + step - 1) // step * step


def _resize_rows(image: tf.Tensor, size: int) -> tf.Tensor:
  """The first (vertical) pass of `resize`'s kernel alone: the rows of a (H, W, C) image resized
  to `size`, as float32; every column is resized on its own."""
  shape = tf.shape(image)
  rows = tf.reshape(image, [1, shape[0], 1, shape[1] * shape[2]])
  in_size = tf.cast(tf.stack([shape[0], 1]), tf.float32)
  resized = tf.raw_ops.ScaleAndTranslate(
      images=rows,
      size=tf.constant([size, 1]),
      scale=tf.constant([size, 1], tf.float32) / in_size,
      translation=tf.zeros([2]),
      kernel_type='keyscubic',
      antialias=True,
  )
  return tf.reshape(resized, [size, shape[1], shape[2]])


def resize_crop(
    image: tf.Tensor, size: int, whole: bool, flip: tf.Tensor | None = None
) -> tf.Tensor:
  """`resize` of a crop to size x size, bit for bit, clipped; `whole` rounds it as `whole_pixels`;
  mirrored where `flip`. Both passes run vertically (TensorFlow's horizontal pass goes one pixel
  at a time), the image transposed in between and after, same weights in the same order."""
  flip = tf.constant(False) if flip is None else flip
  if image.shape[:2].is_fully_defined() or size * size < _COMPILED_MIN_PIXELS:
    resized = tf.ensure_shape(resize(image, size, size, clip=not whole), [size, size, None])
    return _mirrored(whole_pixels(resized) if whole else resized, flip)
  augment.ignore_jax_xla_flags()
  width = tf.shape(image)[1]
  padded = tf.pad(image, [[0, 0], [0, _transpose_width(width) - width], [0, 0]])
  columns = _COMPILED_TRANSPOSE(_resize_rows(padded, size))[:width]
  transposed = tf.ensure_shape(_resize_rows(columns, size), [size, size, None])
  return (_COMPILED_TRANSPOSE_WHOLE if whole else _COMPILED_TRANSPOSE_CLIPPED)(transposed, flip)


def normalize(image: tf.Tensor, mean: Sequence[float], std: Sequence[float]) -> tf.Tensor:
  """(image / 255 - mean) / std of a uint8 or float image, as one multiply-add per value."""
  mean64, std64 = (np.array(v, np.float64) for v in (mean, std))
  scale, offset = (tf.constant(v, tf.float32) for v in (1.0 / (255.0 * std64), -mean64 / std64))
  if not _compiled(image):
    return _normalize_pixels(image, scale, offset)
  augment.ignore_jax_xla_flags()
  return _COMPILED_NORMALIZE(image, scale, offset)


def decode(image: tf.Tensor) -> tf.Tensor:
  """uint8 RGB (H, W, 3) from an image (any channel count) or its encoded bytes."""
  if image.dtype == tf.string:
    return tf.io.decode_image(image, channels=3, expand_animations=False)
  return to_rgb(image)


def inception_crop(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """The `inception_crop_box` window of `image`; of an encoded JPEG only that window is decoded, a
  few edge pixels a few levels off a full decode's (chroma upsampling)."""

  def crop(decoded):
    top, left, height, width = inception_crop_box(tf.shape(decoded), seed)
    return decoded[top : top + height, left : left + width]

  if image.dtype != tf.string:
    return crop(to_rgb(image))

  def jpeg_window():
    window = tf.stack(inception_crop_box(tf.io.extract_jpeg_shape(image), seed))
    return tf.io.decode_and_crop_jpeg(image, window, channels=3)

  return tf.cond(tf.io.is_jpeg(image), jpeg_window, lambda: crop(decode(image)))


def simple_random_crop(image: tf.Tensor, seed: tf.Tensor, size: int, padding: int) -> tf.Tensor:
  """DeiT III's simple random crop (deit augment.py, `--src`): torchvision's `Resize(size)` of the
  shorter side, then `RandomCrop(size, padding, padding_mode='reflect')`."""
  height, width, _, _ = centre_crop_window(*_height_width(image), size, 1.0)
  image = resize(image, height, width)
  if padding:
    image = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]], mode='REFLECT')
  return tf.image.stateless_random_crop(image, [size, size, 3], seed)
