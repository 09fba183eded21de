"""Every config: loads with and without arguments, rejects bad arguments, and trains."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import pytest

from vit_jax import configs
from vit_jax import models
from vit_jax.loop import setup
from vit_jax.process import runtime
from vit_jax.loop import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = configs.family_configs()


def load(name: str):
  spec = importlib.util.spec_from_file_location(
      f'configs.{name}', os.path.join(REPO, 'configs', f'{name}.py')
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# (config, argument) pairs that select a published size; each must name a registered model.
PUBLISHED = (
    [('vit', f'variant={v}') for v in load('vit').VARIANTS]
    + [('deit', f'variant={v}') for v in ('Ti', 'S', 'B')]
    + [('deit', 'variant=B,distilled=false')]
    + [('deit3', f'variant={v}') for v in load('deit3').VARIANTS]
    + [('deit3', f'variant={v},finetune={r}') for r, v in load('deit3').FINETUNE_DROP_PATH]
    + [('regnet', f'variant={v}') for v in load('regnet').VARIANTS]
    + [('cait', f'variant={v}') for v in load('cait').VARIANTS]
    + [('deepvit', f'variant={v}') for v in load('deepvit').VARIANTS]
    + [('deepvit', f'variant={v},baseline=true') for v in load('deepvit').BASELINES]
    + [('t2t', f'variant={v}') for v in load('t2t').VARIANTS]
    + [
        ('sa_conv', f'attention={a},heads={h},dataset=cifar10')
        for a in load('sa_conv').KINDS
        for h in (9, 16)
    ]
)


@pytest.mark.parametrize('name, arg', PUBLISHED)
def test_published_sizes_name_registered_models(name, arg):
  config = load(name).get_config(arg)
  models.create_model(config, 10)


@pytest.mark.parametrize(
    'arg', [arg for name, arg in PUBLISHED if name == 'deit3'] + ['variant=S,crop=src,epochs=400']
)
def test_deit3_recipes_pass_the_config_checks(arg):
  """DeiT III's recipes combine 3-Augment, BCE and LAMB (or RandAugment and softmax for the
  fine-tuning) as the config's checks allow."""
  config = load('deit3').get_config(f'{arg},dataset=imagenet2012')
  setup.validate(config, devices=8, processes=1)
  config.model.depth = 1  # The stem checks that its patches tile the image.
  size, model = config.image_size, models.create_model(config, 1000)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, size, size, 3)))
  assert shapes['params']['pos_embed'].shape[1] == (size // model.patch_size) ** 2


@pytest.mark.parametrize(
    'name, arg, message',
    [
        ('vit', 'variant=X/16', 'X/16'),
        ('deit', 'variant=XL', 'XL'),
        ('cait', 'variant=XXS12', 'XXS12'),
        ('deepvit', 'variant=8B', '8B'),
        ('t2t', 'variant=16', '16'),
        ('sa_conv', 'attention=cubic', 'cubic'),
        ('regnet', 'variant=161', '161'),
        ('deit3', 'variant=M', "'M'"),
        ('deit3', 'variant=S,finetune=224', 'variant=S,finetune=384'),
        ('deit3', 'crop=center', 'center'),
        ('vit', 'colour=red', 'colour'),
        ('vit', 'variant', 'key=value'),
        ('finetune', 'epochs=abc', r"epochs='abc' must be a number, e.g. epochs=100.0"),
        ('finetune', 'image_size=1.5', r"image_size='1.5' must be an integer, e.g. image_size=0"),
        ('finetune', 'epochs=0', r"epochs='0' must be > 0, e.g. epochs=100.0"),
        ('finetune', 'layer_decay=-0.5', r"layer_decay='-0.5' must be > 0, e.g. layer_decay=0.65"),
        ('finetune', 'image_size=-224', r"image_size='-224' must be >= 0 \(0: unset\)"),
        ('deit3', 'epochs=0', r"epochs='0' must be > 0, e.g. epochs=800"),
        ('deit3', 'finetune=-384', r"finetune='-384' must be >= 0"),
        ('deit', 'image_size=0', r"image_size='0' must be > 0, e.g. image_size=224"),
        ('cait', 'image_size=-1', r"image_size='-1' must be >= 0"),
        ('t2t', 'image_size=0', r"image_size='0' must be > 0"),
        ('regnet', 'image_size=-5', r"image_size='-5' must be > 0"),
        ('sa_conv', 'heads=-9', r"heads='-9' must be > 0"),
        ('finetune', 'epochs=nan', r"epochs='nan' must be > 0"),
    ],
)
def test_bad_arguments_are_named(name, arg, message):
  with pytest.raises(ValueError, match=message):
    load(name).get_config(arg)


def test_a_value_that_does_not_convert_is_one_line_naming_its_key():
  """The command line's one-line error (`runtime.flag_error`) names the key, not the cause."""
  with pytest.raises(ValueError) as raised:
    load('finetune').get_config('epochs=abc')
  assert runtime.flag_error(raised.value) == (
      "Config argument epochs='abc' must be a number, e.g. epochs=100.0."
  )


@pytest.mark.e2e  # Each config file's quick default trained, as its command trains it.
@pytest.mark.parametrize('name', CONFIGS)
def test_default_config_trains_with_falling_loss(name, data_dir, tmp_path, train_losses):
  config = load(name).get_config()
  assert config.dataset == 'digits'
  config.data_dir = data_dir
  config.batch_size = 64
  config.total_steps = 20
  config.warmup_steps = 5
  config.log_every = 5
  config.eval_every = 1000
  config.checkpoint_every = 1000
  metrics = train.train_and_evaluate(config, str(tmp_path / 'run')).metrics
  assert len(train_losses) == 4
  assert train_losses[-1] < train_losses[0], train_losses
  assert metrics['count'] == 360
