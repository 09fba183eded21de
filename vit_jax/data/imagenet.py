"""ImageNet-2012's classes: how many, and their names in TFDS's label order."""

from tensorflow_datasets.datasets.imagenet2012 import imagenet_common

NUM_CLASSES = 1000


def class_names() -> tuple[str, ...]:
  """The 1,000 ImageNet-2012 classes in label order, as TFDS names them (WordNet ids, e.g.
  'n01440764'), from the label file shipped inside the tensorflow-datasets package."""
  with open(imagenet_common.label_names_file()) as f:
    names = tuple(line.strip() for line in f if line.strip())
  if len(names) != NUM_CLASSES:
    raise ValueError(
        f'{imagenet_common.label_names_file()} lists {len(names)} classes, not {NUM_CLASSES}.'
    )
  return names
