"""The full check of a run config before anything reads data or compiles (the fields, the mesh, the
model's fields, the evaluators), as one `ConfigError`; then the config resolved where it runs.

It sits above the schema so that checking the fields alone needs neither JAX nor a model.
"""

import jax
import ml_collections

from vit_jax.schema import config as config_lib
from vit_jax.schema import checks as config_checks
from vit_jax import evaluators
from vit_jax import models
from vit_jax.schema import dataset_names
from vit_jax.parallel import sharding


def _evaluator_problems(config: ml_collections.ConfigDict) -> list[str]:
  """Every evaluator's settings, checked by the evaluator itself (`vit_jax.evaluators`)."""
  problems = []
  for name, settings in config.evaluators.items():
    try:
      evaluators.create(name, settings)
    except ValueError as e:
      problems.append(f'{config_lib.FLAG}evaluators.{name}: {e}')
  return problems


def resolved(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of `config` with what depends on where it runs decided: an image folder named by its
  absolute path, and `augment_on_device` None made True on an accelerator (idle between steps)
  and False on a CPU (where the host's per-image ops cost less than the batch program)."""
  config = config.copy_and_resolve_references()
  config.dataset = dataset_names.absolute(config.dataset)
  if config.augment_on_device is None:
    config.augment_on_device = jax.default_backend() != 'cpu'
  return config


def validate(
    config: ml_collections.ConfigDict, *, devices: int | None = None, processes: int | None = None
) -> None:
  """Raises `config_checks.ConfigError` listing every bad field of `config`; compiles and reads
  nothing. `devices` and `processes` (default: JAX's global counts) are what the batches and the
  mesh must divide."""
  devices = jax.device_count() if devices is None else devices
  processes = jax.process_count() if processes is None else processes
  problems = config_checks.problems(config, devices=devices, processes=processes)
  bad = config_checks.bad_fields(problems)
  if 'mesh.fsdp' not in bad:
    try:
      sharding.check_mesh(config.mesh.fsdp, devices)
    except ValueError as e:
      problems.append(f'{config_lib.FLAG}{e}')
  if 'model' not in bad:
    problems += models.section_problems(config.model, config_lib.FLAG)
  if 'evaluators' not in bad:
    problems += _evaluator_problems(config)
  if problems:
    raise config_checks.ConfigError(problems)
