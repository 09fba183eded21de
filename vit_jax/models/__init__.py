"""The model registry: `create(name, **overrides)` and `names()`.

A family module of this package registers its models by defining `MODELS`, a dict from registry
name to a `functools.partial` of its `flax.linen.Module` class with that model's fields; the
registry collects every such table, so a new model is added in its family's table only.
"""

import dataclasses
import functools
import importlib
import pkgutil
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

_NOT_FIELDS = ('parent', 'name')
_DTYPE_FIELDS = ('dtype', 'param_dtype')


@functools.cache
def _registry() -> dict[str, functools.partial]:
  models: dict[str, functools.partial] = {}
  for info in pkgutil.iter_modules(__path__):
    module = importlib.import_module(f'{__name__}.{info.name}')
    for name, factory in getattr(module, 'MODELS', {}).items():
      if name in models:
        raise ValueError(f'Model name {name!r} is registered twice (second in {module.__name__}).')
      models[name] = factory
  return dict(sorted(models.items()))


def names() -> list[str]:
  """Every registered model name, sorted."""
  return list(_registry())


def fields(name: str) -> list[str]:
  """The fields of model `name` that `create` accepts as overrides."""
  return [f.name for f in dataclasses.fields(_factory(name).func) if f.name not in _NOT_FIELDS]


def _factory(name: str) -> functools.partial:
  models = _registry()
  if name not in models:
    raise ValueError(f'Unknown model {name!r}; valid names: {list(models)}.')
  return models[name]


def create(name: str, **overrides: Any) -> nn.Module:
  """The registered model `name` with its fields replaced by `overrides`.

  `dtype`/`param_dtype` may be given as strings ('float32', 'bfloat16').
  """
  factory = _factory(name)
  valid = fields(name)
  for key, value in overrides.items():
    if key not in valid:
      raise ValueError(f'Unknown override {key!r} for model {name!r} '
                       f'({factory.func.__name__}); valid fields: {valid}.')
    if key in _DTYPE_FIELDS and isinstance(value, str):
      overrides[key] = jnp.dtype(value)
  return factory(**overrides)
