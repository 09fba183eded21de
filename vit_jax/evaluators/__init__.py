"""Evaluation: every evaluator (`evaluator.Evaluator`, a frozen dataclass of its settings) is
registered by name (`EVALUATORS`, `register`): 'test_sets' (`eval_sets`), 'fewshot' and
'linear_probe' (`frozen`) or your own. The loop runs `due` ones every `every` steps and all at the
end (`run`); `eval_only` and `python -m vit_jax.evaluate` run them once (`standalone`).
"""

import dataclasses
import inspect
from typing import Any, Mapping, Sequence

from vit_jax.process import extensions
from vit_jax.evaluators import eval_sets
from vit_jax.evaluators import evaluator
from vit_jax.evaluators import fewshot
from vit_jax.evaluators import linear_probe
from vit_jax.schema import data as data_settings
from vit_jax.schema import evaluators as evaluator_settings

# Name -> the evaluator's class, in the order they run and log.
EVALUATORS: dict[str, type] = {
    'fewshot': fewshot.FewShot,
    'linear_probe': linear_probe.LinearProbe,
    'test_sets': eval_sets.TestSets,
}
_METHODS = ('check', 'run', 'log', 'summaries', 'results')


def register(name: str, evaluator_class: type) -> None:
  """Makes `evaluator_class`, a frozen dataclass of its settings with the methods of
  `evaluator.Evaluator`, the evaluator `name`, its fields in every config made afterwards."""
  if name in EVALUATORS:
    raise ValueError(f'Evaluator {name!r} is registered already; registered: {list(EVALUATORS)}.')
  if not (isinstance(evaluator_class, type) and dataclasses.is_dataclass(evaluator_class)):
    raise ValueError(
        f'Evaluator {name!r}: {evaluator_class!r} is not a dataclass of its settings; subclass '
        'vit_jax.evaluators.predictions.Evaluator or frozen.Evaluator with @dataclasses.dataclass.'
    )
  fields = {field.name for field in dataclasses.fields(evaluator_class)}
  missing = [field for field in ('every',) if field not in fields]
  missing += [method for method in _METHODS if not callable(getattr(evaluator_class, method, None))]
  if missing or inspect.isabstract(evaluator_class):
    abstract = sorted(getattr(evaluator_class, '__abstractmethods__', ()))
    raise ValueError(
        f'Evaluator {name!r}: {evaluator_class.__name__} lacks {missing + abstract}; an '
        'evaluator has an `every` field and defines check, run, log, summaries and results '
        '(predictions.Evaluator and frozen.Evaluator define all but `evaluate`).'
    )
  if not getattr(evaluator_class, 'name', ''):
    setattr(evaluator_class, 'name', name)  # What its log line shows.
  EVALUATORS[name] = evaluator_class
  evaluator_settings.add(name, evaluator_class)
  extensions.note('evaluator', name, evaluator_class.__module__, f'evaluators.{name}')


def create(
    name: str, settings: Mapping[str, Any] | None = None, *, run: Any = None
) -> evaluator.Evaluator:
  """The evaluator `name` with `settings` (None: the field's default) and its `run_field`s from
  `run` (a run's config or settings); ValueError for unknown names or fields."""
  if name not in EVALUATORS:
    raise ValueError(f'Unknown evaluator {name!r}; valid: {list(EVALUATORS)}.')
  cls = EVALUATORS[name]
  values = {key: value for key, value in dict(settings or {}).items() if value is not None}
  valid = [field.name for field in dataclasses.fields(cls) if field.init]
  unknown = [key for key in values if key not in valid]
  if unknown:
    raise ValueError(f'Unknown settings {unknown} of evaluator {name!r}; valid: {valid}.')
  if run is not None:
    for field, flag in evaluator_settings.run_fields(cls).items():
      values.setdefault(field, getattr(run, flag))
  return cls(**{key: tuple(v) if isinstance(v, list) else v for key, v in values.items()})


def periodic(
    sections: Mapping[str, Mapping[str, Any]], run: Any = None
) -> dict[str, evaluator.Evaluator]:
  """The evaluators that training runs (`every` > 0), in order, with the run's `evaluators`
  `sections` and its own fields from `run`."""
  names = [*EVALUATORS, *(name for name in sections if name not in EVALUATORS)]
  evaluators = {name: create(name, sections.get(name), run=run) for name in names}
  return {name: e for name, e in evaluators.items() if e.every > 0}


def check(
    evaluators: Sequence[evaluator.Evaluator],
    data: data_settings.DataSettings,
    *,
    num_classes: int,
    class_names: Sequence[str] | None,
) -> None:
  """Each evaluator's `check`, before anything compiles."""
  for e in evaluators:
    e.check(data, num_classes=num_classes, class_names=class_names)


def due(evaluators: Sequence[evaluator.Evaluator], step: int) -> list[evaluator.Evaluator]:
  """The evaluators to run after `step`: those whose `every` divides it."""
  return [e for e in evaluators if e.every > 0 and step % e.every == 0]


@dataclasses.dataclass(frozen=True)
class Scores:
  """One round's metrics, by the evaluator that gave them."""

  by_evaluator: tuple[tuple[evaluator.Evaluator, dict[str, float]], ...]

  @property
  def metrics(self) -> dict[str, float]:
    """Every metric under the name its evaluator gives it."""
    return {k: v for _, metrics in self.by_evaluator for k, v in metrics.items()}

  def summaries(self) -> dict[str, float]:
    """Every metric under its TensorBoard name."""
    return {k: v for e, metrics in self.by_evaluator for k, v in e.summaries(metrics).items()}

  def results(self) -> dict[str, float]:
    """Every metric under its results.json name."""
    return {k: v for e, metrics in self.by_evaluator for k, v in e.results(metrics).items()}


def run(
    evaluators: Sequence[evaluator.Evaluator],
    subject: evaluator.Subject,
    step: int | None = None,
    *,
    final: bool = False,
) -> Scores:
  """Each evaluator's metrics of `subject`, in order; each logs its lines at `step` (none
  without a step; `final`: the run's last)."""
  scores = []
  for e in evaluators:
    metrics = e.run(subject)
    if step is not None:
      e.log(step, metrics, final=final)
    scores.append((e, metrics))
  return Scores(tuple(scores))
