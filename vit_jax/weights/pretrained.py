"""Weights from elsewhere: foreign formats, their key rules, resizing, and export back to timm.

`load(path, model, image_size=...)` returns Flax variables for `model` from
  - a timm / DeiT / CaiT / DeepViT / T2T-ViT / RegNet PyTorch checkpoint, `.safetensors` (read
    with the `safetensors` package, without torch, bfloat16 included) or `.pth` (read with
    `torch.load(weights_only=True)`: tensors only, never arbitrary objects), plain or wrapped in
    `state_dict_ema` / `model_ema` / `state_dict` / `model`, with `module.` prefixes stripped;
  - a Google ViT `.npz`: google-research/vision_transformer's or big_vision's layout
    (`google_to_timm`);
  - a work directory written by `vit_jax.main` (`vit_jax.training.workdir.Workdir.read_variables`);
  - Hub weights by name, `hf-hub:ORG/NAME` (`vit_jax.weights.hub`: fetched once into the Hugging Face
    cache, then read as the file they are).
EMA weights are read first where a file or run has them; `use_ema=False` reads the raw ones.
The PyTorch key layout is converted by the `from_torch` of the target model's family. The position
embedding is resized when the resolution differs (`resize_pos_embed`), with `reset_head=True` a
head whose class count differs is initialised afresh, and a model with `scan_layers` gets its
blocks stacked. `export_timm` writes the inverse: a timm `.safetensors`. Files are recognised by
their content, not their extension.
"""

import argparse
import math
import os
import re
import warnings
import zipfile
from typing import Any, Mapping

from absl import logging
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes  # Names bfloat16 for NumPy: safetensors.numpy (>= 0.8) reads BF16 through it.
import numpy as np
import safetensors
from safetensors import numpy as safetensors_numpy

from vit_jax.weights import hub
from vit_jax import models
from vit_jax.training import workdir as workdir_lib
from vit_jax.models import layouts

HEAD_NAMES = ('head', 'head_dist')
POS_EMBED_RESIZE_METHODS = ('timm', 'pytorch')
_EMA_WRAPPERS = ('state_dict_ema', 'model_ema')
_WRAPPERS = ('state_dict', 'model')
_STRIPPED_PREFIX = 'module.'
_VARIABLE_COLLECTIONS = ('params', 'batch_stats')

# A key that only one layout has -> (what the file holds, the families that accept it).
_LAYOUT_HINTS = (
    ('blocks_token_only.', 'CaiT', ('cait',)),
    ('reatten_matrix', 'DeepViT', ('deepvit',)),
    ('tokens_to_token.', 'T2T-ViT', ('t2t',)),
    ('dist_token', 'distilled DeiT', ('deit',)),
    ('stem.conv.weight', 'RegNet', ('regnet',)),
    ('blocks.0.ls1.gamma', 'DeiT III', ('deit3',)),
    ('blocks.0.attn.qkv.weight', 'ViT/DeiT', ('vit', 'deit', 'deit3', 'deepvit')),
)
# Key prefixes of the families' own layouts (a ViT without a class token still starts so).
_FAMILY_PREFIXES = ('blocks.', 'patch_embed.', 'pos_embed', 'cls_token')
# A key of a layout that no family here reads -> what the file resembles.
_FOREIGN_LAYOUTS = (
    ('layer1.0.conv1.weight', 'a ResNet (torchvision or timm)'),
    ('relative_position_bias_table', 'a Swin Transformer or BEiT'),
    ('conv_dw.weight', 'a ConvNeXt'),
    ('encoder.layers.encoder_layer_0.', "a torchvision ViT (torchvision's own key layout)"),
    ('vit.embeddings.', 'a Hugging Face transformers ViT'),
    ('conv_stem.weight', 'an EfficientNet or MobileNet'),
    ('features.0.', 'a torchvision CNN (VGG, AlexNet, MobileNet)'),
)


def converting_family(model: nn.Module) -> models.Family:
  """`model`'s registered family, which converts the PyTorch layout."""
  family = models.family(model)
  if family.from_torch is None or family.to_torch is None:
    raise ValueError(
        f'{type(model).__name__} ({family.name}) has no from_torch/to_torch, so '
        'PyTorch-layout weights cannot be converted for it.'
    )
  return family


def _family_name(model: nn.Module) -> str:
  return models.family(model).name


def _layout_hint(keys: list[str], family: str) -> str:
  """'The file holds CaiT weights but the model is vit. ' when the keys betray another family;
  'The keys … match no model family here …' when they betray none."""
  for marker, layout, families in _LAYOUT_HINTS:
    if any(marker in key for key in keys):
      if family in families:
        return ''
      return f'The file holds {layout} weights but the model is of family {family!r}. '
  if any(key.startswith(_FAMILY_PREFIXES) for key in keys):
    return ''
  known = ', '.join(dict.fromkeys(layout for _, layout, _ in _LAYOUT_HINTS))
  resembles = next(
      (what for marker, what in _FOREIGN_LAYOUTS if any(marker in key for key in keys)), None
  )
  return f'Its keys match no model family here ({known}): ' + (
      f'it looks like {resembles}. '
      if resembles
      else f'its first keys are {", ".join(sorted(keys)[:4])}. '
  )


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
_GOOGLE_PACKED = (
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
  packed: dict[tuple[str, str], dict[str, np.ndarray]] = {}
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
      for pattern, target, rule in _GOOGLE_RULES:
        found = re.fullmatch(pattern, key)
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
  for (target, leaf, parts), found in sorted(packed.items()):
    if set(found) != set(parts):
      unknown += [f'{target} {p}/{leaf}' for p in found]
      continue
    if leaf == 'kernel':
      state_dict[f'{target}.weight'] = np.concatenate(
          [found[p].reshape(found[p].shape[0], -1).T for p in parts], axis=0
      )
    else:
      state_dict[f'{target}.bias'] = np.concatenate([found[p].reshape(-1) for p in parts])
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
  """The weights in a .safetensors, .pth or Google ViT .npz file, as a PyTorch-layout state dict.

  The format is recognised from the content. Wrappers (EMA first when `use_ema`, as timm does) are
  unwrapped and `module.` prefixes stripped.
  """
  if not os.path.isfile(path):
    raise ValueError(f'No checkpoint file or work directory at {path!r}.')
  with open(path, 'rb') as f:
    magic = f.read(9)
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
  elif magic[:1] == b'\x80':  # A bare pickle: PyTorch's legacy format.
    checkpoint = _read_torch(path)
  elif len(magic) == 9 and magic[8:9] == b'{':
    checkpoint = _read_safetensors(path)
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


# Adapting to the target model.


def resize_pos_embed(
    pos_embed: np.ndarray, grid: tuple[int, int], num_prefix_tokens: int, *, method: str = 'timm'
) -> np.ndarray:
  """(1, prefix + h*w, D) -> (1, prefix + grid rows*cols, D), prefix tokens kept unchanged.

  method='timm' equals timm's `resample_abs_pos_embed` (bicubic, antialias=True: PyTorch's
  antialiased kernel, a = -0.5, in both directions); 'pytorch' equals deit/T2T's
  `F.interpolate(mode='bicubic', align_corners=False)` (a = -0.75, no antialiasing).
  """
  if method not in POS_EMBED_RESIZE_METHODS:
    raise ValueError(
        f'Unknown position-embedding resize method {method!r}; valid: '
        f'{list(POS_EMBED_RESIZE_METHODS)}.'
    )
  pos_embed = np.asarray(pos_embed)
  prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
  side = math.isqrt(patches.shape[1])
  if side * side != patches.shape[1]:
    raise ValueError(
        f'pos_embed of shape {pos_embed.shape} minus {num_prefix_tokens} prefix '
        f'tokens leaves {patches.shape[1]} positions, not a square grid.'
    )
  width = patches.shape[-1]
  grid_in = jnp.asarray(patches.reshape(side, side, width), jnp.float32)
  jax_method, antialias = ('cubic', True) if method == 'timm' else ('cubic-pytorch', False)
  resized = jax.image.resize(grid_in, (*grid, width), method=jax_method, antialias=antialias)
  resized = np.asarray(resized).reshape(1, -1, width).astype(pos_embed.dtype)
  return np.concatenate([prefix, resized], axis=1)


def _path(key: tuple[str, ...]) -> str:
  return '/'.join(key)


def _abstract_variables(model: nn.Module, image_size: int) -> dict[tuple[str, ...], Any]:
  """Flat {(collection, ...): ShapeDtypeStruct} of `model` at `image_size` (checks its fields)."""
  images = jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32)
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), images)
  return flax.traverse_util.flatten_dict(
      {c: shapes[c] for c in _VARIABLE_COLLECTIONS if c in shapes}
  )


def _fresh_variables(
    model: nn.Module, image_size: int, rng: int | jax.Array, keys: list[tuple[str, ...]]
) -> dict[tuple[str, ...], np.ndarray]:
  """The variables `keys` (flat paths) of `model` freshly initialised from `rng`."""
  key = jax.random.key(rng) if isinstance(rng, int) else rng
  images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)

  def init(k):  # Only the requested variables leave the computation; XLA drops the rest.
    flat = flax.traverse_util.flatten_dict(model.init(k, images, train=False))
    return {'/'.join(path): flat[path] for path in keys}

  fresh = jax.device_get(jax.jit(init)(key))
  return {path: fresh['/'.join(path)] for path in keys}


def _resize_position_embeddings(flat: dict, target: dict, model: nn.Module) -> None:
  for key, value in flat.items():
    wanted = target.get(key)
    if (
        key[-1] != 'pos_embed'
        or wanted is None
        or value.shape == wanted.shape
        or value.ndim != 3
        or value.shape[-1] != wanted.shape[-1]
    ):
      continue
    num_prefix = len(getattr(model, 'embedded_prefix_tokens', ('cls_token',)))
    side, old_side = (math.isqrt(n - num_prefix) for n in (wanted.shape[1], value.shape[1]))
    if side * side != wanted.shape[1] - num_prefix or old_side**2 != value.shape[1] - num_prefix:
      continue  # Another prefix layout (another family): reported by `_check_fit`.
    flat[key] = resize_pos_embed(value, (side, side), num_prefix)
    logging.info(
        'Resized %s from %d to %d positions (%d prefix tokens kept).',
        _path(key),
        value.shape[1],
        wanted.shape[1],
        num_prefix,
    )


def _is_head(key: tuple[str, ...]) -> bool:
  return key[0] == 'params' and key[1] in HEAD_NAMES


def _reset_head(
    flat: dict, target: dict, model: nn.Module, image_size: int, rng: int | jax.Array
) -> None:
  """Replaces heads whose shape differs (or that are missing) by fresh ones; drops pre_logits."""
  heads = [k for k in target if _is_head(k) and (k not in flat or flat[k].shape != target[k].shape)]
  for key in [k for k in flat if _is_head(k) and k not in target]:
    del flat[key]
  dropped = [k for k in flat if k[:2] == ('params', 'pre_logits') and k not in target]
  for key in dropped:
    del flat[key]
  if dropped:
    logging.warning(
        'Dropped the pre-logits layer of the checkpoint (the model has none), as '
        'fine-tuning in the ViT paper does.'
    )
  if not heads:
    return
  fresh = _fresh_variables(model, image_size, rng, heads)
  old = {_path(k): tuple(flat[k].shape) for k in heads if k in flat}
  for key in heads:
    flat[key] = fresh[key]
  logging.warning(
      'Initialised the classifier head afresh for %d classes (checkpoint: %s).',
      model.num_classes,
      old or 'no head',
  )


def _check_fit(
    flat: dict, target: dict, source: str, model: nn.Module, image_size: int, hint: str
) -> None:
  """One ValueError listing every missing, unexpected and wrongly shaped variable."""
  diff = workdir_lib.ShapeDiff.between(
      {_path(k): v.shape for k, v in flat.items()}, {_path(k): v.shape for k, v in target.items()}
  )
  if not diff:
    return
  classes_differ = any(
      _is_head(k) and flat[k].shape[-1] != target[k].shape[-1] for k in set(flat) & set(target)
  )
  if classes_differ and not hint:
    hint = (
        f"The checkpoint's head has a different class count than the model "
        f'(num_classes={model.num_classes}); pass reset_head=True (init_from does) to '
        'fine-tune with a fresh head. '
    )
  raise ValueError(
      f'{source} does not fit {type(model).__name__} ({_family_name(model)}) at image_size '
      f'{image_size}. {hint}'.rstrip() + diff.listing()
  )


def _from_workdir(path: str, model: nn.Module, use_ema: bool) -> tuple[dict, str, str]:
  """(unrolled variables, a description of the source, a hint if another family saved them)."""
  run = workdir_lib.Workdir.open(path)
  saved = run.read_variables(use_ema=use_ema, unrolled=True)
  flat = flax.traverse_util.flatten_dict(saved.variables)
  check_finite(
      {'/'.join(k): v for k, v in flat.items()}, f'The checkpoint of step {saved.step} in {path!r}'
  )
  name = run.config().model.name
  fields = models.model_overrides(run.config().model)
  source = (
      f'Work directory {path!r} (model {name!r} with fields {fields}, step {saved.step}, '
      f'{"ema" if saved.ema else "raw"} weights)'
  )
  family, saved_family = _family_name(model), _family_name(models.create(name))
  hint = (
      f'It holds a {saved_family!r} model but the model is of family {family!r}. '
      if saved_family != family
      else ''
  )
  return saved.variables, source, hint


def _from_file(path: str, model: nn.Module, use_ema: bool) -> tuple[dict, str, str]:
  """(variables converted by `model`'s family, a description of the file, a hint on misfits)."""
  family = _family_name(model)
  hint = ''
  if hub.is_hub_name(path):
    weights = hub.resolve(path)
    source = f'{path} (timm {weights.architecture}: our {weights.model!r}, {weights.path})'
    if models.family(weights.model).name != family:
      hint = (
          f'It holds a {models.family(weights.model).name!r} model ({weights.model!r}); '
          f'configs/finetune.py:init_from={path} picks it. '
      )
    path = weights.path
  else:
    source = f'Checkpoint {path!r}'
  state_dict = read_state_dict(path, use_ema=use_ema)
  hint = hint or _layout_hint(list(state_dict), family)
  if (
      'cls_token' not in state_dict
      and 'cls_token' in getattr(model, 'prefix_tokens', ())
      and 'match no model family' not in hint
  ):
    hint += (
        "The checkpoint has no class token (big_vision pool_type 'gap' or 'map'): "
        "give the model global_pool='avg' or 'map' (and big_vision's "
        "mlp_activation='gelu_tanh'). "
    )
  try:
    variables = converting_family(model).from_torch(state_dict)
  except (ValueError, KeyError) as e:
    detail = str(e) if len(str(e)) <= 1000 else str(e)[:1000] + ' …'
    raise ValueError(
        f'{source} cannot be converted for {type(model).__name__} ({family}). ' f'{hint}{detail}'
    ) from e
  return variables, source, hint


def load(
    path: str,
    model: nn.Module,
    *,
    image_size: int,
    reset_head: bool = False,
    rng: int | jax.Array = 0,
    use_ema: bool = True,
) -> dict[str, Any]:
  """Flax variables ({'params', maybe 'batch_stats'}) for `model` at `image_size` from `path`.

  `path` is a weights file or Hub name (see the module docstring) or a vit_jax work directory,
  read EMA first unless `use_ema=False` (the log says which weights were read). PyTorch and
  Google layouts go through the `from_torch` of `model`'s family. A position embedding for another
  resolution is resized (`resize_pos_embed`, timm's method). With `reset_head`, heads
  whose class count differs from `model.num_classes` are initialised afresh from `rng` (and a
  pre-logits layer the model lacks is dropped); without it a class-count mismatch is an error.
  The variables come in `model`'s layout: stacked where it scans its layers (`scan_layers`).
  Raises ValueError for unreadable files, another family, or any variable that does not fit.
  """
  scanned = getattr(model, 'scan_layers', False)
  unrolled = model.clone(scan_layers=False) if scanned else model
  target = _abstract_variables(unrolled, image_size)
  read = _from_workdir if os.path.isdir(path) else _from_file
  variables, source, hint = read(path, unrolled, use_ema)
  flat = flax.traverse_util.flatten_dict(
      {c: dict(variables[c]) for c in _VARIABLE_COLLECTIONS if c in variables}
  )
  flat = {key: np.asarray(value) for key, value in flat.items()}
  _resize_position_embeddings(flat, target, unrolled)
  if reset_head:
    _reset_head(flat, target, unrolled, image_size, rng)
  _check_fit(flat, target, source, unrolled, image_size, hint)
  cast = {key: np.asarray(value, dtype=target[key].dtype) for key, value in flat.items()}
  variables = flax.traverse_util.unflatten_dict(cast)
  if not scanned:
    return variables
  return layouts.stack_layers(
      variables, flax.traverse_util.unflatten_dict(_abstract_variables(model, image_size))
  )


def load_for_run(
    path: str, model: nn.Module, config: ml_collections.ConfigDict, **kwargs
) -> dict[str, Any]:
  """`load` of `path` for `model` as a run of `config` reads it: at `config.image_size`, EMA
  weights first unless `config.use_ema` is False."""
  kwargs.setdefault('use_ema', config.use_ema)
  return load(path, model, image_size=config.image_size, **kwargs)


EXPORT_ROOM = (
    'write access and room for the exported .safetensors file (--out)'  # What export needs.
)


def export_timm(variables: Mapping[str, Any], model: nn.Module, path: str) -> list[str]:
  """Writes `variables` as a timm-layout .safetensors file (inverse of `load`); returns its keys.

  `timm.create_model(<matching name>, num_classes=..., img_size=...)` accepts the file with
  `model.load_state_dict(safetensors.torch.load_file(path))`.
  """
  state_dict = converting_family(model).to_torch(jax.device_get(dict(variables)))
  tensors = {}
  for key, value in state_dict.items():
    value = np.asarray(value)
    if value.dtype == ml_dtypes.bfloat16:  # timm's models hold float32 parameters.
      value = value.astype(np.float32)
    tensors[key] = np.ascontiguousarray(value)
  directory = os.path.dirname(os.path.abspath(path))
  partial = os.path.join(directory, f'.{os.path.basename(path)}.partial')
  with workdir_lib.writing(path, EXPORT_ROOM):
    try:
      os.makedirs(directory, exist_ok=True)
      safetensors_numpy.save_file(tensors, partial, metadata={'format': 'pt'})
      os.replace(partial, path)  # Whole or not at all: a failed write leaves no partial file.
    finally:
      if os.path.exists(partial):
        os.remove(partial)
  return sorted(tensors)
