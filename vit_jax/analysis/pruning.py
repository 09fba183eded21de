"""Pruning degenerate Gaussian heads of SA-conv (Cordonnier et al., Section 4 / Appendix E).

A non-isotropic head with spread A_h (Sigma_h^-1 = A_h A_h^T) is degenerate when the condition
number of A_h^T A_h exceeds a threshold (1000 in the official `find_degenerated_heads`, 1e5 in
the paper: `PRUNING_RULES`) or its largest eigenvalue is below 1e-5; an isotropic head when
s_h^2 < 1e-5. Pruning removes mu_h, A_h and the head's input rows of the `value` projection, and
the result is a registered SA-conv model with `layer_heads` giving each layer's remaining heads,
trained by the ordinary loop (`write_run`).
"""

import contextlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax.training import optim
from vit_jax.training import run_writer
from vit_jax.loop import train
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings
from vit_jax.training import start as start_lib
from vit_jax.workdir import reader

PRUNING_RULES = {'official': 1e3, 'paper': 1e5}
MIN_EIGENVALUE = 1e-5
PRUNABLE = ('quadratic', 'gaussian')


def _layer_names(params: Any) -> list[str]:
  names = [k for k in params if k.startswith('layers_')]
  return sorted(names, key=lambda k: int(k.split('_')[1]))


def head_spectra(params: Any, attention: str) -> list[np.ndarray]:
  """Per layer, (heads, 2) eigenvalues (ascending) of A_h^T A_h; isotropic: s_h^2 twice."""
  if attention not in PRUNABLE:
    raise ValueError(
        f'Only Gaussian heads can be pruned: attention={attention!r}; valid: ' f'{list(PRUNABLE)}.'
    )
  spectra = []
  for name in _layer_names(params):
    spreads = np.asarray(params[name]['attention']['attention_spreads'], np.float64)
    if attention == 'quadratic':
      spectra.append(np.repeat((spreads**2)[:, None], 2, axis=1))
    else:
      spectra.append(np.linalg.eigvalsh(np.einsum('hji,hjk->hik', spreads, spreads)))
  return spectra


def degenerate_heads(
    params: Any, attention: str, *, rule: str = 'official', min_eigenvalue: float = MIN_EIGENVALUE
) -> list[list[int]]:
  """Per layer, the heads to prune: condition number above PRUNING_RULES[rule] (non-isotropic
  heads) or largest eigenvalue below `min_eigenvalue`."""
  if rule not in PRUNING_RULES:
    raise ValueError(f'Unknown pruning rule {rule!r}; valid: {list(PRUNING_RULES)}.')
  max_condition = PRUNING_RULES[rule]
  result = []
  for eigenvalues in head_spectra(params, attention):
    smallest, largest = eigenvalues[:, 0], eigenvalues[:, 1]
    condition = np.divide(largest, smallest, out=np.full_like(largest, np.inf), where=smallest > 0)
    flat = largest < min_eigenvalue
    if attention == 'gaussian':
      flat = flat | (condition > max_condition)
    result.append([int(h) for h in np.flatnonzero(flat)])
  return result


def prune(params: Any, heads: Sequence[Sequence[int]]) -> tuple[dict, tuple[int, ...]]:
  """Params without `heads[i]` of layer i, and the remaining head count of every layer."""
  params = jax.tree.map(np.asarray, dict(params))
  names = _layer_names(params)
  if len(heads) != len(names):
    raise ValueError(f'{len(heads)} lists of heads given for {len(names)} layers.')
  layer_heads = []
  for name, drop in zip(names, heads):
    attention = dict(params[name]['attention'])
    count = attention['attention_centers'].shape[0]
    keep = [h for h in range(count) if h not in set(drop)]
    if not keep:
      raise ValueError(
          f'Every head of {name} is degenerate ({sorted(drop)}); a layer needs at '
          'least one head. Use a larger condition threshold for this model.'
      )
    attention['attention_centers'] = attention['attention_centers'][keep]
    attention['attention_spreads'] = attention['attention_spreads'][keep]
    kernel = attention['value']['kernel']
    width = kernel.shape[0] // count
    kernel = kernel.reshape(count, width, -1)[keep].reshape(len(keep) * width, -1)
    attention['value'] = dict(attention['value'], kernel=kernel)
    params[name] = dict(params[name], attention=attention)
    layer_heads.append(len(keep))
  return params, tuple(layer_heads)


def forward_cost(model: Any, params: Any, image_size: int) -> dict[str, float]:
  """Parameter count and forward FLOPs per image (XLA's cost analysis, a multiply-add = 2)."""
  images = jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32)
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.float32), params)
  compiled = jax.jit(lambda p, x: model.apply({'params': p}, x)).lower(shapes, images).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  if cost is None:
    raise ValueError(f'XLA gives no cost analysis on {jax.default_backend()}.')
  return {
      'parameters': int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(params))),
      'flops': float(cost['flops']),
  }


def pruned_config(
    config: ml_collections.ConfigDict,
    layer_heads: Sequence[int],
    *,
    steps: int,
    lr_factor: float = 0.1,
) -> ml_collections.ConfigDict:
  """The run's config for the pruned model, fine-tuned for `steps` at `lr_factor` x base_lr."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.model.layer_heads = tuple(int(h) for h in layer_heads)
  config.base_lr = config.base_lr * lr_factor
  config.num_epochs = None
  config.warmup_epochs = None
  config.total_steps = int(steps)
  config.warmup_steps = 0
  config.eval_every = max(int(steps), 1)
  config.checkpoint_every = max(int(steps), 1)
  return config


def write_run(
    config: ml_collections.ConfigDict, params: Any, workdir: str, num_classes: int
) -> None:
  """Writes a work directory with config.json and a step-0 checkpoint of `params` (e.g. a pruned
  model), from which `train.train_and_evaluate(config, workdir)` trains on."""
  if reader.Workdir(workdir).has_checkpoint():
    raise ValueError(
        f'{workdir!r} already holds a checkpoint; remove it or use another ' 'directory.'
    )
  settings = setting.build(run_settings.Settings, config)
  total, warmup = config.total_steps, config.warmup_steps
  schedule = optim.learning_rate_schedule(settings.schedule, total, warmup)
  start = start_lib.for_run(settings, num_classes, schedule)
  abstract = jax.eval_shape(start.init)
  params = jax.tree.map(lambda x, s: jnp.asarray(x, s.dtype), params, abstract.params)
  state = abstract.replace(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=start.tx.init(params),
      batch_stats={},
      rng=start.rngs[1],
  )
  with contextlib.ExitStack() as run_scope:
    run = run_writer.RunWriter(workdir).start(config, run_scope)
    run.save(0, state, model_name=config.model.name)
    run.wait_until_finished()
