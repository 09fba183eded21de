"""What every evaluator is (`Evaluator`) and what it scores (`Subject`): the one interface of the
test sets (`eval_sets.TestSets`), the frozen-feature evaluators (`frozen.Evaluator`), the
prediction-scoring ones (`predictions.Evaluator`) and any evaluator of your own."""

from typing import Any, ClassVar, Mapping, Protocol, Sequence

from absl import logging
import flax.linen as nn
from jax.sharding import Mesh

from vit_jax.evaluators import passes
from vit_jax.schema import data as data_settings
from vit_jax.training import steps


class Subject:
  """A model to score: its state on the mesh, its raw variables as host arrays or its logits over
  a split, each made from the others when first asked for; `data`: its images' evaluation
  preprocessing; `num_classes`: the classes it predicts (default: the model's)."""

  def __init__(
      self,
      model: nn.Module,
      data: data_settings.DataSettings,
      *,
      state: steps.TrainState | None = None,
      variables: dict[str, Any] | None = None,
      mesh: Mesh | None = None,
      fsdp_min_size: int = 0,
      num_classes: int | None = None,
  ):
    if (state is None) == (variables is None):
      raise ValueError('A Subject takes either a state or variables.')
    self.model = model
    self.data = data
    self.num_classes: int = model.num_classes if num_classes is None else num_classes
    self._state = state
    self._variables = variables
    self._mesh = mesh
    self._fsdp_min_size = fsdp_min_size
    self._predictions: dict[str | None, passes.Predictions] = {}

  @property
  def mesh(self) -> Mesh:
    """The mesh the state lies on, where the model's predictions are computed."""
    if self._mesh is None:
      raise ValueError('Scoring predictions needs a mesh: Subject(..., mesh=...).')
    return self._mesh

  @property
  def state(self) -> steps.TrainState:
    """The state on the mesh: given, or the variables placed on `mesh` (a frozen state)."""
    if self._state is None:
      self._state = passes.frozen_state(self.variables, self.mesh, self._fsdp_min_size)
    return self._state

  @property
  def variables(self) -> dict[str, Any]:
    """The raw variables as host arrays: given, or gathered from the state."""
    if self._variables is None:
      self._variables = passes.host_variables(self.state)
    return self._variables

  def predictions(self, split: str | None = None) -> passes.Predictions:
    """The model's logits over every example of `split` (default: the run's eval split), with
    the labels: one pass, shared by every evaluator that asks."""
    if split not in self._predictions:
      self._predictions[split] = passes.predictions(
          self.model, self.state, self.data, self.mesh, split
      )
    return self._predictions[split]


class Evaluator(Protocol):
  """An evaluation, run every `every` training steps (0: none)."""

  every: int

  def check(
      self,
      data: data_settings.DataSettings,
      *,
      num_classes: int,
      class_names: Sequence[str] | None,
  ) -> None:
    """ValueError, before anything compiles, where what it scores cannot be read beside the run
    reading `data` with a model of `num_classes` classes (named `class_names`; None: unnamed)."""

  def run(self, subject: Subject) -> dict[str, float]:
    """The metrics of `subject`."""

  def log(self, step: int, metrics: Mapping[str, float], *, final: bool) -> None:
    """Logs `metrics`, of step `step` (`final`: the run's last)."""

  def summaries(self, metrics: Mapping[str, float]) -> dict[str, float]:
    """`metrics` under their TensorBoard names."""

  def results(self, metrics: Mapping[str, float]) -> dict[str, float]:
    """`metrics` under their results.json names."""


def check_head(name: str, num_classes: int) -> None:
  """ValueError where evaluator `name`, which scores predictions, gets a model without a head."""
  if not num_classes:
    raise ValueError(
        f'{name} scores predictions, and the model has no classifier head (headless weights); '
        'fewshot and linear_probe read its features.'
    )


class Named:
  """What most evaluators share: nothing to check, one log line under its registered `name`,
  its metrics under their own names in TensorBoard and results.json."""

  name: ClassVar[str] = ''

  def check(
      self,
      data: data_settings.DataSettings,
      *,
      num_classes: int,
      class_names: Sequence[str] | None,
  ) -> None:
    del data, num_classes, class_names

  def log(self, step: int, metrics: Mapping[str, float], *, final: bool) -> None:
    del final
    logging.info(
        'step %d  %s: %s',
        step,
        self.name or type(self).__name__,
        ', '.join(f'{k} {v:.4g}' for k, v in metrics.items()),
    )

  def summaries(self, metrics: Mapping[str, float]) -> dict[str, float]:
    return dict(metrics)

  def results(self, metrics: Mapping[str, float]) -> dict[str, float]:
    return dict(metrics)
