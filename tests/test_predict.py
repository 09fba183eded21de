"""`python -m vit_jax.predict`: a trained run names digits; published weights get ImageNet names."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
from PIL import Image
import pytest
from sklearn import datasets as sk_datasets

from vit_jax import models
from vit_jax.data import digits
from vit_jax.data import imagenet
from vit_jax.weights import inference
from vit_jax.weights import pretrained
from vit_jax.workdir import reader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_test_digits(directory, count: int) -> dict[str, int]:
  """The first `count` test digits as 8x8 grayscale PNGs, stored as the dataset stores them."""
  data = sk_datasets.load_digits()
  labels = {}
  for row in digits.split_indices()['test'][:count]:
    path = os.path.join(directory, f'digit_{row}.png')
    Image.fromarray(np.round(data.images[row] * 255 / 16).astype(np.uint8)).save(path)
    labels[path] = int(data.target[row])
  return labels


@pytest.mark.e2e
def test_cli_names_the_digits_of_a_trained_run_and_reports_bad_files(trained_digits_run, tmp_path):
  labels = _write_test_digits(str(tmp_path), 10)
  (tmp_path / 'broken.png').write_text('not an image')
  result = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.predict',
          f'--workdir={trained_digits_run}',
          '--json',
          '--top_k=3',
          '--batch_size=4',
          str(tmp_path),
          str(tmp_path / 'missing_*.jpg'),
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=600,
      env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL='2'),
  )
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout)
  predictions = {p['file']: p['top_k'] for p in report['predictions']}
  assert sorted(predictions) == sorted(labels)
  for top in predictions.values():
    assert len(top) == 3 and top[0]['probability'] >= top[1]['probability'] >= top[2]['probability']
    assert all(entry['name'] == str(entry['class']) for entry in top)  # Digits are named 0-9.
  right = sum(top[0]['class'] == labels[path] for path, top in predictions.items())
  assert right >= 9, predictions  # The run scores about 0.9 on the test split.
  skipped = {entry['file']: entry['reason'] for entry in report['skipped']}
  assert set(skipped) == {str(tmp_path / 'broken.png'), str(tmp_path / 'missing_*.jpg')}
  assert 'Unknown image file format' in skipped[str(tmp_path / 'broken.png')]
  assert 'skipped' in result.stderr and 'broken.png' in result.stderr


def test_published_weight_layout_runs_end_to_end_with_imagenet_names(timm_model, tmp_path):
  import torch  # pylint: disable=g-import-not-at-top
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top

  reference, state_dict = timm_model('deit_tiny_patch16_224')
  weights = str(tmp_path / 'deit_tiny.safetensors')
  safetensors_numpy.save_file(state_dict, weights)
  rng = np.random.default_rng(0)
  photo = str(tmp_path / 'photo.jpg')
  Image.fromarray(rng.integers(0, 256, (180, 260, 3), np.uint8)).save(photo)

  run = inference.load_weights(weights, 'deit_ti16')
  # A batch far larger than the images given allocates one image's batch, not its padding.
  [prediction] = list(inference.predict(run, [photo], top_k=5, batch_size=100_000_000))
  names = imagenet.class_names()
  assert len(names) == 1000 and names[0] == 'n01440764'  # tench, in TFDS's label order.
  assert [name for _, name, _ in prediction.top_k] == [names[i] for i, _, _ in prediction.top_k]

  # timm's model on the very input our eval preprocessing made ranks the same classes.
  image = inference.decode_for_model(photo, run.eval_transform)
  assert image.shape == (224, 224, 3)
  with torch.no_grad():
    logits = reference(torch.from_numpy(image[None].transpose(0, 3, 1, 2))).numpy()[0]
  expected = np.argsort(-logits)[:5]
  assert [i for i, _, _ in prediction.top_k] == expected.tolist()
  np.testing.assert_allclose(
      [p for _, _, p in prediction.top_k], np.asarray(jax.nn.softmax(logits))[expected], atol=1e-4
  )


def test_bad_arguments_are_one_clear_error(tmp_path):
  with pytest.raises(ValueError, match=r"^--normalization='imagenets': must be one of"):
    inference.load_weights(str(tmp_path / 'w.safetensors'), 'deit_ti16', normalization='imagenets')
  paths, missing = inference.image_paths([str(tmp_path / 'nothing_here')])
  assert not paths and missing[0][1].startswith('no such file')


@pytest.fixture(scope='module')
def exported_run(checkpointed_run, tmp_path_factory) -> str:
  """`checkpointed_run` (vit_ti4 with fields unlike the registry's) exported as export does."""
  run = reader.Workdir.open(checkpointed_run)
  saved = run.read_variables(unrolled=True)
  path = str(tmp_path_factory.mktemp('export') / 'run.safetensors')
  described = pretrained.describe_run(run, saved.variables)
  pretrained.export_timm(saved.variables, models.create('vit_ti4'), path, described=described)
  return path


def test_an_export_loads_as_its_run_without_naming_the_model(
    checkpointed_run, exported_run, tmp_path
):
  [image] = _write_test_digits(str(tmp_path), 1)
  original = inference.load_run(checkpointed_run)
  for weights in (
      inference.load_weights(exported_run),
      inference.load_weights(exported_run, 'vit_ti4'),
  ):
    assert weights.config.model.to_dict() == {
        'name': 'vit_ti4',
        **models.model_overrides(original.config.model),
    }
    assert weights.class_names == original.class_names
    assert weights.eval_transform == original.eval_transform
    logits = [
        np.asarray(
            r.model.apply(
                r.variables, inference.decode_for_model(image, r.eval_transform)[None], train=False
            )
        )
        for r in (original, weights)
    ]
    np.testing.assert_allclose(*logits, atol=1e-5)


def test_a_class_count_unlike_the_weights_says_which_to_give(exported_run):
  with pytest.raises(
      ValueError,
      match=r'The weights have 10 classes, not 5: give --num_classes=10 \(or leave it out\)\.',
  ):
    inference.load_weights(exported_run, num_classes=5)


def test_files_that_are_no_images_are_skipped_without_reading_them(
    exported_run, tmp_path, monkeypatch
):
  empty = tmp_path / 'empty'
  empty.mkdir()
  assert inference.image_paths([str(empty)]) == (
      [],
      [(str(empty), 'the folder holds no .jpg/.jpeg/.png images')],
  )
  images = tmp_path / 'images'
  images.mkdir()
  [digit] = _write_test_digits(str(images), 1)
  with open(os.fsencode(images) + b'/\xff.png', 'wb') as f:  # A name that is not UTF-8.
    f.write((images / os.path.basename(digit)).read_bytes())
  os.mkfifo(images / 'pipe.png')  # Read, it would block until a writer came.
  paths, missing = inference.image_paths([str(images)])
  assert len(paths) == 3 and not missing

  results = list(inference.predict(inference.load_weights(exported_run), paths))
  assert [r for r in results if not isinstance(r, inference.Prediction)] == [
      (str(images / 'pipe.png'), 'not a regular file')
  ]
  predicted = [r for r in results if isinstance(r, inference.Prediction)]
  assert {json.loads(json.dumps(p.to_json()))['file'] for p in predicted} == {
      digit,
      f'{images}/\\xff.png',
  }
  monkeypatch.setattr(inference, 'MAX_IMAGE_BYTES', 64)
  [(path, reason)] = inference.predict(inference.load_weights(exported_run), [digit])
  assert path == digit and reason.startswith('larger than')


@pytest.mark.e2e
def test_predict_refuses_a_closed_standard_output_before_loading_anything(tmp_path):
  command = [
      sys.executable,
      '-m',
      'vit_jax.predict',
      f'--workdir={tmp_path}/none',
      '--json',
      'x.png',
  ]
  result = subprocess.run(
      ['sh', '-c', '"$@" >&-', 'sh', *command],  # Started with its standard output closed.
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL='2'),
  )
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      'error: standard output is closed, so the predictions would go nowhere; give predict an '
      'open output (e.g. > predictions.txt).'
  )
