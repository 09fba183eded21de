"""big_vision ViT `.npz` checkpoints load with the logits of big_vision's own model code
(tests/reference/big_vision_vit.py) on the same weights, for each of its pooling heads."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.reference import big_vision_vit
from vit_jax import models
from vit_jax.weights import pretrained
from vit_jax.benchmarks import timm_reference
from vit_jax.training import steps

WIDTH, DEPTH, HEADS, MLP, CLASSES, SIZE = 32, 2, 2, 64, 5, 16
# big_vision pool_type -> our global_pool.
POOLS = {'tok': 'token', 'gap': 'avg', 'map': 'map'}


def _big_vision_npz(path, pool_type: str, rep_size: int | bool = False, prefix: str = 'params/'):
  """A big_vision ViT with random weights, saved as big_vision saves them; returns the model."""
  reference = big_vision_vit.Model(
      CLASSES,
      patch_size=(4, 4),
      width=WIDTH,
      depth=DEPTH,
      mlp_dim=MLP,
      num_heads=HEADS,
      pool_type=pool_type,
      rep_size=rep_size,
      head_zeroinit=False,
  )
  params = reference.init(jax.random.key(0), jnp.zeros((1, SIZE, SIZE, 3)))['params']
  flat = flax.traverse_util.flatten_dict(jax.device_get(params), sep='/')
  rng = np.random.default_rng(1)
  flat = {
      key: np.asarray(value) + 0.1 * rng.normal(size=value.shape).astype(np.float32)
      for key, value in flat.items()
  }  # Non-trivial norms, biases and class token too.
  np.savez(path, **{prefix + key: value for key, value in flat.items()})
  return reference, flax.traverse_util.unflatten_dict(flat, sep='/')


@pytest.mark.parametrize(
    'pool_type, rep_size, prefix',
    [
        ('tok', False, 'params/'),
        ('tok', 24, ''),
        ('gap', False, 'params/img/'),
        ('map', False, 'params/'),
    ],
)
def test_logits_equal_big_visions(tmp_path, pool_type, rep_size, prefix):
  path = str(tmp_path / 'bv.npz')
  reference, params = _big_vision_npz(path, pool_type, rep_size, prefix)
  model = models.create(
      'vit_ti4',
      num_classes=CLASSES,
      hidden_size=WIDTH,
      depth=DEPTH,
      num_heads=HEADS,
      mlp_dim=MLP,
      global_pool=POOLS[pool_type],
      mlp_activation='gelu_tanh',
      representation_size=rep_size or None,
  )
  variables = pretrained.load(path, model, image_size=SIZE)
  images = np.random.default_rng(2).uniform(-1, 1, size=(3, SIZE, SIZE, 3)).astype(np.float32)
  logits = jax.jit(model.apply)(variables, images)
  expected, _ = jax.jit(reference.apply)({'params': params}, images)
  assert np.abs(expected).max() > 0.5
  np.testing.assert_allclose(logits, expected, atol=2e-5, rtol=1e-5)


def test_init_from_a_big_vision_npz_fine_tunes_at_another_size(tmp_path):
  path = str(tmp_path / 'bv.npz')
  _big_vision_npz(path, 'gap')
  model = models.create(
      'vit_ti4',
      num_classes=3,
      hidden_size=WIDTH,
      depth=DEPTH,
      num_heads=HEADS,
      mlp_dim=MLP,
      global_pool='avg',
      mlp_activation='gelu_tanh',
  )
  variables = pretrained.load(
      path, model, image_size=24, reset_head=True, rng=steps.init_rngs(0)[0]
  )  # As fine-tuning reads it.
  assert variables['params']['pos_embed'].shape == (1, 36, WIDTH)  # 4x4 grid -> 6x6, no cls.
  assert variables['params']['head']['kernel'].shape == (WIDTH, 3)


def test_a_class_token_model_names_the_missing_token(tmp_path):
  path = str(tmp_path / 'bv.npz')
  _big_vision_npz(path, 'gap')
  model = models.create(
      'vit_ti4', num_classes=CLASSES, hidden_size=WIDTH, depth=DEPTH, num_heads=HEADS, mlp_dim=MLP
  )
  with pytest.raises(ValueError, match="no class token.*global_pool='avg'(.|\n)*cls_token"):
    pretrained.load(path, model, image_size=SIZE)


@pytest.mark.parametrize('pool_type', ['gap', 'map'])
def test_exported_to_timm_gives_timms_logits(tmp_path, pool_type):
  """The pooled heads in timm's layout: timm's ViT of the same pooling reads the export."""
  torch = pytest.importorskip('torch')
  timm = timm_reference.import_timm()
  path = str(tmp_path / 'bv.npz')
  reference, params = _big_vision_npz(path, pool_type)
  model = models.create(
      'vit_ti4',
      num_classes=CLASSES,
      hidden_size=WIDTH,
      depth=DEPTH,
      num_heads=HEADS,
      mlp_dim=MLP,
      global_pool=POOLS[pool_type],
      mlp_activation='gelu_tanh',
  )
  out = str(tmp_path / 'timm.safetensors')
  pretrained.export_timm(pretrained.load(path, model, image_size=SIZE), model, out)
  twin = timm.models.vision_transformer.VisionTransformer(
      img_size=SIZE,
      patch_size=4,
      num_classes=CLASSES,
      embed_dim=WIDTH,
      depth=DEPTH,
      num_heads=HEADS,
      mlp_ratio=MLP / WIDTH,
      class_token=False,
      fc_norm=False,
      global_pool=POOLS[pool_type],
      act_layer='gelu_tanh',
  ).eval()
  from safetensors import torch as safetensors_torch  # pylint: disable=g-import-not-at-top

  twin.load_state_dict(safetensors_torch.load_file(out))
  images = np.random.default_rng(2).uniform(-1, 1, size=(3, SIZE, SIZE, 3)).astype(np.float32)
  with torch.no_grad():
    logits = twin(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
  expected, _ = jax.jit(reference.apply)({'params': params}, images)
  np.testing.assert_allclose(logits, expected, atol=2e-5, rtol=1e-5)
