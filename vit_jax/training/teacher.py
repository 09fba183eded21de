"""The teacher of DeiT's distillation (Touvron et al., 2021, Section 4): which model, which
weights, and how the student's normalised images map to the teacher's."""

import os

from absl import logging
import ml_collections
import numpy as np

from vit_jax import config as config_lib
from vit_jax.weights import hub
from vit_jax.data import input_pipeline
from vit_jax import models
from vit_jax.weights import pretrained
from vit_jax.training import steps
from vit_jax.training import workdir as workdir_lib


def source(teacher: str) -> tuple[str | None, str]:
  """(registry name, weights file) for 'MODEL:FILE'; (None, teacher) for a work directory."""
  name, separator, path = teacher.partition(':')
  if separator and name in models.names():
    return name, path
  return None, teacher


def normalization_change(student: str, teacher: str) -> tuple[np.ndarray, np.ndarray] | None:
  """(scale, shift) with teacher-normalised = scale * student-normalised + shift; None if equal."""
  if student == teacher:
    return None
  for name in (student, teacher):
    if name not in input_pipeline.NORMALIZATIONS:
      raise ValueError(f'Unknown normalization {name!r}; valid: '
                       f'{list(input_pipeline.NORMALIZATIONS)}.')
  (mean_s, std_s), (mean_t, std_t) = (np.asarray(input_pipeline.NORMALIZATIONS[n], np.float32)
                                      for n in (student, teacher))
  return std_s / std_t, (mean_s - mean_t) / std_t


def load(config: ml_collections.ConfigDict, num_classes: int) -> steps.Teacher | None:
  """The teacher of `config.distillation`; None if unused.

  `distillation.teacher` is a work directory of vit_jax.main (its model, fields and
  normalisation are read from its config.json), Hub weights 'hf-hub:ORG/NAME' (model, fields and
  normalisation from their config.json, `vit_jax.weights.hub`) or 'MODEL:FILE', a registered model and a
  weights file that `pretrained.load` reads (timm .pth/.safetensors, .npz); such a teacher expects
  `distillation.teacher_normalization` ('' = the student's). The teacher computes in the run's
  `dtype`.
  """
  spec = config.distillation
  if spec.type == 'none':
    return None
  if spec.type not in ('hard', 'soft'):
    raise ValueError(f"distillation.type={spec.type!r} is not valid; choose from "
                     "['none', 'hard', 'soft'].")
  model_name, path = source(spec.teacher)
  normalization = spec.teacher_normalization or config.normalization
  if hub.is_hub_name(path) and model_name is None:
    weights = hub.resolve(path)
    model_name, overrides = weights.model, dict(weights.model_fields)
    normalization = spec.teacher_normalization or weights.normalization
  elif model_name is None:
    try:
      saved = workdir_lib.Workdir.open(path).config()
    except ValueError as e:
      raise ValueError(
          f'distillation.teacher={spec.teacher!r} must be a work directory written by '
          'vit_jax.main, or MODEL:FILE with MODEL a registered model name and FILE its weights '
          f'(e.g. regnety_160:/path/regnety_160.pth). {e}') from None
    model_name = saved.model.name
    overrides = config_lib.model_overrides(saved.model)
    normalization = spec.teacher_normalization or saved.get('normalization', normalization)
  elif not os.path.isfile(path) and not hub.is_hub_name(path):
    raise ValueError(f'distillation.teacher={spec.teacher!r}: no weights file at {path!r}.')
  else:
    overrides = {}
  overrides.setdefault('dtype', config.dtype)
  model = models.create(model_name, num_classes=num_classes, **overrides)
  variables = pretrained.load_for_run(path, model, config)
  change = normalization_change(config.normalization, normalization)
  logging.info('Distilling (%s, alpha=%s, tau=%s) from %s in %s (%s); the teacher sees the '
               'student\'s batch in %s normalisation%s.', spec.type, spec.alpha, spec.tau,
               model_name, path,
               'EMA weights where kept' if config.use_ema else 'raw weights',
               normalization, '' if change is None else f' (converted from {config.normalization})')
  return steps.Teacher(model, variables, *(change or (None, None)))
