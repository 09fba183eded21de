"""The run config's fields, in the order the settings types declare them (`FIELDS`, from
`run.Settings`'s tree), its sections (`SECTIONS`: sub-configs their owners check) and `defaults()`,
the ConfigDict every family config starts from (`configs/common.py`). Like the whole of
`vit_jax.schema`, it imports neither JAX nor TensorFlow. `python -m vit_jax.config` prints it.
"""

import dataclasses
import json
import types
import typing
from typing import Any

import ml_collections

from vit_jax.schema import parts
from vit_jax.schema import evaluators as evaluator_settings
from vit_jax.schema import run as run_settings
from vit_jax.schema import setting

FLAG = '--config.'  # How a field is named on the command line, and in every message about it.


@dataclasses.dataclass(frozen=True)
class Section:
  """A sub-config checked by its owner (the model family, the evaluators), not by a `Rule`.

  A `default` value that is a type declares a field unset (None) until the command line sets it:
  its owner's own default applies. `saved`: whether a run's saved arrays depend on it.
  """

  name: str
  default: dict[str, Any]
  owner: str
  doc: str
  saved: bool = True


FIELDS: tuple[setting.Field, ...] = setting.config_fields(run_settings.Settings)

SECTIONS: tuple[Section, ...] = (
    Section(
        'evaluators',
        evaluator_settings.SECTION,
        'vit_jax.evaluators',
        'The settings of every registered evaluator (vit_jax.schema.evaluators: the fields of '
        'its dataclass), run every `every` steps and at the end when `every` > 0. Unset (None) '
        "fields take the evaluator's own defaults, under which fewshot and linear_probe are "
        "off; e.g. --config.evaluators.fewshot.every=400. The test sets' are eval_sets and "
        'eval_every.',
        saved=False,
    ),
    Section(
        'model',
        {'name': 'vit_ti4'},
        'vit_jax.models',
        'name: a registry key (vit_jax.models.names()); every other field is passed to '
        "vit_jax.models.create(). The backbone's parts and shared fields "
        '(vit_jax.schema.parts.Parts: scan_layers, remat, attention, ...) and the own settings '
        'of part kinds (parts.register_settings: soft_splits, centre_init_std, ...) are unset (None: '
        "the registered model's own value) until set, e.g. "
        '--config.model.attention=talking_heads.',
    ),
)


def _part_field_type(annotation: Any) -> type:
  """What ml_collections must accept for a part field of `annotation` (`X | None` -> X, a
  `tuple[...]` -> tuple; a field of several types, such as `layer_scale_init`'s float or 'paper',
  takes any literal)."""
  union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
  kinds = [kind for kind in typing.get_args(annotation) if kind is not type(None)]
  kinds = kinds if union else [annotation]
  return typing.get_origin(kinds[0]) or kinds[0] if len(kinds) == 1 else object


def model_part_fields() -> dict[str, type]:
  """The backbone's parts and shared fields and the fields of the part kinds' own settings
  (`vit_jax.schema.parts.part_fields`), with the type a config holds them as. Any config may set
  them from the command line; unset (None) they keep the registered model's value, and the model
  checks them (`check_fields`)."""
  return {field.name: _part_field_type(field.type) for field in parts.part_fields()}


def _config_dict(tree: dict[str, Any]) -> ml_collections.ConfigDict:
  """Nested dicts as nested ConfigDicts (tuples stay tuples; a type: unset, of that type)."""

  def value(v):
    if isinstance(v, dict):
      return _config_dict(v)
    return ml_collections.FieldReference(None, field_type=v) if isinstance(v, type) else v

  return ml_collections.ConfigDict({k: value(v) for k, v in tree.items()})


def _shown(tree: Any) -> Any:
  """A section's default as a config holds it: a declared type as None (unset)."""
  if isinstance(tree, dict):
    return {k: _shown(v) for k, v in tree.items()}
  return None if isinstance(tree, type) else tree


def defaults() -> ml_collections.ConfigDict:
  """A ConfigDict of every field at its default: the start of every family config."""
  config = ml_collections.ConfigDict()
  for field in FIELDS:
    *parents, leaf = field.name.split('.')
    target = config
    for parent in parents:
      if parent not in target:
        target[parent] = ml_collections.ConfigDict()
      target = target[parent]
    target[leaf] = (
        field.default
        if field.default is not None
        else ml_collections.FieldReference(None, field_type=field.field_type)
    )
  for section in SECTIONS:
    config[section.name] = _config_dict(section.default)
  for name, field_type in model_part_fields().items():
    config.model[name] = ml_collections.FieldReference(None, field_type=field_type)
  for name, (field_type, _) in parts.FIELD_SPELLINGS.items():
    config.model[name] = ml_collections.FieldReference(None, field_type=field_type)
  return config


def json_fields(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Every leaf of `config` by name ('model.hidden_size'), as its config.json holds it (tuples as
  lists), sections included: what a run's saved config is compared with."""

  def leaves(tree: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(tree, dict):
      return {prefix[:-1]: tree}
    return {
        k: v for key, value in tree.items() for k, v in leaves(value, f'{prefix}{key}.').items()
    }

  return leaves(json.loads(config.to_json_best_effort()), '')


def describe() -> str:
  """Every field with its default, rule and meaning, as `python -m vit_jax.config` prints it."""
  lines = []
  for field in FIELDS:
    lines.append(f'{FLAG}{field.name}={field.default!r}')
    lines.append(f'    {field.rule.valid}. {field.doc}')
  for section in SECTIONS:
    lines.append(f'{FLAG}{section.name}={_shown(section.default)!r}')
    lines.append(f'    checked by {section.owner}. {section.doc}')
  return '\n'.join(lines)
