"""How a settings type declares the config fields it reads, and how a config becomes settings.

A settings type is a frozen dataclass. Each of its fields is one of:
* `setting(default, rule, doc, ...)`: a config field it owns, named `--config.NAME` after the
  attribute unless `flag` names it otherwise, with its default, its rule
  (`vit_jax.schema.rules`), its meaning and what changing it means to a saved run (`Resume`);
* `passed('flag')`: a field another settings type owns, whose value it receives;
* another settings type (or one `| None`: a type whose `off(config)` can say it is off);
* `section('name')`: a whole sub-config (`vit_jax.schema.config.SECTIONS`), as a dict.
`config_fields(root)` lists the fields a settings tree owns (the config's schema, `config.FIELDS`);
`build(cls, config)` makes settings of a validated config. Free of JAX: a config file reads these.
"""

import dataclasses
import functools
import importlib
import types
import typing
from typing import Any, Callable, Iterator, TypeVar

from vit_jax.schema import rules as config_rules

_KEY = 'vit_jax.schema'
# The settings type whose tree is the whole config (`build` resolves `passed` fields against it).
ROOT = 'vit_jax.schema.run.Settings'
T = TypeVar('T')


@dataclasses.dataclass(frozen=True)
class Resume:
  """What a changed field means to a run resumed from its checkpoint.

  `saved`: whether a saved array depends on it (a checkpoint that cannot be read names only
  such fields); `note`: what resuming does about the change ('' where nothing saved depends on
  it); `started`/`stopped`: for a field whose 0 turns a saved part off, what resuming does when it
  turns on or off.
  """

  saved: bool = True
  note: str = ''
  started: str = ''
  stopped: str = ''


SHAPES = Resume()
NOT_SAVED = Resume(saved=False)
SCHEDULE = Resume(
    saved=False,
    note='the learning-rate schedule is recomputed for the new settings from the saved step',
)


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field as the schema lists it: `name` as typed after --config., its default (as a
  config holds it), rule and meaning.

  `field_type`: what the config holds where the default is None (ml_collections must know it to
  take the value from the command line); `convert` turns the config's value into what its
  settings type holds.
  """

  name: str
  default: Any
  rule: config_rules.Rule
  doc: str
  field_type: type | None = None
  convert: Callable[[Any], Any] | None = None
  resume: Resume = SHAPES

  def flag_name(self, attribute: str) -> str:
    """Its name after --config. when declared on `attribute` (`setting`'s `flag`, else that)."""
    return self.name or attribute


@dataclasses.dataclass(frozen=True)
class _Passed:
  flag: str


@dataclasses.dataclass(frozen=True)
class _Section:
  name: str


def setting(
    default: Any,
    rule: config_rules.Rule,
    doc: str,
    *,
    flag: str = '',
    convert: Callable[[Any], Any] | None = None,
    resume: Resume = SHAPES,
) -> Any:
  """A field that a settings type owns: `--config.FLAG` (default: the attribute's name) with
  `default`, checked by `rule`; the settings type holds `convert(value)` where `convert` is
  given."""
  field = Field(flag, default, rule, doc, convert=convert, resume=resume)
  held = default if convert is None else convert(default)
  return dataclasses.field(default=held, metadata={_KEY: field})


def passed(flag: str) -> Any:
  """A field whose value is that of `--config.FLAG`, which another settings type owns: given
  explicitly when the type is made by hand."""
  return dataclasses.field(kw_only=True, metadata={_KEY: _Passed(flag)})


def section(name: str) -> Any:
  """A field holding the config's section `name` as a dict."""
  return dataclasses.field(kw_only=True, metadata={_KEY: _Section(name)})


def _settings_types(annotation: Any) -> tuple[type, ...]:
  """The settings types an annotation names (`X` or `X | None`)."""
  kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
  return tuple(kind for kind in kinds if isinstance(kind, type) and dataclasses.is_dataclass(kind))


def _held_type(annotation: Any) -> type | None:
  """What a config holds for a field of `annotation` (`X | None` -> X)."""
  kinds = [k for k in typing.get_args(annotation) if k is not type(None)] or [annotation]
  kind = typing.get_origin(kinds[0]) or kinds[0]
  return kind if isinstance(kind, type) else None


def _walk(cls: type, path: str) -> Iterator[tuple[str, dataclasses.Field, Any]]:
  """(where, dataclass field, its resolved annotation) of every field of the tree under `cls`."""
  hints = typing.get_type_hints(cls)
  for declared in dataclasses.fields(cls):
    where = f'{path}.{declared.name}'
    yield where, declared, hints[declared.name]
    if _KEY not in declared.metadata:
      for nested in _settings_types(hints[declared.name]):
        yield from _walk(nested, f'{path}.{declared.name}')


def config_fields(root: type) -> tuple[Field, ...]:
  """The config fields that the settings tree of `root` owns, in declaration order; TypeError
  where a field is owned twice, where a `passed` field names none, or where a field of the tree
  is neither a setting, a passed field, a section nor a settings type."""
  owned: dict[str, Field] = {}
  passed_flags: dict[str, str] = {}
  for where, declared, annotation in _walk(root, root.__name__):
    spec = declared.metadata.get(_KEY)
    if isinstance(spec, Field):
      field = dataclasses.replace(spec, name=spec.flag_name(declared.name))
      if field.name in owned:
        raise TypeError(f'{where}: --config.{field.name} is owned twice; pass it with passed().')
      if field.default is None and field.convert is None:
        field = dataclasses.replace(field, field_type=_held_type(annotation))
      owned[field.name] = field
    elif isinstance(spec, _Passed):
      passed_flags[where] = spec.flag
    elif spec is None and not _settings_types(annotation):
      raise TypeError(
          f'{where}: declare it with setting(), passed() or section(), or make it a settings type.'
      )
  for where, flag in passed_flags.items():
    if flag not in owned:
      raise TypeError(
          f'{where}: passed({flag!r}) names no field that a settings type owns; owned: '
          f'{sorted(owned)}.'
      )
  return tuple(owned.values())


@functools.cache
def _owned() -> dict[str, Field]:
  """The fields of the whole config by name (`ROOT`'s tree)."""
  module, _, name = ROOT.rpartition('.')
  root = getattr(importlib.import_module(module), name)
  return {field.name: field for field in config_fields(root)}


def _value(config: Any, name: str, convert: Callable[[Any], Any] | None) -> Any:
  """The value of field `name` ('distillation.alpha') in `config`, as `convert` turns it."""
  value = config
  for key in name.split('.'):
    value = value[key]
  return value if convert is None else convert(value)


def build(cls: type[T], config: Any) -> T:
  """The settings `cls` with the values of a validated `config`."""
  hints = typing.get_type_hints(cls)
  values: dict[str, Any] = {}
  for declared in dataclasses.fields(cls):  # type: ignore[arg-type]
    spec = declared.metadata.get(_KEY)
    if isinstance(spec, Field):
      values[declared.name] = _value(config, spec.flag_name(declared.name), spec.convert)
    elif isinstance(spec, _Passed):
      values[declared.name] = _value(config, spec.flag, _owned()[spec.flag].convert)
    elif isinstance(spec, _Section):
      tree = config[spec.name]
      values[declared.name] = tree.to_dict() if hasattr(tree, 'to_dict') else dict(tree)
    else:
      (settings,) = _settings_types(hints[declared.name])
      optional = type(None) in typing.get_args(hints[declared.name])
      values[declared.name] = (build_unless_off if optional else build)(settings, config)
  return cls(**values)


def build_unless_off(cls: type[T], config: Any) -> T | None:
  """`build(cls, config)`, or None where `cls.off(config)` says these settings are off."""
  off = getattr(cls, 'off', None)
  return None if off is not None and off(config) else build(cls, config)
