"""Scan-over-layers and remat: the unrolled model's outputs, gradients and training; layout
converters."""

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common
from tests.tiny_runs import tiny_config
from vit_jax import models
from vit_jax.weights import pretrained
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.loop import train
from vit_jax.models import deepvit
from vit_jax.models import layouts
from vit_jax.models import sa_conv
from vit_jax.schema import setting
from vit_jax.schema import step as step_settings
from vit_jax.schema import optim as optim_settings
from vit_jax.workdir import reader

SWITCHES = [dict(scan_layers=True), dict(remat=True), dict(scan_layers=True, remat=True)]

# Tiny members of every family with a block stack, at 16x16 inputs: two blocks to a scan, the
# fewest it takes; timm init, so that the head is not zero.
TINY = {
    # Drop-path rates 0 and 0.2, one per block.
    'vit': (
        'vit_ti4',
        dict(
            hidden_size=24, depth=2, num_heads=3, mlp_dim=48, init_scheme='timm', drop_path_rate=0.2
        ),
    ),
    # Distillation token and head.
    'deit': (
        'deit_ti16_distilled',
        dict(patch_size=4, hidden_size=24, depth=2, num_heads=3, mlp_dim=48, init_scheme='timm'),
    ),
    # LayerScale on every block.
    'deit3': (
        'deit3_s16',
        dict(patch_size=4, hidden_size=24, depth=2, num_heads=3, mlp_dim=48, init_scheme='timm'),
    ),
    # Constant drop path, then two unscanned class-attention blocks.
    'cait': (
        'cait_ti4',
        dict(hidden_size=24, depth=2, num_heads=3, layer_scale_init=0.5, drop_path_rate=0.2),
    ),
    # Two scanned groups (content blocks 0-1, Re-attention blocks 2-3) with BatchNorm statistics.
    'deepvit': (
        'deepvit_ti4',
        dict(hidden_size=24, depth=4, num_heads=3, re_attention_blocks=2, drop_path_rate=0.2),
    ),
    't2t': (
        't2t_vit_t_ti4',
        dict(
            hidden_size=24,
            depth=2,
            num_heads=3,
            mlp_dim=48,
            token_dim=8,
            soft_splits=((3, 1, 1), (3, 2, 1), (3, 2, 1)),
            drop_path_rate=0.2,
        ),
    ),
    # Positional attention with content on the 8x8 grid; no drop path in this family.
    'sa_conv': (
        'sa_conv_learned_content',
        dict(hidden_size=24, num_heads=4, num_layers=2, intermediate_size=32),
    ),
    # A head-pruned model: layers 0-1 (2 heads) scan together, layer 2 (3 heads) stays alone.
    'sa_conv_pruned': (
        'sa_conv_gaussian',
        dict(
            hidden_size=24, num_heads=4, num_layers=3, layer_heads=(2, 2, 3), intermediate_size=32
        ),
    ),
}


def _tiny(family: str, **overrides):
  name, fields = TINY[family]
  return models.create(name, **{'num_classes': 5, **fields, **overrides})


def _images(batch: int = 2):
  return jax.random.normal(jax.random.key(1), (batch, 16, 16, 3))


def _max_diff(a, b) -> float:
  assert jax.tree.structure(a) == jax.tree.structure(b)
  return max(
      float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


# DeiT's and DeiT III's blocks are ViT's (with LayerScale): their scans are checked by training.
CASES = [('vit', switches) for switches in SWITCHES] + [
    (family, SWITCHES[-1]) for family in sorted(TINY) if family not in ('vit', 'deit', 'deit3')
]


def _outputs_and_gradients(model, variables):
  """Logits, sown intermediates and the gradient of a scalar loss, in one compiled call."""

  def loss(params):
    logits, state = model.apply(
        {**variables, 'params': params}, _images(), mutable=['intermediates']
    )
    return jnp.sum(logits**2), (logits, state['intermediates'])

  (_, (logits, intermediates)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
      variables['params']
  )
  return logits, intermediates, grads


def _shapes(tree):
  return jax.tree.map(lambda x: (tuple(x.shape), x.dtype), tree)


def _in_layout_of(model, variables):
  """`variables` of the unrolled model converted to `model`'s layout, checked against its init."""
  like = jax.eval_shape(model.init, jax.random.key(0), _images())
  converted = layouts.stack_layers(variables, like)
  assert _shapes(converted) == _shapes(like)
  assert _max_diff(layouts.unstack_layers(converted), variables) == 0.0
  return converted


@functools.cache
def _unrolled_outputs_and_gradients(family: str) -> tuple[dict, tuple]:
  """The variables of the unrolled tiny model of `family` and its `_outputs_and_gradients`, shared
  by the family's cases."""
  plain = _tiny(family)
  variables = jax.jit(plain.init)(jax.random.key(0), _images())
  return variables, _outputs_and_gradients(plain, variables)


@pytest.mark.parametrize('family, switches', CASES, ids=str)
def test_same_outputs_and_gradients_as_unrolled(family, switches):
  switched = _tiny(family, **switches)
  variables, (logits, intermediates, grads) = _unrolled_outputs_and_gradients(family)
  logits_s, intermediates_s, grads_s = _outputs_and_gradients(
      switched, _in_layout_of(switched, variables)
  )
  assert _max_diff(logits, logits_s) <= 1e-5
  # Sown attention maps and gradients, unstacked, match block by block.
  assert _max_diff(intermediates, layouts.unstack_layers(intermediates_s)) <= 1e-5
  assert _max_diff(grads, layouts.unstack_layers(grads_s)) <= 1e-5


# Training without dropout or drop path: a scan draws its blocks' masks from other keys than the
# unrolled blocks do.
WITHOUT_DROPOUT = {
    'sa_conv': dict(dropout_rate=0.0, attention_dropout_rate=0.0),
    **{
        family: dict(drop_path_rate=0.0)
        for family in ('vit', 'deit', 'deit3', 'cait', 'deepvit', 't2t')
    },
}


def _perturbed(variables: dict) -> dict:
  """`variables` with noise added to every parameter, of a random scale per tensor (and so per
  block), so that no bias, norm or LayerScale starts at a value (0, 1) that hides a difference
  and the blocks' norms differ."""
  rng = np.random.default_rng(3)
  noisy = jax.tree.map(
      lambda p: (np.asarray(p) + rng.uniform(0.01, 0.2) * rng.normal(size=p.shape)).astype(p.dtype),
      variables['params'],
  )
  return {**variables, 'params': noisy}


def _three_training_steps(model, variables, optimizer: str) -> dict:
  """Variables, EMA included, after three steps of `optimizer` with weight decay, layer-wise lr
  decay and an EMA, on one batch of random images."""
  config = common.get_config()
  config.update(dict(optimizer=optimizer, weight_decay=1.0, layer_decay=0.75))
  tx = optim.create_optimizer(
      setting.build(optim_settings.OptimizerSettings, config), lambda _: 1e-3, model
  )
  step = jax.jit(steps.make_train_step(model, tx, step_settings.StepSettings(ema_decay=0.5), 5))
  state = steps.TrainState(
      step=jnp.zeros((), jnp.int32),
      params=variables['params'],
      opt_state=tx.init(variables['params']),
      batch_stats=variables.get('batch_stats', {}),
      rng=steps.init_rngs(0)[1],
  )
  state = steps.with_fresh_ema(state, ema=True)
  batch = {'image': _images(4), 'label': jnp.arange(4) % 5}
  for _ in range(3):
    state, _ = step(state, batch)
  return {'params': state.params, 'batch_stats': state.batch_stats, 'ema': state.ema}


def _seen_by_the_loss(path: tuple[str, ...], value: np.ndarray) -> np.ndarray:
  """`value` without the biases whose gradient is zero up to rounding, which Adam's normalisation
  turns into steps of either sign: those softmax cannot see (a key bias adds q.b_k to all of a
  query's scores, CaiT's pre-softmax head mixing `proj_l` adds its bias to all of a head's) and
  DeepViT's Re-attention bias, which the BatchNorm after it subtracts (with that BatchNorm's
  running mean, which follows it)."""
  module, leaf = path[-2:]
  if (module, leaf) in (
      ('k', 'bias'),
      ('key', 'bias'),
      ('proj_l', 'bias'),
      ('reatten_matrix', 'bias'),
      ('var_norm', 'mean'),
  ):
    return value[..., :0]
  if (module, leaf) == ('qkv', 'bias'):  # [3, heads, head_dim]: the query and value thirds.
    return np.delete(value.reshape(value.shape[:-1] + (3, -1)), 1, axis=-2)
  return value


def _relative_differences(expected: dict, got: dict) -> dict[str, float]:
  """Per tensor, max |got - expected| over max |expected| (`_seen_by_the_loss`)."""
  expected = flax.traverse_util.flatten_dict(expected)
  got = flax.traverse_util.flatten_dict(got)
  assert expected.keys() == got.keys()
  differences = {}
  for path, value in expected.items():
    value, other = (_seen_by_the_loss(path, np.asarray(x)) for x in (value, got[path]))
    if value.size:
      scale = max(float(np.max(np.abs(value))), 1e-12)
      differences['/'.join(path)] = float(np.max(np.abs(other - value))) / scale
  return differences


@pytest.mark.parametrize('family', sorted(WITHOUT_DROPOUT))
def test_scanned_training_equals_unrolled(family):
  """Three steps of AdamW and of LAMB, with weight decay, layer-wise lr decay and an EMA: the
  scanned model's variables, unstacked, are the unrolled model's to float rounding (per tensor,
  2e-4 of its largest value)."""
  plain = _tiny(family, **WITHOUT_DROPOUT[family])
  scanned = plain.clone(scan_layers=True)
  variables = _perturbed(jax.jit(plain.init)(jax.random.key(0), _images()))
  stacked = _in_layout_of(scanned, variables)
  for optimizer in ('adamw', 'lamb'):
    expected = _three_training_steps(plain, variables, optimizer)
    got = layouts.unstack_layers(_three_training_steps(scanned, stacked, optimizer))
    differences = _relative_differences(expected, got)
    assert max(differences.values()) <= 2e-4, (
        optimizer,
        {name: d for name, d in differences.items() if d > 2e-4},
    )


def test_scanned_variables_are_stacked_and_convert_to_timm():
  model = _tiny('deepvit', scan_layers=True)
  variables = jax.jit(model.init)(jax.random.key(0), _images())
  # Two stacks: content blocks 0-1 and Re-attention blocks 2-3 (with BatchNorm statistics).
  assert variables['params']['blocks_0_to_1']['mlp']['fc1']['kernel'].shape == (2, 24, 72)
  assert variables['batch_stats']['blocks_2_to_3']['attn']['var_norm']['mean'].shape == (2, 3)
  unrolled = layouts.unstack_layers(variables)
  assert 'blocks_3' in unrolled['params'] and 'blocks_0_to_1' not in unrolled['params']
  ours, reference = deepvit.to_dvit_repo(variables), deepvit.to_dvit_repo(unrolled)
  assert ours.keys() == reference.keys()
  assert all(np.array_equal(ours[k], reference[k]) for k in ours)


def test_batch_statistics_update_like_unrolled():
  """Re-attention BatchNorm running averages: the same update through the scan."""
  plain, scanned = _tiny('deepvit', drop_path_rate=0.0), _tiny(
      'deepvit', drop_path_rate=0.0, scan_layers=True
  )
  variables = jax.jit(plain.init)(jax.random.key(0), _images())
  assert variables['batch_stats']
  _, updates = plain.apply(variables, _images(), train=True, mutable=['batch_stats'])
  _, updates_s = scanned.apply(
      _in_layout_of(scanned, variables), _images(), train=True, mutable=['batch_stats']
  )
  assert _max_diff(updates, layouts.unstack_layers(updates_s)) <= 1e-5
  assert _max_diff(updates, {'batch_stats': variables['batch_stats']}) > 0


def test_training_mode_draws_per_layer_stochastic_depth():
  model = _tiny('vit', depth=3, scan_layers=True, remat=True)
  variables = model.init(jax.random.key(0), _images())
  images = _images(batch=32)
  apply = jax.jit(lambda rng: model.apply(variables, images, train=True, rngs={'dropout': rng}))
  outputs = [apply(jax.random.key(k)) for k in (0, 1)]
  assert outputs[0].shape == (32, 5)
  # Some of the 64 drop-path draws of rates 0.1 and 0.2 differ between the two rngs.
  assert _max_diff(outputs[0], outputs[1]) > 0


def test_scanned_run_checkpoint_loads_into_either_layout(data_dir, tmp_path):
  """A work directory trained with scan_layers reads as unrolled variables (init_from, export,
  analysis)."""
  config = tiny_config(
      data_dir,
      total_steps=2,
      **{'model.scan_layers': True, 'model.init_scheme': 'timm'},
  )
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(config, workdir)
  saved = reader.Workdir(workdir).read_state()['params']
  assert 'blocks_0_to_1' in saved
  variables = reader.Workdir.open(workdir).read_variables(unrolled=True).variables
  assert 'blocks_1' in variables['params'] and 'blocks_0_to_1' not in variables['params']

  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  scanned = models.create_model(config, 10)
  config.model.scan_layers = False
  unrolled = models.create_model(config, 10)
  expected = scanned.apply({'params': saved}, images)
  np.testing.assert_allclose(
      unrolled.apply(pretrained.load_for_run(workdir, unrolled, config), images),
      expected,
      atol=1e-5,
  )
  np.testing.assert_allclose(
      scanned.apply(pretrained.load_for_run(workdir, scanned, config), images), expected, atol=1e-5
  )

  from vit_jax.weights import inference  # pylint: disable=g-import-not-at-top

  run = inference.load_run(workdir, unroll=True)  # As analysis reads it: per-block maps.
  assert not run.model.scan_layers
  _, state = run.model.apply(run.variables, images, mutable=['intermediates'])
  assert {'blocks_0', 'blocks_1'} <= set(state['intermediates'])
  np.testing.assert_allclose(run.model.apply(run.variables, images), expected, atol=1e-5)


def test_sa_conv_scans_runs_of_equal_head_counts():
  model = _tiny('sa_conv_pruned', scan_layers=True)
  params = jax.jit(model.init)(jax.random.key(0), _images())['params']
  assert {k for k in params if k.startswith('layers')} == {'layers_0_to_1', 'layers_2'}
  assert params['layers_0_to_1']['attention']['attention_centers'].shape == (2, 2, 2)
  # The analyses read per-layer heads from either layout.
  heads = sa_conv.attention_heads(params)
  assert [h['attention_centers'].shape for h in heads] == [(2, 2), (2, 2), (3, 2)]
