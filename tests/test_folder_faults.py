"""An image folder first used by several processes at once, and files that cannot be trained on."""

import logging as std_logging
import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
from PIL import Image
import pytest

from vit_jax.data import folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _images(root: str, per_class: int = 3) -> str:
  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for name in ('a', 'b'):
      os.makedirs(os.path.join(root, split, name))
      for i in range(per_class):
        Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(
            os.path.join(root, split, name, f'{i}.jpg')
        )
  return root


@pytest.mark.e2e  # Two processes importing TensorFlow.
def test_two_processes_preparing_one_new_folder_both_get_it_prepared_once(tmp_path):
  root, data_dir, go = _images(str(tmp_path / 'images')), str(tmp_path / 'tfds'), tmp_path / 'go'
  script = textwrap.dedent(
      f"""
      import os, sys, time
      sys.path.insert(0, {REPO!r})
      from vit_jax.data import folder
      print('READY', flush=True)
      while not os.path.exists({str(go)!r}):
        time.sleep(0.01)
      builder = folder.prepare({root!r}, {data_dir!r})
      print('TRAIN', builder.info.splits['train'].num_examples, flush=True)
      """
  )
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  processes = [
      subprocess.Popen(
          [sys.executable, '-c', script],
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
          env=env,
      )
      for _ in range(2)
  ]
  for process in processes:  # Both past their imports: they start preparing together.
    assert process.stdout.readline().strip() == 'READY'
  go.touch()
  outputs = [process.communicate(timeout=240) for process in processes]
  for process, (out, err) in zip(processes, outputs):
    assert process.returncode == 0, err[-3000:]
    assert 'TRAIN 6' in out
  (dataset,) = [d for d in os.listdir(os.path.join(data_dir, 'folder')) if not d.endswith('.lock')]
  assert os.listdir(os.path.join(data_dir, 'folder', dataset)) == ['1.0.0']  # No incomplete.*.
  assert (
      sum(
          'Waiting for another process preparing' in err or 'Subsequent calls' in out
          for out, err in outputs
      )
      >= 1
  )


def test_a_killed_preparation_is_cleaned_up_on_next_use(tmp_path, caplog):
  root, data_dir = _images(str(tmp_path / 'images')), str(tmp_path / 'tfds')
  dataset_dir = os.path.dirname(folder.Folder(config=folder.scan(root), data_dir=data_dir).data_dir)
  left = os.path.join(dataset_dir, 'incomplete.ABC123_1.0.0')
  os.makedirs(left)
  open(os.path.join(left, 'folder-train.array_record-00000-of-00001'), 'wb').close()
  with caplog.at_level(std_logging.WARNING):
    builder = folder.prepare(root, data_dir)
  assert builder.info.splits['train'].num_examples == 6
  assert not os.path.exists(left)
  assert f'Removing {left}, left by a preparation that was stopped.' in caplog.text


def test_tfds_per_file_config_line_is_kept_out_of_the_log(tmp_path, caplog):
  root = _images(str(tmp_path / 'images'))
  with caplog.at_level(std_logging.INFO):
    folder.prepare(root, str(tmp_path / 'tfds'))
  assert 'Using custom data configuration' not in caplog.text
  assert '0.jpg' not in caplog.text
  config = folder.scan(root)
  assert repr(config) == f'FolderConfig({root}: 12 images in 2 classes, {config.name})'


def _gif_named_jpg(root):
  path = os.path.join(root, 'train', 'a', 'animated.jpg')
  frames = [Image.fromarray(np.full((12, 12, 3), v, np.uint8)) for v in (0, 255)]
  frames[0].save(path, format='GIF', save_all=True, append_images=frames[1:])
  return path


def _apple_double(root):
  path = os.path.join(root, 'train', 'b', '._0.jpg')
  with open(path, 'wb') as f:
    f.write(b'\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ' + bytes(64))
  return path


def _broken_link(root):
  path = os.path.join(root, 'train', 'a', 'gone.png')
  os.symlink(os.path.join(root, 'nowhere.png'), path)
  return path


@pytest.mark.parametrize(
    'make, reason',
    [
        (_gif_named_jpg, 'a GIF named .jpg, which training does not decode'),
        (_apple_double, 'an AppleDouble resource fork (macOS metadata), not an image'),
        (_broken_link, 'not readable (No such file or directory)'),
    ],
)
def test_a_file_training_cannot_decode_is_named_at_preparation(tmp_path, make, reason):
  root = _images(str(tmp_path / 'images'))
  path = make(root)
  reason = re.escape(reason)
  with pytest.raises(
      ValueError,
      match=(
          rf"^1 file\(s\) in the image folder '{root}' cannot be decoded: {path} \({reason}\)\. "
          'Repair or remove them, or set --config.skip_unreadable_images=true'
      ),
  ):
    folder.prepare(root, str(tmp_path / 'tfds'))


@pytest.mark.parametrize('make', [_gif_named_jpg, _apple_double])
def test_skip_unreadable_images_leaves_them_out_with_a_warning(tmp_path, caplog, make):
  root = _images(str(tmp_path / 'images'))
  path = make(root)
  with caplog.at_level(std_logging.WARNING):
    builder = folder.prepare(root, str(tmp_path / 'tfds'), skip_unreadable=True)
  assert f'Leaving out {path}, which cannot be decoded (' in caplog.text
  assert builder.info.splits['train'].num_examples == 6


def test_a_decompression_bomb_is_named_not_decoded(tmp_path, monkeypatch):
  root = _images(str(tmp_path / 'images'))
  monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 50)  # 12 x 12 images: PIL's bombs (> 2 x 50).
  with pytest.raises(ValueError, match=r'cannot be decoded: .*0\.jpg \(a decompression bomb: '):
    folder.scan(root)
  monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 120)  # Over the limit, under PIL's own error.
  with pytest.raises(ValueError, match=r'\(12x12 pixels, more than the 120 beyond which'):
    folder.scan(root)


def test_files_of_unread_formats_are_counted_in_one_warning(tmp_path, caplog):
  root = _images(str(tmp_path / 'images'))
  for name in ('x.webp', 'y.webp', 'z.gif'):
    open(os.path.join(root, 'train', 'a', name), 'wb').close()
  with caplog.at_level(std_logging.WARNING):
    folder.scan(root)
  assert caplog.text.count('left out') == 1
  assert (
      f'Image folder {root}: left out 3 file(s) of formats the pipeline does not read '
      '(.gif: 1, .webp: 2)'
  ) in caplog.text


def test_files_beside_the_class_directories_are_named_in_one_warning(tmp_path, caplog):
  root = _images(str(tmp_path / 'images'))
  for name in ('stray.png', 'labels.txt', '.DS_Store'):
    open(os.path.join(root, 'train', name), 'wb').close()
  for i in range(6):
    open(os.path.join(root, 'test', f'{i}.jpg'), 'wb').close()
  with caplog.at_level(std_logging.WARNING):
    scanned = folder.scan(root)
  assert scanned.classes == ('a', 'b')
  assert caplog.text.count('directly in a split directory') == 1
  assert (
      f'Image folder {root}: left out 8 file(s) lying directly in a split directory, outside '
      'every class directory (test/0.jpg, test/1.jpg, test/2.jpg, test/3.jpg, test/4.jpg and 3 '
      'more); move images into their class directory to use them.'
  ) in caplog.text


def test_a_changed_folder_names_its_earlier_copies_when_prepared_afresh(tmp_path, caplog):
  root, data_dir = _images(str(tmp_path / 'images')), str(tmp_path / 'tfds')
  first = folder.prepare(root, data_dir)
  Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(os.path.join(root, 'train', 'a', 'x.jpg'))
  with caplog.at_level(std_logging.WARNING):
    folder.prepare(root, data_dir)
  earlier = os.path.dirname(str(first.data_dir))
  assert (
      f'Image folder {root} changed since it was prepared: its earlier copies, no longer read, '
      f'remain at {earlier} ('
  ) in caplog.text
