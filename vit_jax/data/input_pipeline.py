"""Input pipelines: any TFDS image-classification dataset, `digits` or an image folder, as batches.

Every dataset goes through one path: a `tfds` builder, its per-process sub-split
(`tfds.split_for_jax_process`), then `tf.data` preprocessing that is identical for all datasets.

Training reads examples by index. Stream position p (counted over the process's batches, so step k
starts at position k * B) holds draw d = p // repeated_aug; epoch e = d // N of the process's N
examples is a permutation drawn with `tf.random.experimental.index_shuffle` seeded by (seed,
process, e), and all augmentation is stateless, keyed by (seed, process, p). Batch k is therefore a
pure function of (seed, process, k): `start_step=k` reads exactly the records of batch k onwards and
yields the batches an uninterrupted run would have seen, at the same cost for every k. Records come
from one of two random-access sources, chosen by `_random_access`:
* ArrayRecord (`tfds.data_source`): the embedded digits, image folders, TFDS datasets that
  vit_jax prepares itself, and TFRecord datasets converted with `python -m vit_jax.convert`.
  Records are read in chunks by a `tf.data` map (`tf.numpy_function`), then parsed, decoded and
  augmented by `tf.data`'s parallel map; an inception crop without repeated augmentation decodes
  only the crop window of a JPEG (`decodes_crop_window`).
* In memory: a split whose images have a fixed shape and fit in `IN_MEMORY_MAX_BYTES` decoded (the
  digits, CIFAR, MNIST) is decoded once and held as one array, and each training example is then
  looked up, augmented and normalised in one `tf.data` map (for a TFRecord-only dataset,
  `--config.in_memory=true/false` forces either way). An ArrayRecord split whose inception crops
  decode only the crop window stays encoded, on the ArrayRecord path.
A TFRecord-only dataset that fits neither (e.g. an ImageNet prepared as TFRecord) is streamed
instead: seeded file order and shuffle buffer, the same stateless augmentation, and `start_step`
reads and discards every record consumed before, in an order only approximately the original; a
log line says so and how to convert it.

A training image is resized to image_size (or inception-cropped to it), cropped and flipped per
`augment`, RandAugmented (`randaugment`, e.g. 'rand-m9-mstd0.5-inc1') and/or given DeiT III's
3-Augment (`three_augment`) and colour jitter (`color_jitter`), normalised, then randomly erased
(`random_erase_prob`), as timm and deit order them: `TrainTransform`, built once from the run
config; evaluation and prediction use `EvalTransform`. Mixup/CutMix run on device
(`mixing.mix_batch`). The config fields and their defaults are declared in `vit_jax.config`.
"""

import dataclasses
import math
import os
import socket
import threading
import time
from typing import Any, Callable, Iterator, Sequence
import urllib.parse
import urllib.request

from absl import logging
import jax
import ml_collections
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax import runtime
from vit_jax.data import augment
from vit_jax.data import convert
from vit_jax.data import digits
from vit_jax.data import folder
from vit_jax.data import storage

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

# 'simple_random_crop': DeiT III's (deit `--src`): shorter side to image_size, reflect padding,
# a random image_size crop.
AUGMENTS = ('crop_flip', 'inception_crop', 'simple_random_crop', 'none')
IN_MEMORY_MAX_BYTES = 1024**3
# timm's RandomResizedCrop: area fraction and aspect-ratio ranges, and its number of attempts.
INCEPTION_CROP_AREA = (0.08, 1.0)
INCEPTION_CROP_RATIO = (3 / 4, 4 / 3)
_INCEPTION_CROP_ATTEMPTS = 10
# How long a dataset's download host may take to accept a connection before the download is
# deemed unable to start (TFDS's own retries take minutes to give up).
DOWNLOAD_PROBE_SECONDS = 5.0
# Salts that keep the shuffle and augmentation random streams apart.
_SHUFFLE_SALT, _AUGMENT_SALT = 0, 1
# Training images preprocessed at once per CPU. A parallel map hands out its results in order, and
# AUTOTUNE keeps at most one image per CPU in flight: one slow image (a rotation, an erasure) would
# leave the other CPUs idle until it is done. The extra calls wait in the thread pool's queue.
_PREPROCESS_CALLS_PER_CPU = 4


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
    if np.allclose(mean, known_mean, atol=1e-4) and np.allclose(std, known_std, atol=1e-4):
      return name
  return '/'.join(','.join(repr(float(v)) for v in values) for values in (mean, std))


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What training needs to know about a dataset before building anything."""

  name: str
  num_classes: int
  num_train_examples: int
  num_eval_examples: int
  image_size: int
  class_names: tuple[str, ...]  # Index -> name: TFDS label names, folder names, digits '0'..'9'.


@dataclasses.dataclass(frozen=True)
class _Source:
  """A resolved dataset: its builder and the feature keys of image and label."""

  builder: tfds.core.DatasetBuilder
  image_key: str
  label_key: str
  label_set_key: str | None = None  # A Sequence(ClassLabel) of each example's labels (ReaL).

  @property
  def name(self) -> str:
    return self.builder.name

  @property
  def random_access(self) -> bool:
    """True if stored as ArrayRecord: read by example index."""
    return convert.has_array_record(self.builder)

  @property
  def streamable(self) -> bool:
    """True unless stored as ArrayRecord only, which `as_dataset` cannot read."""
    return self.builder.info.available_file_formats() != {convert.ARRAY_RECORD}

  def image_feature(self) -> tfds.features.Image:
    return self.builder.info.features[self.image_key]


def _resolve(
    data: 'DataSettings',
    dataset: str | None = None,
    label_key: str | None = None,
    label_set_key: str | None = None,
) -> _Source:
  """Finds (and prepares, if needed) the builder of `dataset` (default `data.dataset`).

  Its image and label are its supervised keys, or 'image' and `label_key` where given;
  `label_set_key` names a feature holding several labels per example.
  """
  name = data.dataset if dataset is None else dataset
  storage.check_location(data.data_dir)
  with runtime.quiet_preparation():  # No progress bars in a run's log.
    builder = _prepared_builder(data, name)
  storage.check_complete(builder, name)
  keys = builder.info.supervised_keys
  image_key, supervised_label = (
      keys
      if (isinstance(keys, tuple) and len(keys) == 2 and all(isinstance(k, str) for k in keys))
      else ('image', 'label')
  )
  label_key = label_key or supervised_label
  features = builder.info.features
  if not (
      image_key in features
      and isinstance(features[image_key], tfds.features.Image)
      and label_key in features
      and isinstance(features[label_key], tfds.features.ClassLabel)
  ):
    raise ValueError(
        f'Dataset {name!r} is not an image-classification dataset: it needs an Image '
        f'feature and a ClassLabel feature, but its features are {features}.'
    )
  if label_set_key is not None and not (
      label_set_key in features
      and isinstance(features[label_set_key], tfds.features.Sequence)
      and isinstance(features[label_set_key].feature, tfds.features.ClassLabel)
  ):
    raise ValueError(
        f'Dataset {name!r} has no feature {label_set_key!r} holding a sequence of '
        f'class labels; its features are {features}.'
    )
  return _Source(builder, image_key, label_key, label_set_key)


def _prepared_builder(data: 'DataSettings', name: str) -> tfds.core.DatasetBuilder:
  """The builder of dataset `name`, prepared on first use."""
  if name == digits.NAME:
    return digits.prepare(data.data_dir)
  if name.startswith(folder.PREFIX):
    return folder.prepare(
        name[len(folder.PREFIX) :], data.data_dir, skip_unreadable=data.skip_unreadable_images
    )
  try:
    builder = tfds.builder(name, data_dir=data.data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    message = (
        f'Unknown dataset {name!r}. Valid: {digits.NAME!r} (embedded), '
        f"'{folder.PREFIX}/path/to/images' (your own images) or any TFDS dataset name, "
        "e.g. 'cifar10', 'cifar100', 'imagenet2012' (tfds.list_builders())."
    )
    raise ValueError(message) from None
  storage.check_preparable(builder, name)
  _prepare_tfds(builder)
  return builder


def _prepare_tfds(builder: tfds.core.DatasetBuilder) -> None:
  """Prepares a TFDS dataset on first use; where that fails, one error that says how to.

  A download that cannot start (a host of its URLs unreachable, no archive on disk) is refused at
  once, before TFDS's download retries, which take minutes to give up.
  """
  if builder.is_prepared():
    return
  name, root = builder.name, builder.data_dir_root
  manual = builder.MANUAL_DOWNLOAD_INSTRUCTIONS
  what = 'its download cannot start'
  # TFDS's own download only (`tfds.testing.mock_data` makes it a no-op that needs no network).
  downloads = type(builder).download_and_prepare.__module__.startswith('tensorflow_datasets.core')
  probe = downloads and not manual and not _has_downloads(builder)
  reason = _unreachable_host(builder) if probe else None
  if reason is None:
    try:
      builder.download_and_prepare(file_format=convert.ARRAY_RECORD)
      return
    except Exception as e:  # No network, no write access... pylint: disable=broad-except
      what = 'TFDS cannot download it' if manual else 'preparing it failed'
      reason = f'{type(e).__name__}: {(str(e).strip().splitlines() or [""])[0][:300]}'
  if manual:
    how = (
        f'Put its archives in {root}/downloads/manual ({" ".join(manual.split())}), then run '
        f'`tfds build {name} --data_dir={root} --file_format=array_record`'
    )
  else:
    how = (
        f'Prepare it once where the network is reachable, `tfds build {name} '
        f'--data_dir={root} --file_format=array_record` (copy that directory here if this '
        'machine is offline)'
    )
  raise ValueError(
      f'Dataset {name!r} is not prepared in data_dir={root}, and {what} ({reason}). '
      f'{how}, then train with --config.data_dir={root}.'
  )


def _has_downloads(builder: tfds.core.DatasetBuilder) -> bool:
  """Whether TFDS may find `builder`'s archives on disk already: its download folder, the manual
  folder or the shared (legacy) one under the data dir holds a file."""
  downloads = builder.data_dir_root / 'downloads'
  folders = (downloads, downloads / builder.name, downloads / 'manual')
  return any(f.is_file() for folder in folders if folder.is_dir() for f in folder.iterdir())


def _unreachable_host(builder: tfds.core.DatasetBuilder) -> str | None:
  """'HOST:PORT (why)' for a host that `builder`'s downloads need (its own, or the proxy that
  stands for it) and that does not accept a connection within `DOWNLOAD_PROBE_SECONDS`; None where
  every one does, or the builder lists no URLs."""
  proxies = urllib.request.getproxies()
  ports = {'http': 80, 'https': 443, 'ftp': 21}
  hosts = set()
  for url in builder.url_infos or {}:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ports or not parts.hostname:
      continue
    if parts.scheme in proxies and not urllib.request.proxy_bypass(parts.hostname):
      parts = urllib.parse.urlsplit(proxies[parts.scheme])
      if not parts.hostname:
        continue
    hosts.add((parts.hostname, parts.port or ports.get(parts.scheme, 80)))
  refusals = {}  # (host, port): None where it answered, else why not.

  def connect(host: str, port: int) -> None:
    try:
      socket.create_connection((host, port), timeout=DOWNLOAD_PROBE_SECONDS).close()
      refusals[host, port] = None
    except OSError as e:
      refusals[host, port] = f'{type(e).__name__}: {e}'

  # Daemon threads bound the name lookup too, which no socket timeout covers.
  probes = [threading.Thread(target=connect, args=h, daemon=True) for h in sorted(hosts)]
  for probe in probes:
    probe.start()
  deadline = time.monotonic() + DOWNLOAD_PROBE_SECONDS
  for probe in probes:
    probe.join(max(0.0, deadline - time.monotonic()))
  for host, port in sorted(hosts):
    why = refusals.get((host, port), f'no answer within {DOWNLOAD_PROBE_SECONDS:g} s')
    if why is not None:
      return f'{host}:{port} unreachable: {why}'
  return None


def _check_split(source: _Source, split: str) -> None:
  """Raises ValueError if `split` names a split that the dataset does not have."""
  known = list(source.builder.info.splits.keys())
  if not known:  # Split metadata unavailable (a mocked dataset): reading will tell.
    return
  for part in split.split('+'):
    base = part.split('[')[0].strip()
    if base not in known:
      raise ValueError(
          f'Dataset {source.name!r} has no split {base!r} (in {split!r}); valid '
          f"splits: {known}, optionally sliced, e.g. '{known[0]}[:90%]'."
      )


def _num_examples(source: _Source, split: Any) -> int:
  """Number of examples in `split` (a split name, slice or per-process sub-split)."""
  try:
    return source.builder.info.splits[split].num_examples
  except KeyError:  # No split metadata (a mocked dataset): count the records.
    records = source.builder.as_dataset(
        split=split, decoders={source.image_key: tfds.decode.SkipDecoding()}
    )
    count = int(records.cardinality())
    return count if count >= 0 else int(records.reduce(0, lambda n, _: n + 1))


def _process_split(split: str, process_index: int, process_count: int) -> Any:
  return tfds.split_for_jax_process(split, process_index=process_index, process_count=process_count)


def _local_batch(batch_size: int, process_count: int, field: str) -> int:
  if batch_size <= 0 or batch_size % process_count:
    raise ValueError(
        f'--config.{field}={batch_size} must be a positive multiple of the '
        f'process count {process_count}.'
    )
  return batch_size // process_count


def _process(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index {process_index} must be in [0, {process_count}).')
  return process_index, process_count


def get_dataset_info(data: 'DataSettings') -> DatasetInfo:
  """Sizes and class count of `data.dataset`; prepares digits on first use."""
  source = _resolve(data)
  _check_split(source, data.train_split)
  _check_split(source, data.eval_split)
  labels = source.builder.info.features[source.label_key]
  return DatasetInfo(
      name=data.dataset,
      num_classes=labels.num_classes,
      num_train_examples=_num_examples(source, data.train_split),
      num_eval_examples=_num_examples(source, data.eval_split),
      image_size=data.image_size,
      class_names=tuple(labels.names),
  )


def eval_num_classes(
    data: 'DataSettings',
    *,
    dataset: str,
    split: str,
    label_key: str | None = None,
    label_set_key: str | None = None,
) -> int:
  """The class count of `dataset`'s labels, checking that it and its `split` exist and that
  the split holds examples (an evaluation set's, before anything compiles); ValueError naming
  what is valid otherwise."""
  source = _resolve(data, dataset, label_key, label_set_key)
  _check_split(source, split)
  if _num_examples(source, split) == 0:
    known = list(source.builder.info.splits.keys())
    raise ValueError(
        f'The eval set {dataset}:{split} has no examples; name a split or slice that holds '
        f'some' + (f", e.g. '{dataset}:{known[0]}'." if known else '.')
    )
  return source.builder.info.features[source.label_key].num_classes


# Preprocessing. Images enter as uint8 (H, W, C) and leave as normalised float32 (S, S, 3).


def _to_rgb(image: tf.Tensor) -> tf.Tensor:
  """Grayscale is tiled to three channels; an alpha channel is dropped."""
  channels = image.shape[-1]
  if channels == 1:
    return tf.tile(image, [1, 1, 3])
  if channels == 4:
    return image[..., :3]
  return image


def _resize(image: tf.Tensor, height: Any, width: Any, clip: bool = True) -> tf.Tensor:
  """Bicubic, antialiased resize to float32 in [0, 255] (a no-op at the same static size);
  `clip=False` leaves the overshoot beyond [0, 255] to the caller (`_whole_pixels` clips).

  A uint8 image goes to the resize kernel as it is: it converts each pixel as it reads it, so
  the result is that of a float32 copy without the copy.
  """
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
  """(resized height, resized width, top, left) of timm's eval transform of a height x width image.

  timm's `transforms_imagenet_eval(size, crop_pct=crop_ratio)` is torchvision's
  `Resize(floor(size / crop_ratio))` of the shorter side, whose long side is
  int(short * long / shorter side), truncated (`_compute_resized_output_size`), then
  `CenterCrop(size)` at offsets round((resized - size) / 2), halves to even (`center_crop`).
  Works on Python ints and on int32 tensors alike (TensorFlow's round is half to even too).
  """
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


def _resize_centre_crop(image: tf.Tensor, size: int, crop_ratio: float) -> tf.Tensor:
  """timm's eval transform: shorter side to floor(size / crop_ratio), then the central size x size.

  Window arithmetic in `centre_crop_window`; bicubic, antialiased when shrinking, like PIL's
  bicubic resize that timm's `interpolation='bicubic'` runs. Training with augment='crop_flip' or
  'none' resizes by the same rule (crop_ratio 1).
  """
  static = image.shape[0] is not None and image.shape[1] is not None
  shape = (image.shape[0], image.shape[1]) if static else tf.unstack(tf.shape(image)[:2])
  height, width, top, left = centre_crop_window(*shape, size, crop_ratio)
  image = _resize(image, height, width)
  return image[top : top + size, left : left + size]


def _inception_crop_box(image_shape: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, ...]:
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


def _whole_pixels(image: tf.Tensor) -> tf.Tensor:
  """A float image as whole uint8 values: clipped to [0, 255], rounded half to even."""
  if not _compiled(image):
    return _round_pixels(image)
  augment.ignore_jax_xla_flags()
  return _COMPILED_ROUND(image)


def _transpose_pixels(image: tf.Tensor) -> tf.Tensor:
  return tf.transpose(image, [1, 0, 2])


def _transpose_whole_pixels(image: tf.Tensor) -> tf.Tensor:
  return _round_pixels(_transpose_pixels(image))


def _transpose_clipped(image: tf.Tensor) -> tf.Tensor:
  return tf.clip_by_value(_transpose_pixels(image), 0.0, 255.0)


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
  """The first (vertical) pass of `_resize`'s kernel alone: the rows of a (H, W, C) image resized
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


def _resize_crop(image: tf.Tensor, size: int, whole: bool) -> tf.Tensor:
  """`_resize` of a crop to size x size, bit for bit, clipped to [0, 255]; `whole` rounds it to
  uint8 as `_whole_pixels` does.

  TensorFlow's antialiased resize runs its vertical pass over contiguous rows and its horizontal
  pass one pixel at a time. Here both passes are vertical ones, the image transposed in between
  and after, with the same weights summed in the same order.
  """
  if image.shape[:2].is_fully_defined() or size * size < _COMPILED_MIN_PIXELS:
    resized = tf.ensure_shape(_resize(image, size, size, clip=not whole), [size, size, None])
    return _whole_pixels(resized) if whole else resized
  augment.ignore_jax_xla_flags()
  width = tf.shape(image)[1]
  padded = tf.pad(image, [[0, 0], [0, _transpose_width(width) - width], [0, 0]])
  columns = _COMPILED_TRANSPOSE(_resize_rows(padded, size))[:width]
  transposed = tf.ensure_shape(_resize_rows(columns, size), [size, size, None])
  return (_COMPILED_TRANSPOSE_WHOLE if whole else _COMPILED_TRANSPOSE_CLIPPED)(transposed)


def _normalize(image: tf.Tensor, normalization: str) -> tf.Tensor:
  """(image / 255 - mean) / std of a uint8 or float image, as one multiply-add per value."""
  mean, std = (np.array(v, np.float64) for v in mean_std(normalization))
  scale, offset = (tf.constant(v, tf.float32) for v in (1.0 / (255.0 * std), -mean / std))
  if not _compiled(image):
    return _normalize_pixels(image, scale, offset)
  augment.ignore_jax_xla_flags()
  return _COMPILED_NORMALIZE(image, scale, offset)


def _decode(image: tf.Tensor) -> tf.Tensor:
  """uint8 RGB (H, W, 3) from an image (any channel count) or its encoded bytes."""
  if image.dtype == tf.string:
    return tf.io.decode_image(image, channels=3, expand_animations=False)
  return _to_rgb(image)


def _inception_crop(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """The `_inception_crop_box` window of `image`; of an encoded JPEG, only that window is decoded.

  `tf.io.decode_and_crop_jpeg` skips the rest of the image (as big_vision's
  `decode_jpeg_and_inception_crop` does); chroma upsampling makes a few pixels along the window's
  edge differ by a few levels from those of a full decode.
  """

  def crop(decoded):
    top, left, height, width = _inception_crop_box(tf.shape(decoded), seed)
    return decoded[top : top + height, left : left + width]

  if image.dtype != tf.string:
    return crop(_to_rgb(image))

  def jpeg_window():
    window = tf.stack(_inception_crop_box(tf.io.extract_jpeg_shape(image), seed))
    return tf.io.decode_and_crop_jpeg(image, window, channels=3)

  return tf.cond(tf.io.is_jpeg(image), jpeg_window, lambda: crop(_decode(image)))


def _simple_random_crop(image: tf.Tensor, seed: tf.Tensor, size: int, padding: int) -> tf.Tensor:
  """DeiT III's simple random crop (deit augment.py, `--src`): torchvision's `Resize(size)` of the
  shorter side, then `RandomCrop(size, padding, padding_mode='reflect')`."""
  static = image.shape[0] is not None and image.shape[1] is not None
  shape = (image.shape[0], image.shape[1]) if static else tf.unstack(tf.shape(image)[:2])
  height, width, _, _ = centre_crop_window(*shape, size, 1.0)
  image = _resize(image, height, width)
  if padding:
    image = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]], mode='REFLECT')
  return tf.image.stateless_random_crop(image, [size, size, 3], seed)


@dataclasses.dataclass(frozen=True)
class TrainTransform:
  """How one training image is cropped, augmented and normalised (`from_config` reads a run's)."""

  image_size: int
  augment: str  # One of AUGMENTS.
  crop_padding: int
  flip: bool
  normalization: str  # A key of NORMALIZATIONS, or numbers (`mean_std`).
  randaugment: augment.RandAugmentSpec | None  # None: off.
  three_augment: bool
  color_jitter: float  # 0: off.
  random_erase_prob: float

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> 'TrainTransform':
    return cls(
        image_size=config.image_size,
        augment=config.augment,
        crop_padding=config.crop_padding,
        flip=config.flip,
        normalization=config.normalization,
        randaugment=(augment.parse_randaugment(config.randaugment) if config.randaugment else None),
        three_augment=config.three_augment,
        color_jitter=config.color_jitter,
        random_erase_prob=config.random_erase_prob,
    )


@dataclasses.dataclass(frozen=True)
class EvalTransform:
  """How one image is resized, centre-cropped and normalised for evaluation and prediction."""

  image_size: int
  crop_ratio: float  # In (0, 1]: resize to image_size / crop_ratio, then centre crop.
  normalization: str  # A key of NORMALIZATIONS, or numbers (`mean_std`).

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> 'EvalTransform':
    return cls(
        image_size=config.image_size,
        crop_ratio=config.eval_crop_ratio,
        normalization=config.normalization,
    )


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """Which dataset a run reads, how it batches, orders and preprocesses it (`from_config` reads a
  run's)."""

  dataset: str
  data_dir: str | None
  train_split: str
  eval_split: str
  image_size: int
  batch_size: int  # Global: over every process.
  eval_batch_size: int
  seed: int
  repeated_aug: int
  shuffle_buffer: int
  prefetch: int
  in_memory: bool | None  # None: decided by size (`_fits_in_memory`).
  skip_unreadable_images: bool
  train_transform: TrainTransform
  eval_transform: EvalTransform

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> 'DataSettings':
    return cls(
        dataset=config.dataset,
        data_dir=config.data_dir,
        train_split=config.train_split,
        eval_split=config.eval_split,
        image_size=config.image_size,
        batch_size=config.batch_size,
        eval_batch_size=config.eval_batch_size,
        seed=config.seed,
        repeated_aug=config.repeated_aug,
        shuffle_buffer=config.shuffle_buffer,
        prefetch=config.prefetch,
        in_memory=config.in_memory,
        skip_unreadable_images=config.skip_unreadable_images,
        train_transform=TrainTransform.from_config(config),
        eval_transform=EvalTransform.from_config(config),
    )


def _train_image(image: tf.Tensor, seed: tf.Tensor, transform: TrainTransform) -> tf.Tensor:
  """Crop, resize, augment (stateless, keyed by `seed`) and normalise one training image.

  `image` is uint8 (H, W, C) or its encoded bytes (a scalar string: JPEG, PNG, ...); an
  inception crop of a JPEG decodes only the crop window.
  """
  size = transform.image_size
  crop_seed, flip_seed, randaugment_seed, erase_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 4)
  )
  pixel_ops = transform.randaugment is not None or transform.three_augment or transform.color_jitter
  if transform.augment == 'inception_crop':
    image = _resize_crop(_inception_crop(image, crop_seed), size, whole=pixel_ops)
  elif transform.augment == 'simple_random_crop':
    image = _simple_random_crop(_decode(image), crop_seed, size, transform.crop_padding)
  else:
    image = _resize_centre_crop(_decode(image), size, 1.0)
    if transform.augment == 'crop_flip' and transform.crop_padding > 0:
      pad = transform.crop_padding
      image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
      image = tf.image.stateless_random_crop(image, [size, size, 3], crop_seed)
  image = tf.ensure_shape(image, [size, size, 3])
  if pixel_ops and image.dtype != tf.uint8:  # Whole values; rounding commutes with the flip.
    image = _whole_pixels(image)
  if transform.flip and transform.augment != 'none':
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
  if pixel_ops:
    if transform.randaugment is not None:
      mean = mean_std(transform.normalization)[0]
      image = augment.randaugment(
          image,
          randaugment_seed,
          transform.randaugment,
          fill=tuple(min(255, round(255 * m)) for m in mean),
      )
    three_seed, jitter_seed = tf.unstack(
        tf.random.experimental.stateless_split(
            tf.random.experimental.stateless_fold_in(randaugment_seed, 1), 2
        )
    )
    if transform.three_augment:
      image = augment.three_augment(image, three_seed)
    if transform.color_jitter:
      image = augment.color_jitter(image, jitter_seed, transform.color_jitter)
  image = _normalize(image, transform.normalization)
  if transform.random_erase_prob > 0:
    image = augment.random_erase(image, erase_seed, transform.random_erase_prob)
  return image


def eval_image(image: tf.Tensor, transform: EvalTransform) -> tf.Tensor:
  """One decoded uint8 (H, W, C) image as the model sees it in evaluation and prediction: timm's
  eval transform, pixels rounded to whole values as PIL's 8-bit resize output is."""
  image = _resize_centre_crop(_to_rgb(image), transform.image_size, transform.crop_ratio)
  return _normalize(tf.round(image), transform.normalization)


# Reading examples by index.

# Records per `tf.numpy_function` read of an ArrayRecord source: enough that the Python call costs
# little per record, few enough that the first batch waits for little beyond its own records.
_READ_CHUNK = 32

# Maps a dataset of int64 example indices to one of (image uint8 (H, W, C), label) in that order
# (and the example's labels, where the source has a `label_set_key`); an `encoded` lookup yields
# the image's encoded bytes (a scalar string) instead, for `_train_image` to decode.
Lookup = Callable[[tf.data.Dataset], tf.data.Dataset]


@dataclasses.dataclass(frozen=True)
class _Access:
  """Random access to the `num` examples of a split: `lookup` over a dataset of indices and, for a
  split held in memory, `gather` of one index (so that a training example's lookup and
  preprocessing are one `tf.data` map, whose per-element overhead dominates on small images)."""

  num: int
  lookup: Lookup
  gather: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]] | None = None


def decodes_crop_window(transform: 'TrainTransform', repeated_aug: int) -> bool:
  """True where training decodes only each JPEG's inception-crop window, once per copy; False
  where it decodes each drawn image whole, once, and crops its `repeated_aug` copies from that.

  Decoding a window still entropy-decodes the rows above it, so it saves little on one copy and
  costs more than one whole decode from two copies on.
  """
  return transform.augment == 'inception_crop' and repeated_aug == 1


def _array_record_lookup(source: _Source, split: Any, encoded: bool = False) -> _Access:
  """The `_Access` of the ArrayRecord records of `split`: reads only the records asked for;
  `encoded` leaves 8-bit images encoded."""
  records = source.builder.as_data_source(
      split=split,
      deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES,
      file_format=convert.ARRAY_RECORD,
  )
  features = source.builder.info.features
  feature = source.image_feature()
  encoded = encoded and feature.tf_dtype == tf.uint8

  def read(indices: np.ndarray) -> np.ndarray:
    return np.array(records.__getitems__(indices.tolist()), dtype=object)

  def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, ...]:
    example = features.deserialize_example(
        serialized, decoders={source.image_key: tfds.decode.SkipDecoding()}
    )
    label_set = () if source.label_set_key is None else (example[source.label_set_key],)
    image = example[source.image_key]
    image = image if encoded else feature.decode_example(image)
    return image, example[source.label_key], *label_set

  def lookup(indices: tf.data.Dataset) -> tf.data.Dataset:
    chunks = indices.batch(_READ_CHUNK).map(
        lambda i: tf.ensure_shape(tf.numpy_function(read, [i], tf.string, stateful=False), [None]),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return chunks.unbatch().map(parse, num_parallel_calls=tf.data.AUTOTUNE)

  return _Access(len(records), lookup)


def _fits_in_memory(data: 'DataSettings', source: _Source, split: Any) -> bool:
  """True if a TFRecord-only split is held in memory (exact resume), False if it is streamed."""
  if data.in_memory is not None:
    return data.in_memory
  shape = source.image_feature().shape
  if any(d is None for d in shape):
    return False
  return _num_examples(source, split) * math.prod(shape) <= IN_MEMORY_MAX_BYTES


def _in_memory_lookup(source: _Source, split: Any) -> _Access:
  """`split` decoded once into one array, read by index."""
  if source.random_access:
    access = _array_record_lookup(source, split)
    examples = access.lookup(tf.data.Dataset.range(access.num))
  else:
    examples = source.builder.as_dataset(split=split).map(
        lambda record: (record[source.image_key], record[source.label_key])
    )
  chunks = list(examples.batch(4096).as_numpy_iterator())
  if not chunks:
    raise ValueError(f'Split {split} of {source.name!r} is empty.')
  # Variables are captured by reference; constants would be copied into the tf.data graph.
  images = tf.Variable(np.concatenate([chunk[0] for chunk in chunks]), trainable=False)
  labels = tf.Variable(np.concatenate([chunk[1] for chunk in chunks]), trainable=False)

  def gather(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.gather(images, index), tf.gather(labels, index)

  def lookup(indices: tf.data.Dataset) -> tf.data.Dataset:
    return indices.map(gather, num_parallel_calls=tf.data.AUTOTUNE)

  return _Access(int(labels.shape[0]), lookup, gather)


def _random_access(
    data: 'DataSettings', source: _Source, split: Any, encoded: bool = False
) -> _Access | None:
  """`split` read by example index, or None where it can only be streamed (module docstring); `encoded`:
  ArrayRecord images stay encoded (`_array_record_lookup`)."""
  forced = data.in_memory
  if forced is not None and not source.streamable:
    raise ValueError(
        f'--config.in_memory={forced} chooses between holding a TFRecord dataset in '
        f'memory and streaming it, but {source.name!r} is stored as ArrayRecord only '
        'and read by index; leave --config.in_memory unset (None).'
    )
  if source.random_access and forced is None:
    if not encoded and _fits_in_memory(data, source, split):
      return _in_memory_lookup(source, split)
    return _array_record_lookup(source, split, encoded)
  if _fits_in_memory(data, source, split):
    return _in_memory_lookup(source, split)
  return None


# Training.


def _seed(data: 'DataSettings', process_index: int, salt: int) -> tf.Tensor:
  base = tf.constant([data.seed, process_index], tf.int64)
  return tf.random.experimental.stateless_fold_in(base, salt)


def _preprocess_calls() -> int:
  """Training images in flight in the preprocessing map (`_PREPROCESS_CALLS_PER_CPU`)."""
  return _PREPROCESS_CALLS_PER_CPU * len(os.sched_getaffinity(0))


def _shuffled_examples(
    data: 'DataSettings', access: _Access, start: int, process_index: int, preprocess: Callable
) -> tf.data.Dataset:
  """Stream positions start, start+1, ... → preprocess(image, label, position), shuffled per
  epoch."""
  num = access.num
  if num == 0:
    raise ValueError(f'The train split is empty for process {process_index}.')
  repeats = data.repeated_aug
  shuffle_seed = _seed(data, process_index, _SHUFFLE_SALT)

  def index(draw):
    epoch_seed = tf.random.experimental.stateless_fold_in(shuffle_seed, draw // num)
    return tf.random.experimental.index_shuffle(
        draw % num, epoch_seed, tf.constant(num - 1, tf.int64)
    )

  calls = _preprocess_calls()
  if access.gather is not None and repeats == 1:
    return tf.data.Dataset.counter(start).map(
        lambda position: preprocess(*access.gather(index(position)), position),
        num_parallel_calls=calls,
    )
  # Each drawn example fills `repeats` consecutive positions; it is read and decoded once.
  draws = tf.data.Dataset.counter(start // repeats)
  examples = tf.data.Dataset.zip(access.lookup(draws.map(index)), draws)

  def copies(example, draw):
    positions = tf.data.Dataset.range(draw * repeats, (draw + 1) * repeats)
    return tf.data.Dataset.zip(tf.data.Dataset.from_tensors(example).repeat(), positions)

  if repeats > 1:  # The first draw's copies may begin before `start`.
    examples = examples.flat_map(copies).skip(start % repeats)
  return examples.map(
      lambda example, position: preprocess(*example, position), num_parallel_calls=calls
  )


def _streamed_examples(data, source, split, start, process_index) -> tf.data.Dataset:
  """As `_shuffled_examples`, from a seeded file order and shuffle buffer (TFRecord only)."""
  records = source.builder.as_dataset(
      split=split,
      shuffle_files=True,
      decoders={source.image_key: tfds.decode.SkipDecoding()},
      read_config=tfds.ReadConfig(shuffle_seed=data.seed + process_index),
  )
  repeats = data.repeated_aug
  records = records.repeat().shuffle(
      data.shuffle_buffer, seed=data.seed + process_index, reshuffle_each_iteration=True
  )
  records = records.flat_map(lambda r: tf.data.Dataset.from_tensors(r).repeat(repeats))
  records = records.enumerate().skip(start)

  def example(position, record):  # Images stay encoded: `_train_image` decodes what it needs.
    return record[source.image_key], record[source.label_key], position

  return records.map(example, num_parallel_calls=tf.data.AUTOTUNE)


def train_iterator(
    data: 'DataSettings',
    *,
    start_step: int = 0,
    process_index: int | None = None,
    process_count: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """Infinite training batches of this process: 'image' (B, S, S, 3) float32, 'label' (B,) int32.

  B = data.batch_size // process_count. Batches from `start_step=k` equal batches k, k+1, ...
  of a run from step 0 with the same config, and cost the same to start at any k (except for a
  streamed TFRecord dataset; see the module docstring). With data.repeated_aug = r > 1, each
  drawn example fills r consecutive positions, differently augmented; where r does not divide B
  the copies of an example may span two batches (DeiT's RASampler spreads them over devices).
  """
  process_index, process_count = _process(process_index, process_count)
  local_batch = _local_batch(data.batch_size, process_count, 'batch_size')
  if start_step < 0:
    raise ValueError(f'start_step must be >= 0, got {start_step}.')
  source = _resolve(data)
  _check_split(source, data.train_split)
  split = _process_split(data.train_split, process_index, process_count)
  start = start_step * local_batch
  transform = data.train_transform
  augment_seed = _seed(data, process_index, _AUGMENT_SALT)

  @tf.autograph.experimental.do_not_convert  # Graph code already: nothing to convert.
  def preprocess(image, label, position):
    seed = tf.random.experimental.stateless_fold_in(augment_seed, position)
    return {'image': _train_image(image, seed, transform), 'label': tf.cast(label, tf.int32)}

  access = _random_access(
      data, source, split, encoded=decodes_crop_window(transform, data.repeated_aug)
  )
  if access is not None:
    batches = _shuffled_examples(data, access, start, process_index, preprocess)
  else:
    logging.warning(
        'Dataset %r is stored as TFRecord only and is too large to hold in memory, so it is '
        'streamed: resuming at step k reads and discards the k x %d records consumed before '
        '(on the order of 10,000 records/s, e.g. about an hour late in a 300-epoch ImageNet run), '
        'and the resumed order is only approximately the original. Add an ArrayRecord copy for '
        'exact resume at the same cost at any step: python -m vit_jax.convert '
        '--dataset=%s%s',
        source.name,
        local_batch,
        source.name,
        f' --data_dir={data.data_dir}' if data.data_dir else '',
    )
    batches = _streamed_examples(data, source, split, start, process_index).map(
        preprocess, num_parallel_calls=_preprocess_calls()
    )
  batches = batches.batch(local_batch, drop_remainder=True).prefetch(data.prefetch)
  # Each image's ops run on one thread: images are preprocessed in parallel already, and splitting
  # one image's ops over threads would only add synchronisation.
  options = tf.data.Options()
  options.threading.max_intra_op_parallelism = 1
  return batches.with_options(options).as_numpy_iterator()


# Evaluation.


def eval_iterator(
    data: 'DataSettings',
    *,
    split: str | None = None,
    dataset: str | None = None,
    label_key: str | None = None,
    label_set_key: str | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """One pass over this process's part of `split` (default data.eval_split) of `dataset`
  (default data.dataset), padded.

  Yields 'image', 'label' and 'mask' (float32, 1 real, 0 padding) with B =
  data.eval_batch_size // process_count; with `label_set_key` (`_resolve`) also 'label_set',
  (B, classes) bool: the example's labels. Every process yields the same number of batches, and
  over all processes every example of the split has mask 1 exactly once.
  """
  process_index, process_count = _process(process_index, process_count)
  local_batch = _local_batch(data.eval_batch_size, process_count, 'eval_batch_size')
  split = data.eval_split if split is None else split
  source = _resolve(data, dataset, label_key, label_set_key)
  _check_split(source, split)
  most = max(
      _num_examples(source, _process_split(split, p, process_count)) for p in range(process_count)
  )
  num_batches = -(-most // local_batch)
  local_split = _process_split(split, process_index, process_count)
  keys = (source.image_key, source.label_key) + (() if label_set_key is None else (label_set_key,))
  if source.random_access:
    access = _array_record_lookup(source, local_split)
    examples = access.lookup(tf.data.Dataset.range(access.num))
  else:
    examples = source.builder.as_dataset(split=local_split, shuffle_files=False).map(
        lambda record: tuple(record[key] for key in keys)
    )
  size = data.image_size
  transform = data.eval_transform
  num_classes = source.builder.info.features[source.label_key].num_classes

  @tf.autograph.experimental.do_not_convert  # Graph code already: nothing to convert.
  def preprocess(image, label, *label_set):
    example = {
        'image': eval_image(image, transform),
        'label': tf.cast(label, tf.int32),
        'mask': tf.constant(1.0, tf.float32),
    }
    if label_set:  # The union of the labels' one-hot rows: none for an unlabelled example.
      example['label_set'] = tf.reduce_sum(tf.one_hot(label_set[0], num_classes), 0) > 0
    return example

  padding = {
      'image': tf.zeros([size, size, 3], tf.float32),
      'label': tf.constant(0, tf.int32),
      'mask': tf.constant(0.0, tf.float32),
  }
  if label_set_key is not None:
    padding['label_set'] = tf.zeros([num_classes], tf.bool)
  batches = examples.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).concatenate(
      tf.data.Dataset.from_tensors(padding).repeat()
  )
  batches = batches.take(num_batches * local_batch).batch(local_batch).prefetch(data.prefetch)
  return batches.as_numpy_iterator()
