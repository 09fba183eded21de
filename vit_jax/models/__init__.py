"""The model registry: `create(name, **overrides)`, `names()`, `fields(name)` and `family(...)`.

Each family module declares one `Family` as its `FAMILY`: its model class, its registered models
(registry name -> `functools.partial` of the class with that model's fields) and the converters of
its PyTorch checkpoint layout. A new model is added in its family's table only; a new family is a
module of this package that declares a `FAMILY` (`family_modules`), named after it, and a config
that trains it (`vit_jax.configs.family_configs`). Importing this package (or `parts`) does not
import JAX: a config file reads the backbone's part fields from `parts` alone.

`create` also takes the fields of a part kind's own settings (`parts.register_settings`) by name, e.g.
`create('t2t_vit_ti4', soft_splits=...)`: they replace those of the registered model's
`{part}_settings`.
"""

import ast
import dataclasses
import functools
import importlib
import pathlib
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from vit_jax.schema import parts

if TYPE_CHECKING:
  import flax.linen as nn
  import jax
  import numpy as np

# The type aliases of every model module.
Initializer = Callable[..., 'jax.Array']
ModuleDef = Callable[..., 'nn.Module']
Dtype = Any
StateDict = Mapping[str, Any]
Variables = Mapping[str, Any]

_NOT_FIELDS = ('parent', 'name')
_DTYPE_FIELDS = ('dtype', 'param_dtype')


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family: its class, its registered models and its checkpoint converters.

  from_torch: PyTorch state dict of the family's reference layout (timm's, or the official
    repository's where timm has none) -> Flax variables; raises ValueError naming keys outside
    that layout. None: no such layout. The family module names it after the layout it reads.
  to_torch: Flax variables (unrolled or scanned) -> that state dict (inverse of `from_torch`).
  timm_architectures: timm's architecture name (what a Hub repository's config.json names) ->
    the registered model of that shape, whose `from_torch` reads its weights.
  timm_arguments: timm's model argument (config.json `model_args`) -> our field of the same
    meaning; None for the arguments that change training only, not the weights.
  """

  name: str
  model_class: type['nn.Module']
  models: Mapping[str, functools.partial]
  from_torch: Callable[[StateDict], dict[str, dict]] | None = None
  to_torch: Callable[[Variables], dict[str, 'np.ndarray']] | None = None
  timm_architectures: Mapping[str, str] = dataclasses.field(default_factory=dict)
  timm_arguments: Mapping[str, str | None] = dataclasses.field(default_factory=dict)


def _declares_family(source: str) -> bool:
  """Whether a module's source assigns `FAMILY` at its top level."""
  return 'FAMILY' in source and any(
      isinstance(node, (ast.Assign, ast.AnnAssign))
      and any(
          isinstance(target, ast.Name) and target.id == 'FAMILY'
          for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
      )
      for node in ast.parse(source).body
  )


def modules_declaring_family(search_path: Iterable[str]) -> tuple[str, ...]:
  """The modules of a package (its `__path__`) that declare a `FAMILY`, sorted, read from their
  source without importing them: this package's family modules, `vit_jax.configs`' family
  configs."""
  return tuple(
      sorted(
          path.stem
          for directory in search_path
          for path in pathlib.Path(directory).glob('*.py')
          if path.stem != '__init__' and _declares_family(path.read_text())
      )
  )


def family_modules() -> tuple[str, ...]:
  """The modules of this package that declare a `FAMILY`, each named after its family, sorted."""
  return modules_declaring_family(__path__)


@functools.cache
def families() -> tuple[Family, ...]:
  """Every family, in `family_modules` order; ValueError where a module's family is named
  otherwise."""
  found = []
  for module in family_modules():
    family_ = importlib.import_module(f'{__name__}.{module}').FAMILY
    if family_.name != module:
      raise ValueError(
          f'{__name__}.{module} declares the family {family_.name!r}; a family module is named '
          f'after its family ({module}.py -> {family_.name}.py).'
      )
    found.append(family_)
  return tuple(found)


@functools.cache
def _registry() -> dict[str, tuple[Family, functools.partial]]:
  models: dict[str, tuple[Family, functools.partial]] = {}
  for family_ in families():
    for name, factory in family_.models.items():
      if name in models:
        raise ValueError(
            f'Model name {name!r} is registered twice (second in family ' f'{family_.name!r}).'
        )
      models[name] = family_, factory
  return dict(sorted(models.items()))


def names() -> list[str]:
  """Every registered model name, sorted."""
  return list(_registry())


def _entry(name: str) -> tuple[Family, functools.partial]:
  models = _registry()
  if name not in models:
    raise ValueError(f'Unknown model {name!r}; valid names: {list(models)}.')
  return models[name]


def family(model: 'str | nn.Module') -> Family:
  """The family of a registered model name, or of a model built by `create`."""
  if isinstance(model, str):
    return _entry(model)[0]
  for family_ in families():
    if type(model) is family_.model_class:
      return family_
  raise ValueError(
      f"{type(model).__name__} is no registered family's model class; valid: "
      f'{[f.model_class.__name__ for f in families()]}.'
  )


def timm_architecture(architecture: str) -> str:
  """The registered model that timm's `architecture` names (e.g. 'deit_small_patch16_224' ->
  'deit_s16'); ValueError listing the architectures every family reads."""
  known = {
      timm_name: name
      for family_ in families()
      for timm_name, name in family_.timm_architectures.items()
  }
  if architecture not in known:
    raise ValueError(
        f'timm architecture {architecture!r} has no registered counterpart; known: '
        f'{sorted(known)}.'
    )
  return known[architecture]


def fields(name: str) -> list[str]:
  """The fields of model `name` that `create` accepts as overrides: its own, then those of the
  registered kind settings (`parts.register_settings`) that its `{part}_settings` fields hold."""
  model_class = _entry(name)[0].model_class
  own = [f.name for f in dataclasses.fields(model_class) if f.name not in _NOT_FIELDS]
  return own + [
      field
      for field, settings in parts.kind_settings_fields().items()
      if field not in own and parts.settings_field(settings.part) in own
  ]


def _with_kind_settings(
    family_: Family, factory: functools.partial, overrides: dict[str, Any]
) -> dict[str, Any]:
  """`overrides` with the fields of kind settings given by name put into their dataclass, over
  the `{part}_settings` that the overrides or the registered model (`factory`) give (else its
  defaults)."""
  own = {f.name for f in dataclasses.fields(family_.model_class)}
  by_settings: dict[type, dict[str, Any]] = {}
  for field, settings in parts.kind_settings_fields().items():
    if field in overrides and field not in own:
      by_settings.setdefault(settings, {})[field] = overrides.pop(field)
  for settings, values in by_settings.items():
    field = parts.settings_field(settings.part)
    base = overrides.get(field, factory.keywords.get(field))
    if not isinstance(base, settings):
      base = settings()
    overrides[field] = dataclasses.replace(base, **values)
  return overrides


def create(name: str, **overrides: Any) -> 'nn.Module':
  """The registered model `name` with its fields replaced by `overrides`.

  `dtype`/`param_dtype` may be given as strings ('float32', 'bfloat16').
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  family_, factory = _entry(name)
  valid = fields(name)
  for key, value in overrides.items():
    if key not in valid:
      raise ValueError(
          f'Unknown override {key!r} for model {name!r} '
          f'({factory.func.__name__}); valid fields: {valid}.'
      )
    if key in _DTYPE_FIELDS and isinstance(value, str):
      overrides[key] = jnp.dtype(value)
  return factory(**_with_kind_settings(family_, factory, overrides))


def _hashable(value: Any) -> Any:
  """`value` with lists as tuples, at any depth: a saved config.json gives JSON lists, and a Flax
  module's fields must hash (T2T's `soft_splits`, say)."""
  return tuple(map(_hashable, value)) if isinstance(value, (list, tuple)) else value


def model_overrides(model: Mapping[str, Any]) -> dict[str, Any]:
  """The fields of a config's `model` section to pass to `create`: all but the name and the
  unset (None) part fields, which keep the registered model's own values."""
  part_fields = {field.name for field in parts.part_fields()}
  overrides, spelled_overrides = {}, []
  for key, value in model.items():
    if key == 'name' or (key in part_fields and value is None):
      continue
    if key in parts.FIELD_SPELLINGS:
      spelled = parts.FIELD_SPELLINGS[key][1](value) if value is not None else None
      if spelled is not None:
        spelled_overrides.append(spelled)
      continue
    overrides[key] = _hashable(value)
  return {**overrides, **dict(spelled_overrides)}


def model_from_section(model: Mapping[str, Any], num_classes: int, dtype: str) -> 'nn.Module':
  """The model a `model` section ({'name': ..., fields}) describes, computing in `dtype` unless
  the section sets its own (a run's model; a teacher's section, saved or from the Hub)."""
  overrides = model_overrides(model)
  overrides.setdefault('dtype', dtype)
  return create(model['name'], num_classes=num_classes, **overrides)


def create_model(config: Any, num_classes: int) -> 'nn.Module':
  """The registered model `config.model.name` with the config's overrides (a Flax module).

  `config.dtype` is the compute dtype of every model ('bfloat16': mixed precision with float32
  parameters, softmax, norms and loss); a `model.dtype` override takes precedence.
  """
  return model_from_section(config.model, num_classes, config.dtype)


def section_problems(model: Mapping[str, Any], prefix: str) -> list[str]:
  """What is wrong with a config's `model` section, as one problem naming the field (`prefix`
  before it, e.g. '--config.'): an unknown name or override, or a field its model refuses
  (`check_fields`); [] when nothing is."""
  name: Any = model.get('name')  # A config's value, whatever was typed: create refuses a non-name.
  try:
    create(name, num_classes=1, **model_overrides(model)).check_fields()
  except (ValueError, TypeError) as e:
    return [f'{prefix}model.name={name!r}: {e}' if name not in names() else f'{prefix}model: {e}']
  return []
