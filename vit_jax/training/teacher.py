"""The teacher of DeiT's distillation (Touvron et al., 2021, Section 4): which model, which
weights, and how the student's normalised images map to the teacher's."""

import os

from absl import logging
import numpy as np

from vit_jax.weights import hub
from vit_jax.schema import normalization
from vit_jax import models
from vit_jax.weights import pretrained
from vit_jax.training import steps
from vit_jax.schema import step as step_settings
from vit_jax.workdir import reader


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
  (mean_s, std_s), (mean_t, std_t) = (
      np.asarray(normalization.mean_std(n), np.float32) for n in (student, teacher)
  )
  return std_s / std_t, (mean_s - mean_t) / std_t


def load(settings: step_settings.TeacherSettings, num_classes: int) -> steps.Teacher:
  """The teacher `settings.teacher`, computing in the run's `dtype`: a vit_jax work directory or
  Hub weights (their config.json names model, fields and normalisation), or 'MODEL:FILE' (a
  weights file, expecting `teacher_normalization`; '' = the student's)."""
  model_name, path = source(settings.teacher)
  normalization = settings.teacher_normalization or settings.normalization
  if hub.is_hub_name(path) and model_name is None:
    weights = hub.describe(path)
    if weights.headless:
      raise ValueError(
          f'distillation.teacher={path} is headless (no classifier): a teacher must predict '
          'classes.'
      )
    section = {'name': weights.model, **weights.model_fields}
    normalization = settings.teacher_normalization or weights.normalization
  elif model_name is None:
    try:
      saved = reader.Workdir.open(path).required_config()
    except ValueError as e:
      raise ValueError(
          f'distillation.teacher={settings.teacher!r} must be a work directory written by '
          'vit_jax.main, or MODEL:FILE with MODEL a registered model name and FILE its weights '
          f'(e.g. regnety_160:/path/regnety_160.pth). {e}'
      ) from None
    section = saved.model
    normalization = settings.teacher_normalization or saved.get('normalization', normalization)
  elif not os.path.isfile(path) and not hub.is_hub_name(path):
    raise ValueError(f'distillation.teacher={settings.teacher!r}: no weights file at {path!r}.')
  else:
    section = {'name': model_name}
  model = models.model_from_section(section, num_classes, settings.dtype)
  variables = pretrained.load(path, model, image_size=settings.image_size, use_ema=settings.use_ema)
  change = normalization_change(settings.normalization, normalization)
  logging.info(
      "Distilling from %s in %s (%s); the teacher sees the student's batch in %s "
      'normalisation%s.',
      section['name'],
      path,
      'EMA weights where kept' if settings.use_ema else 'raw weights',
      normalization,
      '' if change is None else f' (converted from {settings.normalization})',
  )
  return steps.Teacher(model, variables, *(change or (None, None)))
