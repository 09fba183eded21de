"""Evaluators of frozen features, run by name.

Each evaluator is a `frozen.Evaluator`, a frozen dataclass built from its settings, with `every`
(steps between runs; 0: only when asked for) and `run(model, variables, data) -> {metric:
value}`, where `data` (`input_pipeline.DataSettings`) gives the evaluation preprocessing of the
model's images. The loop runs
those of `config.evaluators` whose `every` is set (and at the end), writing their metrics to
TensorBoard and results.json; `python -m vit_jax.evaluate` runs any of them on a run or weights.
"""

from typing import Any, Mapping

from vit_jax.evaluators import fewshot
from vit_jax.evaluators import frozen
from vit_jax.evaluators import linear_probe

EVALUATORS = {'fewshot': fewshot.FewShot, 'linear_probe': linear_probe.LinearProbe}


def register(name: str, evaluator: type[frozen.Evaluator]) -> None:
  """Makes `evaluator`, a `frozen.Evaluator` subclass, the evaluator `name`: set under
  `--config.evaluators.NAME`, run by `python -m vit_jax.evaluate --evaluators=NAME`."""
  if name in EVALUATORS:
    raise ValueError(f'Evaluator {name!r} is registered already; registered: {list(EVALUATORS)}.')
  if not (isinstance(evaluator, type) and issubclass(evaluator, frozen.Evaluator)):
    raise ValueError(f'Evaluator {name!r}: {evaluator!r} is not a frozen.Evaluator subclass.')
  EVALUATORS[name] = evaluator


def create(name: str, settings: Mapping[str, Any] | None = None) -> frozen.Evaluator:
  """The evaluator `name` with `settings` (its fields; None: the field's default); ValueError for
  unknown names or fields."""
  if name not in EVALUATORS:
    raise ValueError(f'Unknown evaluator {name!r}; valid: {list(EVALUATORS)}.')
  settings = {key: value for key, value in dict(settings or {}).items() if value is not None}
  cls = EVALUATORS[name]
  valid = list(cls.__dataclass_fields__)
  unknown = [key for key in settings if key not in valid]
  if unknown:
    raise ValueError(f'Unknown settings {unknown} of evaluator {name!r}; valid: {valid}.')
  settings = {
      key: tuple(value) if isinstance(value, list) else value for key, value in settings.items()
  }
  return cls(**settings)


def periodic(sections: Mapping[str, Mapping[str, Any]]) -> dict[str, frozen.Evaluator]:
  """The evaluators of a run's `evaluators` sections that training runs (`every` > 0)."""
  evaluators = {name: create(name, settings) for name, settings in sections.items()}
  return {name: evaluator for name, evaluator in evaluators.items() if evaluator.every > 0}


def due(
    evaluators: Mapping[str, frozen.Evaluator], step: int, last_step: int
) -> dict[str, frozen.Evaluator]:
  """The evaluators to run after `step`: every `every` steps, and all of them at the last."""
  return {
      name: evaluator
      for name, evaluator in evaluators.items()
      if step % evaluator.every == 0 or step == last_step
  }
