"""The data settings of a run: which dataset, how it is batched, ordered and preprocessed (types
derived from `vit_jax.config.FIELDS`); free of TensorFlow, so that every data module can name them.
"""

from vit_jax import config as config_lib


@config_lib.settings_type
class TrainTransform:
  """How one training image is cropped, augmented and normalised: `augment` one of `AUGMENTS`,
  `normalization` a key of `NORMALIZATIONS` or numbers (`mean_std`), `randaugment` parsed (None:
  off), `color_jitter` 0 for off (fields: `vit_jax.config.FIELDS`)."""


@config_lib.settings_type
class EvalTransform:
  """How one image is resized (to image_size / crop_ratio), centre-cropped and normalised for
  evaluation and prediction (fields: `vit_jax.config.FIELDS`)."""


@config_lib.settings_type
class DataSettings:
  """Which dataset a run reads, how it batches (globally: over every process), orders and
  preprocesses it; `in_memory` None decides by size (`input_pipeline`) (fields:
  `vit_jax.config.FIELDS`)."""

  train_transform: TrainTransform
  eval_transform: EvalTransform
