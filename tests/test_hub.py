"""Weights by name (`hf-hub:ORG/NAME`): read from a local Hugging Face cache that timm's own
`save_for_hf` fills, offline; the metadata picks model, preprocessing and class names; a clear
error when the weights are neither cached nor downloadable."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import Any

import jax
import numpy as np
import pytest
from PIL import Image

from vit_jax.schema import normalization
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.weights import hub
from vit_jax.weights import inference
from vit_jax.schema import checks as config_checks
from vit_jax.loop import setup
from vit_jax import models
from vit_jax.weights import pretrained
from vit_jax.training import teacher as teacher_lib
from vit_jax.loop import train
from vit_jax.models import vit
from vit_jax.configs import common
from vit_jax.configs import finetune
from vit_jax.schema import setting
from vit_jax.schema import step as step_settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Hub name -> (timm's architecture and the arguments of a small version, the model we register,
# the input size of the test).
CASES = {
    'timm/deit_tiny_patch16_224.fb_in1k': (
        'deit_tiny_patch16_224',
        dict(depth=2, img_size=32, patch_size=8),
        'deit_ti16',
        32,
    ),
    'timm/deit_small_distilled_patch16_224.fb_in1k': (
        'deit_small_distilled_patch16_224',
        dict(depth=2, img_size=32, patch_size=8),
        'deit_s16_distilled',
        32,
    ),
    'timm/cait_xxs24_224.fb_dist_in1k': (
        'cait_xxs24_224',
        dict(depth=2, depth_token_only=1, img_size=32, patch_size=8),
        'cait_xxs24',
        32,
    ),
    'timm/deit3_small_patch16_224.fb_in1k': (
        'deit3_small_patch16_224',
        dict(depth=2, img_size=32, patch_size=8),
        'deit3_s16',
        32,
    ),
    'timm/regnety_002.pycls_in1k': ('regnety_002', {}, 'regnety_002', 64),
    'timm/vit_small_patch16_224.augreg_in21k_ft_in1k': (
        'vit_small_patch16_224',
        dict(depth=1, img_size=32, num_heads=2),
        'vit_s16',
        32,
    ),
}
LABELS = tuple(f'class {i}' for i in range(10))
# A timm ViT small enough to train in seconds (16-pixel images), for Hub repositories of tests.
TINY_TIMM_VIT = dict(depth=1, img_size=16, patch_size=4, embed_dim=32, num_heads=2)
# Two training steps of a fine-tuning config, small and in float32.
TWO_FAST_STEPS = dict(
    batch_size=32,
    eval_batch_size=72,
    num_epochs=None,
    warmup_epochs=None,
    total_steps=2,
    warmup_steps=1,
    log_every=1,
    dtype='float32',
    randaugment='',
    mixup_alpha=0.0,
    cutmix_alpha=0.0,
)


def _timm_logits(model, images: np.ndarray) -> np.ndarray:
  import torch  # pylint: disable=g-import-not-at-top

  with torch.no_grad():
    return model(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()


@pytest.mark.parametrize('name', sorted(CASES))
def test_hub_names_load_with_timms_logits(name, hub_cache, timm_model):
  architecture, arguments, ours, size = CASES[name]
  reference, _ = timm_model(architecture, num_classes=10, **arguments)
  hub_cache(name, reference, label_names=LABELS)
  weights = hub.resolve(f'hf-hub:{name}')
  assert (weights.model, weights.num_classes, weights.label_names) == (ours, 10, LABELS)
  assert weights.image_size == arguments.get('img_size', 224)
  model = weights.create_model()
  variables = pretrained.load(f'hf-hub:{name}', model, image_size=size)
  images = np.random.default_rng(0).normal(size=(2, size, size, 3)).astype(np.float32)
  logits = np.asarray(jax.jit(model.apply)(variables, images))
  np.testing.assert_allclose(logits, _timm_logits(reference, images), atol=1e-5, rtol=0)


def test_metadata_picks_preprocessing():
  config = {
      'architecture': 'vit_base_patch16_384',
      'num_classes': 3,
      'label_names': ['a', 'b', 'c'],
      'model_args': {'global_pool': 'token', 'img_size': [384, 384], 'drop_path_rate': 0.1},
      'pretrained_cfg': {
          'input_size': [3, 384, 384],
          'interpolation': 'bicubic',
          'crop_pct': 1.0,
          'mean': [0.5] * 3,
          'std': [0.5] * 3,
      },
  }
  picked = hub.read_config('hf-hub:x/y', config)
  assert picked['model'] == 'vit_b16'
  assert picked['model_fields'] == {'global_pool': 'token'}
  assert (picked['image_size'], picked['crop_ratio'], picked['normalization']) == (
      384,
      1.0,
      'inception',
  )
  assert picked['label_names'] == ('a', 'b', 'c')
  config['pretrained_cfg']['mean'] = [0.48145466, 0.4578275, 0.40821073]  # CLIP's.
  config['pretrained_cfg']['std'] = [0.26862954, 0.26130258, 0.27577711]
  assert hub.read_config('hf-hub:x/y', config)['normalization'] == 'clip'
  config['pretrained_cfg']['std'] = [0.5, 0.25, 0.125]  # Of no known normalisation.
  numbers = hub.read_config('hf-hub:x/y', config)['normalization']
  np.testing.assert_array_equal(
      normalization.mean_std(numbers),
      ([0.48145466, 0.4578275, 0.40821073], [0.5, 0.25, 0.125]),
  )
  config['pretrained_cfg']['std'] = [0.5, 0.0, 0.5]
  with pytest.raises(ValueError, match=r'pretrained_cfg.std=\[0.5, 0.0, 0.5\], .*three positive'):
    hub.read_config('hf-hub:x/y', config)


@pytest.mark.parametrize(
    'config, message',
    [
        ({'architecture': 'convnext_tiny'}, r"timm architecture 'convnext_tiny' has no registered"),
        (
            {'architecture': 'vit_base_patch16_224', 'model_args': {'class_token': False}},
            r"arguments \{'class_token': False\} that 'vit_b16' has no field for",
        ),
        ({}, r'names no timm "architecture"'),
    ],
)
def test_unsupported_hub_configs_are_named(config, message):
  with pytest.raises(ValueError, match=message):
    hub.read_config('hf-hub:x/y', config)


@pytest.mark.parametrize(
    'family', [f for f in models.families() if f.timm_architectures], ids=lambda f: f.name
)
def test_every_timm_architecture_maps_to_a_model_of_its_shape(family, timm):
  """Each architecture we map builds (on PyTorch's meta device: no memory) a model of our
  model's shape: as many parameters in a transformer (ours traced one block deep, scanned), the
  same stages (blocks, width, group width) in a RegNet."""
  import torch  # pylint: disable=g-import-not-at-top

  for architecture, name in family.timm_architectures.items():
    with torch.device('meta'):
      reference = timm.create_model(architecture, pretrained=False, num_classes=10)
    ours = models.create(name, num_classes=10)
    if isinstance(ours, vit.VisionTransformer):
      size = reference.pretrained_cfg['input_size'][-1]
      shapes = jax.eval_shape(
          lambda m=ours.clone(scan_layers=True), s=size: m.init(
              jax.random.key(0), jax.numpy.zeros((1, s, s, 3)), train=False
          )['params']
      )
      count = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes))
      assert count == sum(p.numel() for p in reference.parameters()), (architecture, name)
    else:
      stages = [
          (
              stage.b1.conv3.conv.out_channels,
              len(list(stage.children())),
              stage.b1.conv2.conv.in_channels // stage.b1.conv2.conv.groups,
          )
          for stage in (getattr(reference, f's{i + 1}') for i in range(len(ours.stages)))
      ]
      assert stages == ours.stages and not hasattr(reference, f's{len(stages) + 1}'), name


def test_weights_of_another_family_name_the_model_they_hold(hub_cache, timm_model):
  reference, _ = timm_model('deit_tiny_patch16_224', depth=1, img_size=32, patch_size=8)
  hub_cache('timm/deit_tiny_patch16_224.fb_in1k', reference)
  with pytest.raises(
      ValueError,
      match=r"It holds a 'deit' model \('deit_ti16'\); configs/"
      r'finetune.py:init_from=hf-hub:timm/deit_tiny_patch16_224',
  ):
    pretrained.load(
        'hf-hub:timm/deit_tiny_patch16_224.fb_in1k',
        models.create('cait_xxs24', depth=1),
        image_size=32,
    )


def test_empty_cache_offline_fails_naming_the_weights_and_the_cache(hub_cache):
  del hub_cache  # Empty, offline.
  name = 'hf-hub:timm/deit_small_patch16_224.fb_in1k'
  for load in (
      lambda: hub.resolve(name),
      lambda: pretrained.load(name, models.create('deit_s16'), image_size=224),
      lambda: inference.load_weights(name),
  ):
    with pytest.raises(ValueError) as raised:
      load()
    message = str(raised.value)
    assert message.startswith(f'Cannot get {name}: neither downloaded (HF_HUB_OFFLINE is set')
    assert hub.cache_dir() in message and 'Traceback' not in message


def test_a_cache_under_a_file_is_named_as_a_file(hub_cache):
  del hub_cache
  home = os.path.dirname(hub.cache_dir())
  shutil.rmtree(home)
  with open(home, 'w') as f:
    f.write('not a folder')
  with pytest.raises(
      ValueError, match=f'{re.escape(home)} is a file, where the cache needs a folder'
  ):
    hub.resolve('hf-hub:timm/deit_small_patch16_224.fb_in1k')


def test_predict_reads_model_preprocessing_and_labels_from_the_hub(hub_cache, timm_model, tmp_path):
  reference, _ = timm_model(
      'deit_tiny_patch16_224', num_classes=10, depth=1, img_size=32, patch_size=8
  )
  hub_cache('timm/deit_tiny_patch16_224.fb_in1k', reference, label_names=LABELS)
  image = tmp_path / 'a.png'
  Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 48, 3), np.uint8)).save(image)
  run = inference.load_weights('hf-hub:timm/deit_tiny_patch16_224.fb_in1k')
  assert (
      run.config.model.name,
      run.config.image_size,
      run.config.eval_crop_ratio,
      run.config.normalization,
      run.class_names,
  ) == ('deit_ti16', 32, 0.9, 'imagenet', LABELS)
  [prediction] = inference.predict(run, [str(image)], top_k=3)
  pixels = inference.decode_for_model(str(image), run.eval_transform)[None]
  expected = _timm_logits(reference, pixels)[0]
  assert [name for _, name, _ in prediction.top_k] == [LABELS[i] for i in np.argsort(-expected)[:3]]


def test_the_command_line_fails_in_one_line_without_network_or_cache(tmp_path):
  """`python -m vit_jax.predict --init_from=hf-hub:...` with an empty cache and HF_HUB_OFFLINE=1."""
  image = tmp_path / 'a.png'
  Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(image)
  cache = tmp_path / 'hf_home' / 'hub'
  env = {
      **os.environ,
      'PYTHONPATH': REPO,
      'HF_HOME': str(tmp_path / 'hf_home'),
      'HF_HUB_CACHE': str(cache),
      'HF_HUB_OFFLINE': '1',
  }
  done = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.predict',
          '--init_from=hf-hub:timm/deit_tiny_patch16_224.fb_in1k',
          str(image),
      ],
      env=env,
      capture_output=True,
      text=True,
      cwd=REPO,
      check=False,
  )
  assert done.returncode == 1
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith(
      'error: Cannot get hf-hub:timm/deit_tiny_patch16_224.fb_in1k: neither '
      'downloaded (HF_HUB_OFFLINE is set: no network) nor in the Hugging Face '
      f'cache {cache}'
  )
  assert 'Traceback' not in done.stderr


def test_fine_tuning_from_a_hub_name_then_eval_only(hub_cache, timm_model, tmp_path):
  """configs/finetune.py from Hub weights (their 1000-class head replaced for the digits' 10),
  with layer-wise lr decay; then eval_only of 10-class Hub weights."""
  student, _ = timm_model('deit_tiny_patch16_224', **TINY_TIMM_VIT)
  hub_cache('timm/deit_tiny_patch16_224.fb_in1k', student)
  config = finetune.get_config(
      'init_from=hf-hub:timm/deit_tiny_patch16_224.fb_in1k,dataset=digits,layer_decay=0.75'
  )
  assert (
      config.model.name,
      config.model.hidden_size,
      config.model.depth,
      config.image_size,
      config.normalization,
      config.eval_crop_ratio,
      config.layer_decay,
  ) == ('deit_ti16', 32, 1, 16, 'imagenet', 0.9, 0.75)
  config.update(data_dir=str(tmp_path / 'tfds'), **TWO_FAST_STEPS)
  result = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert result.step == 2 and np.isfinite(result.metrics['loss'])

  student, _ = timm_model('deit_tiny_patch16_224', num_classes=10, **TINY_TIMM_VIT)
  hub_cache('timm/deit_tiny_patch16_224.digits', student)
  evaluation = finetune.get_config(
      'init_from=hf-hub:timm/deit_tiny_patch16_224.digits,dataset=digits'
  )
  evaluation.update({'data_dir': str(tmp_path / 'tfds'), **TWO_FAST_STEPS, 'eval_only': True})
  result = train.train_and_evaluate(evaluation, str(tmp_path / 'eval'))
  assert result.metrics['count'] == 360 and 0 <= result.metrics['accuracy'] <= 1


def test_a_teacher_by_hub_name_brings_its_model_and_normalisation(hub_cache, timm_model):
  regnet, _ = timm_model('regnety_002', num_classes=10)
  hub_cache('timm/regnety_002.pycls_in1k', regnet)
  config = common.get_config()
  config.normalization = 'digits'  # The student's; the teacher's is ImageNet's.
  config.distillation.type = 'hard'
  config.distillation.teacher = 'hf-hub:timm/regnety_002.pycls_in1k'
  teacher = teacher_lib.load(setting.build_unless_off(step_settings.TeacherSettings, config), 10)
  assert (type(teacher.model).__name__, teacher.model.depth, teacher.model.num_classes) == (
      'RegNet',
      13,
      10,
  )
  scale, shift = teacher_lib.normalization_change('digits', 'imagenet')
  np.testing.assert_allclose(teacher.input_scale, scale)
  np.testing.assert_allclose(teacher.input_shift, shift)
  images = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype(np.float32)
  np.testing.assert_allclose(
      np.asarray(jax.jit(teacher.model.apply)(teacher.variables, images)),
      _timm_logits(regnet, images),
      atol=1e-5,
      rtol=0,
  )


def test_a_normalisation_given_as_numbers_is_accepted_and_applied():
  """A config takes a mean and std as numbers; evaluation normalises with them."""
  numbers = '0.25,0.5,0.75/0.5,0.25,0.125'
  config = common.get_config()
  config.normalization = numbers
  setup.validate(config, devices=1, processes=1)
  config.normalization = '0.5,0.5/0.5,0.5'
  with pytest.raises(
      config_checks.ConfigError, match=r"normalization='0.5,0.5/0.5,0.5': .*'R,G,B/"
  ):
    setup.validate(config, devices=1, processes=1)
  image = np.random.default_rng(0).integers(0, 256, (20, 24, 3), np.uint8)
  seen = {
      normalization: np.asarray(
          input_pipeline.eval_image(
              image,
              data_settings.EvalTransform(
                  crop_ratio=0.9, image_size=16, normalization=normalization
              ),
          )
      )
      for normalization in (numbers, 'inception')
  }
  pixels = seen['inception'] * 0.5 + 0.5  # In [0, 1], before normalisation.
  mean, std = np.array([0.25, 0.5, 0.75]), np.array([0.5, 0.25, 0.125])
  np.testing.assert_allclose(seen[numbers], (pixels - mean) / std, atol=1e-4)


def _cache_config_only(repo_id: str, config: Any) -> pathlib.Path:
  """Stores a Hub repository holding only `config` (its config.json) in the offline cache;
  returns that file."""
  org, name = repo_id.split('/')
  repo = pathlib.Path(hub.cache_dir()) / f'models--{org}--{name}'
  snapshot = repo / 'snapshots' / ('0' * 40)
  snapshot.mkdir(parents=True)
  (snapshot / 'config.json').write_text(json.dumps(config))
  (repo / 'refs').mkdir()
  (repo / 'refs' / 'main').write_text('0' * 40)
  return snapshot / 'config.json'


def test_an_unmapped_architecture_is_refused_before_its_weights_are_fetched(hub_cache, monkeypatch):
  """Every way in (resolve, load, the inference runs, configs/finetune.py) reads config.json,
  refuses the architecture naming it and the mapped ones, and never asks for the weights."""
  import huggingface_hub  # pylint: disable=g-import-not-at-top

  del hub_cache  # Empty, offline.
  name = 'hf-hub:timm/convnext_tiny.fb_in1k'
  _cache_config_only(
      'timm/convnext_tiny.fb_in1k',
      {'architecture': 'convnext_tiny', 'num_classes': 1000, 'pretrained_cfg': {}},
  )
  fetched = []
  download = huggingface_hub.hf_hub_download

  def recording_download(repo_id, filename, **kwargs):
    fetched.append(filename)
    return download(repo_id, filename, **kwargs)

  monkeypatch.setattr(huggingface_hub, 'hf_hub_download', recording_download)
  for load in (
      lambda: hub.resolve(name),
      lambda: pretrained.load(name, models.create('deit_s16'), image_size=224),
      lambda: inference.load_weights(name),
      lambda: finetune.get_config(f'init_from={name},dataset=digits'),
  ):
    with pytest.raises(ValueError) as raised:
      load()
    message = str(raised.value)
    assert message.startswith(
        f"{name}: timm architecture 'convnext_tiny' has no registered counterpart; known: ["
    )
    assert "'deit_small_patch16_224'" in message and "'cait_xxs24_224'" in message
  assert fetched == ['config.json'] * 4


def test_headless_weights_fine_tune_with_a_fresh_head_and_give_features(
    hub_cache, timm_model, data_dir, tmp_path
):
  """Weights without a classifier (timm's num_classes=0: DINO, MAE, in21k backbones): a model
  without a head gives timm's features; configs/finetune.py trains them with a fresh head."""
  from vit_jax import evaluators  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluators import evaluator  # pylint: disable=g-import-not-at-top
  from vit_jax.models import features  # pylint: disable=g-import-not-at-top

  name = 'hf-hub:timm/vit_small_patch16_224.dino'
  reference, _ = timm_model('vit_small_patch16_224', num_classes=0, **TINY_TIMM_VIT)
  hub_cache('timm/vit_small_patch16_224.dino', reference)
  assert hub.describe(name).headless

  run = inference.load_weights(name)
  assert (run.model.num_classes, run.class_names) == (0, ())
  images = np.random.default_rng(0).normal(size=(2, 16, 16, 3)).astype(np.float32)
  extracted = jax.jit(lambda v, x: features.extract(run.model, v, x))(run.variables, images)
  np.testing.assert_allclose(
      np.asarray(extracted.pre_logits), _timm_logits(reference, images), atol=1e-5, rtol=0
  )
  run.config.data_dir = data_dir
  data = setting.build(data_settings.DataSettings, run.config)
  probe = evaluators.create('fewshot', {'datasets': ('digits',), 'shots': (1,), 'seeds': 1})
  metrics = probe.run(evaluator.Subject(run.model, data, variables=run.variables))
  assert 0 <= metrics['fewshot/digits_1shot'] <= 1
  with pytest.raises(ValueError, match=r'has no classifier head \(headless weights\)'):
    list(inference.predict(run, ['unread.png']))

  config = finetune.get_config(f'init_from={name},dataset=digits')
  assert (config.model.name, config.model.hidden_size, config.normalization) == (
      'vit_s16',
      32,
      'inception',
  )
  config.update(data_dir=data_dir, **TWO_FAST_STEPS)
  result = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert result.step == 2 and np.isfinite(result.metrics['loss'])
  fine_tuned = inference.load_run(str(tmp_path / 'run'), use_ema=False)
  assert fine_tuned.model.num_classes == 10
  assert fine_tuned.variables['params']['head']['kernel'].shape == (32, 10)


def test_the_papers_evaluation_crop_is_one_flag_away(hub_cache, timm_model):
  """Hub weights evaluate with timm's crop_pct (0.9 for DeiT at 224); the paper's 0.875 is
  --config.eval_crop_ratio, on the command line as main reads it."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  reference, _ = timm_model('deit_tiny_patch16_224', depth=1, img_size=32, patch_size=8)
  hub_cache('timm/deit_tiny_patch16_224.fb_in1k', reference)
  config_file = os.path.join(REPO, 'configs', 'finetune.py')
  arg = 'init_from=hf-hub:timm/deit_tiny_patch16_224.fb_in1k,dataset=digits'
  crops = []
  for overrides in ([], ['--config.eval_crop_ratio=0.875']):
    argv = ['main', f'--config={config_file}:{arg}', *overrides]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file('config', None, flag_values=flag_values, sys_argv=argv)
    flag_values(argv)
    transform = setting.build(data_settings.EvalTransform, flag_values.config)
    crops.append(transform.crop_ratio)
  assert crops == [0.9, 0.875]


def test_a_headless_regnet_gives_timms_pooled_features(hub_cache, timm_model):
  """SEER-style RegNetY weights without a head: our model without one outputs what timm's does."""
  reference, _ = timm_model('regnety_002', num_classes=0)
  hub_cache('timm/regnety_002.seer', reference)
  run = inference.load_weights('hf-hub:timm/regnety_002.seer')
  assert (run.model.num_classes, run.class_names) == (0, ())
  images = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype(np.float32)
  np.testing.assert_allclose(
      np.asarray(jax.jit(run.model.apply)(run.variables, images)),
      _timm_logits(reference, images),
      atol=1e-5,
      rtol=0,
  )


# A config.json that maps to a model here, and its damaged fields: (field, value, what is valid).
_GOOD_CONFIG = {
    'architecture': 'deit_tiny_patch16_224',
    'num_classes': 10,
    'pretrained_cfg': {'input_size': [3, 224, 224], 'crop_pct': 0.9},
}
_BAD_FIELDS = [
    ('num_classes', 'ten', 'a whole number of classes'),
    ('num_classes', -3, 'a whole number of classes'),
    ('num_classes', 2.5, 'a whole number of classes'),
    ('pretrained_cfg', 'big', 'a JSON object'),
    ('pretrained_cfg.input_size', 'big', '[3, HEIGHT, WIDTH] of positive whole numbers'),
    ('pretrained_cfg.input_size', [3, -5, -5], '[3, HEIGHT, WIDTH] of positive whole numbers'),
    ('pretrained_cfg.input_size', [224, 224], '[3, HEIGHT, WIDTH] of positive whole numbers'),
    ('pretrained_cfg.crop_pct', 'wide', 'a number in (0, 1]'),
    ('pretrained_cfg.crop_pct', 1.5, 'a number in (0, 1]'),
    ('pretrained_cfg.crop_pct', 0, 'a number in (0, 1]'),
    ('pretrained_cfg.mean', [0.5, 0.5], 'three numbers (R, G, B)'),
    ('pretrained_cfg.std', 'wide', 'three positive numbers (R, G, B)'),
    ('pretrained_cfg.std', [0.5, -0.5, 0.5], 'three positive numbers (R, G, B)'),
    ('label_names', 'abcdefghij', 'a list of class names (strings)'),
    ('label_names', list(range(10)), 'a list of class names (strings)'),
    ('model_args', [1], 'a JSON object'),
    ('architecture', 7, 'the name of a timm architecture'),
]


@pytest.mark.parametrize(
    'field, value, valid', _BAD_FIELDS, ids=[f'{f}={v!r}' for f, v, _ in _BAD_FIELDS]
)
def test_a_damaged_hub_config_field_is_one_line_before_the_weights_are_read(
    hub_cache, field, value, valid
):
  """An absurd value in a Hub repository's config.json names the file, the field, its value and
  what would be valid, in one line, and the weights are never asked for."""
  del hub_cache  # Empty, offline: the weights are not there, so asking for them would fail.
  config = json.loads(json.dumps(_GOOD_CONFIG))
  *parents, leaf = field.split('.')
  target = config
  for parent in parents:
    target = target[parent]
  target[leaf] = value
  path = _cache_config_only('timm/deit_tiny_patch16_224.broken', config)
  name = 'hf-hub:timm/deit_tiny_patch16_224.broken'
  with pytest.raises(ValueError) as raised:
    hub.resolve(name)
  message = str(raised.value)
  assert '\n' not in message, message
  assert message.startswith(f'{name}: {path} has {field}={value!r}, '), message
  assert valid in message, message


def test_a_hub_config_that_is_a_json_list_is_one_line(hub_cache):
  del hub_cache
  path = _cache_config_only('timm/deit_tiny_patch16_224.list', [])
  name = 'hf-hub:timm/deit_tiny_patch16_224.list'
  with pytest.raises(ValueError) as raised:
    hub.describe(name)
  message = str(raised.value)
  assert '\n' not in message, message
  assert message.startswith(f'{name}: {path} is a JSON list, not an object'), message
