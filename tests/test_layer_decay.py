"""Layer-wise learning-rate decay: our per-parameter factors against timm's
`param_groups_layer_decay`, the optimizer's scaled updates, the config's rule, a short run."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vit_jax.configs import common
from tests.tiny_runs import tiny_config
from vit_jax import config as config_lib
from vit_jax import models
from vit_jax.training import optim
from vit_jax.training import train

DECAY = 0.6
# timm name, our registry name, the fields both take (two main blocks, ten classes).
CASES = {
    'vit': ('vit_tiny_patch16_224', 'vit_ti16', {'depth': 3}, {'depth': 3}),
    'deit_distilled': (
        'deit_tiny_distilled_patch16_224',
        'deit_ti16_distilled',
        {'depth': 3},
        {'depth': 3},
    ),
    'cait': (
        'cait_xxs24_224',
        'cait_xxs24',
        {'depth': 3, 'depth_token_only': 2},
        {'depth': 3, 'class_attention_depth': 2},
    ),
    'regnet': ('regnety_002', 'regnety_002', {}, {}),
}


def _abstract_variables(model, size: int = 32) -> dict:
  return jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.zeros((1, size, size, 3)), train=False)
  )


def _timm_scales(model, decay: float) -> dict[str, float]:
  """timm's lr_scale of every named parameter of `model`."""
  from timm.optim import param_groups_layer_decay  # pylint: disable=g-import-not-at-top

  scale_of = {}
  for group in param_groups_layer_decay(model, weight_decay=0.05, layer_decay=decay):
    for parameter in group['params']:
      scale_of[id(parameter)] = group['lr_scale']
  return {name: scale_of[id(p)] for name, p in model.named_parameters()}


@pytest.mark.parametrize('case', sorted(CASES))
def test_scales_equal_timms_param_groups_layer_decay(case, timm):
  timm_name, our_name, timm_fields, our_fields = CASES[case]
  reference = timm.create_model(timm_name, pretrained=False, num_classes=10, **timm_fields)
  expected = _timm_scales(reference, DECAY)
  ours = models.create(our_name, num_classes=10, **our_fields)
  variables = _abstract_variables(ours)
  scales = optim.layer_decay_scales(ours, variables['params'], DECAY)
  # Each parameter filled with its factor, renamed and reshaped to timm's layout by our converter.
  filled = {
      **variables,
      'params': jax.tree.map(lambda s, v: np.broadcast_to(s, v.shape), scales, variables['params']),
  }
  if 'batch_stats' in variables:
    filled['batch_stats'] = jax.tree.map(
        lambda v: np.zeros(v.shape, v.dtype), variables['batch_stats']
    )
  converted = models.family(ours).to_torch(filled)
  assert set(expected) <= set(converted)
  for name, scale in expected.items():
    value = np.asarray(converted[name])
    np.testing.assert_allclose(value, np.full(value.shape, scale), rtol=1e-6, err_msg=name)
  assert len(set(expected.values())) == ours.top_layer + 1  # Every layer holds parameters.


def test_scanned_blocks_get_one_factor_per_block():
  unrolled = models.create('cait_xxs24', num_classes=10, depth=3)
  scanned = unrolled.clone(scan_layers=True)
  expected = optim.layer_decay_scales(unrolled, _abstract_variables(unrolled)['params'], DECAY)
  params = _abstract_variables(scanned)['params']
  assert 'blocks_0_to_2' in params
  stacked = optim.layer_decay_scales(scanned, params, DECAY)
  stacked = jax.tree.map(lambda s, p: np.broadcast_to(s, p.shape), stacked, params)
  for i in range(3):
    for path, factor in flax.traverse_util.flatten_dict(expected[f'blocks_{i}']).items():
      block = flax.traverse_util.flatten_dict(stacked['blocks_0_to_2'])[path][i]
      np.testing.assert_array_equal(block, np.full(block.shape, factor))


@pytest.mark.parametrize('optimizer', ['adamw', 'sgd'])
def test_each_update_is_scaled_by_its_layers_factor(optimizer):
  """With the same gradients, an update (weight decay included) is the undecayed one times
  decay^(top - layer)."""
  model = models.create('deit_ti16_distilled', num_classes=10, depth=2, hidden_size=24, num_heads=2)
  params = jax.tree.map(lambda v: jnp.ones(v.shape, v.dtype), _abstract_variables(model)['params'])
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.3), params)
  config = common.get_config()
  config.optimizer = optimizer
  config.weight_decay = 0.1

  def first_update(decay):
    config.layer_decay = decay
    tx = optim.create_optimizer(optim.OptimizerSettings.from_config(config), lambda _: 1e-2, model)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    return updates

  plain, decayed = first_update(1.0), first_update(0.5)
  top = model.top_layer
  for name, layer in (
      ('patch_embed', 0),
      ('dist_token', 0),
      ('blocks_0', 1),
      ('blocks_1', 2),
      ('norm', 2),
      ('head_dist', top),
  ):
    for got, want in zip(jax.tree.leaves(decayed[name]), jax.tree.leaves(plain[name])):
      np.testing.assert_allclose(got, want * 0.5 ** (top - layer), rtol=1e-6, err_msg=name)


@pytest.mark.parametrize('value', [0.0, -0.5, 1.5])
def test_layer_decay_outside_zero_to_one_is_refused(value):
  config = common.get_config()
  config.layer_decay = value
  with pytest.raises(config_lib.ConfigError, match=r'--config.layer_decay=.*\(0, 1\]'):
    config_lib.validate(config, devices=1, processes=1)


def test_training_with_layer_decay_runs(tmp_path):
  config = tiny_config(
      str(tmp_path / 'tfds'), total_steps=2, warmup_steps=1, log_every=1, layer_decay=0.75
  )
  result = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert result.step == 2
  assert np.isfinite(result.metrics['loss'])


def test_a_run_with_layer_decay_resumes_under_a_changed_config(tmp_path):
  """The resume check builds the saved config's optimizer too, with the model it decays."""
  config = tiny_config(
      str(tmp_path / 'tfds'),
      total_steps=2,
      warmup_steps=1,
      log_every=1,
      checkpoint_every=2,
      layer_decay=0.75,
  )
  assert train.train_and_evaluate(config, str(tmp_path / 'run')).step == 2
  config.update(dict(total_steps=3, grad_clip_norm=1.0))
  result = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert result.step == 3
  assert np.isfinite(result.metrics['loss'])
