"""Foreign weights: file formats, family dispatch, position-embedding resizing, export, errors."""

import os
import pickle
import warnings

import jax
import numpy as np
import pytest

from vit_jax import models
from vit_jax.weights import checkpoint_formats
from vit_jax.weights import pretrained

# timm name, our registry name; tiny versions: 32x32 images, patch 8, two blocks, ten classes.
TIMM_CASES = {
    'vit': ('vit_tiny_patch16_224', 'vit_ti16'),
    'deit_distilled': ('deit_tiny_distilled_patch16_224', 'deit_ti16_distilled'),
    'cait': ('cait_xxs24_224', 'cait_xxs24'),
}
TINY = dict(patch_size=8, depth=2, num_classes=10)


def _ours(name: str, **overrides):
  """Our model `name`, or a skip while its family (branch `families`) has no timm conversion."""
  if name not in models.names():
    pytest.skip(f'{name} is not registered yet.')
  model = models.create(name, **overrides)
  try:
    pretrained.converting_family(model)
  except ValueError as e:
    pytest.skip(str(e))
  return model


def _images(size: int, count: int = 2) -> np.ndarray:
  return np.random.default_rng(0).normal(size=(count, size, size, 3)).astype(np.float32)


def _timm_logits(model, images: np.ndarray) -> np.ndarray:
  import torch  # pylint: disable=g-import-not-at-top

  with torch.no_grad():
    return model(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()


def _save_pth(state_dict: dict, path: str, **save_kwargs) -> str:
  import torch  # pylint: disable=g-import-not-at-top

  torch.save(state_dict, path, **save_kwargs)
  return path


def _tensors(state_dict: dict, prefix: str = '') -> dict:
  import torch  # pylint: disable=g-import-not-at-top

  return {
      prefix + key: torch.from_numpy(np.ascontiguousarray(value))
      for key, value in state_dict.items()
  }


def _save_safetensors(state_dict: dict, path: str) -> str:
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top

  safetensors_numpy.save_file({k: np.ascontiguousarray(v) for k, v in state_dict.items()}, path)
  return path


@pytest.mark.parametrize('case', sorted(TIMM_CASES))
def test_timm_checkpoints_give_timm_logits(case, timm_model, tmp_path):
  timm_name, our_name = TIMM_CASES[case]
  ours = _ours(our_name, **TINY)
  model, state_dict = timm_model(timm_name, img_size=32, **TINY)
  files = [
      _save_safetensors(state_dict, str(tmp_path / 'plain.safetensors')),
      # The official DeiT/CaiT wrapper, with DataParallel's `module.` prefix.
      _save_pth({'model': _tensors(state_dict, 'module.')}, str(tmp_path / 'wrapped.pth')),
      _save_pth(
          _tensors(state_dict), str(tmp_path / 'legacy.pth'), _use_new_zipfile_serialization=False
      ),
  ]
  images = _images(32)
  expected = _timm_logits(model, images)
  apply = jax.jit(ours.apply)
  for path in files:
    variables = pretrained.load(path, ours, image_size=32)
    logits = np.asarray(apply(variables, images))
    assert np.abs(logits - expected).max() <= 1e-5, path


def test_ema_weights_are_preferred_like_timm(timm_model, tmp_path):
  ours = _ours('vit_ti16', **TINY)
  _, state_dict = timm_model('vit_tiny_patch16_224', img_size=32, **TINY)
  plain = {key: value + 1.0 for key, value in state_dict.items()}
  path = _save_pth(
      {'state_dict': _tensors(plain), 'state_dict_ema': _tensors(state_dict), 'epoch': 3},
      str(tmp_path / 'train.pth'),
  )
  ema = pretrained.load(path, ours, image_size=32)
  np.testing.assert_array_equal(ema['params']['cls_token'], state_dict['cls_token'])
  raw = pretrained.load(path, ours, image_size=32, use_ema=False)
  np.testing.assert_array_equal(raw['params']['cls_token'], plain['cls_token'])


def test_bfloat16_safetensors_load_as_timm_runs_them(timm_model, tmp_path):
  """Weights published in bfloat16 (saved by safetensors.torch) load with the logits timm gives
  for the same bfloat16 values."""
  import torch  # pylint: disable=g-import-not-at-top
  from safetensors import torch as safetensors_torch  # pylint: disable=g-import-not-at-top

  ours = _ours('vit_ti16', **TINY)
  model, state_dict = timm_model('vit_tiny_patch16_224', img_size=32, **TINY)
  halved = {key: value.to(torch.bfloat16) for key, value in _tensors(state_dict).items()}
  path = str(tmp_path / 'bf16.safetensors')
  safetensors_torch.save_file(halved, path)
  model.load_state_dict({key: value.float() for key, value in halved.items()})
  images = _images(32)
  variables = pretrained.load(path, ours, image_size=32)
  assert variables['params']['cls_token'].dtype == np.float32
  logits = np.asarray(jax.jit(ours.apply)(variables, images))
  assert np.abs(logits - _timm_logits(model, images)).max() <= 1e-5


def _google_npz(state_dict: dict, num_heads: int, path: str) -> str:
  """Writes a timm ViT state dict in the google-research/vision_transformer .npz layout."""
  width = state_dict['cls_token'].shape[-1]
  head_dim = width // num_heads
  arrays = {
      'embedding/kernel': state_dict['patch_embed.proj.weight'].transpose(2, 3, 1, 0),
      'embedding/bias': state_dict['patch_embed.proj.bias'],
      'cls': state_dict['cls_token'],
      'Transformer/posembed_input/pos_embedding': state_dict['pos_embed'],
      'Transformer/encoder_norm/scale': state_dict['norm.weight'],
      'Transformer/encoder_norm/bias': state_dict['norm.bias'],
      'head/kernel': state_dict['head.weight'].T,
      'head/bias': state_dict['head.bias'],
  }
  depth = len({key.split('.')[1] for key in state_dict if key.startswith('blocks.')})
  for i in range(depth):
    block, google = f'blocks.{i}.', f'Transformer/encoderblock_{i}/'
    for ours, theirs in (('norm1', 'LayerNorm_0'), ('norm2', 'LayerNorm_2')):
      arrays[f'{google}{theirs}/scale'] = state_dict[f'{block}{ours}.weight']
      arrays[f'{google}{theirs}/bias'] = state_dict[f'{block}{ours}.bias']
    for j, fc in enumerate(('fc1', 'fc2')):
      arrays[f'{google}MlpBlock_3/Dense_{j}/kernel'] = state_dict[f'{block}mlp.{fc}.weight'].T
      arrays[f'{google}MlpBlock_3/Dense_{j}/bias'] = state_dict[f'{block}mlp.{fc}.bias']
    attention = f'{google}MultiHeadDotProductAttention_1/'
    qkv_weight = state_dict[f'{block}attn.qkv.weight']
    qkv_bias = state_dict[f'{block}attn.qkv.bias']
    for j, name in enumerate(('query', 'key', 'value')):
      rows = slice(j * width, (j + 1) * width)
      arrays[f'{attention}{name}/kernel'] = qkv_weight[rows].T.reshape(width, num_heads, head_dim)
      arrays[f'{attention}{name}/bias'] = qkv_bias[rows].reshape(num_heads, head_dim)
    arrays[f'{attention}out/kernel'] = state_dict[f'{block}attn.proj.weight'].T.reshape(
        num_heads, head_dim, width
    )
    arrays[f'{attention}out/bias'] = state_dict[f'{block}attn.proj.bias']
  np.savez(path, **arrays)
  return path


def test_google_npz_gives_timm_logits(timm, timm_model, tmp_path):
  import torch  # pylint: disable=g-import-not-at-top
  from timm.models import vision_transformer  # pylint: disable=g-import-not-at-top

  model, state_dict = timm_model('vit_tiny_patch16_224', img_size=32, **TINY)
  path = _google_npz(state_dict, 3, str(tmp_path / 'ViT-Ti_8.npz'))
  # The file is what timm's own Google-checkpoint reader expects.
  reread = timm.create_model('vit_tiny_patch16_224', pretrained=False, img_size=32, **TINY)
  with torch.no_grad():
    vision_transformer._load_weights(reread, path)  # pylint: disable=protected-access
  for key, value in reread.state_dict().items():
    np.testing.assert_allclose(value.numpy(), state_dict[key], atol=1e-7, err_msg=key)
  ours = _ours('vit_ti16', **TINY)
  images = _images(32)
  logits = np.asarray(jax.jit(ours.apply)(pretrained.load(path, ours, image_size=32), images))
  assert np.abs(logits - _timm_logits(model, images)).max() <= 1e-5


def test_google_npz_pre_logits_load_or_drop_for_fine_tuning(timm_model, tmp_path):
  _, state_dict = timm_model('vit_tiny_patch16_224', img_size=32, **TINY)
  path = _google_npz(state_dict, 3, str(tmp_path / 'ViT-Ti_8.npz'))
  with np.load(path) as arrays:
    arrays = dict(arrays)
  rng = np.random.default_rng(0)
  arrays['pre_logits/kernel'] = rng.normal(size=(192, 32)).astype(np.float32)
  arrays['pre_logits/bias'] = rng.normal(size=(32,)).astype(np.float32)
  arrays['head/kernel'] = rng.normal(size=(32, 10)).astype(np.float32)
  np.savez(path, **arrays)
  with_representation = _ours('vit_ti16', **TINY, representation_size=32)
  params = pretrained.load(path, with_representation, image_size=32)['params']
  np.testing.assert_array_equal(params['pre_logits']['kernel'], arrays['pre_logits/kernel'])
  np.testing.assert_array_equal(params['head']['kernel'], arrays['head/kernel'])
  plain = _ours('vit_ti16', **TINY)
  with pytest.raises(ValueError, match='unexpected in the checkpoint(.|\n)*params/pre_logits'):
    pretrained.load(path, plain, image_size=32)
  params = pretrained.load(path, plain, image_size=32, reset_head=True)['params']
  assert 'pre_logits' not in params and params['head']['kernel'].shape == (192, 10)
  np.testing.assert_array_equal(params['norm']['scale'], state_dict['norm.weight'])


def test_export_round_trip_is_exact_and_timm_reads_it(timm, tmp_path):
  from safetensors import torch as safetensors_torch  # pylint: disable=g-import-not-at-top

  ours = _ours('deit_ti16_distilled', **TINY)
  images = _images(32)
  variables = _random_variables(ours, 32, seed=3, scale=0.1)
  path = str(tmp_path / 'export' / 'deit.safetensors')
  keys = pretrained.export_timm(variables, ours, path)
  reloaded = pretrained.load(path, ours, image_size=32)
  flat, back = (dict(jax.tree_util.tree_flatten_with_path(v)[0]) for v in (variables, reloaded))
  assert flat.keys() == back.keys()
  for key, value in flat.items():
    np.testing.assert_array_equal(np.asarray(value), back[key])
  model = timm.create_model(
      'deit_tiny_distilled_patch16_224', pretrained=False, img_size=32, **TINY
  ).eval()
  model.load_state_dict(safetensors_torch.load_file(path), strict=True)
  assert sorted(model.state_dict()) == keys
  expected = np.asarray(jax.jit(ours.apply)(variables, images))
  assert np.abs(_timm_logits(model, images) - expected).max() <= 1e-5


@pytest.mark.parametrize('prefix', [0, 1, 2])
@pytest.mark.parametrize('grids', [(14, 24), (24, 14)])
def test_resize_matches_timm_and_pytorch(timm, prefix, grids):
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  from timm.layers import resample_abs_pos_embed  # pylint: disable=g-import-not-at-top

  old, new = grids
  pos_embed = np.random.default_rng(prefix).normal(size=(1, prefix + old * old, 16))
  pos_embed = pos_embed.astype(np.float32)
  expected = resample_abs_pos_embed(
      torch.from_numpy(pos_embed), new_size=[new, new], num_prefix_tokens=prefix
  ).numpy()
  resized = pretrained.resize_pos_embed(pos_embed, (new, new), prefix)
  assert resized.shape == (1, prefix + new * new, 16)
  assert np.abs(resized - expected).max() <= 1e-4
  np.testing.assert_array_equal(resized[:, :prefix], pos_embed[:, :prefix])
  # deit/main.py and T2T: F.interpolate(bicubic, align_corners=False), no antialiasing.
  grid = torch.from_numpy(pos_embed[:, prefix:]).reshape(1, old, old, 16).permute(0, 3, 1, 2)
  plain = F.interpolate(grid, size=(new, new), mode='bicubic', align_corners=False)
  plain = plain.permute(0, 2, 3, 1).reshape(1, -1, 16).numpy()
  resized = pretrained.resize_pos_embed(pos_embed, (new, new), prefix, method='pytorch')
  assert np.abs(resized[:, prefix:] - plain).max() <= 1e-4


@pytest.mark.parametrize('case, prefix', [('vit', 1), ('deit_distilled', 2), ('cait', 0)])
def test_load_at_384_resizes_224_position_embedding(timm, timm_model, case, prefix, tmp_path):
  import torch  # pylint: disable=g-import-not-at-top
  from timm.layers import resample_abs_pos_embed  # pylint: disable=g-import-not-at-top

  timm_name, our_name = TIMM_CASES[case]
  ours = _ours(our_name, depth=1, num_classes=10)
  _, state_dict = timm_model(timm_name, depth=1, num_classes=10)
  path = _save_safetensors(state_dict, str(tmp_path / 'w224.safetensors'))
  variables = pretrained.load(path, ours, image_size=384)
  expected = resample_abs_pos_embed(
      torch.from_numpy(state_dict['pos_embed']), new_size=[24, 24], num_prefix_tokens=prefix
  ).numpy()
  assert variables['params']['pos_embed'].shape == (1, prefix + 576, 192)
  assert np.abs(variables['params']['pos_embed'] - expected).max() <= 1e-4


def _random_variables(model, image_size: int, seed: int = 0, scale: float = 1.0) -> dict:
  """Every variable of `model` drawn at random, N(0, scale^2) (running variances positive)."""
  shapes = jax.eval_shape(
      lambda: model.init(
          jax.random.key(0), np.zeros((1, image_size, image_size, 3), np.float32), train=False
      )
  )
  rng = np.random.default_rng(seed)
  draw = lambda path, s: (
      np.abs(rng.normal(size=s.shape)) + 0.5
      if path[-1].key == 'var'
      else scale * rng.normal(size=s.shape)
  ).astype(np.float32)
  return {
      c: jax.tree_util.tree_map_with_path(draw, shapes[c])
      for c in ('params', 'batch_stats')
      if c in shapes
  }


def _assert_same_variables(expected: dict, actual: dict) -> None:
  flat, other = (dict(jax.tree_util.tree_flatten_with_path(v)[0]) for v in (expected, actual))
  assert flat.keys() == other.keys()
  for key, value in flat.items():
    np.testing.assert_array_equal(np.asarray(value), other[key], err_msg=str(key))


def test_deepvit_official_layout_with_batch_norm_statistics(tmp_path):
  ours = _ours('deepvit_ti4', depth=2, num_classes=10)
  family = pretrained.converting_family(ours)
  variables = _random_variables(ours, 32)
  state_dict = family.to_torch(variables)
  heads = ours.num_heads
  # The key names of zhoudaquan/dvit_repo, BatchNorm statistics included.
  assert state_dict['blocks.0.attn.reatten_matrix.weight'].shape == (heads, heads, 1, 1)
  for leaf in ('weight', 'bias', 'running_mean', 'running_var'):
    assert state_dict[f'blocks.0.attn.var_norm.{leaf}'].shape == (heads,)
  for i in range(2):  # PyTorch's BatchNorm also stores a counter, which has no Flax counterpart.
    state_dict[f'blocks.{i}.attn.var_norm.num_batches_tracked'] = np.array(7, np.int64)
  for path in (
      _save_safetensors(state_dict, str(tmp_path / 'deepvit.safetensors')),
      _save_pth({'model': _tensors(state_dict)}, str(tmp_path / 'deepvit.pth')),
  ):
    loaded = pretrained.load(path, ours, image_size=32)
    assert loaded['batch_stats']
    _assert_same_variables(variables, loaded)


def test_t2t_vit_14_official_layout(tmp_path):
  ours = _ours('t2t_vit_14', num_classes=10)
  family = pretrained.converting_family(ours)
  variables = _random_variables(ours, 224)
  state_dict = family.to_torch(variables)
  # The key names of yitu-opensource/T2T-ViT.
  for key in ('tokens_to_token.project.weight', 'pos_embed', 'cls_token', 'blocks.13.mlp.fc2.bias'):
    assert key in state_dict, key
  assert any(key.startswith('tokens_to_token.attention1.') for key in state_dict)
  # The official training checkpoint: EMA weights beside the raw ones, DataParallel prefixes.
  path = _save_pth(
      {
          'state_dict_ema': _tensors(state_dict, 'module.'),
          'state_dict': _tensors({k: v * 0 for k, v in state_dict.items()}, 'module.'),
      },
      str(tmp_path / 't2t.pth.tar'),
  )
  _assert_same_variables(variables, pretrained.load(path, ours, image_size=224))


# Errors.


def test_truncated_and_corrupt_files_are_named(timm_model, tmp_path):
  ours = _ours('vit_ti16', **TINY)
  _, state_dict = timm_model('vit_tiny_patch16_224', img_size=32, **TINY)
  good = [
      _save_safetensors(state_dict, str(tmp_path / 'w.safetensors')),
      _save_pth(_tensors(state_dict), str(tmp_path / 'w.pth')),
      _save_pth(
          _tensors(state_dict), str(tmp_path / 'legacy.pth'), _use_new_zipfile_serialization=False
      ),
      _google_npz(state_dict, 3, str(tmp_path / 'w.npz')),
  ]
  for path in good:
    with open(path, 'rb') as f:
      data = f.read()
    for cut in (len(data) // 2, len(data) - 100):
      broken = f'{path}.cut{cut}'
      with open(broken, 'wb') as f:
        f.write(data[:cut])
      with pytest.raises(ValueError, match='truncated or corrupt') as error:
        pretrained.load(broken, ours, image_size=32)
      assert broken in str(error.value)
  pickle_like = tmp_path / 'garbage.pth'
  pickle_like.write_bytes(b'\x80garbage' * 10)
  with warnings.catch_warnings(record=True) as warned:
    warnings.simplefilter('always')
    with pytest.raises(ValueError, match='not a readable PyTorch checkpoint'):
      pretrained.load(str(pickle_like), ours, image_size=32)
  assert not warned, [str(w.message) for w in warned]  # One line: no library warning before it.
  garbage = tmp_path / 'notes.txt'
  garbage.write_text('not weights')
  with pytest.raises(ValueError, match='not a recognised checkpoint'):
    pretrained.load(str(garbage), ours, image_size=32)
  with pytest.raises(ValueError, match='No checkpoint file or work directory'):
    pretrained.load(str(tmp_path / 'missing.pth'), ours, image_size=32)


class _Payload:
  """Unpickling this would create a file: proof that an arbitrary object was executed."""

  marker = ''

  def __reduce__(self):
    return (open, (self.marker, 'w'))


def test_pickled_objects_are_refused_not_executed(timm_model, tmp_path):
  ours = _ours('vit_ti16', **TINY)
  _, state_dict = timm_model('vit_tiny_patch16_224', img_size=32, **TINY)
  payload = _Payload()
  payload.marker = str(tmp_path / 'executed')
  path = _save_pth({'model': _tensors(state_dict), 'extra': payload}, str(tmp_path / 'evil.pth'))
  assert not os.path.exists(payload.marker)
  with pytest.raises(
      ValueError, match='refused as unsafe: it holds Python objects besides tensors'
  ):
    pretrained.load(path, ours, image_size=32)
  assert not os.path.exists(payload.marker)
  bare = str(
      tmp_path / 'evil.pkl'
  )  # A bare pickle (PyTorch's legacy format) that calls a function.
  with open(bare, 'wb') as f:
    pickle.dump({'w': payload}, f, protocol=2)
  with pytest.raises(
      ValueError,
      match=r'refused as unsafe: it holds Python objects besides tensors \(_?io\.open\)',
  ):
    pretrained.load(bare, ours, image_size=32)
  assert not os.path.exists(payload.marker)


def test_wrong_family_is_named(timm_model, tmp_path):
  _, cait_state = timm_model('cait_xxs24_224', img_size=32, **TINY)
  path = _save_safetensors(cait_state, str(tmp_path / 'cait.safetensors'))
  with pytest.raises(ValueError, match=r"CaiT weights but the model is of family 'vit'"):
    pretrained.load(path, _ours('vit_ti16', **TINY), image_size=32)
  _, distilled_state = timm_model('deit_tiny_distilled_patch16_224', img_size=32, **TINY)
  path = _save_safetensors(distilled_state, str(tmp_path / 'deit.safetensors'))
  with pytest.raises(ValueError, match=r"distilled DeiT weights .*'vit'(.|\n)*dist_token"):
    pretrained.load(path, _ours('vit_ti16', **TINY), image_size=32)
  _, vit_state = timm_model('vit_tiny_patch16_224', img_size=32, **TINY)
  path = _save_safetensors(vit_state, str(tmp_path / 'vit.safetensors'))
  with pytest.raises(ValueError, match="ViT/DeiT weights but the model is of family 'cait'"):
    pretrained.load(path, _ours('cait_xxs24', **TINY), image_size=32)


def test_wrong_class_count_without_reset_lists_the_head(timm_model, tmp_path):
  _, state_dict = timm_model('vit_tiny_patch16_224', img_size=32, **TINY)
  path = _save_safetensors(state_dict, str(tmp_path / 'vit.safetensors'))
  ours = _ours('vit_ti16', **{**TINY, 'num_classes': 3})
  with pytest.raises(
      ValueError, match=r'class count(.|\n)*params/head/kernel \(192, 10\) vs ' r'\(192, 3\)'
  ):
    pretrained.load(path, ours, image_size=32)
  variables = pretrained.load(path, ours, image_size=32, reset_head=True, rng=5)
  # The Google scheme initialises the head to zero; the checkpoint's head was not.
  assert not np.any(variables['params']['head']['kernel'])
  assert variables['params']['head']['kernel'].shape == (192, 3)
  np.testing.assert_array_equal(variables['params']['norm']['scale'], state_dict['norm.weight'])
  deit_variables = pretrained.load(
      path, _ours('deit_ti16', **{**TINY, 'num_classes': 3}), image_size=32, reset_head=True, rng=5
  )
  kernel = deit_variables['params']['head']['kernel']  # timm/DeiT scheme: N(0, 0.02).
  assert kernel.shape == (192, 3) and 0.015 < kernel.std() < 0.025


def test_mismatch_is_one_error_listing_missing_unexpected_and_shapes(timm_model, tmp_path):
  _, state_dict = timm_model('vit_tiny_patch16_224', img_size=32, **TINY)
  del state_dict['norm.bias']
  path = _save_safetensors(state_dict, str(tmp_path / 'vit.safetensors'))
  ours = _ours('vit_ti16', patch_size=8, depth=1, num_classes=10, mlp_dim=384)
  with pytest.raises(ValueError) as error:
    pretrained.load(path, ours, image_size=32)
  message = str(error.value)
  assert 'missing from the checkpoint' in message and 'params/norm/bias' in message
  assert 'unexpected in the checkpoint' in message and 'params/blocks_1/attn/qkv/kernel' in message
  assert (
      'wrong shape' in message
      and 'params/blocks_0/mlp/fc1/kernel (192, 768) vs (192, 384)' in message
  )


def test_safetensors_is_recognised_by_content_whatever_its_name(tmp_path):
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top

  key = next(  # A header of 128 bytes starts the file with 0x80, as a pickle starts.
      'w' * n
      for n in range(1, 200)
      if safetensors_numpy.save({'w' * n: np.zeros(3, np.float32)})[0] == 0x80
  )
  for name in ('weights.txt', 'W.SAFETENSORS'):
    path = str(tmp_path / name)
    safetensors_numpy.save_file({key: np.arange(3, dtype=np.float32)}, path)
    with open(path, 'rb') as f:
      assert f.read(1) == b'\x80'
    np.testing.assert_array_equal(checkpoint_formats.read_state_dict(path)[key], [0, 1, 2])


def test_export_gets_the_mode_the_umask_gives_a_new_file(tmp_path):
  ours = _ours('vit_ti16', **TINY)
  variables = _random_variables(ours, 32)
  path = str(tmp_path / 'w.safetensors')
  umask = os.umask(0o027)
  try:
    pretrained.export_timm(variables, ours, path)
  finally:
    os.umask(umask)
  assert os.stat(path).st_mode & 0o777 == 0o640
  assert checkpoint_formats.safetensors_metadata(path) == {'format': 'pt'}
