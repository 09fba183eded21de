"""The embedded `digits` dataset: 1,797 real 8x8 handwritten digits, as a TFDS builder.

Provenance: the images are the copy of the UCI "Optical Recognition of Handwritten Digits" test set
(optdigits, E. Alpaydin and C. Kaynak, 1998) that ships inside scikit-learn as
`sklearn.datasets.load_digits`. 43 writers; 32x32 bitmaps were divided into 4x4 blocks and the
pixels of each block counted, giving 8x8 images with values 0..16. Licence: CC BY 4.0 (UCI Machine
Learning Repository, https://doi.org/10.24432/C50P49).

Everything is read from the scikit-learn package, so preparing the dataset needs no network. The
builder stores images as uint8 (8, 8, 1) scaled from 0..16 to 0..255 (round(v * 255 / 16)) and
splits the 1,797 examples once, stratified by class, with a fixed seed:

  train: 1,437 examples    test: 360 examples    (20 % test, `TEST_FRACTION`, seed `SPLIT_SEED`)

Per class (0..9) the test split holds 36, 36, 35, 37, 36, 37, 36, 36, 35, 36 examples
(`TEST_COUNTS`): the class frequencies of the whole set to within one example. Each example also
carries `index`, its row in `load_digits()`, so the split can be audited.
"""

import functools

import numpy as np
from sklearn import datasets as sk_datasets
from sklearn import model_selection
import tensorflow_datasets as tfds

from vit_jax.schema import dataset_names as datasets
from vit_jax.data import convert
from vit_jax.data import folder
from vit_jax.data import storage

NUM_CLASSES = 10
TEST_FRACTION = 0.2
SPLIT_SEED = 0
NUM_TRAIN_EXAMPLES = 1437
NUM_TEST_EXAMPLES = 360
TEST_COUNTS = (36, 36, 35, 37, 36, 37, 36, 36, 35, 36)

_CITATION = """\
@misc{optical_recognition_of_handwritten_digits_80,
  author = {Alpaydin, E. and Kaynak, C.},
  title = {{Optical Recognition of Handwritten Digits}},
  year = {1998},
  howpublished = {UCI Machine Learning Repository},
  note = {{DOI}: https://doi.org/10.24432/C50P49}
}"""


def split_indices() -> dict[str, np.ndarray]:
  """Rows of `load_digits()` in each split: the fixed stratified 80/20 split."""
  labels = sk_datasets.load_digits().target
  train, test = model_selection.train_test_split(
      np.arange(len(labels)), test_size=TEST_FRACTION, stratify=labels, random_state=SPLIT_SEED
  )
  return {'train': np.sort(train), 'test': np.sort(test)}


class Digits(tfds.core.GeneratorBasedBuilder):
  """scikit-learn's 8x8 handwritten digits (UCI optdigits), prepared locally without network."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Stratified 80/20 split of sklearn.datasets.load_digits, seed 0.'}
  # Nothing is downloaded, so there are no URL checksums to look up beside the module.
  url_infos = None

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict(
            {
                'image': tfds.features.Image(shape=(8, 8, 1)),
                'label': tfds.features.ClassLabel(num_classes=NUM_CLASSES),
                'index': np.int64,
            }
        ),
        supervised_keys=('image', 'label'),
        homepage='https://archive.ics.uci.edu/dataset/80',
        citation=_CITATION,
        license='CC BY 4.0',
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Everything comes from the scikit-learn package.
    return {name: self._generate_examples(rows) for name, rows in split_indices().items()}

  def _generate_examples(self, rows: np.ndarray):
    digits = sk_datasets.load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    for row in rows:
      yield int(row), {'image': images[row], 'label': int(digits.target[row]), 'index': int(row)}


def prepare(data_dir: str | None = None) -> tfds.core.DatasetBuilder:
  """The `digits` builder for `data_dir` (TFDS's default if None), prepared on first use.

  Stored twice (340 KB each): TFRecord for `tfds.load`, ArrayRecord for training by index.
  """
  builder = Digits(data_dir=data_dir)
  if (
      builder.is_prepared()
      and convert.has_array_record(builder)
      and not storage.missing_files(builder)
  ):
    return builder  # Nothing to write: a read-only data dir serves.
  what = f'the {datasets.DIGITS!r} dataset'
  storage.check_writable(builder.data_dir_root, what)
  leftovers = functools.partial(storage.preparation_leftovers, builder)
  with storage.writing(builder.data_dir_root, what, leftovers), folder.preparing(builder):
    builder = Digits(data_dir=data_dir)  # Read after the wait: another may have prepared it.
    if storage.remove_if_incomplete(builder, what):
      builder = Digits(data_dir=data_dir)
    if not builder.is_prepared():
      builder.download_and_prepare()
      builder = Digits(data_dir=data_dir)
    convert.add_array_record(builder)
  return builder
