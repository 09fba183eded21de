"""The settings types of the modules that read a config (`data.settings.DataSettings`,
`optim.OptimizerSettings`, ..., `training.train.Settings`), derived from `vit_jax.config.FIELDS`
by `settings_type` and built by one function, `from_config`: the training loop's set-up resolves
a validated config once into them; no field or default is restated anywhere else.
"""

import dataclasses
import types
import typing
from typing import Any, Callable

import ml_collections

from vit_jax import config as config_lib
from vit_jax.data import augment_spec


# The settings types that are None, their settings off, for a config: no mixing, no distillation.
SETTINGS_OFF: dict[str, Callable[[Any], bool]] = {
    'MixSettings': lambda c: c.mixup_alpha == 0 and c.cutmix_alpha == 0,
    'DistillationLoss': lambda c: c.distillation.type == 'none',
    'TeacherSettings': lambda c: c.distillation.type == 'none',
    'BatchAugment': lambda c: not augment_spec.augments_on_device(
        c.augment_on_device, c.randaugment, c.random_erase_prob, c.three_augment, c.color_jitter
    ),
}
# A settings field's metadata key: the `Field` it holds; a section field's: what turns the
# section into it.
_SETTINGS_FIELD = 'vit_jax.config_settings.field'
_SECTION_CONVERT = 'vit_jax.config_settings.convert'


def _into(field: config_lib.Field) -> dict[str, str]:
  """Settings type name -> the attribute that holds `field` (its last name part unless renamed)."""
  attributes = {}
  for target in field.into:
    settings, _, attribute = target.partition('.')
    attributes[settings] = attribute or field.name.rsplit('.', 1)[-1]
  return attributes


def _annotation(field: config_lib.Field) -> Any:
  """The type a settings type holds `field` as."""
  if field.convert is not None:
    return Any
  kind = field.field_type or type(field.default)
  return kind | None if field.default is None else kind


def section(convert: Callable[[Any], Any]) -> Any:
  """A settings type's field that holds a section (`SECTIONS`, by the field's name) as `convert`
  turns its dict."""
  return dataclasses.field(metadata={_SECTION_CONVERT: convert})


def settings_type(cls: type) -> type:
  """`cls` as a frozen dataclass of the fields that `FIELDS` declares `into` it (by its name), in
  their order and with their defaults, then the fields `cls` itself annotates (keyword-only):
  other settings types, built from the same config, or sections (`SECTIONS`). `cls.from_config`
  builds it from a config (`from_config`)."""
  own = dict(cls.__dict__.get('__annotations__', {}))
  annotations = {}
  for field in config_lib.FIELDS:
    attribute = _into(field).get(cls.__name__)
    if attribute is None:
      continue
    if attribute in own or attribute in annotations:
      raise TypeError(f'{cls.__name__}.{attribute} is declared twice ({field.name}).')
    annotations[attribute] = _annotation(field)
    default = field.default if field.convert is None else field.convert(field.default)
    setattr(cls, attribute, dataclasses.field(default=default, metadata={_SETTINGS_FIELD: field}))
  for name in own:
    declared = cls.__dict__.get(name, dataclasses.MISSING)
    if not isinstance(declared, dataclasses.Field):
      declared = dataclasses.field(default=declared)
    declared.kw_only = True
    setattr(cls, name, declared)
  cls.__annotations__ = {**annotations, **own}
  cls.from_config = classmethod(from_config)
  return dataclasses.dataclass(frozen=True)(cls)


def _settings_types(annotation: Any) -> tuple[type, ...]:
  """The settings types an annotation names (`X` or `X | None`)."""
  kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
  return tuple(kind for kind in kinds if hasattr(kind, '__dataclass_fields__'))


def _value(config: Any, name: str) -> Any:
  """The value of field `name` ('distillation.alpha') in `config`."""
  for key in name.split('.'):
    config = config[key]
  return config


def from_config(cls: type, config: ml_collections.ConfigDict) -> Any:
  """The settings type `cls` (`settings_type`) with the values of `config`, or None when its
  settings are off (`SETTINGS_OFF`)."""
  off = SETTINGS_OFF.get(cls.__name__)
  if off is not None and off(config):
    return None
  values = {}
  for declared in dataclasses.fields(cls):
    field = declared.metadata.get(_SETTINGS_FIELD)
    if field is not None:
      value = _value(config, field.name)
      values[declared.name] = value if field.convert is None else field.convert(value)
    elif _SECTION_CONVERT in declared.metadata:
      tree = config[declared.name]
      tree = tree.to_dict() if isinstance(tree, ml_collections.ConfigDict) else dict(tree)
      values[declared.name] = declared.metadata[_SECTION_CONVERT](tree)
    else:
      (settings,) = _settings_types(declared.type)
      values[declared.name] = settings.from_config(config)
  return cls(**values)
