"""A trained model to run frozen: a run of `vit_jax.main`, or published weights.

`load_run(workdir)` restores a run (its config, model, variables and dataset class names);
`load_weights(path, model_name)` reads a weights file for a registered model and gives it the
published models' ImageNet evaluation preprocessing and class names. `predict`, `analyze` and the
evaluators' command read models through these two.
"""

import dataclasses
from typing import Any, Callable

from absl import flags
import flax.linen as nn
import ml_collections
from tensorflow_datasets.datasets.imagenet2012 import imagenet_common

from vit_jax import config as config_lib
from vit_jax import input_pipeline
from vit_jax import models
from vit_jax import pretrained
from vit_jax import workdir as workdir_lib

IMAGENET_CLASSES = 1000


@dataclasses.dataclass(frozen=True)
class Run:
  """A model with its variables, the config whose eval fields preprocess its images, and the
  name of each class it predicts."""
  config: ml_collections.ConfigDict
  model: nn.Module
  variables: dict[str, Any]
  class_names: tuple[str, ...]
  step: int | None
  source: str
  ema: bool = False  # Whether `variables` are a run's EMA.


def load_run(workdir: str, step: int | None = None, *, use_ema: bool = True,
             unroll: bool = False) -> Run:
  """The config, model and variables of `workdir`'s checkpoint at `step` (default: newest): its
  EMA where the run kept one and `use_ema` (`workdir.Workdir.read_variables`).

  With `unroll`, a run that stacked its blocks with `nn.scan` is restored unrolled (analysis reads
  per-block attention maps); otherwise in the layout it trained in.
  """
  run = workdir_lib.Workdir.open(workdir)
  config = run.config()
  if unroll:
    for field in ('scan_layers', 'remat'):
      if field in config.model:
        del config.model[field]  # Off by default.
  info = input_pipeline.get_dataset_info(config)
  model = config_lib.create_model(config, info.num_classes)
  saved = run.read_variables(step, use_ema=use_ema, unrolled=unroll)
  return Run(config, model, saved.variables, info.class_names, saved.step, workdir, saved.ema)


def imagenet_class_names() -> tuple[str, ...]:
  """The 1,000 ImageNet-2012 classes in label order, as TFDS names them (WordNet ids, e.g.
  'n01440764'), from the label file shipped inside the tensorflow-datasets package."""
  with open(imagenet_common.label_names_file()) as f:
    names = tuple(line.strip() for line in f if line.strip())
  if len(names) != IMAGENET_CLASSES:
    raise ValueError(f'{imagenet_common.label_names_file()} lists {len(names)} classes, not '
                     f'{IMAGENET_CLASSES}.')
  return names


def load_weights(path: str, model_name: str, *, num_classes: int = IMAGENET_CLASSES,
                 image_size: int = 224, eval_crop_ratio: float = 0.875,
                 normalization: str = 'imagenet') -> Run:
  """`pretrained.load` of a weights file for the registered `model_name`.

  The defaults are the ImageNet evaluation of timm/DeiT weights (resize to 224 / 0.875 bicubic,
  centre crop, ImageNet mean and std); Google ViT weights use `normalization='inception'`.
  1,000 classes are named by `imagenet_class_names`, other counts by their index.
  """
  if num_classes < 1:
    raise ValueError(f'--num_classes={num_classes} must be >= 1.')
  # The weights' evaluation on ImageNet, for evaluators on any dataset; checked by the schema,
  # whose field names are these flags' names.
  config = config_lib.defaults()
  config.update(dict(image_size=image_size, eval_crop_ratio=eval_crop_ratio,
                     normalization=normalization, augment='none', dataset='imagenet2012',
                     eval_split='validation', eval_batch_size=64))
  config.model = ml_collections.ConfigDict({'name': model_name})
  try:
    config_lib.validate(config, devices=1, processes=1)
  except config_lib.ConfigError as e:
    raise ValueError('; '.join(p.replace(config_lib.FLAG, '--') for p in e.problems)) from None
  model = models.create(model_name, num_classes=num_classes)
  variables = pretrained.load(path, model, image_size=image_size)
  names = (imagenet_class_names() if num_classes == IMAGENET_CLASSES
           else tuple(str(i) for i in range(num_classes)))
  return Run(config, model, variables, names, None, path)


def define_flags() -> Callable[[], Run]:
  """Defines --workdir, or --init_from with --model and the weights' preprocessing, for a
  command; returns the function that loads the run or weights those flags name."""
  workdir = flags.DEFINE_string('workdir', None, 'Work directory of a run of vit_jax.main.')
  init_from = flags.DEFINE_string(
      'init_from', None, 'Weights file (timm/DeiT/CaiT/DeepViT/T2T .pth or .safetensors, Google '
      'ViT .npz), with --model.')
  model = flags.DEFINE_string('model', None, "Registry name of the weights' model, e.g. deit_s16.")
  num_classes = flags.DEFINE_integer('num_classes', IMAGENET_CLASSES,
                                     "Classes of the weights' head.")
  image_size = flags.DEFINE_integer('image_size', 224, 'Input resolution for weights.')
  eval_crop_ratio = flags.DEFINE_float('eval_crop_ratio', 0.875, 'Centre-crop ratio for weights.')
  normalization = flags.DEFINE_string('normalization', 'imagenet', "Normalisation for weights "
                                      "('imagenet'; 'inception' for Google ViT weights).")

  def load() -> Run:
    if (workdir.value is None) == (init_from.value is None):
      raise ValueError('Give either --workdir=RUN or --init_from=WEIGHTS --model=NAME.')
    if workdir.value is not None:
      return load_run(workdir.value)
    if not model.value:
      raise ValueError(f'--init_from={init_from.value} needs --model=NAME (a registry name, e.g. '
                       'deit_s16; vit_jax.models.names() lists them).')
    return load_weights(init_from.value, model.value, num_classes=num_classes.value,
                        image_size=image_size.value, eval_crop_ratio=eval_crop_ratio.value,
                        normalization=normalization.value)

  return load
