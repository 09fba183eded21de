"""A checkpoint file of another code base read as a PyTorch-layout (timm) state dict, its format
recognised from its content: `.safetensors` (without torch, bfloat16 included), `.pth` (tensors
only: `torch.load(weights_only=True)`), plain or wrapped in `state_dict_ema` / `model_ema` /
`state_dict` / `model`, or a Google ViT `.npz` in either of its layouts (`google_to_timm`);
every array checked finite."""

import argparse
import os
import re
import warnings
import zipfile
from typing import Any, Mapping

from absl import logging
import ml_dtypes  # Names bfloat16 for NumPy: safetensors.numpy (>= 0.8) reads BF16 through it.
import numpy as np
import safetensors
from safetensors import numpy as safetensors_numpy

_EMA_WRAPPERS = ('state_dict_ema', 'model_ema')
_WRAPPERS = ('state_dict', 'model')
_STRIPPED_PREFIX = 'module.'
_SAFETENSORS_LENGTH = 8  # Bytes of the little-endian header length that starts the file.


def check_finite(arrays: Mapping[str, Any], source: str) -> None:
  """Raises ValueError naming the first array of `arrays` with a NaN or an infinity."""
  for key, value in arrays.items():
    value = np.asarray(value)
    if np.issubdtype(value.dtype, np.inexact) or value.dtype == ml_dtypes.bfloat16:
      finite = np.isfinite(value.astype(np.float32))
      if not finite.all():
        raise ValueError(
            f'{source} holds {value.size - int(finite.sum())} non-finite value(s) (NaN or '
            f'infinity) in {key!r} (shape {value.shape}): these weights are damaged; download '
            'or export them again.'
        )


def _corrupt(path: str, what: str, detail: str) -> ValueError:
  return ValueError(
      f'{path!r} is not a readable {what}: {detail}. The file may be truncated or '
      'corrupt; download or write it again.'
  )


def is_safetensors(path: str) -> bool:
  """Whether `path` is a safetensors file by its content, whatever its name: an 8-byte
  little-endian header length, then a JSON object."""
  if not os.path.isfile(path):
    return False
  try:
    with open(path, 'rb') as f:
      return _starts_safetensors(f.read(_SAFETENSORS_LENGTH + 1))
  except OSError:
    return False


def _starts_safetensors(head: bytes) -> bool:
  """Whether a file starting with `head` is safetensors (a zip's timestamp may hold a '{')."""
  return not head.startswith(b'PK') and head[_SAFETENSORS_LENGTH : _SAFETENSORS_LENGTH + 1] == b'{'


def safetensors_metadata(path: str) -> dict[str, str]:
  """The string metadata in the header of the safetensors file `path` ({} when it has none)."""
  try:
    with safetensors.safe_open(path, framework='numpy') as f:
      return dict(f.metadata() or {})
  except safetensors.SafetensorError as e:
    raise _corrupt(path, 'safetensors file', str(e)) from e


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  """The tensors of a .safetensors file, bfloat16 included (as ml_dtypes' bfloat16)."""
  try:
    return safetensors_numpy.load_file(path)
  except safetensors.SafetensorError as e:
    raise _corrupt(path, 'safetensors file', str(e)) from e


def _read_torch(path: str) -> Any:
  """`torch.load(path, weights_only=True)` on CPU: tensors and plain containers, nothing else."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError(
        f'{path!r} is a PyTorch pickle; reading it needs torch (pip install torch), '
        'or convert it to .safetensors.'
    ) from e
  try:
    # Training checkpoints of deit/timm carry their argparse arguments beside the weights.
    with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
      # Said of bytes that are no pickle at all; the error below names the file instead.
      warnings.filterwarnings('ignore', message='Detected pickle protocol')
      return torch.load(path, map_location='cpu', weights_only=True)
  except Exception as e:  # RuntimeError, UnpicklingError, EOFError... pylint: disable=broad-except
    text = str(e)
    found = re.search(r'unsupported (?:global: )?GLOBAL ([\w.]+)', text, re.IGNORECASE)
    if found or 'Weights only load failed' in text:
      culprit = found.group(1) if found else 'see torch.load'
      raise ValueError(
          f'{path!r} was refused as unsafe: it holds Python objects besides tensors ({culprit}), '
          'which could run code when unpickled, so it is not unpickled (torch.load with '
          'weights_only=True). If you trust its source, save only its state dict, or convert it '
          'to .safetensors.'
      ) from e
    first_line = text.strip().splitlines()[0] if text.strip() else ''
    raise _corrupt(path, 'PyTorch checkpoint', f'{type(e).__name__}: {first_line}') from e


def _tensor_to_numpy(key: str, value: Any, path: str) -> np.ndarray:
  if isinstance(value, np.ndarray):
    return value
  if type(value).__module__.startswith('torch') and hasattr(value, 'detach'):
    value = value.detach().cpu()
    if str(value.dtype) == 'torch.bfloat16':
      value = value.float()
    return value.numpy()
  raise ValueError(
      f'{path!r}: entry {key!r} is a {type(value).__name__}, not a tensor; expected a '
      'state dict (optionally inside state_dict / state_dict_ema / model).'
  )


def _unwrap(checkpoint: Mapping[str, Any], *, use_ema: bool) -> Mapping[str, Any]:
  """The state dict inside a training checkpoint (EMA weights first when `use_ema`)."""
  for wrapper in (_EMA_WRAPPERS if use_ema else ()) + _WRAPPERS:
    inner = checkpoint.get(wrapper)
    if isinstance(inner, Mapping) and inner:
      logging.info(
          'Read the %s weights (%r) of the checkpoint.',
          'EMA' if wrapper in _EMA_WRAPPERS else 'raw',
          wrapper,
      )
      return inner
  return checkpoint


# Google ViT .npz -> timm keys; the inverse of timm's `_load_weights`. Two layouts:
# google-research/vision_transformer (`opt/target/` prefix, LayerNorm_0/2, MlpBlock_3,
# MultiHeadDotProductAttention_1, `Transformer/posembed_input/pos_embedding` with the class slot)
# and big_vision's `models/vit.py` (`params/` or `params/img/` prefix, LayerNorm_0/1, MlpBlock_0,
# MultiHeadDotProductAttention_0, a top-level `pos_embedding` without one: the class token gets
# no position embedding there, a zero row here; `MAPHead_0` for pool_type='map').
_GOOGLE_PREFIXES = ('opt/target/', 'params/img/', 'params/')
_BLOCK = r'Transformer/encoderblock_(\d+)/'
_MAP = r'MAPHead_0/'


def _mlp_rules(source: str, target: str) -> tuple[tuple[str, str, str], ...]:
  """The rules of an MlpBlock's Dense_0 / Dense_1 (`source` prefix) -> timm's `target`.fc1 / fc2."""
  return tuple(
      (f'{source}Dense_{i}/{leaf}', f'{target}.fc{i + 1}.{name}', rule)
      for i in (0, 1)
      for leaf, name, rule in (('kernel', 'weight', 'dense'), ('bias', 'bias', 'copy'))
  )


_GOOGLE_RULES = (
    (r'embedding/kernel', 'patch_embed.proj.weight', 'conv'),
    (r'embedding/bias', 'patch_embed.proj.bias', 'copy'),
    (r'cls', 'cls_token', 'copy'),
    (r'Transformer/posembed_input/pos_embedding', 'pos_embed', 'copy'),
    (r'pos_embedding', 'pos_embed', 'copy'),
    (r'Transformer/encoder_norm/(scale|bias)', 'norm.{0}', 'norm'),
    (r'(head|pre_logits)/kernel', '{0}.weight', 'dense'),
    (r'(head|pre_logits)/bias', '{0}.bias', 'copy'),
    (_BLOCK + r'LayerNorm_0/(scale|bias)', 'blocks.{0}.norm1.{1}', 'norm'),
    (_BLOCK + r'LayerNorm_[12]/(scale|bias)', 'blocks.{0}.norm2.{1}', 'norm'),
    *_mlp_rules(_BLOCK + r'MlpBlock_[03]/', 'blocks.{0}.mlp'),
    # (H, hd, D) -> Linear weight (D, H * hd)
    (
        _BLOCK + r'MultiHeadDotProductAttention_[01]/out/kernel',
        'blocks.{0}.attn.proj.weight',
        'out',
    ),
    (_BLOCK + r'MultiHeadDotProductAttention_[01]/out/bias', 'blocks.{0}.attn.proj.bias', 'copy'),
    (_MAP + r'probe', 'attn_pool.latent', 'copy'),
    (_MAP + r'LayerNorm_0/(scale|bias)', 'attn_pool.norm.{0}', 'norm'),
    *_mlp_rules(_MAP + r'MlpBlock_0/', 'attn_pool.mlp'),
    (_MAP + r'MultiHeadDotProductAttention_0/query/kernel', 'attn_pool.q.weight', 'in'),
    (_MAP + r'MultiHeadDotProductAttention_0/query/bias', 'attn_pool.q.bias', 'flat'),
    (_MAP + r'MultiHeadDotProductAttention_0/out/kernel', 'attn_pool.proj.weight', 'out'),
    (_MAP + r'MultiHeadDotProductAttention_0/out/bias', 'attn_pool.proj.bias', 'copy'),
)
# Projections packed into one Linear: (pattern, timm name, parts in order).
_GOOGLE_PACKED: tuple[tuple[re.Pattern[str], str, tuple[str, ...]], ...] = (
    (
        re.compile(_BLOCK + r'MultiHeadDotProductAttention_[01]/(query|key|value)/(kernel|bias)'),
        'blocks.{0}.attn.qkv',
        ('query', 'key', 'value'),
    ),
    (
        re.compile(r'()' + _MAP + r'MultiHeadDotProductAttention_0/(key|value)/(kernel|bias)'),
        'attn_pool.kv',
        ('key', 'value'),
    ),
)


def google_to_timm(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Google ViT .npz arrays (either layout above) -> timm ViT state dict.

  query/key/value are packed into one qkv (the MAP head's key/value into kv): a kernel
  (D, H, hd) gives rows W[0:D] = kernel.reshape(D, D).T; biases (H, hd) are flattened; an out
  kernel (H, hd, D) gives proj.weight = kernel.reshape(D, D).T.
  """
  state_dict: dict[str, np.ndarray] = {}
  packed: dict[tuple[str, str, tuple[str, ...]], dict[str, np.ndarray]] = {}
  unknown = []
  for key, value in arrays.items():
    key = next((key[len(p) :] for p in _GOOGLE_PREFIXES if key.startswith(p)), key)
    value = np.asarray(value)
    for pattern, target, parts in _GOOGLE_PACKED:
      found = pattern.fullmatch(key)
      if found:
        index, part, leaf = found.groups()
        packed.setdefault((target.format(index), leaf, parts), {})[part] = value
        break
    else:
      for key_pattern, target, rule in _GOOGLE_RULES:
        found = re.fullmatch(key_pattern, key)
        if not found:
          continue
        groups = [
            {'scale': 'weight', 'pre_logits': 'pre_logits.fc'}.get(g, g) for g in found.groups()
        ]
        if rule == 'conv':
          value = value.transpose(3, 2, 0, 1)
        elif rule == 'dense':
          value = value.T
        elif rule == 'out':
          value = value.reshape(-1, value.shape[-1]).T
        elif rule == 'in':
          value = value.reshape(value.shape[0], -1).T
        elif rule == 'flat':
          value = value.reshape(-1)
        state_dict[target.format(*groups)] = value
        break
      else:
        unknown.append(key)
  for (target, leaf, parts), by_part in sorted(packed.items()):
    if set(by_part) != set(parts):
      unknown += [f'{target} {p}/{leaf}' for p in by_part]
      continue
    if leaf == 'kernel':
      state_dict[f'{target}.weight'] = np.concatenate(
          [by_part[p].reshape(by_part[p].shape[0], -1).T for p in parts], axis=0
      )
    else:
      state_dict[f'{target}.bias'] = np.concatenate([by_part[p].reshape(-1) for p in parts])
  if unknown:
    raise ValueError(
        'Arrays outside the Google ViT layouts (google-research/vision_transformer, '
        f'big_vision models/vit.py): {sorted(unknown)}.'
    )
  unslotted = not any('posembed_input' in key for key in arrays)
  if unslotted and {'cls_token', 'pos_embed'} <= set(state_dict):
    pos_embed = state_dict['pos_embed']  # big_vision's: no class slot.
    state_dict['pos_embed'] = np.concatenate([np.zeros_like(pos_embed[:, :1]), pos_embed], 1)
  return state_dict


def read_state_dict(path: str, *, use_ema: bool = True) -> dict[str, np.ndarray]:
  """The weights in a .safetensors, .pth or Google ViT .npz file (recognised by content) as a
  PyTorch-layout state dict, unwrapped (EMA first when `use_ema`, as timm does) and unprefixed."""
  if not os.path.isfile(path):
    raise ValueError(f'No checkpoint file or work directory at {path!r}.')
  with open(path, 'rb') as f:
    magic = f.read(_SAFETENSORS_LENGTH + 1)
  if magic.startswith(b'PK'):  # A zip archive: NumPy .npz or PyTorch's default .pth format.
    try:
      with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    except zipfile.BadZipFile as e:
      raise _corrupt(path, 'zip archive (.npz or .pth)', str(e)) from e
    if names and all(name.endswith('.npy') for name in names):
      try:
        with np.load(path, allow_pickle=False) as npz:
          arrays = {key: npz[key] for key in npz.files}
      except (ValueError, OSError, zipfile.BadZipFile) as e:
        raise _corrupt(path, '.npz file', str(e)) from e
      check_finite(arrays, repr(path))
      return google_to_timm(arrays)
    if not any(name.endswith('data.pkl') for name in names):
      raise ValueError(f'{path!r} is a zip archive but neither a .npz nor a PyTorch checkpoint.')
    checkpoint = _read_torch(path)
  elif _starts_safetensors(magic):  # Before pickles: its header length may start with 0x80.
    checkpoint = _read_safetensors(path)
  elif magic[:1] == b'\x80':  # A bare pickle: PyTorch's legacy format.
    checkpoint = _read_torch(path)
  else:
    raise ValueError(
        f'{path!r} is not a recognised checkpoint; supported: .safetensors, PyTorch '
        '.pth/.pt/.bin, Google ViT .npz, or a vit_jax work directory.'
    )
  if not isinstance(checkpoint, Mapping):
    raise ValueError(f'{path!r} holds a {type(checkpoint).__name__}, not a state dict.')
  state_dict = _unwrap(checkpoint, use_ema=use_ema)
  arrays = {
      key.removeprefix(_STRIPPED_PREFIX): _tensor_to_numpy(key, value, path)
      for key, value in state_dict.items()
  }
  check_finite(arrays, repr(path))
  return arrays
