"""The configs: one per model family (`family_configs`), beside every config's start (`common`),
fine-tuning (`finetune`) and the ablation grids (`ablations`).

A family config declares `FAMILY`, the family whose models it trains
(`vit_jax.models.family_modules`), and is named after it; its default is the family's quick run
on the embedded digits.
"""

from vit_jax import models


def family_configs() -> tuple[str, ...]:
  """The configs of this package that declare a `FAMILY`, each named after its family, sorted."""
  return models.modules_declaring_family(__path__)
