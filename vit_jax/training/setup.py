"""The full check of a run config, before anything reads data or compiles: the fields
(`vit_jax.config.problems`, the batches over the devices included), then what the owners of the
rest check: the mesh over the devices, the model's own fields (`models.section_problems`) and the
evaluators' settings. One `ConfigError` lists every bad field with its value and what is valid.

It sits above the schema (`vit_jax.config`, which imports none of the modules checked here), so
that reading and checking the fields alone needs neither JAX nor a model.
"""

import jax
import ml_collections

from vit_jax import config as config_lib
from vit_jax import evaluators
from vit_jax import models
from vit_jax.parallel import sharding

FLAG = config_lib.FLAG


def _evaluator_problems(config: ml_collections.ConfigDict) -> list[str]:
  """Every evaluator's settings, checked by the evaluator itself (`vit_jax.evaluators`)."""
  problems = []
  for name, settings in config.evaluators.items():
    try:
      evaluators.create(name, settings)
    except ValueError as e:
      problems.append(f'{FLAG}evaluators.{name}: {e}')
  return problems


def validate(
    config: ml_collections.ConfigDict, *, devices: int | None = None, processes: int | None = None
) -> None:
  """Raises `config_lib.ConfigError` listing every bad field of `config`; compiles and reads
  nothing. `devices` and `processes` (default: JAX's global counts) are what the batches and the
  mesh must divide."""
  devices = jax.device_count() if devices is None else devices
  processes = jax.process_count() if processes is None else processes
  problems = config_lib.problems(config, devices=devices, processes=processes)
  bad = config_lib.bad_fields(problems)
  if 'mesh.fsdp' not in bad:
    try:
      sharding.check_mesh(config.mesh.fsdp, devices)
    except ValueError as e:
      problems.append(f'{FLAG}{e}')
  if 'model' not in bad:
    problems += models.section_problems(config.model, FLAG)
  if 'evaluators' not in bad:
    problems += _evaluator_problems(config)
  if problems:
    raise config_lib.ConfigError(problems)
