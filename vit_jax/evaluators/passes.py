"""The eval steps (`make_eval_step`: a scoring's sums of the model's logits) and their passes over
a split, summed into metrics; `predictions`: the model's logits over a split, with the labels."""

import dataclasses
import functools
import typing
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
import numpy as np
import optax

from vit_jax.data import input_pipeline
from vit_jax.parallel import sharding
from vit_jax.schema import data as data_settings
from vit_jax.training import steps

# An evaluation set's scoring: (logits (B, classes) float32, batch) -> sums over the batch's real
# examples of 'correct' and 'count' (and 'loss' where defined).
Score = Callable[[jax.Array, dict[str, jax.Array]], dict[str, jax.Array]]


def top1_sums(logits: jax.Array, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Correct top-1 predictions, cross-entropy and the count of real examples (mask 1)."""
  mask = batch['mask']
  loss = optax.softmax_cross_entropy(logits, jax.nn.one_hot(batch['label'], logits.shape[-1]))
  return {
      'correct': jnp.sum((jnp.argmax(logits, -1) == batch['label']) * mask),
      'loss': jnp.sum(loss * mask),
      'count': jnp.sum(mask),
  }


def _variables(state: steps.TrainState) -> dict[str, Any]:
  """The state's raw variables, {'params'[, 'batch_stats']}."""
  if state.batch_stats:
    return {'params': state.params, 'batch_stats': state.batch_stats}
  return {'params': state.params}


def _logits(model: nn.Module, state: steps.TrainState, images: jax.Array) -> jax.Array:
  """The model's float32 logits of `images` with the state's variables."""
  logits = model.apply(_variables(state), images, train=False)
  return jnp.asarray(typing.cast(jax.Array, logits), jnp.float32)


def make_eval_step(
    model: nn.Module, num_classes: int, score: Score = top1_sums
) -> Callable[[steps.TrainState, dict[str, jax.Array]], dict[str, jax.Array]]:
  """The (unjitted) eval step: `score`'s sums (default: top-1 and loss) of the model's logits."""

  def eval_step(state: steps.TrainState, batch: dict[str, jax.Array]):
    logits = _logits(model, state, batch['image'])
    if logits.shape[-1] != num_classes:
      raise ValueError(f'The model predicts {logits.shape[-1]} classes, not {num_classes}.')
    return score(logits, batch)

  return eval_step


@functools.cache
def jitted_eval_step(
    model: nn.Module, num_classes: int, mesh: Mesh, score: Score = top1_sums
) -> jax.stages.Wrapped:
  """The eval step (`make_eval_step`) jitted for `mesh`, its sums replicated: one per model, mesh
  and scoring, compiled once."""
  return jax.jit(make_eval_step(model, num_classes, score), out_shardings=sharding.replicated(mesh))


@dataclasses.dataclass(frozen=True)
class Predictions:
  """The model's logits (examples, classes) float32 over a split, and the labels (examples,)."""

  logits: np.ndarray
  labels: np.ndarray


@functools.cache
def _logits_step(model: nn.Module, mesh: Mesh) -> Callable[..., dict[str, jax.Array]]:
  """The model's float32 logits of a batch, with its labels and mask, replicated on `mesh`."""

  def logits_step(state: steps.TrainState, batch: dict[str, jax.Array]):
    logits = _logits(model, state, batch['image'])
    return {'logits': logits, 'label': batch['label'], 'mask': batch['mask']}

  return jax.jit(logits_step, out_shardings=sharding.replicated(mesh))


def predictions(
    model: nn.Module,
    state: steps.TrainState,
    data: data_settings.DataSettings,
    mesh: Mesh,
    split: str | None = None,
) -> Predictions:
  """The logits of `state`'s parameters over every example of `split` (default: the run's
  `eval_split`), preprocessed as the run `data` evaluates; every process gets all of them."""
  step = _logits_step(model, mesh)
  data_sharding = sharding.batch_sharding(mesh)
  logits, labels = [], []
  for batch in input_pipeline.eval_iterator(data, split=split):
    out = jax.device_get(step(state, sharding.global_batch(batch, data_sharding)))
    real = out['mask'] > 0
    logits.append(np.asarray(out['logits'])[real])
    labels.append(np.asarray(out['label'])[real])
  return Predictions(np.concatenate(logits), np.concatenate(labels))


def frozen_state(variables: dict[str, Any], mesh: Mesh, fsdp_min_size: int) -> steps.TrainState:
  """Frozen `variables` (host arrays) placed on `mesh` as a state the eval steps read."""
  variables = sharding.place(variables, sharding.fsdp_shardings(variables, mesh, fsdp_min_size))
  return steps.TrainState(
      step=jnp.zeros((), jnp.int32),
      params=variables['params'],
      opt_state=None,
      batch_stats=variables.get('batch_stats', {}),
      rng=None,  # type: ignore[arg-type]  # A frozen state takes no step: it needs no key.
  )


def host_variables(state: steps.TrainState) -> dict[str, Any]:
  """The state's raw variables as host arrays on every process, whatever mesh holds them."""
  return multihost_utils.process_allgather(_variables(state), tiled=True)


def _metrics(totals: dict[str, float]) -> dict[str, float]:
  """Top-1 accuracy (and mean loss, where the scoring has one) from an eval step's summed sums."""
  count = max(totals.get('count', 0.0), 1.0)
  metrics = {'accuracy': totals.get('correct', 0.0) / count}
  if 'loss' in totals:
    metrics['loss'] = totals['loss'] / count
  return {**metrics, 'count': int(totals.get('count', 0.0))}


def evaluate_with_ema(
    eval_step: Callable,
    state: steps.TrainState,
    batches: Callable[[], Iterator[dict[str, np.ndarray]]],
    data_sharding: NamedSharding,
) -> dict[str, float]:
  """Top-1 accuracy (and mean loss, where the scoring has one) over every scored example of the
  raw variables, plus `ema_accuracy` (and `ema_loss`) with an EMA: both in one pass."""
  states = {'': state, 'ema': state.ema_view()} if state.ema else {'': state}
  totals: dict[str, dict[str, float]] = {name: {} for name in states}
  for batch in batches():
    placed = sharding.global_batch(batch, data_sharding)
    for name, each in states.items():
      for k, v in jax.device_get(eval_step(each, placed)).items():
        totals[name][k] = totals[name].get(k, 0.0) + float(v)
  ema = _metrics(totals['ema']) if state.ema else {}
  return {**_metrics(totals['']), **{f'ema_{k}': ema[k] for k in ('accuracy', 'loss') if k in ema}}
