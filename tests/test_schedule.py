"""The learning-rate schedule is an argument of the train step: runs of any length share one
compiled step, with optax's schedule and optimizer states."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.tiny_runs import tiny_config
from vit_jax.parallel import sharding
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.loop import train
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings
from vit_jax.training import start as start_lib
from vit_jax.schema import optim as optim_settings


def _settings(**overrides):
  return setting.build(run_settings.Settings, tiny_config('/unused', **overrides))


@pytest.mark.parametrize('total, warmup', [(100, 10), (12, 2), (4, 0), (2, 2), (800, 30)])
def test_schedule_is_optaxs_warmup_cosine_decay(total, warmup):
  schedule = _settings(base_lr=2e-3, warmup_lr=1e-6, min_lr=1e-5).schedule
  ours = optim.learning_rate_schedule(schedule, total, warmup)
  reference = optax.warmup_cosine_decay_schedule(
      init_value=1e-6,
      peak_value=2e-3,
      warmup_steps=warmup,
      decay_steps=max(total, warmup + 1),
      end_value=1e-5,
  )
  counts = jnp.arange(total + 3, dtype=jnp.int32)
  # To float32 rounding of the peak: the two compute in another order.
  np.testing.assert_allclose(
      jax.jit(lambda s, c: s(c))(ours, counts), reference(counts), rtol=0, atol=2e-3 * 1e-6
  )


@pytest.mark.parametrize('optimizer', ['adamw', 'sgd', 'lamb'])
def test_optimizer_state_is_laid_out_as_optaxs(optimizer):
  """Checkpoints of earlier runs restore: the optimizer's state holds optax's arrays at optax's
  paths."""
  settings = _settings(optimizer=optimizer)
  params = {'dense': {'kernel': jnp.ones((3, 4)), 'bias': jnp.ones((4,))}}
  schedule = optim.learning_rate_schedule(settings.schedule, 10, 2)
  ours = optim.create_optimizer(settings.optimizer, schedule, model=None).init(params)
  mask = lambda p: optim.weight_decay_mask(p, settings.optimizer.no_decay_names)
  reference = {
      'adamw': lambda: optax.adamw(schedule, weight_decay=0.1, mask=mask),
      'sgd': lambda: optax.chain(
          optax.add_decayed_weights(0.1, mask), optax.sgd(schedule, momentum=0.9)
      ),
      'lamb': lambda: optax.chain(
          optax.clip_by_global_norm(1.0),
          optax.scale_by_adam(),
          optax.add_decayed_weights(0.1, mask),
          optax.masked(optax.scale_by_trust_ratio(), mask),
          optax.scale_by_learning_rate(schedule),
      ),
  }[optimizer]().init(params)
  layout = lambda state: [
      (jax.tree_util.keystr(path), x.shape, x.dtype)
      for path, x in jax.tree_util.tree_leaves_with_path(state)
  ]
  assert layout(ours) == layout(reference)


def test_runs_of_any_length_share_one_compiled_train_step():
  settings = _settings(**{'model.dropout_rate': 0.1})
  mesh = sharding.make_mesh(1)
  lowered = []
  for total, warmup, base_lr in ((4, 1, 1e-3), (100, 10, 3e-3)):
    schedule = optim.learning_rate_schedule(
        optim_settings.ScheduleSettings(**{**vars(settings.schedule), 'base_lr': base_lr}),
        total,
        warmup,
    )
    start = start_lib.for_run(settings, 10, schedule)
    state = jax.eval_shape(start.init)
    layout = sharding.fsdp_shardings(state, mesh, 0)
    step = steps.sharded_train_step(start.model, start.tx, settings.step, 10, mesh, layout)
    batch = {
        'image': jax.ShapeDtypeStruct((32, 16, 16, 3), jnp.float32),
        'label': jax.ShapeDtypeStruct((32,), jnp.int32),
    }
    lowered.append(step.lower(state, batch, None, schedule).as_text())
  assert lowered[0] == lowered[1]


def test_epochs_of_less_than_one_step_are_refused():
  schedule = _settings(num_epochs=1e-9, batch_size=16).schedule
  with pytest.raises(ValueError, match=r'num_epochs=1e-09 is less than one step: an epoch is '):
    optim.training_steps(schedule, 1000)
  assert optim.training_steps(_settings(num_epochs=0.016, batch_size=16).schedule, 1000)[0] == 1
