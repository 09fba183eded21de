"""The optimizer's per-parameter choices against timm's, in either layout (unrolled, scanned):
layer-wise learning-rate factors (`param_groups_layer_decay`) and the weight-decay mask
(`param_groups_weight_decay`); the optimizer's scaled updates, the config's rule, short runs of
every family."""

import importlib

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vit_jax import configs
from vit_jax.configs import common
from tests.tiny_runs import tiny_config
from vit_jax.schema import config as config_lib
from vit_jax.schema import checks as config_checks
from vit_jax.loop import setup
from vit_jax import models
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.loop import train
from vit_jax.schema import setting
from vit_jax.schema import step as step_settings
from vit_jax.schema import optim as optim_settings

DECAY = 0.6
# timm name, our registry name, the fields both take (three main blocks, ten classes).
CASES = {
    'vit': ('vit_tiny_patch16_224', 'vit_ti16', {'depth': 3}, {'depth': 3}),
    'deit3': ('deit3_small_patch16_224', 'deit3_s16', {'depth': 3}, {'depth': 3}),
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


# Every case in both layouts, but RegNetY's (it has no stack of blocks to scan).
LAYOUTS = [
    pytest.param(case, scanned, id=f'{case}-{"scanned" if scanned else "unrolled"}')
    for case in sorted(CASES)
    for scanned in (False, True)
    if not (scanned and case == 'regnet')
]


def _timm_scales(model, decay: float) -> dict[str, float]:
  """timm's lr_scale of every named parameter of `model`."""
  from timm.optim import param_groups_layer_decay  # pylint: disable=g-import-not-at-top

  scale_of = {}
  for group in param_groups_layer_decay(model, weight_decay=0.05, layer_decay=decay):
    for parameter in group['params']:
      scale_of[id(parameter)] = group['lr_scale']
  return {name: scale_of[id(p)] for name, p in model.named_parameters()}


def _timm_no_decay_names(model) -> tuple[str, ...]:
  """The parameter names `model` keeps from weight decay, as timm's optimizer factory reads them."""
  return tuple(model.no_weight_decay()) if hasattr(model, 'no_weight_decay') else ()


def _timm_decays(model) -> dict[str, bool]:
  """Whether timm decays each named parameter of `model` (its `no_weight_decay` names and 1-D
  tensors aside), as its optimizer factory groups them."""
  from timm.optim import param_groups_weight_decay  # pylint: disable=g-import-not-at-top

  decays = {}
  groups = param_groups_weight_decay(model, 0.05, no_weight_decay_list=_timm_no_decay_names(model))
  for group in groups:
    for parameter in group['params']:
      decays[id(parameter)] = group['weight_decay'] > 0
  return {name: decays[id(p)] for name, p in model.named_parameters()}


def _case(case: str, scanned: bool, timm):
  """timm's model of `case` and ours, scanned or not, with our abstract variables."""
  timm_name, our_name, timm_fields, our_fields = CASES[case]
  reference = timm.create_model(timm_name, pretrained=False, num_classes=10, **timm_fields)
  if scanned:
    our_fields = {**our_fields, 'scan_layers': True}
  ours = models.create(our_name, num_classes=10, **our_fields)
  return reference, ours, _abstract_variables(ours)


def _in_timm_layout(model, variables: dict, per_parameter: dict) -> dict[str, np.ndarray]:
  """`per_parameter` (one value per parameter, or per block of a scanned stack), filled into
  each parameter's shape and renamed and reshaped to timm's layout by our converter."""
  filled = {
      **variables,
      'params': jax.tree.map(
          lambda s, v: np.broadcast_to(np.asarray(s, np.float32), v.shape),
          per_parameter,
          variables['params'],
      ),
  }
  if 'batch_stats' in variables:
    filled['batch_stats'] = jax.tree.map(
        lambda v: np.zeros(v.shape, v.dtype), variables['batch_stats']
    )
  return models.family(model).to_torch(filled)


@pytest.mark.parametrize('case, scanned', LAYOUTS)
def test_scales_equal_timms_param_groups_layer_decay(case, scanned, timm):
  reference, ours, variables = _case(case, scanned, timm)
  expected = _timm_scales(reference, DECAY)
  scales = optim.layer_decay_scales(ours, variables['params'], DECAY)
  converted = _in_timm_layout(ours, variables, scales)
  assert set(expected) <= set(converted)
  for name, scale in expected.items():
    value = np.asarray(converted[name])
    np.testing.assert_allclose(value, np.full(value.shape, scale), rtol=1e-6, err_msg=name)
  assert len(set(expected.values())) == ours.top_layer + 1  # Every layer holds parameters.


@pytest.mark.parametrize('case, scanned', LAYOUTS)
def test_weight_decay_mask_equals_timms_param_groups_weight_decay(case, scanned, timm):
  """Per parameter, with timm's `no_weight_decay` names: LayerScale gammas, biases and norm
  scales are never decayed, also where a scan stacks them into arrays of rank 2. The run's
  default names choose alike, but for DeiT's distillation token, which DeiT's recipe decays."""
  reference, ours, variables = _case(case, scanned, timm)
  expected = _timm_decays(reference)
  assert any(expected.values()) and not all(expected.values())
  for names, exceptions in (
      (_timm_no_decay_names(reference), set()),
      (tuple(config_lib.defaults().no_decay_names), {'dist_token'} & set(expected)),
  ):
    mask = optim.weight_decay_mask(variables['params'], names)
    converted = _in_timm_layout(ours, variables, mask)
    assert set(expected) <= set(converted)
    differ = {name for name in expected if np.any(converted[name] != expected[name])}
    assert differ == exceptions, (names, {name: expected[name] for name in differ})


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
    tx = optim.create_optimizer(
        setting.build(optim_settings.OptimizerSettings, config), lambda _: 1e-2, model
    )
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
  with pytest.raises(config_checks.ConfigError, match=r'--config.layer_decay=.*\(0, 1\]'):
    setup.validate(config, devices=1, processes=1)


@pytest.mark.parametrize('family', configs.family_configs())
def test_every_family_trains_two_steps_with_layer_decay(family):
  """Each family config's quick model, two blocks deep, with layer_decay=0.75: every layer of the
  model holds parameters, and two steps of its optimizer train it."""
  config = importlib.import_module(f'configs.{family}').get_config()
  config.layer_decay = 0.75
  depth = 'num_layers' if family == 'sa_conv' else 'depth'
  config.model[depth] = 2
  model = models.create_model(config, 10)
  tx = optim.create_optimizer(
      setting.build(optim_settings.OptimizerSettings, config), lambda _: 1e-3, model
  )
  state = steps.init_state(model, tx, steps.init_rngs(0), image_size=config.image_size, ema=False)
  factors = jax.tree.leaves(optim.layer_decay_scales(model, state.params, 0.75))
  assert {float(f) for f in np.concatenate([np.ravel(f) for f in factors])} == {
      float(np.float32(0.75**k)) for k in range(model.top_layer + 1)
  }
  step = jax.jit(steps.make_train_step(model, tx, step_settings.StepSettings(), 10))
  rng = np.random.default_rng(0)
  size = config.image_size
  batch = {
      'image': jnp.asarray(rng.normal(size=(8, size, size, 3)), jnp.float32),
      'label': jnp.asarray(rng.integers(0, 10, 8), jnp.int32),
  }
  trained, metrics = step(*step(state, batch)[:1], batch)
  assert int(trained.step) == 2 and np.isfinite(float(metrics['loss']))
  assert not np.allclose(
      np.concatenate([np.ravel(p) for p in jax.tree.leaves(trained.params)]),
      np.concatenate([np.ravel(p) for p in jax.tree.leaves(state.params)]),
  )


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
