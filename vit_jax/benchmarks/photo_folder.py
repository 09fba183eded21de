"""Image folders of ImageNet-sized JPEG photographs for the input benchmark, cut offline from the
sample photographs that scikit-learn and matplotlib ship:

  python -c "from vit_jax.benchmarks import photo_folder; photo_folder.write('/tmp/photos_a', 'sklearn')"
  python -m vit_jax.benchmark --mode=input_pipeline --batch=96 --vs_timm \
      --config=configs/deit.py:variant=S,dataset=folder:/tmp/photos_a

Each image is a random crop (35-100 % of the largest of its aspect) of a source photograph,
resized to 500x375 (or 375x500, three in ten), its colours scaled and shifted per channel,
mirrored half of the time, saved as JPEG at quality 90; `test/` holds copies of each class's first
five.
"""

import os

import numpy as np
from PIL import Image

SOURCES = ('sklearn', 'matplotlib')
SIZE = (500, 375)  # Width x height of a landscape image; portrait images are its transpose.
_PORTRAIT = 0.3
_TEST_PER_CLASS = 5


def source_photographs(source: str) -> list[Image.Image]:
  """The photographs of `source`: 'sklearn' (china.jpg, flower.jpg) or 'matplotlib'
  (grace_hopper.jpg)."""
  if source == 'sklearn':
    from sklearn import datasets  # pylint: disable=g-import-not-at-top

    return [Image.fromarray(image) for image in datasets.load_sample_images().images]
  if source == 'matplotlib':
    from matplotlib import cbook  # pylint: disable=g-import-not-at-top

    path = cbook.get_sample_data('grace_hopper.jpg', asfileobj=False)
    return [Image.open(str(path)).convert('RGB')]
  raise ValueError(f'Unknown photograph source {source!r}; valid: {SOURCES}.')


def write(root: str, source: str, classes: int = 10, per_class: int = 300, seed: int = 0) -> str:
  """Writes `classes` x `per_class` JPEGs under root/train/class<k>/ (and five of each class to
  root/test/) from `source`'s photographs; returns `root`."""
  photographs = source_photographs(source)
  if os.path.exists(root) and os.listdir(root):
    raise ValueError(f'{root} is not empty; name a new folder for the photographs.')
  rng = np.random.default_rng(seed)
  for label in range(classes):
    train = os.path.join(root, 'train', f'class{label}')
    test = os.path.join(root, 'test', f'class{label}')
    os.makedirs(train)
    os.makedirs(test)
    for index in range(per_class):
      photograph = photographs[rng.integers(len(photographs))]
      width, height = SIZE[::-1] if rng.random() < _PORTRAIT else SIZE
      scale = rng.uniform(0.35, 1.0)
      crop_w = int(min(photograph.width, photograph.height * width / height) * scale)
      crop_h = int(min(photograph.height, photograph.width * height / width) * scale)
      left = int(rng.integers(0, photograph.width - crop_w + 1))
      top = int(rng.integers(0, photograph.height - crop_h + 1))
      crop = photograph.crop((left, top, left + crop_w, top + crop_h))
      resized = np.asarray(crop.resize((width, height), Image.Resampling.BICUBIC), np.float64)
      pixels = resized * rng.uniform(0.7, 1.2, 3) + rng.uniform(-20, 20, 3)
      if rng.random() < 0.5:
        pixels = pixels[:, ::-1]
      image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
      image.save(os.path.join(train, f'{index}.jpg'), quality=90)
      if index < _TEST_PER_CLASS:
        image.save(os.path.join(test, f'{index}.jpg'), quality=90)
  return root
