"""The flags with which a command names the model it runs: a run, or published weights.

It imports nothing heavy, so that `--help` stays quick.
"""

from typing import Callable, TYPE_CHECKING

from absl import flags

if TYPE_CHECKING:
  from vit_jax.weights import inference  # pylint: disable=g-bad-import-order


def define() -> Callable[[], 'inference.Run']:
  """Defines --workdir, --init_from, --model, --num_classes, --image_size, --eval_crop_ratio,
  --normalization and --data_dir; returns the function that loads the run or weights they
  name."""
  workdir = flags.DEFINE_string('workdir', None, 'Work directory of a run of vit_jax.main.')
  init_from = flags.DEFINE_string(
      'init_from',
      None,
      'Weights: Hub weights hf-hub:ORG/NAME (model and preprocessing from '
      'their config.json), or a file (timm/DeiT/CaiT/DeepViT/T2T .pth or .safetensors, Google '
      'ViT .npz) with --model.',
  )
  model = flags.DEFINE_string(
      'model',
      None,
      "Registry name of the weights' model, e.g. deit_s16 " '(Hub weights: their own).',
  )
  unset = " (default: Hub weights' own, else %s)."
  num_classes = flags.DEFINE_integer(
      'num_classes',
      None,
      "Classes of the weights' head" + unset % "ImageNet's 1000",
      lower_bound=1,
  )
  image_size = flags.DEFINE_integer(
      'image_size', None, 'Input resolution for weights' + unset % 224, lower_bound=1
  )
  eval_crop_ratio = flags.DEFINE_float(
      'eval_crop_ratio', None, 'Centre-crop ratio for weights' + unset % 0.875
  )
  flags.register_validator(
      'eval_crop_ratio',
      lambda ratio: ratio is None or 0 < ratio <= 1,
      'must be in (0, 1]: the share of the image side kept by the centre crop.',
  )
  normalization = flags.DEFINE_string(
      'normalization',
      None,
      'Normalisation for weights ' "('inception' for Google ViT weights)" + unset % 'imagenet',
  )

  data_dir = define_data_dir()

  def load() -> 'inference.Run':
    # pylint: disable-next=g-import-not-at-top,redefined-outer-name
    from vit_jax.weights import inference

    return inference.load(
        workdir=workdir.value,
        init_from=init_from.value,
        model=model.value,
        num_classes=num_classes.value,
        image_size=image_size.value,
        eval_crop_ratio=eval_crop_ratio.value,
        normalization=normalization.value,
        data_dir=data_dir.value,
    )

  return load


def define_data_dir() -> flags.FlagHolder[str | None]:
  """Defines --data_dir: where a command that reads a run reads (and prepares) datasets."""
  return flags.DEFINE_string(
      'data_dir',
      None,
      "TFDS data directory to read and prepare datasets in (default: a run's own data_dir, "
      "read only, else TFDS's default).",
  )
