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

from vit_jax.weights import inference
from vit_jax.data import digits
from vit_jax.data import imagenet

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
