"""The evaluators' settings: the fields of each one's frozen dataclass, each
`--config.evaluators.NAME.FIELD` (`SECTION`) or, declared `run_field`, the run's own field. The
built-in ones are declared here, free of JAX, so that a config lists them.
"""

import dataclasses
import types
import typing
from typing import Any

_RUN_FIELD = 'vit_jax.schema.evaluators.run_field'
DEFAULT_SHOTS = (1, 5, 10, 25)
DEFAULT_L2_REGS = tuple(2.0**k for k in range(-10, 21, 2))


def run_field(flag: str, default: Any) -> Any:
  """A settings field whose value is the run's own `--config.FLAG`, not a field of the section."""
  return dataclasses.field(default=default, metadata={_RUN_FIELD: flag})


def run_fields(settings: type) -> dict[str, str]:
  """Field -> the run's field it is (`run_field`), of the settings dataclass `settings`."""
  return {
      field.name: field.metadata[_RUN_FIELD]
      for field in dataclasses.fields(settings)
      if _RUN_FIELD in field.metadata
  }


@dataclasses.dataclass(frozen=True)
class TestSetsSettings:
  """The model's predictions scored on the run's eval split and the test sets `sets` every
  `every` training steps: the run's `eval_sets` and `eval_every`."""

  sets: tuple[str, ...] = run_field('eval_sets', ())
  every: int = run_field('eval_every', 0)


@dataclasses.dataclass(frozen=True)
class FrozenFeaturesSettings:
  """A frozen-feature evaluator's datasets (digits, TFDS names or 'folder:PATH'), the splits its
  classifiers are fitted and scored on, and the training steps between its runs (0: none)."""

  datasets: tuple[str, ...] = ('digits',)
  train_split: str = 'train'
  test_split: str = 'test'
  every: int = 0

  def __post_init__(self):
    if not self.datasets or self.every < 0:
      raise ValueError(
          f'{type(self).__name__} needs datasets and every >= 0; got datasets='
          f'{self.datasets}, every={self.every}.'
      )


@dataclasses.dataclass(frozen=True)
class FewShotSettings(FrozenFeaturesSettings):
  """Few-shot ridge regression: examples per class, draws averaged, the l2 strengths chosen among
  and the further training examples per class that choose them (`evaluators.fewshot`)."""

  shots: tuple[int, ...] = DEFAULT_SHOTS
  seeds: int = 3
  l2_regs: tuple[float, ...] = DEFAULT_L2_REGS
  validation_per_class: int = 10

  def __post_init__(self):
    super().__post_init__()
    if not self.shots or min(self.shots) < 1:
      raise ValueError(f'fewshot needs shots >= 1; got shots={self.shots}.')
    if self.seeds < 1 or self.validation_per_class < 1:
      raise ValueError(
          f'fewshot seeds={self.seeds} and validation_per_class='
          f'{self.validation_per_class} must be >= 1.'
      )
    if not self.l2_regs or min(self.l2_regs) <= 0:
      raise ValueError(f'fewshot l2_regs={self.l2_regs} must be positive numbers.')


@dataclasses.dataclass(frozen=True)
class LinearProbeSettings(FrozenFeaturesSettings):
  """Logistic regression: the C values (inverse l2) chosen among, the share of the training split
  held out to choose, and L-BFGS's iterations (`evaluators.linear_probe`)."""

  inverse_l2s: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0)
  validation_fraction: float = 0.1
  max_iter: int = 1000

  def __post_init__(self):
    super().__post_init__()
    if not self.inverse_l2s or min(self.inverse_l2s) <= 0:
      raise ValueError(f'linear_probe inverse_l2s={self.inverse_l2s} must be positive numbers.')
    if not 0 < self.validation_fraction < 1 or self.max_iter < 1:
      raise ValueError(
          f'linear_probe validation_fraction={self.validation_fraction} must be in '
          f'(0, 1) and max_iter={self.max_iter} >= 1.'
      )


def held_type(annotation: Any) -> type:
  """What a config holds for a field of `annotation` (`X | None` -> X, `tuple[int, ...]` -> tuple;
  a field of several types takes any literal)."""
  union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
  kinds = [k for k in typing.get_args(annotation) if k is not type(None)] if union else [annotation]
  if len(kinds) != 1:
    return object
  kind = typing.get_origin(kinds[0]) or kinds[0]
  return kind if isinstance(kind, type) else object


# Evaluator name -> {field: the type a config holds it as}: the config's `evaluators` section.
SECTION: dict[str, dict[str, type]] = {}
# The run's own fields that registered evaluators read (`run_field`), and their types.
RUN_FIELDS: dict[str, type] = {}


def add(name: str, settings: type) -> None:
  """Puts the fields of `settings`, evaluator `name`'s dataclass, in `SECTION` (its `run_field`s
  in `RUN_FIELDS`)."""
  hints = typing.get_type_hints(settings)
  run = run_fields(settings)
  fields = {}
  for field in dataclasses.fields(settings):
    if field.name in run:
      RUN_FIELDS[run[field.name]] = held_type(hints[field.name])
    elif field.init:
      fields[field.name] = held_type(hints[field.name])
  if fields:
    SECTION[name] = fields


add('fewshot', FewShotSettings)
add('linear_probe', LinearProbeSettings)
add('test_sets', TestSetsSettings)
