"""An ArrayRecord copy of a TFDS dataset prepared as TFRecord, so training reads it by index.

`add_array_record` copies each TFRecord shard, record for record, into an ArrayRecord shard beside
it and registers the format in `dataset_info.json` (an "alternative file format"), so that both
`tfds.load` and `tfds.data_source` work; the command is `python -m vit_jax.convert`.
"""

import os

from absl import logging
import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.core import file_adapters

from vit_jax.schema import dataset_names
from vit_jax.data import storage

ARRAY_RECORD = file_adapters.FileFormat.ARRAY_RECORD


def prepared_builder(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
  """The builder of TFDS dataset `name` prepared in `data_dir`; a ValueError of one line where
  no dataset has that name or it is not prepared there."""
  why = dataset_names.unknown(name)
  if why is not None:
    raise ValueError(f'--dataset={name!r}: {why}')
  storage.check_location(data_dir)
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    raise ValueError(
        f'Dataset {name!r} is not prepared in {builder.data_dir}; '
        'prepare it first (tfds build, or its own instructions).'
    )
  return builder


def has_array_record(builder: tfds.core.DatasetBuilder) -> bool:
  """True if `builder`'s prepared data can be read by example index (ArrayRecord)."""
  info = builder.info
  # TFDS restores `dataset_info.json`'s alternative formats into the proto only, not into the list
  # that `available_file_formats()` and `as_data_source()` read: a freshly opened builder would
  # miss the ArrayRecord copy (and every process would write it again, racing the others' reads).
  for value in info.as_proto.alternative_file_formats:
    fmt = file_adapters.FileFormat.from_value(value)
    if fmt not in info.alternative_file_formats:
      info.alternative_file_formats.append(fmt)
  return ARRAY_RECORD in info.available_file_formats()


def add_array_record(builder: tfds.core.DatasetBuilder) -> None:
  """Writes an ArrayRecord copy of every TFRecord shard of the prepared `builder` and registers it.

  A copy whose files are gone is written again; a refused write (a full or read-only disk) is one
  line, with the copy's files written so far removed.
  """
  missing = storage.missing_files(builder)
  lost_copies = [path for path in missing if ARRAY_RECORD.file_suffix in os.path.basename(path)]
  if missing != lost_copies or (missing and builder.info.file_format == ARRAY_RECORD):
    storage.check_complete(builder, builder.name)
  if has_array_record(builder) and not lost_copies:
    return
  what = f'the ArrayRecord copy of {builder.name!r}'
  storage.check_writable(str(builder.data_dir), what)
  adapter = file_adapters.ADAPTER_FOR_FORMAT[ARRAY_RECORD]
  written: list[str] = []
  with storage.writing(str(builder.data_dir), what, lambda: written):
    for split in builder.info.splits.values():
      template = split.filename_template.replace(filetype_suffix=ARRAY_RECORD.file_suffix)
      targets = template.sharded_filepaths(len(split.shard_lengths))
      for source, target in zip(split.filepaths, targets):
        logging.info('Copying %s to %s.', source, target)
        records = tf.data.TFRecordDataset(str(source)).as_numpy_iterator()
        written.append(str(target))
        adapter.write_examples(target, enumerate(records))
    if not has_array_record(builder):
      builder.info.add_alternative_file_format(ARRAY_RECORD)
      builder.info.write_to_directory(builder.data_dir)
