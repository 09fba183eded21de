"""What every evaluator is (`Evaluator`) and what it scores (`Subject`): the one interface of the
test sets (`eval_sets.TestSets`) and the frozen-feature evaluators (`frozen.Evaluator`)."""

from typing import Any, Mapping, Protocol

import flax.linen as nn
from jax.sharding import Mesh

from vit_jax.data import settings as data_settings
from vit_jax.evaluators import passes
from vit_jax.training import steps


class Subject:
  """A model to score, as each evaluator reads it: its state on the mesh (the test sets read it,
  and its EMA) or its raw variables as host arrays (the frozen-feature evaluators read those),
  each made from the other when first asked for; `data`: how its images are preprocessed for
  evaluation (the run's or the weights')."""

  def __init__(
      self,
      model: nn.Module,
      data: data_settings.DataSettings,
      *,
      state: steps.TrainState | None = None,
      variables: dict[str, Any] | None = None,
      mesh: Mesh | None = None,
      fsdp_min_size: int = 0,
  ):
    if (state is None) == (variables is None):
      raise ValueError('A Subject takes either a state or variables.')
    self.model = model
    self.data = data
    self._state = state
    self._variables = variables
    self._mesh = mesh
    self._fsdp_min_size = fsdp_min_size

  @property
  def state(self) -> steps.TrainState:
    """The state on the mesh: given, or the variables placed on `mesh` (a frozen state)."""
    if self._state is None:
      if self._mesh is None:
        raise ValueError('Scoring predictions needs a mesh: Subject(..., mesh=...).')
      self._state = passes.frozen_state(self._variables, self._mesh, self._fsdp_min_size)
    return self._state

  @property
  def variables(self) -> dict[str, Any]:
    """The raw variables as host arrays: given, or gathered from the state."""
    if self._variables is None:
      self._variables = passes.host_variables(self._state)
    return self._variables


class Evaluator(Protocol):
  """An evaluation: `every` training steps between its runs during training (0: none), the
  metrics of a `Subject`, its log lines, and its metrics as TensorBoard and results.json name
  them."""

  every: int

  def run(self, subject: Subject) -> dict[str, float]:
    """The metrics of `subject`."""

  def log(self, step: int, metrics: Mapping[str, float], *, final: bool) -> None:
    """Logs `metrics`, of step `step` (`final`: the run's last)."""

  def summaries(self, metrics: Mapping[str, float]) -> dict[str, float]:
    """`metrics` under their TensorBoard names."""

  def results(self, metrics: Mapping[str, float]) -> dict[str, float]:
    """`metrics` under their results.json names."""
