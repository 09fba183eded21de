"""Every registered model's variable tree and a small model of every part, pinned to a golden file.

`tests/golden/model_trees.json` holds, for every registered model (`models.names()`), a hash of its
variable tree (collection, path, shape and dtype of every variable, from `jax.eval_shape`), and for
one tiny configuration of every family and part (stem, attention kind, class stage, distillation,
LayerScale, scanned and rematerialised blocks, RegNet) the logits and head inputs of a fixed init on
a fixed input. A refactoring of the models must leave all of them unchanged. After a change that
means to alter them, regenerate the file with

  VIT_JAX_UPDATE_GOLDEN=1 pytest -n 0 tests/test_model_hashes.py

and say in the commit why the models changed.
"""

import hashlib
import json
import os
import pathlib

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models

GOLDEN = pathlib.Path(__file__).parent / 'golden' / 'model_trees.json'
UPDATE = os.environ.get('VIT_JAX_UPDATE_GOLDEN') == '1'
TOLERANCE = 1e-5

TINY = dict(num_classes=5, hidden_size=16, depth=2, num_heads=2, mlp_dim=32)
TIMM_TINY = dict(TINY, init_scheme='timm')
# name -> (registered model, overrides, image size): one tiny model per family and part.
CASES = {
    'vit_google': ('vit_ti4', TINY, 16),
    'vit_timm': ('vit_ti4', TIMM_TINY, 16),
    'vit_gelu_tanh_no_qkv_bias_pre_logits': (
        'vit_ti4',
        dict(TIMM_TINY, mlp_activation='gelu_tanh', qkv_bias=False, representation_size=8),
        16,
    ),
    'vit_avg_pool': ('vit_ti4', dict(TIMM_TINY, global_pool='avg'), 16),
    'vit_map_pool': ('vit_ti4', dict(TIMM_TINY, global_pool='map'), 16),
    'vit_layer_scale': ('vit_ti4', dict(TIMM_TINY, layer_scale_init=0.5), 16),
    'vit_talking_heads': ('vit_ti4', dict(TIMM_TINY, attention='talking_heads'), 16),
    'vit_re_attention': ('vit_ti4', dict(TIMM_TINY, attention='re_attention'), 16),
    'vit_space_to_depth': ('vit_ti4', dict(TIMM_TINY, stem='space_to_depth', patch_size=2), 8),
    'vit_scan': ('vit_ti4', dict(TIMM_TINY, depth=3, scan_layers=True), 16),
    'vit_remat': ('vit_ti4', dict(TIMM_TINY, depth=3, remat=True), 16),
    'vit_scan_remat_drop_path': (
        'vit_ti4',
        dict(TIMM_TINY, depth=3, scan_layers=True, remat=True, drop_path_rate=0.1),
        16,
    ),
    **{
        f'vit_{kind}': ('vit_ti4', dict(TIMM_TINY, attention=kind, global_pool='avg'), 16)
        for kind in ('quadratic', 'gaussian', 'learned', 'learned_content')
    },
    'vit_class_attention_quadratic': (
        'vit_ti4',
        dict(
            TIMM_TINY, attention='quadratic', class_stage='class_attention', class_attention_depth=1
        ),
        16,
    ),
    'deit_distilled': ('deit_ti16_distilled', dict(TINY, patch_size=4), 16),
    'deit_distilled_sum_softmax': (
        'deit_ti16_distilled',
        dict(TINY, patch_size=4, inference_mode='sum_softmax'),
        16,
    ),
    'deit3': ('deit3_s16', dict(TINY, patch_size=4), 16),
    'cait': ('cait_ti4', dict(TINY, class_attention_depth=1), 16),
    'cait_paper_layer_scale': (
        'cait_ti4',
        dict(TINY, class_attention_depth=1, layer_scale_init='paper'),
        16,
    ),
    'cait_scan': ('cait_ti4', dict(TINY, depth=3, class_attention_depth=2, scan_layers=True), 16),
    'deepvit': ('deepvit_ti4', dict(TINY), 16),
    'deepvit_partial_scaled': (
        'deepvit_ti4',
        dict(TINY, depth=3, re_attention_blocks=1, transform_scale=True, scale_adjustment=0.5),
        16,
    ),
    'deepvit_layer_norm': ('deepvit_ti4', dict(TINY, re_attention_norm='layer'), 16),
    'deepvit_cnn_stem': ('deepvit_s', dict(TINY, patch_size=4, re_attention_blocks=1), 16),
    't2t_performer': ('t2t_vit_ti4', dict(TINY, token_dim=8), 16),
    't2t_transformer': ('t2t_vit_t_ti4', dict(TINY, token_dim=8), 16),
    't2t_scan': ('t2t_vit_t_ti4', dict(TINY, token_dim=8, scan_layers=True), 16),
    **{
        f'sa_conv_{kind}': (
            f'sa_conv_{kind}',
            dict(num_classes=5, hidden_size=16, intermediate_size=16, num_heads=2, num_layers=2),
            8,
        )
        for kind in ('quadratic', 'gaussian', 'learned', 'learned_content')
    },
    'sa_conv_scan': (
        'sa_conv_quadratic',
        dict(
            num_classes=5,
            hidden_size=16,
            intermediate_size=16,
            num_heads=2,
            num_layers=3,
            scan_layers=True,
        ),
        8,
    ),
    'regnet': (
        'regnety_002',
        dict(num_classes=5, w0=8, wa=8.0, wm=2.0, depth=3, group_width=8, stem_width=8),
        16,
    ),
}


def _image_size(name: str) -> int:
  """The input a registered model is made for: 32 pixels for the CIFAR-sized ones, else 224."""
  small = (
      name.startswith('sa_conv') or name.endswith('_ti4') or name[-1] in '24' and name[-2] in 'bist'
  )
  return 32 if small else 224


def tree_hash(variables) -> str:
  """sha256 of every variable's collection/path, shape and dtype, one sorted line each."""
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(variables))
  lines = sorted(
      f"{'/'.join(path)} {tuple(leaf.shape)} {jnp.dtype(leaf.dtype).name}"
      for path, leaf in flat.items()
  )
  return hashlib.sha256('\n'.join(lines).encode()).hexdigest()


def registered_hash(name: str) -> str:
  model = models.create(name)
  size = _image_size(name)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, size, size, 3))))
  return tree_hash(shapes)


def _init_and_apply(model, images):
  # Op by op: the cases share most operations and shapes, which each compile once for all of
  # them; one jitted program per case (its init's random draws above all) costs more in all.
  variables = model.init(jax.random.key(0), images)
  logits, state = model.apply(variables, images, mutable=['features'])
  return variables, logits, state


def case_outputs(case: str) -> dict:
  name, overrides, size = CASES[case]
  model = models.create(name, **overrides)
  images = jax.random.normal(jax.random.key(1), (2, size, size, 3))
  variables, logits, state = _init_and_apply(model, images)
  head_input = np.asarray(state['features']['head_input'][0], np.float64).reshape(2, -1)[:, :8]
  return {
      'tree': tree_hash(variables),
      'logits': np.asarray(logits, np.float64).tolist(),
      'head_input': head_input.tolist(),
  }


def _golden() -> dict:
  return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.mark.parametrize('family', models.family_modules())
def test_every_registered_models_variable_tree_is_unchanged(family):
  names = [name for name in models.names() if models.family(name).name == family]
  hashes = {name: registered_hash(name) for name in names}
  if UPDATE:
    golden = _golden()
    golden['registered'] = {**golden.get('registered', {}), **hashes}
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + '\n')
  stored = _golden()['registered']
  changed = [name for name in names if hashes[name] != stored.get(name)]
  assert not changed, f'variable trees changed (or models added): {changed}'


def test_the_golden_file_holds_every_registered_model():
  if UPDATE:  # Forget the models no longer registered.
    golden = _golden()
    golden['registered'] = {k: v for k, v in golden['registered'].items() if k in models.names()}
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + '\n')
  assert sorted(_golden()['registered']) == models.names()


@pytest.mark.parametrize('case', sorted(CASES))
def test_a_tiny_model_of_every_part_computes_what_it_did(case):
  outputs = case_outputs(case)
  if UPDATE:
    golden = _golden()
    golden.setdefault('parts', {})[case] = outputs
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + '\n')
  stored = _golden()['parts'][case]
  assert outputs['tree'] == stored['tree']
  np.testing.assert_allclose(outputs['logits'], stored['logits'], rtol=TOLERANCE, atol=TOLERANCE)
  np.testing.assert_allclose(
      outputs['head_input'], stored['head_input'], rtol=TOLERANCE, atol=TOLERANCE
  )
  if case != 'vit_google':  # Google's scheme starts the head at zero.
    assert np.std(outputs['logits']) > 0, 'a constant output pins nothing'
  assert np.std(outputs['head_input']) > 0, 'a constant output pins nothing'
