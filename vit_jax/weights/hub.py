"""Weights by name from the Hugging Face Hub: `hf-hub:ORG/NAME`, e.g.
`hf-hub:timm/deit_small_patch16_224.fb_in1k`.

Files are fetched once into huggingface_hub's cache ($HF_HOME/hub, or $HF_HUB_CACHE), where later
runs (and HF_HUB_OFFLINE=1) read them. timm's config.json picks the model, its fields and its
preprocessing (`HubConfig`); the weights are fetched only once it maps to a model here.
"""

import dataclasses
import json
import os
from typing import Any

from absl import logging
import flax.linen as nn
import numpy as np

from vit_jax import models
from vit_jax.schema import normalization
from vit_jax.workdir import disk_writes

PREFIX = 'hf-hub:'
CONFIG_FILE = 'config.json'
WEIGHTS_FILES = ('model.safetensors', 'pytorch_model.bin')  # timm's, safest first.
# The resampling our pipeline does (`input_pipeline`): bicubic.
RESIZE_INTERPOLATION = 'bicubic'


@dataclasses.dataclass(frozen=True)
class HubConfig:
  """What the config.json of Hub weights says about them."""

  name: str  # 'hf-hub:ORG/NAME'
  architecture: str  # timm's.
  model: str  # Our registry name.
  model_fields: dict[str, Any]  # Overrides of the registered model, from `model_args`.
  num_classes: int  # 0: headless (timm's num_classes=0): no classifier in the weights.
  image_size: int
  normalization: str  # A name or numbers, as `normalization.mean_std` reads them.
  crop_ratio: float  # timm's crop_pct: resize to image_size / crop_ratio, centre crop.
  label_names: tuple[str, ...] | None

  @property
  def headless(self) -> bool:
    """Whether the weights hold no classifier (DINO, MAE, in21k backbones): they fine-tune with a
    fresh head or give features, but predict no classes."""
    return self.num_classes == 0

  def create_model(self, **overrides: Any) -> nn.Module:
    """The registered model with the weights' fields and class count (headless: no head), then
    `overrides`."""
    return models.create(
        self.model, **{'num_classes': self.num_classes, **self.model_fields, **overrides}
    )


@dataclasses.dataclass(frozen=True)
class HubWeights(HubConfig):
  """Hub weights in the local cache, and what their config.json says about them."""

  path: str  # The weights file in the cache.


def is_hub_name(source: Any) -> bool:
  """Whether `source` names Hub weights ('hf-hub:ORG/NAME')."""
  return isinstance(source, str) and source.startswith(PREFIX)


def cache_dir() -> str:
  """The cache huggingface_hub reads and fills ($HF_HUB_CACHE, default $HF_HOME/hub)."""
  from huggingface_hub import constants  # pylint: disable=g-import-not-at-top

  return constants.HF_HUB_CACHE


def _repo_id(name: str) -> str:
  repo_id = name[len(PREFIX) :] if is_hub_name(name) else name
  if repo_id.count('/') != 1 or not all(repo_id.split('/')):
    raise ValueError(
        f'{name!r} is not a Hub name; expected {PREFIX}ORG/NAME, e.g. '
        f'{PREFIX}timm/deit_small_patch16_224.fb_in1k.'
    )
  return repo_id


def _download(name: str, repo_id: str, filenames: tuple[str, ...]) -> str:
  """The cached path of the first of `filenames` that the repository has, downloaded if needed."""
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  from huggingface_hub import errors  # pylint: disable=g-import-not-at-top

  reasons = []
  for filename in filenames:
    try:
      return huggingface_hub.hf_hub_download(repo_id, filename)
    except errors.RepositoryNotFoundError as e:
      raise ValueError(
          f'{name}: the Hub has no repository {repo_id!r} (or it is private or '
          f'gated: log in with `hf auth login`). {_first_line(e)}'
      ) from None
    except (
        errors.EntryNotFoundError,
        errors.LocalEntryNotFoundError,
        errors.HfHubHTTPError,
        OSError,
    ) as e:
      reasons.append(f'{filename}: {_first_line(e)}')
  offline = huggingface_hub.constants.HF_HUB_OFFLINE
  in_the_way = disk_writes.existing_parent(cache_dir())
  if os.path.isfile(in_the_way):
    reasons.insert(0, f'{in_the_way} is a file, where the cache needs a folder')
  raise ValueError(
      f'Cannot get {name}: neither downloaded (HF_HUB_OFFLINE is '
      f'{"set: no network" if offline else "unset, but the download failed"}) nor in the '
      f'Hugging Face cache {cache_dir()} (which $HF_HOME or $HF_HUB_CACHE choose). Run once with '
      f'the network to cache it, or point HF_HOME at a cache that holds it. '
      f'({"; ".join(reasons)})'
  )


def _first_line(error: Exception) -> str:
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return lines[0] if lines else type(error).__name__


def _field_error(source: str, field: str, value: Any, valid: str) -> ValueError:
  """One line naming the config.json `source`, its `field` and `value`, and what would be valid."""
  return ValueError(
      f'{source} has {field}={value!r}, which vit_jax cannot use: {valid}. Publish or cache '
      'a config.json as timm writes it.'
  )


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def _object(source: str, field: str, value: Any) -> dict[str, Any]:
  if not isinstance(value, dict):
    raise _field_error(source, field, value, 'a JSON object')
  return value


def _normalization(source: str, mean: Any, std: Any) -> str:
  """The normalisation of (mean, std): its name where one matches, else the numbers."""
  for field, values, least in (('mean', mean, -np.inf), ('std', std, 0)):
    if not (
        isinstance(values, (list, tuple))
        and len(values) == 3
        and all(_is_number(v) and v > least for v in values)
    ):
      kind = 'positive numbers' if least == 0 else 'numbers'
      raise _field_error(source, f'pretrained_cfg.{field}', values, f'three {kind} (R, G, B)')
  return normalization.normalization_name(mean, std)


def _model_fields(
    name: str, architecture: str, model: str, model_args: dict[str, Any]
) -> dict[str, Any]:
  """Our fields for timm's `model_args` (arguments that differ from the architecture's)."""
  arguments = models.family(model).timm_arguments
  unknown = sorted(set(model_args) - set(arguments))
  if unknown:
    raise ValueError(
        f'{name} was built as timm {architecture!r} with arguments '
        f'{ {k: model_args[k] for k in unknown} } that {model!r} has no field for; '
        f'known arguments: {sorted(arguments)}.'
    )
  if model_args.get('in_chans', 3) != 3:
    raise ValueError(
        f'{name} takes {model_args["in_chans"]} input channels; vit_jax models '
        'take RGB images (3).'
    )
  fields = {}
  for argument, value in model_args.items():
    field = arguments[argument]
    if field is not None:
      fields[field] = tuple(value) if isinstance(value, list) else value
  return fields


def read_config(name: str, config: Any, path: str = CONFIG_FILE) -> dict[str, Any]:
  """The `HubConfig` fields (all but name) that timm's config.json `config` (read from `path`)
  gives; ValueError of one line naming `path`, the field and its value where one is unusable."""
  source = f'{name}: {path}'
  if not isinstance(config, dict):
    raise ValueError(
        f"{source} is a JSON {type(config).__name__}, not an object of timm's fields "
        '(architecture, num_classes, pretrained_cfg...). Publish or cache a config.json as timm '
        'writes it.'
    )
  architecture = config.get('architecture')
  if not architecture:
    raise ValueError(
        f'{name}: its {CONFIG_FILE} names no timm "architecture"; vit_jax reads '
        'weights published by timm (push_to_hf_hub).'
    )
  if not isinstance(architecture, str):
    raise _field_error(source, 'architecture', architecture, 'the name of a timm architecture')
  try:
    model = models.timm_architecture(architecture)
  except ValueError as e:
    raise ValueError(f'{name}: {e}') from None
  pretrained_cfg = _object(source, 'pretrained_cfg', config.get('pretrained_cfg', {}))
  field = 'num_classes' if 'num_classes' in config else 'pretrained_cfg.num_classes'
  num_classes = config.get('num_classes', pretrained_cfg.get('num_classes', 1000))
  if not (isinstance(num_classes, int) and not isinstance(num_classes, bool) and num_classes >= 0):
    raise _field_error(
        source, field, num_classes, 'a whole number of classes, or 0 for weights without a head'
    )
  input_size = pretrained_cfg.get('input_size', (3, 224, 224))
  if not (
      isinstance(input_size, (list, tuple))
      and len(input_size) == 3
      and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in input_size)
      and input_size[0] == 3
  ):
    raise _field_error(
        source,
        'pretrained_cfg.input_size',
        input_size,
        '[3, HEIGHT, WIDTH] of positive whole numbers, e.g. [3, 224, 224]',
    )
  if input_size[1] != input_size[2]:
    raise ValueError(
        f'{name} takes {input_size[1]}x{input_size[2]} inputs; vit_jax models '
        'take square images.'
    )
  crop_pct = pretrained_cfg.get('crop_pct', 0.875)
  if not (_is_number(crop_pct) and 0 < crop_pct <= 1):
    raise _field_error(
        source, 'pretrained_cfg.crop_pct', crop_pct, 'a number in (0, 1], e.g. 0.875'
    )
  interpolation = pretrained_cfg.get('interpolation', RESIZE_INTERPOLATION)
  if interpolation != RESIZE_INTERPOLATION:
    logging.warning(
        '%s was evaluated with %s resizing; vit_jax resizes %s.',
        name,
        interpolation,
        RESIZE_INTERPOLATION,
    )
  label_names = config.get('label_names')
  if label_names is not None and not (
      isinstance(label_names, list) and all(isinstance(n, str) for n in label_names)
  ):
    raise _field_error(source, 'label_names', label_names, 'a list of class names (strings)')
  if label_names is not None and len(label_names) != num_classes:
    raise ValueError(f'{name} names {len(label_names)} labels for {num_classes} classes.')
  model_args = _object(source, 'model_args', config.get('model_args', {}))
  return dict(
      architecture=architecture,
      model=model,
      model_fields=_model_fields(name, architecture, model, model_args),
      num_classes=num_classes,
      image_size=input_size[1],
      normalization=_normalization(
          source,
          pretrained_cfg.get('mean', (0.485, 0.456, 0.406)),
          pretrained_cfg.get('std', (0.229, 0.224, 0.225)),
      ),
      crop_ratio=float(crop_pct),
      label_names=None if label_names is None else tuple(label_names),
  )


def describe(name: str) -> HubConfig:
  """What the config.json of `name` ('hf-hub:ORG/NAME') says of its weights, fetched once (the
  weights are not). Raises ValueError when it is neither cached nor downloadable, or names an
  architecture or preprocessing that vit_jax does not have."""
  config_path = _download(name, _repo_id(name), (CONFIG_FILE,))
  try:
    with open(config_path) as f:
      config = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f'{name}: {config_path} is not readable JSON ({e}).') from e
  return HubConfig(name=name, **read_config(name, config, config_path))


def resolve(name: str) -> HubWeights:
  """The weights `name` ('hf-hub:ORG/NAME') in the local cache (downloaded once, after their
  config.json was read and found to map to a model here) and what their config.json says of
  them. Raises ValueError as `describe` does, or when the weights are neither cached nor
  downloadable."""
  config = describe(name)
  path = _download(name, _repo_id(name), WEIGHTS_FILES)
  weights = HubWeights(**dataclasses.asdict(config), path=path)
  logging.info(
      '%s: timm %s as %s%s, %s, %d px, %s normalisation, crop %.3g (%s).',
      name,
      weights.architecture,
      weights.model,
      f' {weights.model_fields}' if weights.model_fields else '',
      'headless' if weights.headless else f'{weights.num_classes} classes',
      weights.image_size,
      weights.normalization,
      weights.crop_ratio,
      weights.path,
  )
  return weights
