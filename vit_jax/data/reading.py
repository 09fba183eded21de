"""A split's examples read by index (ArrayRecord reads, or one array in memory) and in training
order: shuffled per epoch by index, or streamed from TFRecord files (`input_pipeline`'s docstring).
"""

import contextlib
import dataclasses
import os
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax.data import convert
from vit_jax.data import sources
from vit_jax.schema import data as data_settings
from vit_jax.data import storage


# Records per `tf.numpy_function` read of an ArrayRecord source: enough that the Python call costs
# little per record, few enough that the first batch waits for little beyond its own records.
_READ_CHUNK = 32

# Maps a dataset of int64 example indices to one of (image uint8 (H, W, C), label) in that order
# (and the example's labels, where the source has a `label_set_key`); an `encoded` lookup yields
# the image's encoded bytes (a scalar string) instead, for `input_pipeline._train_image` to decode.
Lookup = Callable[[tf.data.Dataset], tf.data.Dataset]


# One line per damaged ArrayRecord file that a read found -> its ValueError (`read_error`).
_DAMAGED: dict[str, ValueError] = {}


def read_error(error: BaseException) -> ValueError | None:
  """The one-line ValueError naming a damaged ArrayRecord file, where `error` is the
  `tf.errors.OpError` that iterating a `tf.data` pipeline of `array_record_lookup` raised for it
  (TensorFlow passes on its message with a traceback); None for any other error."""
  if not isinstance(error, tf.errors.OpError):
    return None
  return next((e for line, e in _DAMAGED.items() if line in error.message), None)


@contextlib.contextmanager
def damage_named() -> Iterator[None]:
  """A read of a damaged file in the block ends in `read_error`'s one line, not TensorFlow's
  error and traceback."""
  try:
    yield
  except tf.errors.OpError as e:
    damaged = read_error(e)
    if damaged is None:
      raise
    raise damaged from None


@dataclasses.dataclass(frozen=True)
class Access:
  """Random access to the `num` examples of a split: `lookup` over a dataset of indices and, for a
  split held in memory, `gather` of one index (so that a training example's lookup and
  preprocessing are one `tf.data` map, whose per-element overhead dominates on small images)."""

  num: int
  lookup: Lookup
  gather: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]] | None = None


def decodes_crop_window(transform: data_settings.TrainTransform, repeated_aug: int) -> bool:
  """True where training decodes only each JPEG's inception-crop window, once per copy; False where
  it decodes each image whole once for its copies (a window still entropy-decodes the rows above
  it, so two window decodes cost more than one whole)."""
  return transform.augment == 'inception_crop' and repeated_aug == 1


def array_record_lookup(source: sources.Source, split: Any, encoded: bool = False) -> Access:
  """The `Access` of the ArrayRecord records of `split`: reads only the records asked for;
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
    keys = indices.tolist()
    try:
      return np.array(records.__getitems__(keys), dtype=object)
    except RuntimeError:  # array_record's error for a corrupted file, naming no file.
      damaged = storage.damaged_records(source.builder, split, keys)
      _DAMAGED[str(damaged)] = damaged
      raise damaged from None

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

  return Access(len(records), lookup)


def in_memory_lookup(source: sources.Source, split: Any) -> Access:
  """`split` decoded once into one array, read by index."""
  if source.random_access:
    access = array_record_lookup(source, split)
    examples = access.lookup(tf.data.Dataset.range(access.num))
  else:
    examples = source.builder.as_dataset(split=split).map(
        lambda record: (record[source.image_key], record[source.label_key])
    )
  with damage_named():
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

  return Access(int(labels.shape[0]), lookup, gather)


# Salts that keep the shuffle and augmentation random streams apart.
_SHUFFLE_SALT, AUGMENT_SALT = 0, 1
# Training images preprocessed at once per CPU. A parallel map hands out its results in order, and
# AUTOTUNE keeps at most one image per CPU in flight: one slow image (a rotation, an erasure) would
# leave the other CPUs idle until it is done. The extra calls wait in the thread pool's queue.
_PREPROCESS_CALLS_PER_CPU = 4


def stream_seed(data: data_settings.DataSettings, process_index: int, salt: int) -> tf.Tensor:
  """The seed of random stream `salt` (shuffle or augmentation) of process `process_index`."""
  base = tf.constant([data.seed, process_index], tf.int64)
  return tf.random.experimental.stateless_fold_in(base, salt)


def preprocess_calls() -> int:
  """Training images in flight in the preprocessing map (`_PREPROCESS_CALLS_PER_CPU`)."""
  return _PREPROCESS_CALLS_PER_CPU * len(os.sched_getaffinity(0))


def shuffled_examples(
    data: data_settings.DataSettings,
    access: Access,
    start: int,
    process_index: int,
    preprocess: Callable,
) -> tf.data.Dataset:
  """Stream positions start, start+1, ... → preprocess(image, label, position), shuffled per
  epoch."""
  num = access.num
  if num == 0:
    raise ValueError(f'The train split is empty for process {process_index}.')
  repeats = data.repeated_aug
  shuffle_seed = stream_seed(data, process_index, _SHUFFLE_SALT)

  def index(draw):
    epoch_seed = tf.random.experimental.stateless_fold_in(shuffle_seed, draw // num)
    return tf.random.experimental.index_shuffle(
        draw % num, epoch_seed, tf.constant(num - 1, tf.int64)
    )

  calls = preprocess_calls()
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


def streamed_examples(
    data: data_settings.DataSettings,
    source: sources.Source,
    split: Any,
    start: int,
    process_index: int,
) -> tf.data.Dataset:
  """As `shuffled_examples`, from a seeded file order and shuffle buffer (TFRecord only)."""
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

  def example(position, record):  # Images stay encoded: `input_pipeline._train_image` decodes.
    return record[source.image_key], record[source.label_key], position

  return records.map(example, num_parallel_calls=tf.data.AUTOTUNE)
