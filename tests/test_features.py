"""Features of every family: shapes, the model's own forward, timm's `forward_intermediates`,
and scanned runs read exactly as unrolled ones."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.models import features
from vit_jax.models import layouts

# (registry name, tiny fields, prefix tokens, blocks) of every family, at 16x16 inputs.
FAMILIES = {
    'vit': (
        'vit_ti4',
        dict(
            hidden_size=24,
            depth=3,
            num_heads=3,
            mlp_dim=48,
            init_scheme='timm',
            representation_size=20,
        ),
        1,
        3,
    ),
    'deit_distilled': (
        'deit_ti16_distilled',
        dict(patch_size=4, hidden_size=24, depth=2, num_heads=3, mlp_dim=48),
        2,
        2,
    ),
    'cait': ('cait_ti4', dict(hidden_size=24, depth=2, num_heads=3, layer_scale_init=0.5), 0, 2),
    'deepvit': (
        'deepvit_ti4',
        dict(hidden_size=24, depth=3, num_heads=3, re_attention_blocks=2),
        1,
        3,
    ),
    't2t': (
        't2t_vit_ti4',
        dict(hidden_size=24, depth=2, num_heads=3, mlp_dim=48, token_dim=8),
        1,
        2,
    ),
    'sa_conv': (
        'sa_conv_gaussian',
        dict(num_layers=2, hidden_size=12, intermediate_size=16, num_heads=4),
        0,
        2,
    ),
    'regnet': (
        'regnety_002',
        dict(w0=8, wa=8.0, wm=2.0, depth=2, group_width=8, stem_width=8),
        0,
        None,
    ),
}
IMAGES = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))


def _model(family: str, **overrides):
  name, fields, _, _ = FAMILIES[family]
  return models.create(name, num_classes=5, **fields, **overrides)


def _head(params, name: str, x):
  return x @ params[name]['kernel'] + params[name]['bias']


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_shapes_and_the_head_of_the_pre_logits_gives_the_logits(family):
  model = _model(family)
  _, _, prefix, depth = FAMILIES[family]
  variables = jax.jit(model.init)(jax.random.key(0), IMAGES)
  assert set(variables) <= {'params', 'batch_stats'}  # Nothing is sown at init.
  logits, out = jax.jit(
      lambda v, x: (model.apply(v, x), features.extract(model, v, x, blocks=None))
  )(variables, IMAGES)
  if family == 'regnet':  # Stages s1, s2, ... halve the resolution: 16 -> 8 (stem) -> 4 -> 2.
    stages = [f's{i + 1}' for i in range(len(model.stages))]
    assert sorted(out.patch_grid) == sorted(stages + [features.ENCODED])
    assert [out.patch_grid[s].shape[1] for s in stages] == [4, 2][: len(stages)]
    np.testing.assert_allclose(
        out.pre_logits, out.patch_grid[features.ENCODED].mean(axis=(1, 2)), atol=1e-5
    )
    np.testing.assert_allclose(
        _head(variables['params'], 'head', out.pre_logits), logits, atol=1e-5
    )
    return
  names = [f'{"layers" if family == "sa_conv" else "blocks"}_{i}' for i in range(depth)]
  assert sorted(out.patch_grid) == sorted(names + [features.ENCODED])
  rows = 8 if family == 'sa_conv' else 4  # SA-conv: a 2x2 space-to-depth grid; others: stride 4.
  width = out.patch_grid[features.ENCODED].shape[-1]
  for name in names:
    assert out.patch_grid[name].shape == (2, rows, rows, width)
    assert out.prefix_tokens[name].shape == (2, prefix, width)
  # CaiT's class token joins in its class-attention stage, before the final norm.
  encoded_prefix = 1 if family == 'cait' else prefix
  assert out.prefix_tokens[features.ENCODED].shape == (2, encoded_prefix, width)

  params = variables['params']
  heads = [_head(params, 'head', out.head_inputs[0])]
  if family == 'deit_distilled':
    heads.append(_head(params, 'head_dist', out.head_inputs[1]))
    np.testing.assert_allclose(
        out.pre_logits, (out.head_inputs[0] + out.head_inputs[1]) / 2, atol=1e-6
    )
  np.testing.assert_allclose(sum(heads) / len(heads), logits, atol=1e-5)
  if family == 'vit':  # The representation layer sits between the class token and the head.
    assert out.pre_logits.shape == (2, 20)
    cls = out.prefix_tokens[features.ENCODED][:, 0]
    expected = jnp.tanh(_head(params, 'pre_logits', cls))
    np.testing.assert_allclose(out.pre_logits, expected, atol=1e-5)
  elif family in ('cait', 'deepvit', 't2t'):
    np.testing.assert_allclose(out.pre_logits, out.prefix_tokens[features.ENCODED][:, 0], atol=1e-6)
  elif family == 'sa_conv':
    np.testing.assert_allclose(
        out.pre_logits, out.patch_grid[features.ENCODED].mean(axis=(1, 2)), atol=1e-5
    )


def test_block_selection_follows_timm_indices_and_rejects_bad_ones():
  model = _model('vit')
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


@pytest.mark.parametrize('family', ['vit', 'cait', 'deepvit', 't2t'])
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
