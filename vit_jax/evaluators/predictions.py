"""The evaluators that score the model's predictions: its logits over the run's eval split, with
the labels (`passes.Predictions`), computed once per evaluation round for all of them
(`evaluator.Subject.predictions`).

A subclass is a frozen dataclass of its settings (fields with defaults; `every` is here) that
defines `evaluate(predictions) -> {metric: value}`; registered (`vit_jax.evaluators.register`),
it runs during training every `every` steps and at the end, and in `python -m vit_jax.evaluate`.
"""

import abc
import dataclasses
from typing import Sequence

from vit_jax.evaluators import evaluator
from vit_jax.evaluators import passes
from vit_jax.schema import data as data_settings

Predictions = passes.Predictions


@dataclasses.dataclass(frozen=True)
class Evaluator(evaluator.Named, abc.ABC):
  """What every prediction-scoring evaluator shares (an `evaluator.Evaluator`): the training
  steps between its runs (0: only when asked for), its log line, a model with a head to score."""

  every: int = 0

  def __post_init__(self):
    if self.every < 0:
      raise ValueError(f'{type(self).__name__} needs every >= 0; got every={self.every}.')

  @abc.abstractmethod
  def evaluate(self, predictions: Predictions) -> dict[str, float]:
    """The metrics of the model's logits (examples, classes) and the labels (examples,)."""

  def check(
      self,
      data: data_settings.DataSettings,
      *,
      num_classes: int,
      class_names: Sequence[str] | None,
  ) -> None:
    del data, class_names
    if not num_classes:
      raise ValueError(
          f'{self.name or type(self).__name__} scores predictions, and the model has no '
          'classifier head (headless weights); fewshot and linear_probe read its features.'
      )

  def run(self, subject: evaluator.Subject) -> dict[str, float]:
    """The metrics of the subject's logits over the run's eval split."""
    return self.evaluate(subject.predictions())
