"""The one validation pass (vit_jax.schema.checks): every field range-checked, every bad one listed.

Nothing here compiles or reads data: validation runs before either.
"""

import dataclasses
import importlib
import os
import re
import subprocess
import sys

import jax
import pytest

from vit_jax.schema import augment_spec
from vit_jax import configs
from vit_jax.configs import cait, common, deepvit, deit, regnet, sa_conv, t2t, vit
from tests.tiny_runs import tiny_config
from vit_jax.data import mixing
from vit_jax.schema import config as config_lib
from vit_jax.schema import checks as config_checks
from vit_jax.schema import rules as config_rules
from vit_jax import models
from vit_jax.loop import setup
from vit_jax.schema import data as data_settings
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(**overrides):
  """A small valid config with `overrides` ('distillation.alpha' reaches into sub-configs)."""
  return tiny_config('unused', **overrides)


def _problems(config, devices=1, processes=1) -> list[str]:
  with pytest.raises(config_checks.ConfigError) as raised:
    setup.validate(config, devices=devices, processes=processes)
  lines = str(raised.value).splitlines()  # One line for one problem, else a header and one each.
  assert lines == (
      [f'Config field not valid: {raised.value.problems[0]}']
      if len(lines) == 1
      else lines[:1] + [f'  {p}' for p in raised.value.problems]
  )
  return raised.value.problems


# Every family's quick default, then published sizes and recipes.
FAMILY_CONFIGS = [
    (importlib.import_module(f'vit_jax.configs.{name}'), '') for name in configs.family_configs()
] + [
    (vit, 'variant=S/4,dataset=cifar10'),
    (vit, 'variant=B/16,dataset=imagenet2012'),
    (deit, 'distilled=false'),
    (deepvit, 'variant=32B,dataset=imagenet2012'),
    (deepvit, 'baseline=true'),
    (t2t, 'variant=14,dataset=imagenet2012'),
    (sa_conv, 'dataset=cifar10'),
    (sa_conv, 'attention=gaussian,heads=16,dataset=cifar10'),
    (deit, 'teacher=regnety_160:/weights.pth'),
    # The DeiT recipe: repeated_aug=3 at batch 1024 (the copies of an example may span batches).
    (deit, 'variant=S,dataset=imagenet2012'),
    (cait, 'variant=XXS24,dataset=imagenet2012'),
    (regnet, 'variant=160,dataset=imagenet2012'),
]


@pytest.mark.parametrize(
    'module, arg', FAMILY_CONFIGS, ids=[f'{m.__name__}:{a}' for m, a in FAMILY_CONFIGS]
)
def test_family_configs_are_valid(module, arg):
  setup.validate(module.get_config(arg or None), devices=1, processes=1)


def test_every_shared_field_has_a_rule_and_nothing_else_does():
  fields = set(config_checks._flatten(common.get_config()))  # pylint: disable=protected-access
  assert fields == {field.name for field in config_lib.FIELDS}


@pytest.mark.parametrize(
    'field, value, valid',
    [
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
        ('seed', 10**23, r'integer in \[-2147483648, 2147483647\]'),
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
        ('augment', 'random_crop', "'crop_flip', 'inception_crop', 'simple_random_crop', 'none'"),
        ('normalization', 'mnist', "'imagenet'"),
        ('optimizer', 'adagrad', "'adamw', 'sgd', 'lamb'"),
        ('dtype', 'bfloat17', "'float32', 'bfloat16', 'float16'"),
        ('mu_dtype', 'int8', "'' \\(the parameters' dtype\\)"),
        ('randaugment', 'rand-m9-x3', "Unknown section 'x3'"),
        ('dataset', '', 'non-empty string'),
        ('train_split', '', 'non-empty string'),
        ('distillation.type', 'medium', "'none', 'hard', 'soft'"),
        ('distillation.alpha', 1.5, r'\[0, 1\]'),
        ('distillation.tau', 0.0, 'number > 0'),
    ],
)
def test_each_bad_value_is_named_with_what_is_valid(field, value, valid):
  problems = _problems(_config(**{field: value}))
  assert len(problems) == 1, problems
  assert problems[0].startswith(f'--config.{field}={value!r}: ')
  assert re.search(valid, problems[0]), problems[0]


@pytest.mark.parametrize(
    'value, reason',
    [
        ('0.5,0.5,0.5/0,0,0', 'has the std 0.0: each std must be > 0 (pixels are divided by it)'),
        ('0.5,0.5,0.5/0.2,-1,0.2', 'has the std -1.0: each std must be > 0 (pixels are divided'),
        ('0.5,nan,0.5/0.2,0.2,0.2', 'holds nan: its means and stds must be finite numbers, e.g.'),
        ('0.5,0.5,0.5/0.2,inf,0.2', 'holds inf: its means and stds must be finite numbers, e.g.'),
    ],
)
def test_normalization_numbers_out_of_range_are_named_with_why(value, reason):
  problems = _problems(_config(normalization=value))
  assert len(problems) == 1, problems
  assert problems[0].startswith(
      f'--config.normalization={value!r}: normalization {value!r} {reason}'
  ), problems


def test_every_bad_field_is_listed_in_one_error():
  bad = {
      'keep_checkpoints': 0,
      'total_steps': 0,
      'num_epochs': -1.0,
      'base_lr': -1e-3,
      'label_smoothing': 2.0,
      'warmup_steps': -5,
      'eval_every': 0,
      'log_every': 0,
      'checkpoint_every': 0,
      'eval_batch_size': 0,
      'model.depth': 0,
  }
  problems = _problems(_config(**bad))
  assert len(problems) == len(bad)
  for field in bad:
    assert any(
        p.startswith(f'--config.{field}=') or field == 'model.depth' and 'depth=0' in p
        for p in problems
    ), field


def test_batches_must_split_over_devices_processes_and_micro_batches(monkeypatch):
  problems = _problems(_config(batch_size=100, eval_batch_size=100), devices=8, processes=2)
  assert problems[0].startswith('--config.batch_size=100: must be a multiple of the 8 device(s)')
  assert 'e.g. 96' in problems[0]
  assert problems[1].startswith(
      '--config.eval_batch_size=100: must be a multiple of the 8 device(s)'
  )
  problems = _problems(_config(batch_size=64, grad_accum_steps=16), devices=8, processes=1)
  assert 'grad_accum_steps=16' in problems[0] and 'of 128' in problems[0]
  setup.validate(_config(batch_size=64, repeated_aug=3), devices=1, processes=2)
  setup.validate(_config(batch_size=96, repeated_aug=3), devices=8, processes=2)
  # Without `devices`, JAX's device count is what the batch must divide.
  monkeypatch.setattr(jax, 'device_count', lambda: 8)
  config = common.get_config()
  config.batch_size = 100
  with pytest.raises(config_checks.ConfigError) as raised:
    setup.validate(config)
  assert 'batch_size=100: must be a multiple of the 8 device(s)' in str(raised.value)


def test_settings_that_do_not_fit_together():
  assert _problems(_config(warmup_steps=900, total_steps=800)) == [
      '--config.warmup_steps=900: must be <= --config.total_steps=800.'
  ]
  assert _problems(_config(min_lr=0.375, base_lr=1e-3)) == [
      '--config.min_lr=0.375: must be <= --config.base_lr=0.001, the peak the cosine decays '
      'from to it.'
  ]
  repeated = _problems(_config(batch_size=16, repeated_aug=32), devices=1, processes=1)
  assert repeated[0].startswith('--config.repeated_aug=32: must be <= the 16 examples each')
  setup.validate(_config(batch_size=16, repeated_aug=16), devices=1, processes=1)
  assert (
      '--config.warmup_epochs=10.0: must be <= --config.num_epochs=5.0'
      in _problems(_config(num_epochs=5.0, warmup_epochs=10.0))[0]
  )
  assert (
      'needs --config.distillation.teacher'
      in _problems(_config(**{'distillation.type': 'hard', 'distillation.teacher': ''}))[0]
  )


def test_the_digits_default_on_another_dataset_says_which_variant():
  problems = _problems(_config(dataset='cifar10'))  # --config.dataset=cifar10 after loading.
  assert problems[0].startswith(
      "--config.dataset='cifar10': does not fit the config's default, "
      'the quick model for the embedded digits'
  )
  assert "e.g. --config='configs/vit.py:variant=S/16,dataset=cifar10'" in problems[0]
  setup.validate(_config(dataset='folder:/images/of/digits'), devices=1, processes=1)
  for module in (vit, deit, cait, deepvit, t2t, regnet):
    first = list(module.VARIANTS)[0]
    with pytest.raises(
        ValueError,
        match=rf"^dataset='imagenet2012': does not fit the config's "
        rf'default.*: add variant= with one of '
        rf"{re.escape(', '.join(module.VARIANTS))} after the "
        rf"config file's colon, e.g. variant={re.escape(first)},"
        r'dataset=imagenet2012;',
    ):
      module.get_config('dataset=imagenet2012')
    module.get_config('dataset=folder:/images/of/digits')


def test_model_fields_are_checked_by_the_model():
  assert _problems(_config(**{'model.num_heads': 3}))[0].startswith(
      '--config.model: num_heads=3 must divide the hidden width 32'
  )
  assert _problems(_config(**{'model.name': 'vit_nonexistent'}))[0].startswith(
      "--config.model.name='vit_nonexistent': Unknown model"
  )
  assert _problems(_config(**{'model.drop_path_rate': 1.0}))[0] == (
      '--config.model: drop_path_rate=1.0 must be in [0, 1).'
  )


def test_evaluator_settings_are_checked_by_the_evaluators():
  assert _problems(_config(**{'evaluators.fewshot.shots': (0, 5)})) == [
      '--config.evaluators.fewshot: fewshot needs shots >= 1; got shots=(0, 5).'
  ]
  assert _problems(_config(**{'evaluators.linear_probe.every': -1}))[0].startswith(
      '--config.evaluators.linear_probe: LinearProbe needs datasets and every >= 0'
  )


@pytest.mark.parametrize(
    'flags, first_line',
    [
        (
            ['--config=configs/no_such.py'],
            'error: cannot load the config file: [Errno 2] No such file or directory: '
            "'configs/no_such.py'",
        ),
        (
            ['--config=configs/vit.py', '--config.batchsize=3'],
            'error: Did you mean "batch_size"? "batchsize" is not a config field.',
        ),
        (
            ['--config=configs/vit.py:dataset=imagenet2012'],
            "error: dataset='imagenet2012': does not fit the config's default, the quick model for "
            'the embedded digits',
        ),
        (
            ['--config=configs/vit.py', '--config.keep_checkpoints=0', '--config.eval_every=0'],
            'error: 2 config fields are not valid:',
        ),
    ],
)
def test_the_command_line_prints_one_clear_error(tmp_path, flags, first_line):
  out = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', f'--workdir={tmp_path / "run"}', *flags],
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=120,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  assert out.returncode == 1
  errors = out.stderr[out.stderr.index('error: ') :].splitlines()
  assert errors[0].startswith(first_line), out.stderr[-2000:]
  assert 'Traceback' not in out.stderr
  assert not (tmp_path / 'run').exists()


@pytest.mark.e2e
@pytest.mark.parametrize(
    'flags, line',
    [
        (
            ['--config=configs/vit.py', '--config.batch_size=-1'],
            'error: Config field not valid: --config.batch_size=-1: must be an integer >= 1.',
        ),
        (
            ['--config=configs/vit.py:variant=Ti/4,dataset=cifar100000'],
            "error: Config field not valid: --config.dataset='cifar100000': no such dataset. ",
        ),
    ],
    ids=['field', 'dataset'],
)
def test_a_bad_field_or_dataset_is_answered_before_tensorflow_or_jax_is_imported(
    tmp_path, flags, line
):
  argv = ['vit_jax.main', f'--workdir={tmp_path / "run"}', *flags]
  script = (
      'import atexit, runpy, sys; '
      "atexit.register(lambda: print('imported:', sorted({'tensorflow', 'jax'} & "
      'set(sys.modules)), file=sys.stderr)); '
      f'sys.argv = {argv!r}; '
      "runpy.run_module('vit_jax.main', run_name='__main__', alter_sys=True)"
  )
  out = subprocess.run(
      [sys.executable, '-c', script], capture_output=True, text=True, cwd=REPO, timeout=120
  )
  assert out.returncode == 1, out.stderr[-2000:]
  errors, imported = out.stderr.splitlines()
  assert errors.startswith(line) and imported == 'imported: []', out.stderr[-2000:]
  assert not (tmp_path / 'run').exists()


def test_the_fields_alone_are_checked_without_the_devices_or_the_model():
  config = _config(batch_size=-1, dataset='cifar100000', eval_batch_size=7, **{'model.depth': 0})
  with pytest.raises(config_checks.ConfigError) as raised:
    config_checks.validate_fields(config)
  alone = raised.value.problems
  assert [p.split(':')[0] for p in alone] == [
      "--config.dataset='cifar100000'",
      '--config.batch_size=-1',
  ]
  everything = _problems(config, devices=2)  # The batches over the devices, and the model.
  assert everything[:2] == alone and len(everything) > len(alone)


# The schema itself.


def test_every_default_obeys_its_rule_and_reaches_the_config():
  config = config_lib.defaults()
  for field in config_lib.FIELDS:
    assert field.rule.accepts(field.default), field.name
    value = config
    for key in field.name.split('.'):
      value = value[key]
    assert value == field.default, field.name
  setup.validate(config, devices=1, processes=1)


def test_fields_without_a_default_can_be_set_from_the_command_line():
  config = config_lib.defaults()
  for field in config_lib.FIELDS:
    if field.default is None:
      assert field.field_type is not None, field.name
  config.in_memory, config.num_epochs, config.data_dir = True, 3.0, '/tfds'
  setup.validate(config, devices=1, processes=1)
  with pytest.raises(TypeError):
    config.in_memory = 'yes'


def test_three_bad_fields_are_one_error_in_the_flags_words():
  with pytest.raises(config_checks.ConfigError) as raised:
    setup.validate(
        _config(mix_prob=1.5, optimizer='adagrad', **{'mesh.fsdp': 0}), devices=1, processes=1
    )
  assert str(raised.value) == (
      '3 config fields are not valid:\n'
      '  --config.mix_prob=1.5: must be a number in [0, 1].\n'
      "  --config.optimizer='adagrad': must be one of ['adamw', 'sgd', 'lamb'].\n"
      '  --config.mesh.fsdp=0: must be an integer >= 1.'
  )


def test_unknown_and_missing_fields_are_named():
  config = _config()
  del config['mix_prob']
  with config.unlocked():
    config.mixprob = 0.5
  problems = _problems(config)
  assert problems[0].startswith("--config.mixprob=0.5: not a known field; valid fields: ['augment'")
  assert (
      problems[1]
      == '--config.mix_prob: missing; every config needs it (python -m vit_jax.config lists them).'
  )


def test_typed_settings_read_the_config_once():
  config = _config(
      randaugment='rand-m9-mstd0.5-inc1',
      random_erase_prob=0.25,
      eval_crop_ratio=0.875,
      mixup_alpha=0.8,
  )
  train = setting.build(data_settings.TrainTransform, config)
  assert train.randaugment == augment_spec.parse_randaugment('rand-m9-mstd0.5-inc1')
  assert (
      train.image_size,
      train.augment,
      train.crop_padding,
      train.flip,
      train.normalization,
      train.random_erase_prob,
  ) == (16, 'crop_flip', 2, False, 'digits', 0.25)
  assert setting.build(data_settings.TrainTransform, _config()).randaugment is None
  assert setting.build(data_settings.EvalTransform, config) == data_settings.EvalTransform(
      image_size=16, crop_ratio=0.875, normalization='digits'
  )
  assert setting.build_unless_off(data_settings.MixSettings, config) == data_settings.MixSettings(
      mixup_alpha=0.8, cutmix_alpha=0.0, switch_prob=0.5, mix_prob=1.0, label_smoothing=0.0
  )


def test_reading_a_config_file_imports_neither_tensorflow_nor_jax():
  script = (
      'import sys; from vit_jax.configs import deit; deit.get_config(); '
      "print(sorted({'tensorflow', 'jax'} & set(sys.modules)))"
  )
  out = subprocess.run(
      [sys.executable, '-c', script],
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=60,
      check=True,
  )
  assert out.stdout.strip() == '[]'


def test_the_schema_prints_every_field_with_default_and_rule():
  text = config_lib.describe()
  for field in config_lib.FIELDS:
    assert f'--config.{field.name}={field.default!r}\n    {field.rule.valid}. {field.doc}' in text
  assert "--config.model={'name': 'vit_ti4'}" in text


def test_unset_evaluator_fields_take_the_evaluators_own_defaults():
  """The schema lists which evaluator fields the command line sets; their values stay the
  evaluators' own until set, and the loop runs no evaluator unless asked."""
  from vit_jax import evaluators  # pylint: disable=g-import-not-at-top
  from vit_jax.loop import train  # pylint: disable=g-import-not-at-top

  config = _config()
  for name, settings in config.evaluators.items():
    assert set(settings.values()) == {None}
    assert evaluators.create(name, settings) == evaluators.create(name), name
  assert evaluators.periodic(setting.build(run_settings.Settings, config).evaluators) == {}
  config.evaluators.fewshot.update(every=400, shots=(10,))
  periodic = evaluators.periodic(setting.build(run_settings.Settings, config).evaluators)
  assert list(periodic) == ['fewshot']
  assert (periodic['fewshot'].every, periodic['fewshot'].shots) == (400, (10,))
  assert periodic['fewshot'].seeds == evaluators.create('fewshot').seeds


def test_scan_layers_and_remat_keep_the_models_own_values_until_set():
  """Every config, RegNet's included, offers them unset; set, they reach a transformer, and a CNN
  refuses them (it has no blocks to scan)."""
  for module in (vit, t2t, sa_conv, regnet):
    config = module.get_config()
    assert (config.model.scan_layers, config.model.remat) == (None, None), module.__name__
    setup.validate(config, devices=1, processes=1)
    model = models.create_model(config, 10)
    assert not getattr(model, 'scan_layers', False) and not getattr(model, 'remat', False)
  config = sa_conv.get_config()
  config.model.scan_layers = config.model.remat = True
  model = models.create_model(config, 10)
  assert (model.scan_layers, model.remat) == (True, True)
  config = regnet.get_config()
  config.model.scan_layers = True
  with pytest.raises(config_checks.ConfigError, match="Unknown override 'scan_layers'"):
    setup.validate(config, devices=1, processes=1)


def test_a_part_kinds_own_settings_are_set_by_name_and_reach_its_module():
  """`--config.model.soft_splits` (the T2T stem's) and `--config.model.centre_init_std` (the
  positional attention's) exist unset in every config, and set they reach the part's module; a
  plain ViT holds no settings of either kind."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from vit_jax.models import attention  # pylint: disable=g-import-not-at-top
  from vit_jax.schema import parts  # pylint: disable=g-import-not-at-top

  plain = models.create_model(vit.get_config(), 10)
  assert (plain.stem_settings, plain.attention_settings) == (None, None)
  config = t2t.get_config('variant=14,dataset=digits')
  assert config.model.soft_splits is None
  assert models.create_model(config, 10).stem_settings == parts.T2TSettings()  # T2T-ViT-14's.
  config.model.token_dim = 32  # Over the registered model's own: T2T-ViT_t-14 keeps its block.
  config.model.name = 't2t_vit_t_14'
  assert models.create_model(config, 10).stem_settings == parts.T2TSettings(
      tokens_type='transformer', token_dim=32
  )
  config.model.name, config.model.token_dim = 't2t_vit_14', None
  config.model.soft_splits = ((3, 2, 1), (3, 1, 1))
  model = models.create_model(config, 10)
  assert model.stem_settings == parts.T2TSettings(soft_splits=((3, 2, 1), (3, 1, 1)))
  config.model.soft_splits = ((3, 0, 1),)
  with pytest.raises(config_checks.ConfigError, match=r'soft_splits=\(\(3, 0, 1\),\) must be'):
    setup.validate(config, devices=1, processes=1)
  config = sa_conv.get_config()
  config.model.centre_init_std = 0.5
  model = models.create_model(config, 10)
  received = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, attention.PositionalAttention):
      received.append(context.module.settings)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):  # Traced only: nothing is computed.
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 16, 16, 3)))
  assert received and set(received) == {parts.PositionalSettings(centre_init_std=0.5)}


def test_the_backbone_parts_can_be_set_on_every_family_config():
  """`--config.model.attention=…` and the other part fields exist unset (the preset's own value)
  in every config, and reach the model when set."""
  for module in (vit, deit, cait, deepvit, t2t, sa_conv, regnet):
    model = module.get_config().model
    assert set(config_lib.model_part_fields()) <= set(model), module.__name__
  config = cait.get_config()
  assert models.create_model(config, 10).attention == 'talking_heads'  # CaiT's own, kept unset.
  config.model.attention = 'standard'
  config.model.class_stage = 'token'
  model = models.create_model(config, 10)
  assert (model.attention, model.class_stage) == ('standard', 'token')
  config = vit.get_config()
  config.model.layer_scale_init = 1e-5
  config.model.attention = 're_attention'
  setup.validate(config, devices=1, processes=1)
  model = models.create_model(config, 10)
  assert (model.layer_scale_init, model.attention) == (1e-5, 're_attention')
  config.model.attention = 'banana'
  with pytest.raises(config_checks.ConfigError, match="attention='banana' is not valid"):
    setup.validate(config, devices=1, processes=1)
  config = regnet.get_config()
  config.model.attention = 'talking_heads'  # A CNN has no attention to replace.
  with pytest.raises(config_checks.ConfigError, match='attention'):
    setup.validate(config, devices=1, processes=1)


def test_layer_scale_and_mlp_width_are_each_said_once():
  """'paper' is a LayerScale init (the earlier --config.model.paper_layer_scale=true still says
  it); a model gets its MLP width from mlp_dim or mlp_ratio, and both at once is an error."""
  config = cait.get_config()  # Its quick model sets layer_scale_init=0.1.
  config.model.layer_scale_init = 'paper'
  assert models.create_model(config, 10).layer_scale_init == 'paper'
  config = cait.get_config()
  config.model.paper_layer_scale = True
  setup.validate(config, devices=1, processes=1)
  assert models.create_model(config, 10).layer_scale_init == 'paper'
  config = cait.get_config()
  config.model.layer_scale_init = 'banana'
  with pytest.raises(config_checks.ConfigError, match="layer_scale_init='banana' is not valid"):
    setup.validate(config, devices=1, processes=1)
  config = vit.get_config()  # Its quick model sets mlp_dim.
  config.model.mlp_ratio = 2.0
  with pytest.raises(config_checks.ConfigError, match='mlp_dim=256 and mlp_ratio=2.0'):
    setup.validate(config, devices=1, processes=1)
  config.model.mlp_dim = None
  assert models.create_model(config, 10).mlp_width == 2 * config.model.hidden_size


@dataclasses.dataclass(frozen=True)
class _Probe:
  """A reader of one new field, `width`."""

  width: int = setting.setting(3, config_rules.integer(1), 'A width.', flag='probe_width')


@dataclasses.dataclass(frozen=True)
class _ProbedRun(run_settings.Settings):
  """The run's settings with the probe among them."""

  probe: _Probe = dataclasses.field(kw_only=True)


def test_a_new_field_is_one_declaration(monkeypatch):
  """One `setting` in its reader's dataclass gives the schema's listing, the defaults, the rule,
  the command line and the value its reader receives."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  assert config_lib.FIELDS == setting.config_fields(run_settings.Settings)
  monkeypatch.setattr(config_lib, 'FIELDS', setting.config_fields(_ProbedRun))
  assert '--config.probe_width=3\n    an integer >= 1. A width.' in config_lib.describe()
  assert config_lib.defaults().probe_width == 3
  assert setting.build(_Probe, config_lib.defaults()) == _Probe(width=3) == _Probe()
  config = _config(probe_width=0)
  with pytest.raises(config_checks.ConfigError, match=r'probe_width=0: must be an integer >= 1'):
    config_checks.validate_fields(config)
  argv = ['main', f'--config={REPO}/vit_jax/configs/vit.py', '--config.probe_width=5']
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  config_checks.validate_fields(flag_values.config)
  assert setting.build(_ProbedRun, flag_values.config).probe.width == 5


@pytest.mark.parametrize(
    'declaration, error',
    [
        (setting.passed('image_sise'), r"passed\('image_sise'\) names no field"),
        (setting.setting(1, config_rules.integer(), 'Twice.', flag='seed'), 'owned twice'),
        (dataclasses.field(default=1), r'declare it with setting\(\), passed\(\)'),
    ],
    ids=['misspelt', 'owned twice', 'undeclared'],
)
def test_a_misspelt_or_unowned_field_is_an_error_when_the_schema_is_read(declaration, error):
  """`vit_jax.config` reads the schema when it is imported: a wrong field stops every command
  there, not when a run reaches it."""
  probe = dataclasses.make_dataclass(
      'Probe', [('width', int, declaration)], frozen=True, kw_only=True
  )
  root = dataclasses.make_dataclass(
      'Root',
      [('probe', probe, dataclasses.field(kw_only=True))],
      bases=(run_settings.Settings,),
      frozen=True,
  )
  with pytest.raises(TypeError, match=error):
    setting.config_fields(root)


def test_each_loss_name_of_the_schema_is_its_loss_of_the_step():
  from vit_jax.training import steps  # pylint: disable=g-import-not-at-top

  assert steps.LOSSES == {
      'softmax_xent': steps.softmax_cross_entropy,
      'bce': steps.binary_cross_entropy,
  }


@pytest.mark.parametrize('returned', [1, None, {'batch_size': 8}])
def test_a_config_file_that_returns_no_config_is_one_line(returned):
  with pytest.raises(ValueError) as refusal:
    config_checks.validate_fields(returned)
  assert str(refusal.value).startswith(
      f"the config file's get_config() returned {returned!r} ({type(returned).__name__}), not an "
      'ml_collections.ConfigDict'
  )
