"""The data settings of a run: which dataset, how it is batched, ordered, preprocessed and
augmented on the host (`TrainTransform`, `EvalTransform`) and in the training step
(`BatchAugment`, `MixSettings`)."""

import dataclasses
from typing import Any

from vit_jax.schema import rules as config_rules
from vit_jax.schema import augment_spec
from vit_jax.schema import dataset_names
from vit_jax.schema.setting import NOT_SAVED, build, passed, setting


def _randaugment_spec(spec: str) -> augment_spec.RandAugmentSpec | None:
  """A `randaugment` field as the transforms hold it: parsed, or None when off."""
  return augment_spec.parse_randaugment(spec) if spec else None


@dataclasses.dataclass(frozen=True)
class TrainTransform:
  """How one training image is cropped, augmented and normalised."""

  augment: str = setting(
      'crop_flip',
      config_rules.choice(augment_spec.AUGMENTS),
      "Training crop: pad and random crop, inception crop, DeiT III's simple random crop, or "
      'resize only.',
  )
  crop_padding: int = setting(
      4,
      config_rules.integer(0),
      "Padding before the random crop: zeros ('crop_flip'), reflected ('simple_random_crop').",
  )
  flip: bool = setting(True, config_rules.boolean(), 'Random horizontal flips during training.')
  randaugment: augment_spec.RandAugmentSpec | None = setting(
      '',
      config_rules.RANDAUGMENT,
      "timm RandAugment spec, e.g. 'rand-m9-mstd0.5-inc1'; '' = off.",
      convert=_randaugment_spec,
  )
  three_augment: bool = setting(
      False,
      config_rules.boolean(),
      "DeiT III's 3-Augment: one of grayscale, solarization, Gaussian blur per image.",
  )
  color_jitter: float = setting(
      0.0,
      config_rules.number(0.0),
      'Colour jitter strength (brightness, contrast, saturation; DeiT III: 0.3); 0 = off.',
  )
  random_erase_prob: float = setting(
      0.0, config_rules.PROBABILITY, 'Random erasing (one box, per-pixel normal noise).'
  )
  augment_on_device: bool | None = setting(
      None,
      config_rules.boolean(optional=True),
      'RandAugment, normalisation and random erasing of each batch in the training step on the '
      'accelerator, in float32 (True; the host sends uint8 crops), or per image in tf.data, '
      "PIL's arithmetic to the bit (False); None: True where JAX's default backend is a GPU or "
      'TPU. With 3-Augment or colour jitter the host does all.',
      resume=NOT_SAVED,
  )
  image_size: int = passed('image_size')
  normalization: str = passed('normalization')

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


@dataclasses.dataclass(frozen=True)
class EvalTransform:
  """How one image is resized (to image_size / crop_ratio), centre-cropped and normalised for
  evaluation and prediction."""

  crop_ratio: float = setting(
      1.0,
      config_rules.number(0.0, 1.0, low_open=True),
      'Evaluation: resize to image_size / ratio, then centre crop.',
      flag='eval_crop_ratio',
  )
  image_size: int = passed('image_size')
  normalization: str = passed('normalization')


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """Which dataset a run reads, how it batches (globally: over every process), orders and
  preprocesses it; `in_memory` None decides by size (`input_pipeline`)."""

  dataset: str = setting(
      dataset_names.DIGITS,
      config_rules.DATASET,
      "'digits' (embedded, nothing to download), 'folder:/path/to/images' or a TFDS name.",
  )
  data_dir: str | None = setting(
      None,
      config_rules.text(optional=True),
      'TFDS data directory; None: TFDS default.',
      resume=NOT_SAVED,
  )
  train_split: str = setting(
      'train', config_rules.text(), "TFDS split to train on, e.g. 'train[:90%]'."
  )
  eval_split: str = setting(
      'test', config_rules.text(), 'TFDS split to evaluate on.', resume=NOT_SAVED
  )
  image_size: int = setting(
      32, config_rules.integer(1), 'Model input resolution; the pipeline resizes to it.'
  )
  normalization: str = setting(
      'imagenet',
      config_rules.normalization_rule(),
      "Per-channel mean and std of the inputs ('inception': 0.5/0.5), by name or as numbers, "
      "e.g. '0.5,0.5,0.5/0.25,0.25,0.25'.",
  )
  batch_size: int = setting(
      128, config_rules.integer(1), 'Global batch, summed over every device of every process.'
  )
  eval_batch_size: int = setting(
      256, config_rules.integer(1), 'Global evaluation batch.', resume=NOT_SAVED
  )
  shuffle_buffer: int = setting(
      10_000,
      config_rules.integer(1),
      'Shuffle buffer of a streamed TFRecord dataset.',
      resume=NOT_SAVED,
  )
  prefetch: int = setting(2, config_rules.integer(1), 'Batches prepared ahead.', resume=NOT_SAVED)
  in_memory: bool | None = setting(
      None,
      config_rules.boolean(optional=True),
      'A TFRecord-only dataset held in memory (True) or streamed (False); None: held when '
      'its images are of one shape and fit in input_pipeline.IN_MEMORY_MAX_BYTES.',
      resume=NOT_SAVED,
  )
  skip_unreadable_images: bool = setting(
      False,
      config_rules.boolean(),
      'Image folders: leave out, with a warning naming each, files that do not decode.',
  )
  repeated_aug: int = setting(
      1,
      config_rules.integer(1),
      'Copies of each example per batch (DeiT: 3); batch_size counts the copies.',
  )
  seed: int = passed('seed')
  train_transform: TrainTransform = dataclasses.field(kw_only=True)
  eval_transform: EvalTransform = dataclasses.field(kw_only=True)


@dataclasses.dataclass(frozen=True)
class MixSettings:
  """Mixup and CutMix of a batch in the training step (timm's Mixup arguments, mode 'batch');
  off (None) when both alphas are 0."""

  mixup_alpha: float = setting(
      0.0, config_rules.number(0.0), 'Mixup Beta(alpha, alpha); 0 = off (DeiT: 0.8).'
  )
  cutmix_alpha: float = setting(
      0.0, config_rules.number(0.0), 'CutMix Beta(alpha, alpha); 0 = off (DeiT: 1.0).'
  )
  switch_prob: float = setting(
      0.5, config_rules.PROBABILITY, 'P(CutMix) when both are on.', flag='mix_switch_prob'
  )
  mix_prob: float = setting(1.0, config_rules.PROBABILITY, 'P(a batch is mixed at all).')
  label_smoothing: float = passed('label_smoothing')

  @staticmethod
  def off(config: Any) -> bool:
    return config.mixup_alpha == 0 and config.cutmix_alpha == 0


@dataclasses.dataclass(frozen=True)
class BatchAugment:
  """RandAugment (None: off), random erasing and normalisation of a batch in the training step
  (`data.batch_augment`); off (None) where the host augments (`TrainTransform.on_device`)."""

  randaugment: augment_spec.RandAugmentSpec | None = passed('randaugment')
  random_erase_prob: float = passed('random_erase_prob')
  normalization: str = passed('normalization')

  @staticmethod
  def off(config: Any) -> bool:
    return not build(TrainTransform, config).on_device
