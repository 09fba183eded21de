"""Image-folder datasets: layout checks, class inference, and the shared pipeline on top."""

import collections
import itertools
import os

import numpy as np
from PIL import Image
import pytest

from vit_jax.configs import common
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.data import folder
from vit_jax.schema import setting

CLASSES = ('cat', 'dog', 'emu')  # Written out of order below, so sorting is exercised.


def _write_images(root, sizes=((12, 12),), train_per_class=7, test_per_class=3):
  """~30 small images, PNG (lossless, some grayscale) and JPEG; returns {path: (pixels, class)}."""
  rng = np.random.default_rng(0)
  written = {}
  for split, count in (('train', train_per_class), ('test', test_per_class)):
    for name in reversed(CLASSES):
      os.makedirs(os.path.join(root, split, name), exist_ok=True)
      for i in range(count):
        width, height = sizes[i % len(sizes)]
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        if i % 3 == 1:
          pixels = np.repeat(pixels[..., :1], 3, axis=-1)
          image = Image.fromarray(pixels[..., 0], mode='L')
        else:
          image = Image.fromarray(pixels)
        extension = '.jpg' if i % 3 == 2 else '.png'
        path = os.path.join(root, split, name, f'{i}{extension}')
        image.save(path)
        written[path] = (pixels if extension == '.png' else None, CLASSES.index(name))
  with open(os.path.join(root, 'train', 'cat', 'notes.txt'), 'w') as f:
    f.write('not an image')
  return written


def _config(root, data_dir, **overrides):
  config = common.get_config()
  config.dataset = f'folder:{root}'
  config.data_dir = data_dir
  config.normalization = 'inception'
  config.update(overrides)
  return config


def test_scan_infers_sorted_classes_and_fixed_shape(tmp_path):
  _write_images(str(tmp_path / 'images'))
  scanned = folder.scan(str(tmp_path / 'images'))
  assert scanned.classes == CLASSES
  assert scanned.image_shape == (12, 12, 3)
  counts = {split: len(files) for split, files in scanned.files}
  assert counts == {'train': 21, 'test': 9}


def test_info_batches_and_eval_through_the_shared_pipeline(tmp_path):
  root, data_dir = str(tmp_path / 'images'), str(tmp_path / 'tfds')
  written = _write_images(root)
  config = _config(root, data_dir, image_size=12, augment='none', batch_size=21, eval_batch_size=4)
  info = input_pipeline.get_dataset_info(setting.build(data_settings.DataSettings, config))
  assert (info.num_classes, info.num_train_examples, info.num_eval_examples) == (3, 21, 9)
  batch = next(
      input_pipeline.train_iterator(
          setting.build(data_settings.DataSettings, config), process_index=0, process_count=1
      )
  )
  assert batch['image'].shape == (21, 12, 12, 3) and batch['image'].dtype == np.float32
  assert collections.Counter(batch['label'].tolist()) == {0: 7, 1: 7, 2: 7}
  # Lossless training images come back exactly (inception normalisation inverted).
  pixels = np.round((batch['image'] * 0.5 + 0.5) * 255).astype(np.uint8)
  expected = collections.Counter(
      (p.tobytes(), label)
      for path, (p, label) in written.items()
      if '/train/' in path and p is not None
  )
  seen = collections.Counter((p.tobytes(), int(label)) for p, label in zip(pixels, batch['label']))
  assert expected <= seen
  batches = list(
      input_pipeline.eval_iterator(
          setting.build(data_settings.DataSettings, config), process_index=0, process_count=1
      )
  )
  assert len(batches) == 3
  labels = np.concatenate([b['label'][b['mask'] == 1] for b in batches])
  assert collections.Counter(labels.tolist()) == {0: 3, 1: 3, 2: 3}


def test_mixed_sizes_stream_and_resize(tmp_path):
  root, data_dir = str(tmp_path / 'images'), str(tmp_path / 'tfds')
  _write_images(root, sizes=((12, 12), (20, 14), (9, 16)))
  config = _config(
      root,
      data_dir,
      image_size=16,
      augment='inception_crop',
      batch_size=8,
      eval_batch_size=8,
      eval_crop_ratio=0.875,
  )
  assert folder.scan(root).image_shape == (None, None, 3)
  batches = list(
      itertools.islice(
          input_pipeline.train_iterator(
              setting.build(data_settings.DataSettings, config), process_index=0, process_count=1
          ),
          2,
      )
  )
  assert all(b['image'].shape == (8, 16, 16, 3) for b in batches)
  again = next(
      input_pipeline.train_iterator(
          setting.build(data_settings.DataSettings, config),
          start_step=1,
          process_index=0,
          process_count=1,
      )
  )
  np.testing.assert_array_equal(again['image'], batches[1]['image'])
  evaluated = list(
      input_pipeline.eval_iterator(
          setting.build(data_settings.DataSettings, config), process_index=1, process_count=2
      )
  )
  assert all(b['image'].shape == (4, 16, 16, 3) for b in evaluated)


def test_missing_folder(tmp_path):
  with pytest.raises(ValueError, match='does not exist.*<split>/<class>'):
    input_pipeline.get_dataset_info(
        setting.build(data_settings.DataSettings, _config(str(tmp_path / 'nowhere'), str(tmp_path)))
    )


def test_empty_class(tmp_path):
  root = str(tmp_path / 'images')
  _write_images(root)
  os.makedirs(os.path.join(root, 'test', 'fox'))
  os.makedirs(os.path.join(root, 'train', 'fox'))
  with open(os.path.join(root, 'train', 'fox', 'a.png'), 'wb') as f:
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(f)
  with pytest.raises(ValueError, match=r"test/fox' holds no images"):
    folder.scan(root)


def test_mismatched_classes(tmp_path):
  root = str(tmp_path / 'images')
  _write_images(root)
  os.rename(os.path.join(root, 'test', 'emu'), os.path.join(root, 'test', 'owl'))
  with pytest.raises(ValueError, match=r"only in 'train': \['emu'\]; only in 'test': \['owl'\]"):
    folder.scan(root)


def test_unreadable_image(tmp_path):
  root = str(tmp_path / 'images')
  _write_images(root)
  with open(os.path.join(root, 'test', 'dog', 'broken.png'), 'w') as f:
    f.write('not a png')
  with pytest.raises(ValueError, match='broken.png.*not a readable image'):
    folder.scan(root)


def test_edited_folder_is_prepared_afresh(tmp_path):
  root, data_dir = str(tmp_path / 'images'), str(tmp_path / 'tfds')
  _write_images(root)
  first = folder.prepare(root, data_dir)
  Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(os.path.join(root, 'test', 'cat', 'x.png'))
  second = folder.prepare(root, data_dir)
  assert first.builder_config.name != second.builder_config.name
  assert second.info.splits['test'].num_examples == 10


def test_macos_archive_folders_are_not_data(tmp_path):
  root = tmp_path / 'images'
  _write_images(str(root))
  for where in (root / '__MACOSX', root / 'train' / '__MACOSX'):
    where.mkdir()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(where / '._0.png')
  scanned = folder.scan(str(root))
  assert scanned.classes == CLASSES
  assert {split for split, _ in scanned.files} == {'train', 'test'}


def test_one_class_is_refused_before_training(tmp_path):
  root, data_dir = tmp_path / 'images', str(tmp_path / 'tfds')
  _write_images(str(root))
  for split in ('train', 'test'):
    for name in CLASSES[1:]:
      for path in (root / split / name).iterdir():
        path.unlink()
      (root / split / name).rmdir()
  config = _config(str(root), data_dir, image_size=12)
  with pytest.raises(ValueError, match=r'has 1 class \(cat\): a classifier needs two or more'):
    input_pipeline.get_dataset_info(setting.build(data_settings.DataSettings, config))


def test_images_in_sub_folders_of_a_class_are_its_images(tmp_path):
  """As torchvision's `ImageFolder`: a class directory's sub-folders at any depth (hidden ones,
  `__MACOSX` and a link back up apart) hold images of the class."""
  root = tmp_path / 'images'
  _write_images(str(root))
  before = {split: len(files) for split, files in folder.scan(str(root)).files}
  nested = root / 'train' / CLASSES[0] / 'day_1' / 'morning'
  nested.mkdir(parents=True)
  Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(nested / 'extra.png')
  (root / 'train' / CLASSES[0] / '.cache').mkdir()
  Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(
      root / 'train' / CLASSES[0] / '.cache' / 'x.png'
  )
  os.symlink(root / 'train' / CLASSES[0], nested / 'loop')
  scanned = folder.scan(str(root))
  files = dict(scanned.files)
  assert len(files['train']) == before['train'] + 1
  assert (CLASSES[0], str(nested / 'extra.png')) in files['train']


def test_a_class_name_with_a_line_break_is_refused(tmp_path):
  root = tmp_path / 'images'
  _write_images(str(root))
  for split in ('train', 'test'):
    os.rename(root / split / CLASSES[0], root / split / 'two\nlines')
  with pytest.raises(ValueError) as refusal:
    folder.scan(str(root))
  assert "class directories ['two\\nlines'] have names with line breaks" in str(refusal.value)
  assert '\n' not in str(refusal.value)


@pytest.mark.parametrize(
    'overrides, missing, advice',
    [
        ({}, 'test', "--config.eval_split='train[:10%]'"),
        (
            {'train_split': 'val', 'eval_split': 'train[:10%]'},
            'val',
            "--config.train_split='train'",
        ),
    ],
)
def test_a_split_without_its_directory_is_named_before_preparing(
    tmp_path, overrides, missing, advice
):
  root, data_dir = str(tmp_path / 'images'), tmp_path / 'tfds'
  _write_images(root)
  for path in (tmp_path / 'images' / 'test').rglob('*.*'):
    path.unlink()
  for name in CLASSES:
    (tmp_path / 'images' / 'test' / name).rmdir()
  (tmp_path / 'images' / 'test').rmdir()
  config = _config(root, str(data_dir), image_size=12, **overrides)
  with pytest.raises(ValueError) as raised:
    input_pipeline.get_dataset_info(setting.build(data_settings.DataSettings, config))
  assert str(raised.value).startswith(
      f'Image folder {root!r} has no {missing}/ directory, which --config.'
  ), raised.value
  assert f"(its split directories: ['train']): add {missing}/ with the same class" in str(
      raised.value
  )
  assert str(raised.value).endswith(f'to a split it has, e.g. {advice}.'), raised.value
  assert not data_dir.exists()  # Refused before anything is prepared.
