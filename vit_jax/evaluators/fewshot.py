"""Few-shot linear evaluation as big_vision does it (`big_vision/evaluators/fewshot_lsr.py`).

For each dataset, seed and shot count k: k training examples per class are drawn, their frozen
pre-logits are whitened (train mean and std) and given a constant bias feature of 100 (almost
unregularised), and a closed-form ridge regression onto {-1, 1} one-hot targets is solved for every
l2 strength at once (`_ridge_solutions`); the test accuracy is the argmax's. Where big_vision fixes l2, this picks it from `l2_regs` by
accuracy on `validation_per_class` further training examples per class, disjoint from the shots,
so the test split never chooses anything; one value in `l2_regs` is big_vision's fixed l2.

Metrics: `fewshot/{dataset}_{k}shot` (mean test accuracy over seeds) and
`fewshot/{dataset}_{k}shot_l2` (the l2 chosen, median over seeds).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.evaluators import frozen
from vit_jax.schema import evaluators as evaluator_settings

BIAS_FEATURE = 100.0


@jax.jit
def _ridge_solutions(x: jax.Array, y: jax.Array, l2_regs: jax.Array) -> dict[str, jax.Array]:
  """Whitening and the ridge weights (l2, features + 1, classes) for every l2 in `l2_regs`.

  y is (examples, classes) in {-1, 1}. With XᵀX = Q diag(e) Qᵀ, W = Q diag(1/(e + l2)) Qᵀ Xᵀ y;
  with XXᵀ = Q diag(e) Qᵀ (fewer examples than features), W = Xᵀ Q diag(1/(e + l2)) Qᵀ y.
  """
  mean = jnp.mean(x, axis=0, keepdims=True)
  std = jnp.std(x, axis=0, keepdims=True) + 1e-5
  x = jnp.pad((x - mean) / std, ((0, 0), (0, 1)), constant_values=BIAS_FEATURE)
  examples, dim = x.shape
  if examples >= dim:
    eigs, q = jnp.linalg.eigh(x.T @ x)
    lhs, rhs = q, q.T @ (x.T @ y)
  else:
    eigs, q = jnp.linalg.eigh(x @ x.T)
    lhs, rhs = x.T @ q, q.T @ y
  weights = jax.vmap(lambda l2: (lhs / (eigs + l2)[None]) @ rhs)(l2_regs)
  return {'mean': mean, 'std': std, 'weights': weights}


@jax.jit
def _accuracies(solutions: dict[str, jax.Array], x: jax.Array, labels: jax.Array) -> jax.Array:
  """(l2,) accuracy of each ridge solution on (x, labels)."""
  x = (x - solutions['mean']) / solutions['std']
  x = jnp.pad(x, ((0, 0), (0, 1)), constant_values=BIAS_FEATURE)
  predictions = jnp.argmax(jnp.einsum('nd,ldc->lnc', x, solutions['weights']), -1)
  return jnp.mean(predictions == labels[None], axis=-1)


def fewshot_accuracy(
    data: frozen.Dataset,
    *,
    shots: int,
    seed: int,
    l2_regs: tuple[float, ...],
    validation_per_class: int,
) -> tuple[float, float]:
  """(test accuracy, chosen l2) of ridge regression on `shots` train examples per class."""
  features, labels, num_classes = data.train.features, data.train.labels, data.num_classes
  rng = np.random.default_rng(seed)
  per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
  short = [c for c, indices in enumerate(per_class) if len(indices) < shots]
  if short:
    raise ValueError(
        f'{shots}-shot evaluation needs {shots} training examples of every class; '
        f'classes {short} have fewer.'
    )
  chosen = np.concatenate([indices[:shots] for indices in per_class])
  targets = 2.0 * jax.nn.one_hot(labels[chosen], num_classes) - 1.0
  solutions = _ridge_solutions(features[chosen], targets, jnp.asarray(l2_regs, jnp.float32))
  best = 0
  if len(l2_regs) > 1:
    held_out = np.concatenate(
        [indices[shots : shots + validation_per_class] for indices in per_class]
    )
    if not len(held_out):
      raise ValueError(
          f'Choosing l2 among {len(l2_regs)} values needs training examples beyond '
          f'the {shots} shots; give one l2_regs value instead.'
      )
    validation = np.asarray(_accuracies(solutions, features[held_out], labels[held_out]))
    best = len(validation) - 1 - int(np.argmax(validation[::-1]))  # Ties: the stronger l2.
  accuracy = np.asarray(_accuracies(solutions, data.test.features, data.test.labels))[best]
  return float(accuracy), float(l2_regs[best])


@dataclasses.dataclass(frozen=True)
class FewShot(evaluator_settings.FewShotSettings, frozen.Evaluator):
  """Few-shot ridge regression on frozen pre-logits, over `datasets` and `shots`."""

  name = 'fewshot'

  def evaluate(self, data: frozen.Dataset) -> dict[str, float]:
    """Test accuracy (mean over seeds) and chosen l2 (median) for every shot count."""
    metrics = {}
    for shots in self.shots:
      results = [
          fewshot_accuracy(
              data,
              shots=shots,
              seed=seed,
              l2_regs=tuple(self.l2_regs),
              validation_per_class=self.validation_per_class,
          )
          for seed in range(self.seeds)
      ]
      metrics[f'fewshot/{data.name}_{shots}shot'] = float(np.mean([r[0] for r in results]))
      metrics[f'fewshot/{data.name}_{shots}shot_l2'] = float(np.median([r[1] for r in results]))
    return metrics
