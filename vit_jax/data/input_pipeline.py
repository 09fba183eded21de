"""Input pipelines: any TFDS image-classification dataset, `digits` or an image folder, as batches.

Training reads examples by index: stream position p (step k starts at k * B) holds draw
d = p // repeated_aug, epoch d // N is a permutation (`tf.random.experimental.index_shuffle`) seeded
by (seed, process, epoch), and augmentation is stateless, keyed by (seed, process, p). Batch k is a
pure function of (seed, process, k), so `start_step=k` resumes exactly, at the same cost for every
k. Records come from ArrayRecord (`tfds.data_source`), or from memory for a split of fixed shape
that fits `IN_MEMORY_MAX_BYTES` decoded (`_random_access`); a TFRecord-only dataset that fits
neither is streamed, and resuming it reads and discards what was consumed before (a log line says
so). The transforms are `data_settings.TrainTransform` and `EvalTransform`, in timm's and deit's
order; Mixup/CutMix run on device (`mixing.mix_batch`).
"""

import dataclasses
import math
from typing import Any, Iterator

from absl import logging
import jax
import numpy as np
import tensorflow as tf

from vit_jax.data import augment
from vit_jax.schema import dataset_names
from vit_jax.data import image_ops
from vit_jax.schema import normalization
from vit_jax.data import reading
from vit_jax.schema import data as data_settings
from vit_jax.data import sources

IN_MEMORY_MAX_BYTES = 1024**3


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What training needs to know about a dataset before building anything."""

  name: str
  num_classes: int
  num_train_examples: int
  num_eval_examples: int
  image_size: int
  class_names: tuple[str, ...]  # Index -> name: TFDS label names, folder names, digits '0'..'9'.


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


def get_dataset_info(data: data_settings.DataSettings) -> DatasetInfo:
  """Sizes and class count of `data.dataset`; prepares digits on first use."""
  source = sources.resolve(
      data,
      splits={'--config.train_split': data.train_split, '--config.eval_split': data.eval_split},
  )
  sources.check_split(source, data.train_split)
  sources.check_split(source, data.eval_split)
  labels = source.builder.info.features[source.label_key]
  if labels.num_classes < 2:
    raise ValueError(
        f'Dataset {data.dataset!r} has {labels.num_classes} class ({", ".join(labels.names)}): a '
        'classifier needs two or more (an image folder: one folder per class in each split).'
    )
  counts = {}
  for field, split in (('train_split', data.train_split), ('eval_split', data.eval_split)):
    counts[field] = sources.num_examples(source, split)
    if counts[field] <= 0:  # An empty or reversed slice: found now, not after a whole training.
      raise ValueError(
          f'--config.{field}={split!r} holds no examples of {data.dataset!r}; name a split or '
          f"slice that holds some, e.g. '{split.split('[')[0]}'."
      )
  return DatasetInfo(
      name=data.dataset,
      num_classes=labels.num_classes,
      num_train_examples=counts['train_split'],
      num_eval_examples=counts['eval_split'],
      image_size=data.image_size,
      class_names=tuple(labels.names),
  )


def eval_num_classes(
    data: data_settings.DataSettings,
    *,
    dataset: str,
    split: str,
    label_key: str | None = None,
    label_set_key: str | None = None,
) -> int:
  """The class count of `dataset`'s labels, checking that its `split` exists and holds examples;
  ValueError naming what is valid otherwise."""
  source = sources.resolve(data, dataset, label_key, label_set_key)
  sources.check_split(source, split)
  if sources.num_examples(source, split) == 0:
    known = list(source.builder.info.splits.keys())
    raise ValueError(
        f'The eval set {dataset}:{split} has no examples; name a split or slice that holds '
        f'some' + (f", e.g. '{dataset}:{known[0]}'." if known else '.')
    )
  return source.builder.info.features[source.label_key].num_classes


def _train_image(
    image: tf.Tensor, seed: tf.Tensor, transform: data_settings.TrainTransform
) -> dict[str, tf.Tensor]:
  """Crop, resize, augment (stateless, keyed by `seed`) and normalise one uint8 or encoded training
  image: its 'image', or where the step augments (`transform.on_device`) the uint8 crop and its
  'augment_key', (2,) uint32."""
  size = transform.image_size
  crop_seed, flip_seed, randaugment_seed, erase_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 4)
  )
  pixel_ops = bool(
      transform.randaugment is not None or transform.three_augment or transform.color_jitter
  )
  flip = transform.flip and transform.augment != 'none'
  if transform.augment == 'inception_crop':
    # tf.image.stateless_random_flip_left_right's draw, mirrored in the resize's last program.
    mirror = tf.random.stateless_uniform([], flip_seed) < 0.5 if flip else None
    flip = False
    image = image_ops.resize_crop(
        image_ops.inception_crop(image, crop_seed),
        size,
        whole=pixel_ops or transform.on_device,
        flip=mirror,
    )
  elif transform.augment == 'simple_random_crop':
    image = image_ops.simple_random_crop(
        image_ops.decode(image), crop_seed, size, transform.crop_padding
    )
  else:
    image = image_ops.resize_centre_crop(image_ops.decode(image), size, 1.0)
    if transform.augment == 'crop_flip' and transform.crop_padding > 0:
      pad = transform.crop_padding
      image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
      image = tf.image.stateless_random_crop(image, [size, size, 3], crop_seed)
  image = tf.ensure_shape(image, [size, size, 3])
  if (pixel_ops or transform.on_device) and image.dtype != tf.uint8:
    image = image_ops.whole_pixels(image)  # Whole values; rounding commutes with the flip.
  if flip:
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
  if transform.on_device:  # The rest is the training step's (`batch_augment`).
    key = tf.random.stateless_uniform(
        [2], randaugment_seed, minval=None, maxval=None, dtype=tf.uint32
    )
    return {'image': tf.cast(image, tf.uint8), 'augment_key': key}
  if pixel_ops:
    if transform.randaugment is not None:
      image = augment.randaugment(
          image,
          randaugment_seed,
          transform.randaugment,
          fill=normalization.fill_colour(transform.normalization),
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
  image = image_ops.normalize(image, *normalization.mean_std(transform.normalization))
  if transform.random_erase_prob > 0:
    image = augment.random_erase(image, erase_seed, transform.random_erase_prob)
  return {'image': image}


def eval_image(image: tf.Tensor, transform: data_settings.EvalTransform) -> tf.Tensor:
  """One decoded uint8 (H, W, C) image as the model sees it in evaluation and prediction: timm's
  eval transform, pixels rounded to whole values as PIL's 8-bit resize output is."""
  image = image_ops.resize_centre_crop(
      image_ops.to_rgb(image), transform.image_size, transform.crop_ratio
  )
  return image_ops.normalize(tf.round(image), *normalization.mean_std(transform.normalization))


# How a split is read: by index (in memory or from ArrayRecord), or streamed.


def _fits_in_memory(data: data_settings.DataSettings, source: sources.Source, split: Any) -> bool:
  """True if a TFRecord-only split is held in memory (exact resume), False if it is streamed."""
  if data.in_memory is not None:
    return data.in_memory
  shape = source.image_feature().shape
  if any(d is None for d in shape):
    return False
  return sources.num_examples(source, split) * math.prod(shape) <= IN_MEMORY_MAX_BYTES


def _random_access(
    data: data_settings.DataSettings, source: sources.Source, split: Any, encoded: bool = False
) -> reading.Access | None:
  """`split` read by example index, or None where it can only be streamed (module docstring);
  `encoded`: ArrayRecord images stay encoded (`reading.array_record_lookup`)."""
  forced = data.in_memory
  if forced is not None and not source.streamable:
    raise ValueError(
        f'--config.in_memory={forced} chooses between holding a TFRecord dataset in '
        f'memory and streaming it, but {source.name!r} is stored as ArrayRecord only '
        'and read by index; leave --config.in_memory unset (None).'
    )
  if source.random_access and forced is None:
    if not encoded and _fits_in_memory(data, source, split):
      return reading.in_memory_lookup(source, split)
    return reading.array_record_lookup(source, split, encoded)
  if _fits_in_memory(data, source, split):
    return reading.in_memory_lookup(source, split)
  return None


# Training.


def train_iterator(
    data: data_settings.DataSettings,
    *,
    start_step: int = 0,
    process_index: int | None = None,
    process_count: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """Infinite training batches of this process, 'image' (B, S, S, 3) float32 and 'label' (B,) int32,
  B = data.batch_size // process_count, from batch `start_step` of a run from step 0 (module
  docstring). With repeated_aug = r > 1 each example fills r consecutive positions (DeiT's
  RASampler spreads them over devices instead)."""
  process_index, process_count = _process(process_index, process_count)
  local_batch = _local_batch(data.batch_size, process_count, 'batch_size')
  if start_step < 0:
    raise ValueError(f'start_step must be >= 0, got {start_step}.')
  source = sources.resolve(data, splits={'--config.train_split': data.train_split})
  sources.check_split(source, data.train_split)
  split = sources.process_split(data.train_split, process_index, process_count)
  start = start_step * local_batch
  transform = data.train_transform
  augment_seed = reading.stream_seed(data, process_index, reading.AUGMENT_SALT)

  @tf.autograph.experimental.do_not_convert  # Graph code already: nothing to convert.
  def preprocess(image, label, position):
    seed = tf.random.experimental.stateless_fold_in(augment_seed, position)
    return {**_train_image(image, seed, transform), 'label': tf.cast(label, tf.int32)}

  access = _random_access(
      data, source, split, encoded=reading.decodes_crop_window(transform, data.repeated_aug)
  )
  if access is not None:
    batches = reading.shuffled_examples(data, access, start, process_index, preprocess)
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
    batches = reading.streamed_examples(data, source, split, start, process_index).map(
        preprocess, num_parallel_calls=reading.preprocess_calls()
    )
  batches = batches.batch(local_batch, drop_remainder=True).prefetch(data.prefetch)
  # Each image's ops run on one thread: images are preprocessed in parallel already, and splitting
  # one image's ops over threads would only add synchronisation.
  options = tf.data.Options()
  options.threading.max_intra_op_parallelism = 1
  return _damage_named(batches.with_options(options).as_numpy_iterator())


# Evaluation.


def first_eval_images(data: data_settings.DataSettings, count: int) -> np.ndarray:
  """The first `count` real images of the eval split as the model sees them, (count, S, S, 3)."""
  images = []
  for batch in eval_iterator(data, process_index=0, process_count=1):
    images.append(batch['image'][batch['mask'] > 0])
    if sum(len(x) for x in images) >= count:
      break
  return np.concatenate(images)[:count]


def eval_images_to_record(data: data_settings.DataSettings, count: int) -> np.ndarray | None:
  """What a run records of its eval split for analysis (`first_eval_images`), so that its data
  need not stay: None for the embedded digits, which stay."""
  if data.dataset == dataset_names.DIGITS:
    return None
  return first_eval_images(data, count)


def eval_iterator(
    data: data_settings.DataSettings,
    *,
    split: str | None = None,
    dataset: str | None = None,
    label_key: str | None = None,
    label_set_key: str | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """One padded pass over this process's part of `split` of `dataset` (defaults: the config's):
  'image', 'label', 'mask' (1 real, 0 padding) and with `label_set_key` 'label_set', (B, classes)
  bool. Every process yields as many batches; each example has mask 1 exactly once overall."""
  process_index, process_count = _process(process_index, process_count)
  local_batch = _local_batch(data.eval_batch_size, process_count, 'eval_batch_size')
  named = {'--config.eval_split': data.eval_split} if split is None and dataset is None else {}
  split = data.eval_split if split is None else split
  source = sources.resolve(data, dataset, label_key, label_set_key, splits=named)
  sources.check_split(source, split)
  most = max(
      sources.num_examples(source, sources.process_split(split, p, process_count))
      for p in range(process_count)
  )
  num_batches = -(-most // local_batch)
  local_split = sources.process_split(split, process_index, process_count)
  keys = (source.image_key, source.label_key) + (() if label_set_key is None else (label_set_key,))
  if source.random_access:
    access = reading.array_record_lookup(source, local_split)
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
  return _damage_named(batches.as_numpy_iterator())


def _damage_named(batches: Iterator[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
  """`batches`, a damaged file's read ending in one line naming it (`reading.damage_named`)."""
  with reading.damage_named():
    yield from batches
