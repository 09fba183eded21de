"""The one validation pass (vit_jax.config): every field range-checked, every bad one listed.

Nothing here compiles or reads data: validation runs before either.
"""

import os
import re
import subprocess
import sys

import pytest

from configs import cait, common, deepvit, deit, regnet, sa_conv, t2t, vit
from test_train import tiny_config
from vit_jax import config as config_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(**overrides):
  """A small valid config with `overrides` ('distillation.alpha' reaches into sub-configs)."""
  return tiny_config('unused', **overrides)


def _problems(config, devices=1, processes=1) -> list[str]:
  with pytest.raises(config_lib.ConfigError) as raised:
    config_lib.validate(config, devices=devices, processes=processes)
  lines = str(raised.value).splitlines()  # One line for one problem, else a header and one each.
  assert lines == ([f'Config field not valid: {raised.value.problems[0]}']
                   if len(lines) == 1 else lines[:1] + [f'  {p}' for p in raised.value.problems])
  return raised.value.problems


FAMILY_CONFIGS = [
    (vit, ''), (vit, 'variant=S/4,dataset=cifar10'), (vit, 'variant=B/16,dataset=imagenet2012'),
    (deit, ''), (deit, 'distilled=false'), (cait, ''), (deepvit, ''),
    (deepvit, 'variant=32B,dataset=imagenet2012'), (deepvit, 'baseline=true'), (t2t, ''),
    (t2t, 'variant=14,dataset=imagenet2012'), (sa_conv, ''), (sa_conv, 'dataset=cifar10'),
    (sa_conv, 'attention=gaussian,heads=16,dataset=cifar10'), (regnet, ''),
    (deit, 'teacher=regnety_160:/weights.pth'),
    # The DeiT recipe: repeated_aug=3 at batch 1024 (the copies of an example may span batches).
    (deit, 'variant=S,dataset=imagenet2012'), (cait, 'variant=XXS24,dataset=imagenet2012'),
    (regnet, 'variant=160,dataset=imagenet2012'),
]


@pytest.mark.parametrize('module, arg', FAMILY_CONFIGS,
                         ids=[f'{m.__name__}:{a}' for m, a in FAMILY_CONFIGS])
def test_family_configs_are_valid(module, arg):
  config_lib.validate(module.get_config(arg or None), devices=1, processes=1)


def test_every_shared_field_has_a_rule_and_nothing_else_does():
  fields = set(config_lib._flatten(common.get_config()))  # pylint: disable=protected-access
  assert fields == set(config_lib.RULES)


@pytest.mark.parametrize('field, value, valid', [
    ('keep_checkpoints', 0, 'integer >= 1'),
    ('total_steps', 0, 'integer >= 1'),
    ('num_epochs', -1.0, 'number > 0, or None'),
    ('base_lr', -1e-3, 'number > 0'),
    ('label_smoothing', 2.0, r'\[0, 1\)'),
    ('warmup_steps', -5, 'integer >= 0'),
    ('eval_every', 0, 'integer >= 1'),
    ('log_every', 0, 'integer >= 1'),
    ('checkpoint_every', 0, 'integer >= 1'),
    ('eval_batch_size', 0, 'integer >= 1'),
    ('batch_size', 0, 'integer >= 1'),
    ('batch_size', -8, 'integer >= 1'),
    ('image_size', 0, 'integer >= 1'),
    ('crop_padding', -1, 'integer >= 0'),
    ('eval_crop_ratio', 0.0, r'\(0, 1\]'),
    ('eval_crop_ratio', 1.5, r'\(0, 1\]'),
    ('shuffle_buffer', 0, 'integer >= 1'),
    ('prefetch', 0, 'integer >= 1'),
    ('random_erase_prob', 1.5, r'\[0, 1\]'),
    ('repeated_aug', 0, 'integer >= 1'),
    ('mixup_alpha', -0.1, 'number >= 0'),
    ('cutmix_alpha', -1.0, 'number >= 0'),
    ('mix_switch_prob', 1.1, r'\[0, 1\]'),
    ('mix_prob', -0.5, r'\[0, 1\]'),
    ('lr_scaling_batch', -512, 'integer >= 0'),
    ('min_lr', -1e-5, 'number >= 0'),
    ('warmup_lr', -1e-6, 'number >= 0'),
    ('warmup_epochs', -5.0, 'number >= 0'),
    ('weight_decay', -0.05, 'number >= 0'),
    ('momentum', 1.0, r'\[0, 1\)'),
    ('b1', -0.1, r'\[0, 1\)'),
    ('b2', 1.0, r'\[0, 1\)'),
    ('eps', 0.0, 'number > 0'),
    ('grad_clip_norm', -1.0, 'number >= 0'),
    ('grad_accum_steps', 0, 'integer >= 1'),
    ('ema_decay', 1.0, r'\[0, 1\)'),
    ('base_lr', float('nan'), 'number > 0'),
    ('base_lr', float('inf'), 'number > 0'),
    ('augment', 'random_crop', "'crop_flip', 'inception_crop', 'none'"),
    ('normalization', 'mnist', "'imagenet'"),
    ('optimizer', 'adagrad', "'adamw', 'sgd'"),
    ('dtype', 'bfloat17', "'float32', 'bfloat16', 'float16'"),
    ('mu_dtype', 'int8', "'' \\(the parameters' dtype\\)"),
    ('randaugment', 'rand-m9-x3', "Unknown section 'x3'"),
    ('dataset', '', 'non-empty string'),
    ('train_split', '', 'non-empty string'),
    ('distillation.type', 'medium', "'none', 'hard', 'soft'"),
    ('distillation.alpha', 1.5, r'\[0, 1\]'),
    ('distillation.tau', 0.0, 'number > 0'),
])
def test_each_bad_value_is_named_with_what_is_valid(field, value, valid):
  problems = _problems(_config(**{field: value}))
  assert len(problems) == 1, problems
  assert problems[0].startswith(f'{field}={value!r}: ')
  assert re.search(valid, problems[0]), problems[0]


def test_every_bad_field_is_listed_in_one_error():
  bad = {'keep_checkpoints': 0, 'total_steps': 0, 'num_epochs': -1.0, 'base_lr': -1e-3,
         'label_smoothing': 2.0, 'warmup_steps': -5, 'eval_every': 0, 'log_every': 0,
         'checkpoint_every': 0, 'eval_batch_size': 0, 'model.depth': 0}
  problems = _problems(_config(**bad))
  assert len(problems) == len(bad)
  for field in bad:
    assert any(p.startswith(f'{field}=') or field == 'model.depth' and 'depth=0' in p
               for p in problems), field


def test_batches_must_split_over_devices_processes_and_micro_batches():
  problems = _problems(_config(batch_size=100, eval_batch_size=100), devices=8, processes=2)
  assert problems[0].startswith('batch_size=100: must be a multiple of the 8 device(s)')
  assert 'e.g. 96' in problems[0]
  assert problems[1].startswith('eval_batch_size=100: must be a multiple of the 8 device(s)')
  problems = _problems(_config(batch_size=64, grad_accum_steps=16), devices=8, processes=1)
  assert 'grad_accum_steps=16' in problems[0] and 'of 128' in problems[0]
  config_lib.validate(_config(batch_size=64, repeated_aug=3), devices=1, processes=2)
  config_lib.validate(_config(batch_size=96, repeated_aug=3), devices=8, processes=2)


def test_settings_that_do_not_fit_together():
  assert _problems(_config(warmup_steps=900, total_steps=800)) == [
      'warmup_steps=900: must be <= total_steps=800.']
  assert 'warmup_epochs=10.0: must be <= num_epochs=5.0' in _problems(
      _config(num_epochs=5.0, warmup_epochs=10.0))[0]
  assert 'needs distillation.teacher' in _problems(_config(**{
      'distillation.type': 'hard', 'distillation.teacher': ''}))[0]


def test_the_digits_default_on_another_dataset_says_which_variant():
  problems = _problems(_config(dataset='cifar10'))
  assert problems[0].startswith("dataset='cifar10': the config's default is the quick model")
  assert 'variant=' in problems[0]
  for module in (vit, deit, cait, deepvit, t2t, regnet):
    with pytest.raises(ValueError, match=r'dataset=imagenet2012 needs a published model size: '
                                         r'add variant= with one of'):
      module.get_config('dataset=imagenet2012')


def test_model_fields_are_checked_by_the_model():
  assert _problems(_config(**{'model.num_heads': 3}))[0].startswith(
      'model: num_heads=3 must divide the hidden width 32')
  assert _problems(_config(**{'model.name': 'vit_nonexistent'}))[0].startswith(
      "model.name='vit_nonexistent': Unknown model")
  assert _problems(_config(**{'model.drop_path_rate': 1.0}))[0] == (
      'model: drop_path_rate=1.0 must be in [0, 1).')


def test_evaluator_settings_are_checked_by_the_evaluators():
  assert _problems(_config(**{'evaluators.fewshot.shots': (0, 5)})) == [
      'evaluators.fewshot: fewshot needs shots >= 1; got shots=(0, 5).']
  assert _problems(_config(**{'evaluators.linear_probe.every': -1}))[0].startswith(
      'evaluators.linear_probe: LinearProbe needs datasets and every >= 0')


@pytest.mark.parametrize('flags, first_line', [
    (['--config=configs/no_such.py'],
     "error: cannot load the config file: [Errno 2] No such file or directory: "
     "'configs/no_such.py'"),
    (['--config=configs/vit.py', '--config.batchsize=3'],
     'error: Did you mean "batch_size"? "batchsize" is not a config field.'),
    (['--config=configs/vit.py:dataset=imagenet2012'],
     'error: dataset=imagenet2012 needs a published model size: add variant= with one of Ti/16'),
    (['--config=configs/vit.py', '--config.keep_checkpoints=0', '--config.eval_every=0'],
     'error: 2 config fields are not valid:'),
])
def test_the_command_line_prints_one_clear_error(tmp_path, flags, first_line):
  out = subprocess.run([sys.executable, '-m', 'vit_jax.main', f'--workdir={tmp_path / "run"}',
                        *flags], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  assert out.returncode == 1
  errors = out.stderr[out.stderr.index('error: '):].splitlines()
  assert errors[0].startswith(first_line), out.stderr[-2000:]
  assert 'Traceback' not in out.stderr
  assert not (tmp_path / 'run').exists()
