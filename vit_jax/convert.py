r"""Adds an ArrayRecord copy to a TFDS dataset prepared as TFRecord, so training reads it by index.

Training reads ArrayRecord datasets example by example (exact resume at any step in constant
time); a dataset stored as TFRecord only is streamed, and resuming it reads every record consumed
before. This copies each TFRecord shard, record for record, into an ArrayRecord shard beside it and
registers the format in the dataset's `dataset_info.json` (TFDS's "alternative file format"), so
both `tfds.load` and `tfds.data_source` work afterwards. Nothing is downloaded or re-decoded:

  python -m vit_jax.convert --dataset=imagenet2012 --data_dir=/path/to/tfds

(`tfds build imagenet2012 --file_format=array_record` prepares a dataset afresh in that format.)
"""

from absl import flags

from vit_jax.process import runtime

_DATASET = flags.DEFINE_string(
    'dataset', None, 'TFDS name of a prepared dataset, e.g. cifar10.', required=True
)
_DATA_DIR = flags.DEFINE_string('data_dir', None, "TFDS data dir (default: TFDS's own).")


def main(argv) -> None:
  del argv
  from vit_jax.data import convert  # pylint: disable=g-import-not-at-top

  builder = convert.prepared_builder(_DATASET.value, _DATA_DIR.value)
  convert.add_array_record(builder)
  formats = sorted(f.value for f in builder.info.available_file_formats())
  print(f'{builder.data_dir}: formats {formats}.')


if __name__ == '__main__':
  runtime.run(main)
