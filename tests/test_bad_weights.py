"""Weights files that cannot be trusted or placed: non-finite values, keys of no family here."""

import jax
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy

from vit_jax import models
from vit_jax.weights import pretrained


@pytest.fixture(scope='module')
def tiny_vit():
  model = models.create('vit_ti4', num_classes=10, hidden_size=32, depth=1, num_heads=2, mlp_dim=64)
  variables = jax.jit(
      lambda: model.init(jax.random.key(0), np.zeros((1, 16, 16, 3)), train=False)
  )()
  return model, variables


def _timm_file(tiny_vit, tmp_path, **replaced):
  model, variables = tiny_vit
  path = str(tmp_path / 'weights.safetensors')
  pretrained.export_timm(variables, model, path)
  tensors = {**safetensors_numpy.load_file(path), **replaced}
  safetensors_numpy.save_file(tensors, path)
  return path, tensors


def test_a_nan_in_a_weights_file_is_refused_at_load_naming_the_array(tiny_vit, tmp_path):
  path, tensors = _timm_file(tiny_vit, tmp_path)
  kernel = tensors['blocks.0.mlp.fc1.weight'].copy()
  kernel[0, :3] = [np.nan, np.inf, -np.inf]
  safetensors_numpy.save_file({**tensors, 'blocks.0.mlp.fc1.weight': kernel}, path)
  with pytest.raises(
      ValueError,
      match=(
          rf"^'{path}' holds 3 non-finite value\(s\) \(NaN or infinity\) in 'blocks.0.mlp.fc1.weight' "
          r'\(shape \(64, 32\)\): these weights are damaged'
      ),
  ):
    pretrained.load(path, tiny_vit[0], image_size=16)


def test_a_nan_in_a_google_npz_is_refused_before_conversion(tiny_vit, tmp_path):
  path = str(tmp_path / 'vit.npz')
  np.savez(path, **{'Transformer/encoder_norm/scale': np.array([1.0, np.nan], np.float32)})
  with pytest.raises(ValueError, match="non-finite value.* in 'Transformer/encoder_norm/scale'"):
    pretrained.load(path, tiny_vit[0], image_size=16)


def test_finite_weights_load(tiny_vit, tmp_path):
  path, _ = _timm_file(tiny_vit, tmp_path)
  loaded = pretrained.load(path, tiny_vit[0], image_size=16)
  np.testing.assert_array_equal(
      loaded['params']['head']['kernel'], tiny_vit[1]['params']['head']['kernel']
  )


@pytest.mark.parametrize(
    'keys, says',
    [
        (
            ('conv1.weight', 'bn1.weight', 'layer1.0.conv1.weight', 'fc.weight'),
            'it looks like a ResNet (torchvision or timm)',
        ),
        (('features.0.weight', 'classifier.1.weight'), 'it looks like a torchvision CNN'),
        (('encoder.weight', 'decoder.weight'), 'its first keys are decoder.weight, encoder.weight'),
    ],
)
def test_a_file_of_no_family_here_says_so_and_what_it_resembles(tiny_vit, tmp_path, keys, says):
  path = str(tmp_path / 'other.safetensors')
  safetensors_numpy.save_file({k: np.ones((2, 2), np.float32) for k in keys}, path)
  with pytest.raises(ValueError) as raised:
    pretrained.load(path, tiny_vit[0], image_size=16)
  message = str(raised.value)
  assert (
      'Its keys match no model family here (CaiT, DeepViT, T2T-ViT, distilled DeiT, RegNet, '
      'DeiT III, ViT/DeiT): ' in message
  )
  assert says in message
  assert 'class token' not in message  # Not advice for a ViT without one.
