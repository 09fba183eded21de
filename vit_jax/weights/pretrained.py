"""Weights from elsewhere fitted to a model (`load`), and exported back to timm (`export_timm`).

Sources: PyTorch checkpoints (.safetensors, or .pth read with `torch.load(weights_only=True)`:
tensors only) and Google ViT .npz files, recognised by content (`checkpoint_formats`); Hub names
(`hub`); vit_jax work directories (`reader.Workdir.read_variables`).
"""

import dataclasses
import json
import math
import os
from typing import Any, Callable, Mapping

from absl import logging
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes  # Names bfloat16 for NumPy: safetensors.numpy (>= 0.8) reads BF16 through it.
import numpy as np
from safetensors import numpy as safetensors_numpy

from vit_jax.schema import data as data_settings
from vit_jax.weights import checkpoint_formats
from vit_jax.weights import hub
from vit_jax import models
from vit_jax.models import layouts
from vit_jax.schema import setting
from vit_jax.workdir import disk_writes
from vit_jax.workdir import reader
from vit_jax.workdir import shape_diff

HEAD_NAMES = ('head', 'head_dist')
POS_EMBED_RESIZE_METHODS = ('timm', 'pytorch')
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


@dataclasses.dataclass(frozen=True)
class TorchConverters:
  """A family's `from_torch` and `to_torch` (`models.Family`), where it has both."""

  from_torch: Callable[[models.StateDict], dict[str, dict]]
  to_torch: Callable[[models.Variables], dict[str, np.ndarray]]


def converting_family(model: nn.Module) -> TorchConverters:
  """The converters of the PyTorch layout of `model`'s registered family."""
  family = models.family(model)
  if family.from_torch is None or family.to_torch is None:
    raise ValueError(
        f'{type(model).__name__} ({family.name}) has no from_torch/to_torch, so '
        'PyTorch-layout weights cannot be converted for it.'
    )
  return TorchConverters(family.from_torch, family.to_torch)


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


# Adapting to the target model.


def resize_pos_embed(
    pos_embed: np.ndarray, grid: tuple[int, int], num_prefix_tokens: int, *, method: str = 'timm'
) -> np.ndarray:
  """(1, prefix + h*w, D) -> (1, prefix + grid rows*cols, D), prefix tokens kept unchanged.
  'timm': timm's `resample_abs_pos_embed` (bicubic, antialiased, a = -0.5); 'pytorch': deit/T2T's
  `F.interpolate(mode='bicubic', align_corners=False)` (a = -0.75, no antialiasing)."""
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
  dropped = [k for k in flat if k[:2] == ('params', 'pre_logits') and k not in target]
  for key in [k for k in flat if _is_head(k) and k not in target] + dropped:
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
    flat: dict,
    target: dict,
    source: str,
    model: nn.Module,
    image_size: int,
    hint: str,
    *,
    frozen: bool,
    classes_said: bool,
) -> None:
  """One ValueError listing every missing, unexpected and wrongly shaped variable. A class-count
  mismatch of `frozen` weights says the count to give (or to give none where the weights say
  their count: `classes_said`)."""
  diff = shape_diff.ShapeDiff.between(
      {_path(k): v.shape for k, v in flat.items()}, {_path(k): v.shape for k, v in target.items()}
  )
  if not diff:
    return
  classes = {
      flat[k].shape[-1]
      for k in set(flat) & set(target)
      if _is_head(k) and flat[k].shape[-1] != target[k].shape[-1]
  }
  if classes and not hint and frozen:
    hint = (
        f'The weights have {min(classes)} classes, not {model.num_classes}: give '
        f'--num_classes={min(classes)}{" (or leave it out)" if classes_said else ""}. '
    )
  elif classes and not hint:
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
  run = reader.Workdir.open(path)
  saved = run.read_variables(use_ema=use_ema, unrolled=True)
  flat = flax.traverse_util.flatten_dict(saved.variables)
  checkpoint_formats.check_finite(
      {'/'.join(k): v for k, v in flat.items()}, f'The checkpoint of step {saved.step} in {path!r}'
  )
  model_section = run.required_config().model
  name = model_section.name
  fields = models.model_overrides(model_section)
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
    described = exported(path)
    if described is not None:
      source += f' (an export of {described.model!r} with fields {described.model_fields})'
      if models.family(described.model).name != family:
        hint = f'It holds a {models.family(described.model).name!r} model. '
  state_dict = checkpoint_formats.read_state_dict(path, use_ema=use_ema)
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
    frozen: bool = False,
) -> dict[str, Any]:
  """Flax variables ({'params'[, 'batch_stats']}) for `model` at `image_size` from `path`, EMA
  first unless `use_ema=False`, in `model`'s layout (stacked with `scan_layers`).

  A position embedding for another resolution is resized (`resize_pos_embed`); with `reset_head`,
  heads of another class count are initialised afresh from `rng`; without it, a class-count
  mismatch is an error, which for `frozen` weights says to give --num_classes. ValueError for any
  file or variable that does not fit.
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
  classes_said = frozen and (
      hub.is_hub_name(path) or (not os.path.isdir(path) and exported(path) is not None)
  )
  _check_fit(
      flat, target, source, unrolled, image_size, hint, frozen=frozen, classes_said=classes_said
  )
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
EXPORT_METADATA_KEY = 'vit_jax'  # The metadata entry of an export that holds its `Exported`.


@dataclasses.dataclass(frozen=True)
class Exported:
  """What an export says of its weights, so that they load without naming the model: the
  registered model and the fields it overrides, the class count (0: headless), and the run's
  evaluation preprocessing and class names (None: not said)."""

  model: str
  model_fields: dict[str, Any]
  num_classes: int
  image_size: int | None = None
  crop_ratio: float | None = None
  normalization: str | None = None
  label_names: tuple[str, ...] | None = None


def head_classes(variables: Mapping[str, Any]) -> int:
  """The class count of the classifier head in `variables` (0: headless)."""
  flat = flax.traverse_util.flatten_dict(dict(variables))
  return next((v.shape[-1] for k, v in flat.items() if _is_head(k) and k[-1] == 'kernel'), 0)


def describe_run(run: reader.Workdir, variables: Mapping[str, Any]) -> Exported:
  """What an export of `run`'s `variables` says of them: its model, fields, classes (those
  dataset.json records) and evaluation preprocessing."""
  config = run.required_config()
  transform = setting.build(data_settings.EvalTransform, config)
  num_classes = head_classes(variables)
  recorded = run.dataset()
  names = tuple(recorded['class_names']) if recorded else None
  return Exported(
      model=config.model.name,
      model_fields=models.model_overrides(config.model),
      num_classes=num_classes,
      image_size=transform.image_size,
      crop_ratio=transform.crop_ratio,
      normalization=transform.normalization,
      label_names=names if names and len(names) == num_classes else None,
  )


def exported(path: str) -> Exported | None:
  """What the safetensors file `path` says of its weights where `export_timm` described them;
  None for any other file. ValueError naming the file where the description is damaged."""
  if not checkpoint_formats.is_safetensors(path):
    return None
  text = checkpoint_formats.safetensors_metadata(path).get(EXPORT_METADATA_KEY)
  if text is None:
    return None
  try:
    said = json.loads(text)
    names = said.get('label_names')
    described = Exported(**{**said, 'label_names': None if names is None else tuple(names)})
    fields = models.model_overrides({'name': described.model, **described.model_fields})
  except (ValueError, TypeError, AttributeError) as e:
    raise ValueError(
        f'{path!r}: its {EXPORT_METADATA_KEY!r} metadata, which names its model, is damaged '
        f'({e}); export the run again.'
    ) from e
  return dataclasses.replace(described, model_fields=fields)


def export_timm(
    variables: Mapping[str, Any],
    model: nn.Module,
    path: str,
    *,
    described: Exported | None = None,
) -> list[str]:
  """Writes `variables` as a timm-layout .safetensors file (inverse of `load`), which timm's
  `load_state_dict` accepts; with `described`, its metadata names the model (`exported`). Its keys.
  """
  state_dict = converting_family(model).to_torch(jax.device_get(dict(variables)))
  as_timm = lambda v: v.astype(np.float32) if v.dtype == ml_dtypes.bfloat16 else v  # float32.
  tensors = {k: np.ascontiguousarray(as_timm(np.asarray(v))) for k, v in state_dict.items()}
  target = os.path.abspath(path)
  with disk_writes.writing(path, EXPORT_ROOM):
    os.makedirs(os.path.dirname(target), exist_ok=True)
    metadata = {'format': 'pt'}  # timm's loader wants it.
    if described is not None:
      metadata[EXPORT_METADATA_KEY] = json.dumps(dataclasses.asdict(described))
    with disk_writes.replaced_whole(target) as partial:
      with open(partial, 'wb'):
        mode = os.stat(partial).st_mode  # safetensors writes 0600: give what `open` gives.
      safetensors_numpy.save_file(tensors, partial, metadata=metadata)
      os.chmod(partial, mode)
  return sorted(tensors)
