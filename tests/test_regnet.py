"""RegNetY against timm's `RegNet`: stage tables, parameter counts, logits, and the teacher path."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests.tiny_runs import tiny_config
from vit_jax.schema import normalization
from vit_jax import models
from vit_jax.weights import pretrained
from vit_jax.training import teacher
from vit_jax.loop import train
from vit_jax.models import regnet
from vit_jax.schema import setting
from vit_jax.schema import step as step_settings
from vit_jax.workdir import reader

REGNETY = [name for name in models.names() if name.startswith('regnety_')]


def parameter_count(model, image_size: int = 32) -> int:
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)))
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes['params']))


def timm_regnet(timm, name: str, **kwargs):
  """timm's random `name` in eval mode with every BatchNorm's affine parameters and running
  statistics randomised (the last BN of each block is zero-initialised otherwise)."""
  import torch  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  model = timm.create_model(name, pretrained=False, **kwargs).eval()
  generator = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for key, tensor in model.state_dict().items():
      if key.endswith(('bn.bias', 'running_mean', 'se.fc1.bias', 'se.fc2.bias')):
        tensor.copy_(0.1 * torch.randn(tensor.shape, generator=generator))
      elif key.endswith(('bn.weight', 'running_var')):
        tensor.copy_(0.5 + torch.rand(tensor.shape, generator=generator))
  return model, {key: value.numpy().copy() for key, value in model.state_dict().items()}


def test_stage_tables_match_timm(timm):
  """Widths, depths and group widths from the design-space rule equal timm's, for every size."""
  for name in REGNETY:
    cfg = timm.models.regnet.model_cfgs[name]
    stage_args, common_args = timm.models.regnet.RegNet._get_stage_args(None, cfg)
    expected = [(s['out_chs'], s['depth'], s['group_size']) for s in stage_args]
    assert models.create(name).stages == expected, name
    assert common_args['se_ratio'] == models.create(name).se_ratio == 0.25
    assert cfg.bottle_ratio == models.create(name).bottleneck_ratio
    assert cfg.stem_width == models.create(name).stem_width


@pytest.mark.parametrize('name', ['regnety_040', 'regnety_080', 'regnety_160'])
def test_parameter_count_matches_timm(timm, name):
  reference = timm.create_model(name, pretrained=False)
  assert parameter_count(models.create(name)) == sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize('name', ['regnety_040', 'regnety_160'])
def test_timm_weights_give_timm_logits(timm, name):
  """timm's state dict -> from_timm -> our logits equal timm's (eval mode, running statistics)."""
  import torch  # pylint: disable=g-import-not-at-top

  reference, state_dict = timm_regnet(timm, name)
  images = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype(np.float32)
  with torch.no_grad():
    expected = reference(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
  variables = regnet.from_timm(state_dict)
  logits = jax.jit(models.create(name).apply)(variables, jnp.asarray(images))
  assert np.abs(expected).max() > 1.0  # Logits of order one: the tolerance is float32 noise.
  np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-5)

  back = regnet.to_timm(variables)
  assert set(back) == set(state_dict)
  reference.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in back.items()})


def test_training_mode_matches_timm(timm):
  """train=True normalises by batch statistics and moves the running mean as PyTorch does."""
  import torch  # pylint: disable=g-import-not-at-top

  reference, state_dict = timm_regnet(timm, 'regnety_002', num_classes=10)
  # Large enough that no BatchNorm normalises a handful of values (1x1 maps of a batch of 4 at
  # 32 px amplify float32 noise to 1e-3).
  images = np.random.default_rng(0).normal(size=(8, 64, 64, 3)).astype(np.float32)
  with torch.no_grad():
    expected = reference.train()(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
  model = models.create('regnety_002', num_classes=10)
  apply = jax.jit(lambda v, x: model.apply(v, x, train=True, mutable=['batch_stats']))
  logits, updates = apply(regnet.from_timm(state_dict), jnp.asarray(images))
  np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-4, atol=1e-4)
  moved = regnet.to_timm({'batch_stats': updates['batch_stats']})
  for key in ('stem.bn.running_mean', 's4.b1.conv3.bn.running_mean'):
    np.testing.assert_allclose(moved[key], reference.state_dict()[key].numpy(), atol=1e-5)


def test_training_loop_updates_checkpoints_and_averages_batch_stats(data_dir, tmp_path):
  """In `train.train_and_evaluate`, BatchNorm statistics move, are saved, and get an EMA."""
  config = tiny_config(data_dir, total_steps=3, ema_decay=0.5)
  config.model = ml_collections.ConfigDict(
      {'name': 'regnety_002', 'w0': 16, 'wa': 8.0, 'wm': 2.0, 'depth': 2, 'group_width': 8}
  )
  metrics = train.train_and_evaluate(config, str(tmp_path / 'run')).metrics
  assert 'ema_accuracy' in metrics
  state = reader.Workdir(str(tmp_path / 'run')).read_state()
  raw = state['batch_stats']['stem']['bn']['var']
  ema = state['ema']['batch_stats']['stem']['bn']['var']
  assert not np.allclose(raw, 1.0) and not np.allclose(ema, 1.0) and not np.allclose(raw, ema)


def test_bad_design_parameters_are_clear_errors():
  images = jnp.zeros((1, 32, 32, 3))
  with pytest.raises(ValueError, match='w0=20 must be a positive multiple of 8'):
    jax.eval_shape(models.create('regnety_002', w0=20).init, jax.random.key(0), images)
  with pytest.raises(ValueError, match=r'wm=1.0 > 1'):
    jax.eval_shape(models.create('regnety_002', wm=1.0).init, jax.random.key(0), images)


def test_deit_distils_from_a_timm_regnety_weights_file(timm, data_dir, tmp_path, train_losses):
  """`teacher=MODEL:FILE`: timm's RegNetY-200MF .pth teaches a tiny distilled DeiT; the teacher
  logits the step uses are timm's on the same (normalised) batch."""
  import torch  # pylint: disable=g-import-not-at-top

  reference, state_dict = timm_regnet(timm, 'regnety_002', num_classes=10)
  weights = str(tmp_path / 'regnety_002.pth')
  torch.save({'model': {k: torch.from_numpy(v) for k, v in state_dict.items()}}, weights)

  config = tiny_config(data_dir, total_steps=4, log_every=2)
  config.model.name = 'deit_ti16_distilled'
  config.distillation.type = 'hard'
  config.distillation.teacher = f'regnety_002:{weights}'
  config.distillation.teacher_normalization = 'imagenet'
  loaded = teacher.load(
      setting.build_unless_off(step_settings.TeacherSettings, config), num_classes=10
  )
  images = np.random.default_rng(0).normal(size=(2, 16, 16, 3)).astype(np.float32)
  digits_mean, digits_std = (np.asarray(v) for v in normalization.NORMALIZATIONS['digits'])
  imagenet_mean, imagenet_std = (np.asarray(v) for v in normalization.NORMALIZATIONS['imagenet'])
  timm_images = ((images * digits_std + digits_mean) - imagenet_mean) / imagenet_std
  with torch.no_grad():
    expected = reference(torch.from_numpy(timm_images.transpose(0, 3, 1, 2).astype(np.float32)))
  logits = jax.jit(loaded.logits)(loaded.variables, jnp.asarray(images))
  np.testing.assert_allclose(np.asarray(logits), expected.numpy(), rtol=1e-5, atol=1e-5)

  metrics = train.train_and_evaluate(config, str(tmp_path / 'student')).metrics
  assert len(train_losses) == 2 and np.all(np.isfinite(train_losses))
  assert metrics['count'] == 360


def test_teacher_spec_errors_name_the_value(tmp_path):
  assert teacher.source('gs://bucket/run') == (None, 'gs://bucket/run')
  assert teacher.source('regnety_160:gs://b/w.pth') == ('regnety_160', 'gs://b/w.pth')
  config = tiny_config(str(tmp_path / 'tfds'))
  config.distillation.type = 'hard'
  config.distillation.teacher = f'regnety_002:{tmp_path / "missing.pth"}'
  with pytest.raises(ValueError, match='no weights file at'):
    teacher.load(setting.build_unless_off(step_settings.TeacherSettings, config), num_classes=10)
  config.distillation.teacher = f'regnety_002:{tmp_path}'
  with pytest.raises(ValueError, match='no weights file at'):
    teacher.load(setting.build_unless_off(step_settings.TeacherSettings, config), num_classes=10)
  with pytest.raises(ValueError, match="Unknown normalization 'bgr'; valid: .*'imagenet'"):
    teacher.normalization_change('digits', 'bgr')


def test_checkpoints_load_reads_a_timm_file_for_the_family(timm, tmp_path):
  """`init_from=regnety_*.safetensors` goes through this family's from_timm, batch_stats kept."""
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top

  _, state_dict = timm_regnet(timm, 'regnety_002', num_classes=10)
  path = str(tmp_path / 'regnety_002.safetensors')
  safetensors_numpy.save_file(state_dict, path)
  model = models.create('regnety_002', num_classes=10)
  variables = pretrained.load(path, model, image_size=32)
  np.testing.assert_array_equal(
      variables['batch_stats']['s4']['b1']['conv1']['bn']['var'],
      state_dict['s4.b1.conv1.bn.running_var'],
  )
  with pytest.raises(ValueError, match='family'):
    pretrained.load(path, models.create('vit_ti4', num_classes=10), image_size=32)
