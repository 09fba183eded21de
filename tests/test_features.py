"""Features of every family (its config's quick model, `configs.family_configs`): shapes, the
model's own forward, timm's `forward_intermediates`, and scanned runs read exactly as unrolled
ones."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import configs
from vit_jax import models
from vit_jax.models import features
from vit_jax.models import layouts

FAMILIES = configs.family_configs()
IMAGES = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))  # The quick models' input size.
HEADS = ('head', 'head_dist')  # The class head, then a distilled DeiT's distillation head.


def _model(family: str, **overrides):
  """The family config's quick model, two blocks deep where its blocks are a stack of like ones
  (those that scan)."""
  config = importlib.import_module(f'vit_jax.configs.{family}').get_config()
  fields = models.fields(config.model.name)
  if 'scan_layers' in fields:
    overrides = {field: 2 for field in ('depth', 'num_layers') if field in fields} | overrides
  return models.create(
      config.model.name,
      num_classes=5,
      **(models.model_overrides(config.model.to_dict()) | overrides),
  )


def _head(params, name: str, x):
  return x @ params[name]['kernel'] + params[name]['bias']


@pytest.mark.parametrize('family', FAMILIES)
def test_shapes_and_the_heads_of_the_head_inputs_give_the_logits(family):
  model = _model(family)
  variables = jax.jit(model.init)(jax.random.key(0), IMAGES)
  assert set(variables) <= {'params', 'batch_stats'}  # Nothing is sown at init.
  logits, out = jax.jit(
      lambda v, x: (model.apply(v, x), features.extract(model, v, x, blocks=None))
  )(variables, IMAGES)
  blocks = [name for name in out.patch_grid if name != features.ENCODED]
  assert blocks == features.block_names(out.patch_grid)
  prefix = len(getattr(model, 'prefix_tokens', None) or ())
  for name in blocks:
    grid = out.patch_grid[name]
    assert grid.ndim == 4 and grid.shape[0] == 2
    assert out.prefix_tokens[name].shape == (2, prefix, grid.shape[-1])
  rows = [out.patch_grid[name].shape[1] for name in blocks]
  if hasattr(model, 'stages'):  # RegNet's stages each halve the resolution: 16 -> 8 (stem) -> 4.
    assert rows == [max(1, 8 // 2 ** (i + 1)) for i in range(len(blocks))]
  else:  # A transformer's two blocks, each on the same grid of patch tokens.
    assert len(blocks) == 2 and len({out.patch_grid[name].shape for name in blocks}) == 1
  # CaiT's class token joins in its class-attention stage, before the final norm.
  joins = getattr(model, 'class_stage', None) == 'class_attention'
  encoded = out.prefix_tokens[features.ENCODED]
  assert encoded.shape[1] == (1 if joins and not prefix else prefix)
  # Without a representation layer, what the heads read is the final prefix tokens' mean (class
  # and distillation tokens) or, where there are none, the final grid's.
  pooled = (
      encoded.mean(axis=1) if encoded.shape[1] else out.patch_grid[features.ENCODED].mean((1, 2))
  )
  np.testing.assert_allclose(out.pre_logits, pooled, atol=1e-5)
  params = variables['params']
  heads = [_head(params, name, x) for name, x in zip(HEADS, out.head_inputs)]
  np.testing.assert_allclose(sum(heads) / len(heads), logits, atol=1e-5)


def test_the_representation_layer_sits_between_the_class_token_and_the_head():
  model = models.create(
      'vit_ti4',
      num_classes=5,
      hidden_size=24,
      depth=1,
      num_heads=3,
      mlp_dim=48,
      init_scheme='timm',
      representation_size=20,
  )
  variables = jax.jit(model.init)(jax.random.key(0), IMAGES)
  logits, out = jax.jit(
      lambda v, x: (model.apply(v, x), features.extract(model, v, x, blocks=None))
  )(variables, IMAGES)
  params = variables['params']
  assert out.pre_logits.shape == (2, 20)
  cls = out.prefix_tokens[features.ENCODED][:, 0]
  np.testing.assert_allclose(out.pre_logits, jnp.tanh(_head(params, 'pre_logits', cls)), atol=1e-5)
  np.testing.assert_allclose(_head(params, 'head', out.pre_logits), logits, atol=1e-5)


def test_block_selection_follows_timm_indices_and_rejects_bad_ones():
  model = _model('vit', depth=3)
  variables = model.init(jax.random.key(0), IMAGES)
  chosen = lambda blocks: sorted(
      features.extract(model, variables, IMAGES, blocks=blocks).patch_grid
  )
  assert chosen(1) == ['blocks_2', 'encoded']
  assert chosen(0) == ['encoded']
  assert chosen([0, -1]) == ['blocks_0', 'blocks_2', 'encoded']
  with pytest.raises(ValueError, match=r'Block indices \[3\] are out of range.*-3\.\.2'):
    features.extract(model, variables, IMAGES, blocks=[3])
  with pytest.raises(ValueError, match='blocks=4 must be between 0'):
    features.extract(model, variables, IMAGES, blocks=4)


@pytest.mark.parametrize('family', [f for f in FAMILIES if hasattr(_model(f), 'scan_layers')])
def test_scanned_and_unrolled_models_give_the_same_features(family):
  plain, scanned = _model(family), _model(family, scan_layers=True)
  variables = jax.jit(plain.init)(jax.random.key(0), IMAGES)
  stacked = layouts.stack_layers(variables, jax.eval_shape(scanned.init, jax.random.key(0), IMAGES))
  extract = lambda model, v: jax.jit(lambda v, x: features.extract(model, v, x, blocks=None))(
      v, IMAGES
  )
  expected, got = extract(plain, variables), extract(scanned, stacked)
  assert jax.tree.structure(expected) == jax.tree.structure(got)
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_equal_to_timm_forward_intermediates(timm_model):
  import torch  # pylint: disable=g-import-not-at-top

  reference, state_dict = timm_model('deit_tiny_distilled_patch16_224', img_size=32, patch_size=4)
  images = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype(np.float32)
  with torch.no_grad():
    final, intermediates = reference.forward_intermediates(
        torch.from_numpy(images.transpose(0, 3, 1, 2)), indices=[0, 11], return_prefix_tokens=True
    )
    pre_logits = reference.forward_head(final, pre_logits=True).numpy()
  model = models.create('deit_ti16_distilled', patch_size=4)
  variables = models.family(model).from_torch(state_dict)
  out = features.extract(model, variables, images, blocks=[0, 11])
  for name, (grid, prefix) in zip(['blocks_0', 'blocks_11'], intermediates):
    np.testing.assert_allclose(out.patch_grid[name], grid.numpy().transpose(0, 2, 3, 1), atol=1e-4)
    np.testing.assert_allclose(out.prefix_tokens[name], prefix.numpy(), atol=1e-4)
  np.testing.assert_allclose(out.prefix_tokens[features.ENCODED], final[:, :2].numpy(), atol=1e-4)
  np.testing.assert_allclose(out.pre_logits, pre_logits, atol=1e-4)
