"""The data settings of a run: which dataset, how it is batched, ordered and preprocessed (types
derived from `vit_jax.config.FIELDS`); free of TensorFlow, so that every data module can name them.
"""

from vit_jax import config_settings
from vit_jax.data import augment_spec


@config_settings.settings_type
class TrainTransform:
  """How one training image is cropped, augmented and normalised: `augment` one of
  `augment_spec.AUGMENTS`, `normalization` a key of `normalization.NORMALIZATIONS` or numbers
  (`normalization.mean_std`), `randaugment` parsed (None: off), `color_jitter` 0 for off (fields:
  `vit_jax.config.FIELDS`)."""

  @property
  def on_device(self) -> bool:
    """Whether RandAugment, normalisation and erasing are the training step's
    (`batch_augment`): the host then yields uint8 crops and a key per image."""
    return augment_spec.augments_on_device(
        self.augment_on_device,
        self.randaugment,
        self.random_erase_prob,
        self.three_augment,
        self.color_jitter,
    )


@config_settings.settings_type
class EvalTransform:
  """How one image is resized (to image_size / crop_ratio), centre-cropped and normalised for
  evaluation and prediction (fields: `vit_jax.config.FIELDS`)."""


@config_settings.settings_type
class DataSettings:
  """Which dataset a run reads, how it batches (globally: over every process), orders and
  preprocesses it; `in_memory` None decides by size (`input_pipeline`) (fields:
  `vit_jax.config.FIELDS`)."""

  train_transform: TrainTransform
  eval_transform: EvalTransform
