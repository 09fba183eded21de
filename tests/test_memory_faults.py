"""A run that cannot fit is refused before it starts: a published size without its dataset, and
a training step whose compiled memory exceeds what the devices hold."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vit_jax.configs import common
from vit_jax.configs import deit
from vit_jax.configs import vit
from tests.tiny_runs import compiled_programs
from vit_jax.schema import checks as config_checks
from vit_jax.loop import setup
from vit_jax.training import memory
from vit_jax.loop import train
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings


def tiny_config(data_dir: str, **overrides):
  """A one-block ViT on the embedded digits: a training step of a few milliseconds."""
  config = common.get_config()
  config.data_dir = data_dir
  config.image_size, config.crop_padding, config.flip = 16, 2, False
  config.normalization = 'digits'
  config.batch_size, config.eval_batch_size = 16, 64
  config.total_steps, config.warmup_steps = 2, 1
  config.log_every, config.eval_every, config.checkpoint_every = 1, 1000, 1
  config.model.update(
      name='vit_ti4', patch_size=4, hidden_size=16, depth=1, num_heads=1, mlp_dim=16
  )
  config.update(overrides)
  return config


@pytest.mark.parametrize(
    'module, arg', [(vit, 'variant=S/16'), (vit, 'variant=S/4'), (deit, 'variant=B')]
)
def test_a_published_size_without_a_dataset_names_the_dataset_to_add(module, arg):
  with pytest.raises(config_checks.ConfigError) as error:
    setup.validate(module.get_config(arg), devices=1, processes=1)
  assert "--config.dataset=''" in str(error.value)
  assert 'add dataset=imagenet2012' in str(error.value)
  assert 'dataset=cifar10 for the 32-pixel sizes' in str(error.value)
  # Named, the dataset is taken; the quick default still trains on the digits.
  setup.validate(module.get_config(f'{arg},dataset=imagenet2012'), devices=8, processes=1)
  assert module.get_config().dataset == 'digits'
  assert module.get_config(f'{arg},dataset=digits').dataset == 'digits'


def _step():
  mesh = Mesh(np.array(jax.devices()[:1]), ('data',))
  replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))

  def step(state, batch, teacher, schedule):
    del teacher, schedule
    h = jnp.tanh(batch['image'].reshape(batch['image'].shape[0], -1) @ state)
    return state - 1e-3 * jnp.mean(h), {'loss': jnp.mean(h)}

  jitted = jax.jit(
      step,
      in_shardings=(replicated, rows, None, None),
      out_shardings=(replicated, replicated),
      donate_argnums=0,
  )
  state = jax.ShapeDtypeStruct((16 * 16 * 3, 512), jnp.float32, sharding=replicated)
  return jitted, state, rows


def test_a_step_larger_than_the_free_memory_is_refused_with_both_numbers_and_the_knobs():
  settings = setting.build(run_settings.Settings, tiny_config('/unused'))
  step, state, rows = _step()
  need = memory.check_fits(step, state, settings, rows)  # This host holds it.
  assert need['arguments'] >= 16 * 16 * 3 * 512 * 4 and need['total'] >= need['arguments']
  with pytest.raises(ValueError) as error:
    memory.check_fits(
        step, state, settings, rows, available=lambda devices: (need['total'] - 1, 'cpu:0')
    )
  message = str(error.value)
  assert message.startswith(f'The training step needs {memory._size(need["total"])} per device')
  assert f'but cpu:0 has {memory._size(need["total"] - 1)} free' in message
  for knob in (
      'batch_size (now 16)',
      'grad_accum_steps above 1',
      'model.remat=True',
      'mesh.fsdp above 1',
      'dtype=bfloat16',
  ):
    assert knob in message, knob
  assert '\n' not in message


def test_every_device_kind_reports_free_memory():
  free, where = memory.available_bytes(jax.local_devices())
  assert free > 0
  assert where.startswith(
      'this host'
      if jax.local_device_count() == 1
      else f"each of this host's {jax.local_device_count()} cpu devices"
  )


def test_a_run_that_cannot_fit_touches_nothing_and_the_first_step_reuses_the_compilation(
    tmp_path, monkeypatch
):
  config = tiny_config(str(tmp_path / 'tfds'))
  workdir = tmp_path / 'run'
  monkeypatch.setattr(memory, 'available_bytes', lambda devices: (1000, 'the test device'))
  with pytest.raises(ValueError, match=r'needs .* but the test device has 1.0 KiB free'):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists() or not os.listdir(workdir)

  monkeypatch.undo()
  with compiled_programs() as compiled:
    train.train_and_evaluate(config, str(workdir))
  # Compiled once, by the check: the first step reused it.
  assert compiled.count('jit(train_step)') == 1
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['1', '2']
