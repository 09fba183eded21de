"""The evaluators that score the model's logits over the run's eval split, with the labels,
computed once per evaluation round for all of them (`evaluator.Subject.predictions`)."""

import abc
import dataclasses
from typing import Sequence

from vit_jax.evaluators import evaluator
from vit_jax.evaluators import passes
from vit_jax.schema import data as data_settings


@dataclasses.dataclass(frozen=True)
class Evaluator(evaluator.Named, abc.ABC):
  """An `evaluator.Evaluator` of predictions: a subclass is a frozen dataclass of its settings
  that defines `evaluate`."""

  every: int = 0

  def __post_init__(self):
    if self.every < 0:
      raise ValueError(f'{type(self).__name__} needs every >= 0; got every={self.every}.')

  @abc.abstractmethod
  def evaluate(self, predictions: passes.Predictions) -> dict[str, float]:
    """The metrics of the model's logits (examples, classes) and the labels (examples,)."""

  def check(
      self,
      data: data_settings.DataSettings,
      *,
      num_classes: int,
      class_names: Sequence[str] | None,
  ) -> None:
    del data, class_names
    evaluator.check_head(self.name or type(self).__name__, num_classes)

  def run(self, subject: evaluator.Subject) -> dict[str, float]:
    return self.evaluate(subject.predictions())
