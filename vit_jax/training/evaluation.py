"""Evaluation passes on the host: batches in, summed step outputs, metrics out.

The eval steps themselves are traced (`vit_jax.training.steps.make_eval_step`); this module feeds
them batches, adds up their sums and divides.
"""

from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
import numpy as np

from vit_jax.parallel import sharding
from vit_jax.training import steps


def frozen_state(variables: dict[str, Any], mesh: Mesh, fsdp_min_size: int) -> steps.TrainState:
  """Frozen `variables` (host arrays) placed on `mesh` as a state the eval steps read."""
  variables = sharding.place(variables, sharding.fsdp_shardings(variables, mesh, fsdp_min_size))
  return steps.TrainState(
      step=jnp.zeros((), jnp.int32),
      params=variables['params'],
      opt_state=None,
      batch_stats=variables.get('batch_stats', {}),
      rng=None,
  )


def _metrics(totals: dict[str, float]) -> dict[str, float]:
  """Top-1 accuracy (and mean loss, where the scoring has one) from an eval step's summed sums."""
  count = max(totals.get('count', 0.0), 1.0)
  metrics = {'accuracy': totals.get('correct', 0.0) / count}
  if 'loss' in totals:
    metrics['loss'] = totals['loss'] / count
  return {**metrics, 'count': int(totals.get('count', 0.0))}


def _evaluate_states(
    eval_step: Callable,
    states: dict[str, steps.TrainState],
    batches: Iterator[dict[str, np.ndarray]],
    data_sharding: NamedSharding,
) -> dict[str, dict[str, float]]:
  """`_metrics` of each of `states` over one pass of `batches`."""
  totals = {name: {} for name in states}
  for batch in batches:
    batch = sharding.global_batch(batch, data_sharding)
    for name, state in states.items():
      for k, v in jax.device_get(eval_step(state, batch)).items():
        totals[name][k] = totals[name].get(k, 0.0) + float(v)
  return {name: _metrics(sums) for name, sums in totals.items()}


def evaluate(
    eval_step: Callable,
    state: steps.TrainState,
    batches: Iterator[dict[str, np.ndarray]],
    data_sharding: NamedSharding,
) -> dict[str, float]:
  """Top-1 accuracy (and mean loss, where the scoring has one) over every scored example."""
  return _evaluate_states(eval_step, {'': state}, batches, data_sharding)['']


def evaluate_with_ema(
    eval_step: Callable,
    state: steps.TrainState,
    batches: Callable[[], Iterator[dict[str, np.ndarray]]],
    data_sharding: NamedSharding,
) -> dict[str, float]:
  """`evaluate` of the raw variables, plus `ema_accuracy` (and `ema_loss`) with an EMA: both
  in one pass over the batches."""
  states = {'': state, 'ema': state.ema_view()} if state.ema else {'': state}
  metrics = _evaluate_states(eval_step, states, batches(), data_sharding)
  ema = metrics.get('ema', {})
  return {**metrics[''], **{f'ema_{k}': ema[k] for k in ('accuracy', 'loss') if k in ema}}
