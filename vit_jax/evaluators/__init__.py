"""Evaluation: every kind is an evaluator, run by one mechanism in training and outside it.

An evaluator (`evaluator.Evaluator`) has `every` (training steps between its runs; 0: none) and
`run(subject) -> {metric: value}`, where the `evaluator.Subject` is a model with its state on the
mesh or its variables as host arrays, and `data` (`data_settings.DataSettings`) giving the
evaluation preprocessing of its images; it also names its log lines and its metrics' TensorBoard
and results.json names. Two kinds:
* `eval_sets.TestSets`: the model's own predictions, top-1 and loss on the run's eval split (and
  of its EMA) and on the test sets of `config.eval_sets` (ReaL, ImageNet-A/-R, …);
* the frozen-feature evaluators of `EVALUATORS` (`frozen.Evaluator`: few-shot and linear
  probes fitted on pre-logits), set under `config.evaluators.NAME`.
The loop runs `due` ones every `every` steps and all of them at the end (`run`), writing their
metrics to TensorBoard and results.json; `eval_only` and `python -m vit_jax.evaluate` run them
once on a run's or published weights (`standalone`).
"""

import dataclasses
from typing import Any, Mapping, Sequence

from vit_jax import extensions
from vit_jax.evaluators import evaluator
from vit_jax.evaluators import fewshot
from vit_jax.evaluators import frozen
from vit_jax.evaluators import linear_probe

EVALUATORS = {cls.name: cls for cls in (fewshot.FewShot, linear_probe.LinearProbe)}


def register(name: str, evaluator: type[frozen.Evaluator]) -> None:
  """Makes `evaluator`, a `frozen.Evaluator` subclass, the evaluator `name`: set under
  `--config.evaluators.NAME`, run by `python -m vit_jax.evaluate --evaluators=NAME`."""
  if name in EVALUATORS:
    raise ValueError(f'Evaluator {name!r} is registered already; registered: {list(EVALUATORS)}.')
  if not (isinstance(evaluator, type) and issubclass(evaluator, frozen.Evaluator)):
    raise ValueError(f'Evaluator {name!r}: {evaluator!r} is not a frozen.Evaluator subclass.')
  EVALUATORS[name] = evaluator
  extensions.note('evaluator', name, evaluator.__module__, f'evaluators.{name}')


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
  return {name: e for name, e in evaluators.items() if e.every > 0}


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
