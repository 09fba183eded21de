"""A trained model to run frozen: a run of `vit_jax.main`, or published weights.

`load_run(workdir)` restores a run (its config, model, variables and dataset class names);
`load_weights(path, model_name)` reads a weights file for a registered model and gives it the
published models' ImageNet evaluation preprocessing and class names, or Hub weights
(`hf-hub:ORG/NAME`) with the model, preprocessing and class names their config.json gives.
`predict`, `analyze` and the evaluators' command read models through these two.
"""

import dataclasses
from typing import Any, Callable

from absl import flags
import flax.linen as nn
import ml_collections
from tensorflow_datasets.datasets.imagenet2012 import imagenet_common

from vit_jax import config as config_lib
from vit_jax.weights import hub
from vit_jax.data import input_pipeline
from vit_jax import models
from vit_jax.weights import pretrained
from vit_jax.training import workdir as workdir_lib

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
  info = input_pipeline.get_dataset_info(input_pipeline.DataSettings.from_config(config))
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


def load_weights(path: str, model_name: str | None = None, *, num_classes: int | None = None,
                 image_size: int | None = None, eval_crop_ratio: float | None = None,
                 normalization: str | None = None) -> Run:
  """`pretrained.load` of a weights file or Hub name for the registered `model_name`.

  Hub weights (`hf-hub:ORG/NAME`) give every argument left None from their config.json (model and
  its fields, classes, input size, crop ratio, normalisation) and name their classes by its
  `label_names`. For a file, `model_name` is needed and the rest defaults to the ImageNet
  evaluation of timm/DeiT weights (1,000 classes, resize to 224 / 0.875 bicubic, centre crop,
  ImageNet mean and std; Google ViT weights use `normalization='inception'`). 1,000 classes
  without label names are named by `imagenet_class_names`, other counts by their index.
  """
  weights = hub.resolve(path) if hub.is_hub_name(path) else None
  fields, label_names = {}, None
  if weights is not None:
    if model_name in (None, weights.model):
      model_name, fields = weights.model, dict(weights.model_fields)
    num_classes = weights.num_classes if num_classes is None else num_classes
    image_size = image_size or weights.image_size
    eval_crop_ratio = eval_crop_ratio or weights.crop_ratio
    normalization = normalization or weights.normalization
    if weights.label_names is not None and len(weights.label_names) == num_classes:
      label_names = weights.label_names
  elif not model_name:
    raise ValueError(f'--init_from={path} needs --model=NAME (a registry name, e.g. deit_s16; '
                     'vit_jax.models.names() lists them).')
  num_classes = IMAGENET_CLASSES if num_classes is None else num_classes
  if num_classes < 1:
    raise ValueError(f'--num_classes={num_classes} must be >= 1.')
  # The weights' evaluation on ImageNet, for evaluators on any dataset; checked by the schema,
  # whose field names are these flags' names.
  config = config_lib.defaults()
  config.update(dict(image_size=image_size or 224, eval_crop_ratio=eval_crop_ratio or 0.875,
                     normalization=normalization or 'imagenet', augment='none',
                     dataset='imagenet2012', eval_split='validation', eval_batch_size=64))
  config.model = ml_collections.ConfigDict({'name': model_name, **fields})
  try:
    config_lib.validate(config, devices=1, processes=1)
  except config_lib.ConfigError as e:
    raise ValueError('; '.join(p.replace(config_lib.FLAG, '--') for p in e.problems)) from None
  model = models.create(model_name, num_classes=num_classes, **fields)
  variables = pretrained.load(path, model, image_size=config.image_size)
  names = label_names or (imagenet_class_names() if num_classes == IMAGENET_CLASSES
                          else tuple(str(i) for i in range(num_classes)))
  return Run(config, model, variables, names, None, path)


def define_flags() -> Callable[[], Run]:
  """Defines --workdir, or --init_from with --model and the weights' preprocessing, for a
  command; returns the function that loads the run or weights those flags name."""
  workdir = flags.DEFINE_string('workdir', None, 'Work directory of a run of vit_jax.main.')
  init_from = flags.DEFINE_string(
      'init_from', None, 'Weights: Hub weights hf-hub:ORG/NAME (model and preprocessing from '
      'their config.json), or a file (timm/DeiT/CaiT/DeepViT/T2T .pth or .safetensors, Google '
      'ViT .npz) with --model.')
  model = flags.DEFINE_string('model', None, "Registry name of the weights' model, e.g. deit_s16 "
                              '(Hub weights: their own).')
  unset = ' (default: Hub weights\' own, else %s).'
  num_classes = flags.DEFINE_integer('num_classes', None,
                                     "Classes of the weights' head" + unset % IMAGENET_CLASSES)
  image_size = flags.DEFINE_integer('image_size', None,
                                    'Input resolution for weights' + unset % 224)
  eval_crop_ratio = flags.DEFINE_float('eval_crop_ratio', None,
                                       'Centre-crop ratio for weights' + unset % 0.875)
  normalization = flags.DEFINE_string('normalization', None, "Normalisation for weights "
                                      "('inception' for Google ViT weights)" + unset % 'imagenet')

  def load() -> Run:
    if (workdir.value is None) == (init_from.value is None):
      raise ValueError('Give either --workdir=RUN or --init_from=WEIGHTS (hf-hub:ORG/NAME, or a '
                       'file with --model=NAME).')
    if workdir.value is not None:
      return load_run(workdir.value)
    return load_weights(init_from.value, model.value, num_classes=num_classes.value,
                        image_size=image_size.value, eval_crop_ratio=eval_crop_ratio.value,
                        normalization=normalization.value)

  return load
