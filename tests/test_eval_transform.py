"""Eval preprocessing equals timm's `create_transform(size, is_training=False, crop_pct=r,
interpolation='bicubic')`: the same crop window exactly, pixels within resampling noise."""

import numpy as np
import pytest
import tensorflow as tf

from vit_jax.schema import normalization
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.data import image_ops
from vit_jax.benchmarks import timm_reference

# (height, width): common photo shapes, portrait and landscape, odd and even, square.
PHOTO_SIZES = (
    (427, 640),
    (334, 500),
    (366, 500),
    (500, 333),
    (257, 311),
    (640, 427),
    (375, 500),
    (281, 500),
    (400, 299),
    (311, 257),
    (231, 347),
    (257, 257),
    (300, 451),
)
SETTINGS = ((224, 0.875), (224, 0.9), (224, 1.0), (384, 0.875), (384, 1.0), (160, 0.95))


def _timm_transform(size, ratio):
  timm_reference.import_timm()
  import timm.data  # pylint: disable=g-import-not-at-top

  return timm.data.create_transform(
      size, is_training=False, crop_pct=ratio, interpolation='bicubic'
  )


def _timm_window(transform, height, width):
  """(resized height, width, top, left) as timm's own Resize and CenterCrop compute them."""
  import torch  # pylint: disable=g-import-not-at-top
  import torchvision.transforms.functional as tvf  # pylint: disable=g-import-not-at-top

  resize, crop = transform.transforms[:2]
  resized_h, resized_w = tvf._compute_resized_output_size(  # pylint: disable=protected-access
      (height, width), [resize.size]
  )
  positions = torch.arange(resized_h * resized_w).reshape(1, resized_h, resized_w)
  top, left = divmod(int(crop(positions)[0, 0, 0]), resized_w)
  return resized_h, resized_w, top, left


@pytest.fixture(scope='module')
def photos():
  """Real photographs cut to PHOTO_SIZES from scikit-learn's two sample images."""
  datasets = pytest.importorskip('sklearn.datasets')
  sources = datasets.load_sample_images().images  # Two 427 x 640 photographs.
  cut = []
  for i, (height, width) in enumerate(PHOTO_SIZES):
    source = sources[i % 2]
    if height > source.shape[0]:
      source = source.transpose(1, 0, 2)
    top, left = (source.shape[0] - height) // 2, (source.shape[1] - width) // 3
    cut.append(np.ascontiguousarray(source[top : top + height, left : left + width]))
  return cut


@pytest.mark.parametrize('size, ratio', SETTINGS + ((32, 0.875), (224, 0.5)))
def test_crop_window_is_timms(size, ratio):
  transform = _timm_transform(size, ratio)
  shapes = PHOTO_SIZES + tuple(
      (h, w) for h in (size, size + 1, size + 17) for w in range(size, 3 * size, 29)
  )
  expected = [_timm_window(transform, height, width) for height, width in shapes]
  assert [image_ops.centre_crop_window(h, w, size, ratio) for h, w in shapes] == expected
  heights, widths = (tf.constant(side, tf.int32) for side in zip(*shapes))  # Run-time shapes.
  found = image_ops.centre_crop_window(heights, widths, size, ratio)
  assert list(zip(*(v.numpy().tolist() for v in found))) == expected


@pytest.mark.parametrize('size, ratio', SETTINGS)
def test_eval_images_match_timm_on_photographs(photos, size, ratio):
  from PIL import Image  # pylint: disable=g-import-not-at-top

  transform = _timm_transform(size, ratio)
  mean, std = (np.asarray(v, np.float32) for v in normalization.NORMALIZATIONS['imagenet'])
  ours_transform = data_settings.EvalTransform(
      image_size=size, crop_ratio=ratio, normalization='imagenet'
  )
  unknown_shape = tf.function(
      lambda x: input_pipeline.eval_image(x, ours_transform),
      input_signature=[tf.TensorSpec([None, None, 3], tf.uint8)],
  )
  errors = []
  for photo in photos:
    expected = transform(Image.fromarray(photo)).numpy().transpose(1, 2, 0)
    ours = input_pipeline.eval_image(tf.constant(photo), ours_transform).numpy()
    # Shapes known only at run time (a folder of photographs): the same window; the rounding
    # of a few values on a half differs by one pixel level between the two kernels.
    assert np.abs((unknown_shape(tf.constant(photo)).numpy() - ours) * std * 255).max() < 1.001
    # Back to 0..255 pixel values: PIL's 8-bit resampling vs ours in float32, then rounded.
    errors.append(np.abs((ours - expected) * std * 255).mean())
  # A window one pixel off gives 3 to 17 here; resampling alone gives < 0.25.
  assert max(errors) < 0.3, errors
