"""Input pipelines: any TFDS image-classification dataset, `digits` or an image folder, as batches.

Every dataset goes through one path: a `tfds` builder, its per-process sub-split
(`tfds.split_for_jax_process`), then `tf.data` preprocessing that is identical for all datasets.

Training reads a dataset in one of two ways, chosen by `_reads_in_memory`:
* In memory (images of a fixed shape whose per-process split fits in `IN_MEMORY_MAX_BYTES`, e.g.
  digits, CIFAR, MNIST; `config.in_memory = True/False` forces either way): the decoded split is
  held as one array, each epoch is a permutation drawn with `tf.random.experimental.index_shuffle`
  seeded by (seed, process, epoch), and all augmentation is stateless, keyed by (seed, process,
  position in the stream). Batch k is therefore a pure function of k: resuming with
  `start_step=k` yields exactly the batches an uninterrupted run would have seen.
* Streaming (everything else, e.g. ImageNet): seeded file order and shuffle buffer, stateless
  augmentation keyed by stream position, and `start_step` skips the records already consumed.
  Resume is exact only as far as TFDS reads files in the same order, and skipping reads every
  skipped record; treat it as approximate.

A training image is resized to config.image_size (or inception-cropped to it), cropped and
flipped per config.augment, RandAugmented (config.randaugment, e.g. 'rand-m9-mstd0.5-inc1'),
normalised, then randomly erased (config.random_erase_prob), as timm orders them. Mixup/CutMix
run on device (`augment.mix_batch`). Optional config fields and their defaults: randaugment '',
random_erase_prob 0.0, repeated_aug 1, in_memory None (automatic).
"""

import dataclasses
import math
from typing import Any, Iterator

import jax
import ml_collections
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax import augment
from vit_jax.datasets import digits
from vit_jax.datasets import folder

# Per-channel (mean, std) of pixel values in [0, 1].
NORMALIZATIONS = {
    'imagenet': ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    'inception': ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    'cifar10': ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    # The 1,437 train images of `digits` (8x8, 0..255), tiled to three channels.
    'digits': ((0.3054, 0.3054, 0.3054), (0.3760, 0.3760, 0.3760)),
}
AUGMENTS = ('crop_flip', 'inception_crop', 'none')
IN_MEMORY_MAX_BYTES = 1024**3
# timm's RandomResizedCrop: area fraction and aspect-ratio ranges, and its number of attempts.
INCEPTION_CROP_AREA = (0.08, 1.0)
INCEPTION_CROP_RATIO = (3 / 4, 4 / 3)
_INCEPTION_CROP_ATTEMPTS = 10
# Salts that keep the shuffle and augmentation random streams apart.
_SHUFFLE_SALT, _AUGMENT_SALT = 0, 1


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What training needs to know about a dataset before building anything."""
  name: str
  num_classes: int
  num_train_examples: int
  num_eval_examples: int
  image_size: int


@dataclasses.dataclass(frozen=True)
class _Source:
  """A resolved dataset: its builder and the feature keys of image and label."""
  builder: tfds.core.DatasetBuilder
  image_key: str
  label_key: str

  @property
  def name(self) -> str:
    return self.builder.name

  def image_feature(self) -> tfds.features.Image:
    return self.builder.info.features[self.image_key]


def _resolve(config: ml_collections.ConfigDict) -> _Source:
  """Finds (and prepares, if needed) the builder that `config.dataset` names."""
  name = config.dataset
  if name == digits.NAME:
    builder = digits.prepare(config.data_dir)
  elif name.startswith(folder.PREFIX):
    builder = folder.prepare(name[len(folder.PREFIX):], config.data_dir)
  else:
    try:
      builder = tfds.builder(name, data_dir=config.data_dir)
    except tfds.core.registered.DatasetNotFoundError:
      message = (f'Unknown dataset {name!r}. Valid: {digits.NAME!r} (embedded), '
                 f"'{folder.PREFIX}/path/to/images' (your own images) or any TFDS dataset name, "
                 "e.g. 'cifar10', 'cifar100', 'imagenet2012' (tfds.list_builders()).")
      raise ValueError(message) from None
    if not builder.is_prepared():
      builder.download_and_prepare()
  keys = builder.info.supervised_keys
  image_key, label_key = keys if (isinstance(keys, tuple) and len(keys) == 2
                                  and all(isinstance(k, str) for k in keys)) else ('image', 'label')
  features = builder.info.features
  if not (image_key in features and isinstance(features[image_key], tfds.features.Image)
          and label_key in features
          and isinstance(features[label_key], tfds.features.ClassLabel)):
    raise ValueError(f'Dataset {name!r} is not an image-classification dataset: it needs an Image '
                     f'feature and a ClassLabel feature, but its features are {features}.')
  return _Source(builder, image_key, label_key)


def _check_split(source: _Source, split: str) -> None:
  """Raises ValueError if `split` names a split that the dataset does not have."""
  known = list(source.builder.info.splits.keys())
  if not known:  # Split metadata unavailable (a mocked dataset): reading will tell.
    return
  for part in split.split('+'):
    base = part.split('[')[0].strip()
    if base not in known:
      raise ValueError(f'Dataset {source.name!r} has no split {base!r} (in {split!r}); valid '
                       f"splits: {known}, optionally sliced, e.g. '{known[0]}[:90%]'.")


def _num_examples(source: _Source, split: Any) -> int:
  """Number of examples in `split` (a split name, slice or per-process sub-split)."""
  try:
    return source.builder.info.splits[split].num_examples
  except KeyError:  # No split metadata (a mocked dataset): count the records.
    records = source.builder.as_dataset(
        split=split, decoders={source.image_key: tfds.decode.SkipDecoding()})
    count = int(records.cardinality())
    return count if count >= 0 else int(records.reduce(0, lambda n, _: n + 1))


def _process_split(split: str, process_index: int, process_count: int) -> Any:
  return tfds.split_for_jax_process(split, process_index=process_index, process_count=process_count)


def _check_choices(config: ml_collections.ConfigDict) -> None:
  """Raises ValueError for an unknown augmentation or normalisation name."""
  if config.augment not in AUGMENTS:
    raise ValueError(f'Unknown config.augment {config.augment!r}; valid: {AUGMENTS}.')
  if config.normalization not in NORMALIZATIONS:
    raise ValueError(f'Unknown config.normalization {config.normalization!r}; '
                     f'valid: {tuple(NORMALIZATIONS)}.')
  if config.image_size <= 0:
    raise ValueError(f'config.image_size must be positive, got {config.image_size}.')
  if config.get('randaugment', ''):
    augment.parse_randaugment(config.randaugment)
  if not 0 <= config.get('random_erase_prob', 0.0) <= 1:
    raise ValueError(f'config.random_erase_prob must be in [0, 1], got {config.random_erase_prob}.')
  repeats = config.get('repeated_aug', 1)
  if not isinstance(repeats, int) or repeats < 1:
    raise ValueError(f'config.repeated_aug must be a positive integer, got {repeats!r}.')


def _local_batch(batch_size: int, process_count: int, field: str) -> int:
  if batch_size <= 0 or batch_size % process_count:
    raise ValueError(f'config.{field}={batch_size} must be a positive multiple of the process '
                     f'count {process_count}.')
  return batch_size // process_count


def _process(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index {process_index} must be in [0, {process_count}).')
  return process_index, process_count


def get_dataset_info(config: ml_collections.ConfigDict) -> DatasetInfo:
  """Sizes and class count of `config.dataset`; prepares digits on first use."""
  source = _resolve(config)
  _check_split(source, config.train_split)
  _check_split(source, config.eval_split)
  return DatasetInfo(
      name=config.dataset,
      num_classes=source.builder.info.features[source.label_key].num_classes,
      num_train_examples=_num_examples(source, config.train_split),
      num_eval_examples=_num_examples(source, config.eval_split),
      image_size=config.image_size)


# Preprocessing. Images enter as uint8 (H, W, C) and leave as normalised float32 (S, S, 3).


def _to_rgb(image: tf.Tensor) -> tf.Tensor:
  """Grayscale is tiled to three channels; an alpha channel is dropped."""
  channels = image.shape[-1]
  if channels == 1:
    return tf.tile(image, [1, 1, 3])
  if channels == 4:
    return image[..., :3]
  return image


def _resize(image: tf.Tensor, height: Any, width: Any) -> tf.Tensor:
  """Bicubic, antialiased resize to float32 in [0, 255] (a no-op at the same static size)."""
  if image.shape[0] == height and image.shape[1] == width:
    return tf.cast(image, tf.float32)
  # Antialiasing changes nothing when upsampling, and the plain kernel is faster.
  upsampling = (isinstance(height, int) and isinstance(width, int) and image.shape[0] is not None
                and image.shape[1] is not None and image.shape[0] <= height
                and image.shape[1] <= width)
  resized = tf.image.resize(tf.cast(image, tf.float32), [height, width], method='bicubic',
                            antialias=not upsampling)
  return tf.clip_by_value(resized, 0.0, 255.0)


def _resize_centre_crop(image: tf.Tensor, size: int, crop_ratio: float) -> tf.Tensor:
  """Resizes the shorter side to floor(size / crop_ratio), then takes the central size x size."""
  short = math.floor(size / crop_ratio)
  if image.shape[0] == image.shape[1] and image.shape[0] is not None:
    height = width = short
  else:
    shape = tf.shape(image)
    h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    scale = short / tf.minimum(h, w)
    height = tf.maximum(short, tf.cast(tf.round(h * scale), tf.int32))
    width = tf.maximum(short, tf.cast(tf.round(w * scale), tf.int32))
  image = _resize(image, height, width)
  top = (height - size) // 2
  left = (width - size) // 2
  return image[top:top + size, left:left + size]


def _inception_crop_box(image_shape: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, ...]:
  """timm's RandomResizedCrop box: (top, left, height, width)."""
  height, width = tf.cast(image_shape[0], tf.float32), tf.cast(image_shape[1], tf.float32)
  area_seed, ratio_seed, top_seed, left_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 4))
  n = _INCEPTION_CROP_ATTEMPTS
  area = height * width * tf.random.stateless_uniform([n], area_seed, *INCEPTION_CROP_AREA)
  log_ratio = tf.random.stateless_uniform([n], ratio_seed, math.log(INCEPTION_CROP_RATIO[0]),
                                          math.log(INCEPTION_CROP_RATIO[1]))
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


def _normalize(image: tf.Tensor, normalization: str) -> tf.Tensor:
  mean, std = NORMALIZATIONS[normalization]
  return (image / 255.0 - tf.constant(mean)) / tf.constant(std)


def _train_image(image: tf.Tensor, seed: tf.Tensor, config: ml_collections.ConfigDict) -> tf.Tensor:
  """Resize, augment (stateless, keyed by `seed`) and normalise one training image."""
  size = config.image_size
  crop_seed, flip_seed, randaugment_seed, erase_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 4))
  image = _to_rgb(image)
  if config.augment == 'inception_crop':
    top, left, height, width = _inception_crop_box(tf.shape(image), crop_seed)
    image = _resize(image[top:top + height, left:left + width], size, size)
  else:
    image = _resize_centre_crop(image, size, 1.0)
    if config.augment == 'crop_flip' and config.crop_padding > 0:
      pad = config.crop_padding
      image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
      image = tf.image.stateless_random_crop(image, [size, size, 3], crop_seed)
  if config.flip and config.augment != 'none':
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
  if config.get('randaugment', ''):
    mean = NORMALIZATIONS[config.normalization][0]
    pixels = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
    pixels = augment.randaugment(pixels, randaugment_seed,
                                 augment.parse_randaugment(config.randaugment),
                                 fill=tuple(min(255, round(255 * m)) for m in mean))
    image = tf.cast(pixels, tf.float32)
  image = _normalize(image, config.normalization)
  if config.get('random_erase_prob', 0.0) > 0:
    image = augment.random_erase(image, erase_seed, config.random_erase_prob)
  return image


def _eval_image(image: tf.Tensor, config: ml_collections.ConfigDict) -> tf.Tensor:
  image = _resize_centre_crop(_to_rgb(image), config.image_size, config.eval_crop_ratio)
  return _normalize(image, config.normalization)


# Training.


def _reads_in_memory(config: ml_collections.ConfigDict, source: _Source, split: Any) -> bool:
  """True if the train split is held in memory (exact resume), False if it is streamed."""
  forced = config.get('in_memory', None)
  if forced is not None:
    return bool(forced)
  shape = source.image_feature().shape
  if any(d is None for d in shape):
    return False
  return _num_examples(source, split) * math.prod(shape) <= IN_MEMORY_MAX_BYTES


def _seed(config: ml_collections.ConfigDict, process_index: int, salt: int) -> tf.Tensor:
  base = tf.constant([config.seed, process_index], tf.int64)
  return tf.random.experimental.stateless_fold_in(base, salt)


def _in_memory_examples(config, source, split, start, process_index) -> tf.data.Dataset:
  """Stream positions start, start+1, ... → (image, label, position), shuffled per epoch."""
  chunks = list(source.builder.as_dataset(split=split).batch(4096).as_numpy_iterator())
  images = np.concatenate([chunk[source.image_key] for chunk in chunks]) if chunks else []
  labels = np.concatenate([chunk[source.label_key] for chunk in chunks]) if chunks else []
  num = len(labels)
  if num == 0:
    raise ValueError(f'Split {split} of {source.name!r} is empty for process {process_index}.')
  # Variables are captured by reference; constants would be copied into the tf.data graph.
  images = tf.Variable(images, trainable=False)
  labels = tf.Variable(labels, trainable=False)
  repeats = config.get('repeated_aug', 1)
  shuffle_seed = _seed(config, process_index, _SHUFFLE_SALT)

  def example(position):
    draw = position // repeats  # Each drawn example fills `repeats` consecutive positions.
    epoch_seed = tf.random.experimental.stateless_fold_in(shuffle_seed, draw // num)
    index = tf.random.experimental.index_shuffle(draw % num, epoch_seed,
                                                 tf.constant(num - 1, tf.int64))
    return tf.gather(images, index), tf.gather(labels, index), position

  return tf.data.Dataset.counter(start).map(example, num_parallel_calls=tf.data.AUTOTUNE)


def _streamed_examples(config, source, split, start, process_index) -> tf.data.Dataset:
  """As `_in_memory_examples`, from a seeded file order and shuffle buffer."""
  records = source.builder.as_dataset(
      split=split, shuffle_files=True, decoders={source.image_key: tfds.decode.SkipDecoding()},
      read_config=tfds.ReadConfig(shuffle_seed=config.seed + process_index))
  repeats = config.get('repeated_aug', 1)
  records = records.repeat().shuffle(config.shuffle_buffer, seed=config.seed + process_index,
                                     reshuffle_each_iteration=True)
  records = records.flat_map(lambda r: tf.data.Dataset.from_tensors(r).repeat(repeats))
  records = records.enumerate().skip(start)
  feature = source.image_feature()

  def example(position, record):
    return feature.decode_example(record[source.image_key]), record[source.label_key], position

  return records.map(example, num_parallel_calls=tf.data.AUTOTUNE)


def train_iterator(config: ml_collections.ConfigDict, *, start_step: int = 0,
                   process_index: int | None = None,
                   process_count: int | None = None) -> Iterator[dict[str, np.ndarray]]:
  """Infinite training batches of this process: 'image' (B, S, S, 3) float32, 'label' (B,) int32.

  B = config.batch_size // process_count. Batches from `start_step=k` equal batches k, k+1, ...
  of a run from step 0 with the same config (see the module docstring for streamed datasets).
  With config.repeated_aug = r > 1, each batch holds B / r examples, each r times in a row,
  differently augmented.
  """
  process_index, process_count = _process(process_index, process_count)
  local_batch = _local_batch(config.batch_size, process_count, 'batch_size')
  _check_choices(config)
  if local_batch % config.get('repeated_aug', 1):
    raise ValueError(f'The per-process batch {local_batch} must be a multiple of '
                     f'config.repeated_aug={config.repeated_aug}, so that all copies of an '
                     'example share a batch.')
  if start_step < 0:
    raise ValueError(f'start_step must be >= 0, got {start_step}.')
  source = _resolve(config)
  _check_split(source, config.train_split)
  split = _process_split(config.train_split, process_index, process_count)
  start = start_step * local_batch
  if _reads_in_memory(config, source, split):
    examples = _in_memory_examples(config, source, split, start, process_index)
  else:
    examples = _streamed_examples(config, source, split, start, process_index)
  augment_seed = _seed(config, process_index, _AUGMENT_SALT)

  def preprocess(image, label, position):
    seed = tf.random.experimental.stateless_fold_in(augment_seed, position)
    return {'image': _train_image(image, seed, config), 'label': tf.cast(label, tf.int32)}

  batches = examples.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
  batches = batches.batch(local_batch, drop_remainder=True).prefetch(config.prefetch)
  return batches.as_numpy_iterator()


# Evaluation.


def eval_iterator(config: ml_collections.ConfigDict, *, split: str | None = None,
                  process_index: int | None = None,
                  process_count: int | None = None) -> Iterator[dict[str, np.ndarray]]:
  """One pass over this process's part of `split` (default config.eval_split), padded.

  Yields 'image', 'label' and 'mask' (float32, 1 real, 0 padding) with B =
  config.eval_batch_size // process_count. Every process yields the same number of batches, and
  over all processes every example of the split has mask 1 exactly once.
  """
  process_index, process_count = _process(process_index, process_count)
  local_batch = _local_batch(config.eval_batch_size, process_count, 'eval_batch_size')
  _check_choices(config)
  split = config.eval_split if split is None else split
  source = _resolve(config)
  _check_split(source, split)
  most = max(_num_examples(source, _process_split(split, p, process_count))
             for p in range(process_count))
  num_batches = -(-most // local_batch)
  records = source.builder.as_dataset(split=_process_split(split, process_index, process_count),
                                      shuffle_files=False)
  size = config.image_size

  def preprocess(record):
    return {'image': _eval_image(record[source.image_key], config),
            'label': tf.cast(record[source.label_key], tf.int32),
            'mask': tf.constant(1.0, tf.float32)}

  padding = tf.data.Dataset.from_tensors({
      'image': tf.zeros([size, size, 3], tf.float32),
      'label': tf.constant(0, tf.int32),
      'mask': tf.constant(0.0, tf.float32)}).repeat()
  batches = records.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).concatenate(padding)
  batches = batches.take(num_batches * local_batch).batch(local_batch).prefetch(config.prefetch)
  return batches.as_numpy_iterator()
