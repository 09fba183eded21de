"""Linear probe: multinomial logistic regression on frozen pre-logits, scored on the test split.

Features are standardised and scikit-learn's `LogisticRegression` (L-BFGS, L2 penalty 1/C) is
fitted on the whole training split, C chosen among several `inverse_l2s` on a held-out
`validation_fraction` of it (fixed seed; the test split chooses nothing).

Metrics: `linear_probe/{dataset}` (test accuracy) and `linear_probe/{dataset}_C` (the C used).
"""

import dataclasses

import numpy as np
from sklearn import linear_model
from sklearn import model_selection
from sklearn import pipeline
from sklearn import preprocessing

from vit_jax.evaluators import frozen
from vit_jax.schema import evaluators as evaluator_settings


def fit(
    features: np.ndarray, labels: np.ndarray, inverse_l2: float, max_iter: int
) -> pipeline.Pipeline:
  """Standardisation then logistic regression, fitted on (features, labels)."""
  probe = pipeline.make_pipeline(
      preprocessing.StandardScaler(),
      linear_model.LogisticRegression(C=inverse_l2, max_iter=max_iter),
  )
  return probe.fit(features, labels)


@dataclasses.dataclass(frozen=True)
class LinearProbe(evaluator_settings.LinearProbeSettings, frozen.Evaluator):
  """Logistic regression on frozen pre-logits of `datasets`."""

  name = 'linear_probe'

  def choose_inverse_l2(self, data: frozen.Dataset) -> float:
    """The C of `inverse_l2s` with the best accuracy on the held-out part of the train split."""
    if len(self.inverse_l2s) == 1:
      return float(self.inverse_l2s[0])
    fit_x, val_x, fit_y, val_y = model_selection.train_test_split(
        data.train.features,
        data.train.labels,
        test_size=self.validation_fraction,
        random_state=0,
        stratify=data.train.labels,
    )
    scores = [fit(fit_x, fit_y, c, self.max_iter).score(val_x, val_y) for c in self.inverse_l2s]
    return float(self.inverse_l2s[int(np.argmax(scores))])

  def evaluate(self, data: frozen.Dataset) -> dict[str, float]:
    """Test accuracy of the probe fitted on the whole train split, and its C."""
    inverse_l2 = self.choose_inverse_l2(data)
    probe = fit(data.train.features, data.train.labels, inverse_l2, self.max_iter)
    return {
        f'linear_probe/{data.name}': float(probe.score(data.test.features, data.test.labels)),
        f'linear_probe/{data.name}_C': inverse_l2,
    }
