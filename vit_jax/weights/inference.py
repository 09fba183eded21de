"""A trained model to run frozen (`load`: a run of `vit_jax.main`, or published weights), and image
files classified with it (`predict`)."""

import dataclasses
import glob
import os
import re
import stat
from typing import Any, Iterator, Sequence, cast

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import tensorflow as tf

from vit_jax.schema import config as config_lib
from vit_jax.schema import checks as config_checks
from vit_jax.weights import hub
from vit_jax.data import folder
from vit_jax.data import imagenet
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.data import storage
from vit_jax import models
from vit_jax.weights import pretrained
from vit_jax.schema import setting
from vit_jax.workdir import reader
from vit_jax.workdir import run_files

MAX_IMAGE_BYTES = 256 << 20  # A larger file is refused, not read: no image file is that large.


@dataclasses.dataclass(frozen=True)
class Run:
  """A model with its variables, its config, the evaluation preprocessing of its images, and the
  name of each class it predicts."""

  config: ml_collections.ConfigDict
  eval_transform: data_settings.EvalTransform
  model: nn.Module
  variables: dict[str, Any]
  class_names: tuple[str, ...]
  step: int | None
  source: str
  ema: bool = False  # Whether `variables` are a run's EMA.


def load_run(
    workdir: str,
    step: int | None = None,
    *,
    use_ema: bool = True,
    unroll: bool = False,
    data_dir: str | None = None,
) -> Run:
  """The config, model and variables of `workdir`'s checkpoint at `step` (default: newest), as
  `reader.Workdir.read_variables` reads them; its classes as dataset.json records them. Data is
  read from `data_dir` where given, else from the run's own, never written (`storage.read_only`)."""
  run = reader.Workdir.open(workdir)
  config = run.required_config()
  if data_dir:
    config.data_dir = data_dir
  else:
    storage.read_only(config.data_dir, str(run.file(run_files.CONFIG_FILE)))
  if unroll:
    for field in ('scan_layers', 'remat'):
      if field in config.model:
        del config.model[field]  # Off by default.
  data = setting.build(data_settings.DataSettings, config)
  recorded = run.dataset()
  class_names = (
      tuple(recorded['class_names'])
      if recorded is not None
      else input_pipeline.get_dataset_info(data).class_names
  )
  model = models.create_model(config, len(class_names))
  saved = run.read_variables(step, use_ema=use_ema, unrolled=unroll)
  return Run(
      config,
      data.eval_transform,
      model,
      saved.variables,
      class_names,
      saved.step,
      workdir,
      saved.ema,
  )


def load_weights(
    path: str,
    model_name: str | None = None,
    *,
    num_classes: int | None = None,
    image_size: int | None = None,
    eval_crop_ratio: float | None = None,
    normalization: str | None = None,
) -> Run:
  """`pretrained.load` of a weights file or Hub name for the registered `model_name`.

  Hub weights (`hf-hub:ORG/NAME`) give every argument left None from their config.json (model and
  its fields, classes, input size, crop ratio, normalisation) and name their classes by its
  `label_names`; a `vit_jax.export` file from its metadata (`pretrained.exported`), alike. Their
  model's fields apply where `model_name` is None or names their model. For another file,
  `model_name` is needed and the rest defaults to the ImageNet evaluation of timm/DeiT weights
  (1,000 classes, resize to 224 / 0.875 bicubic, centre crop, ImageNet mean and std; Google ViT
  weights use `normalization='inception'`). 1,000 classes without label names are named by
  `imagenet.class_names`, other counts by their index.
  Headless weights (`num_classes` 0, as Hub weights of DINO, MAE or in21k backbones say) load
  into a model without a head, which gives features and names no classes.
  """
  weights = hub.describe(path) if hub.is_hub_name(path) else pretrained.exported(path)
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
    raise ValueError(
        f'--init_from={path} needs --model=NAME (a registry name, e.g. deit_s16; '
        'vit_jax.models.names() lists them).'
    )
  num_classes = imagenet.NUM_CLASSES if num_classes is None else num_classes
  if num_classes < 0:
    raise ValueError(
        f'--num_classes={num_classes} must be >= 0 (0: weights without a head, for features).'
    )
  # The weights' evaluation on ImageNet, for evaluators on any dataset; its fields and the model
  # are checked by the schema's rules, whose field names are these flags' names.
  preprocessing: dict[str, Any] = dict(
      image_size=image_size or 224,
      eval_crop_ratio=eval_crop_ratio or 0.875,
      normalization=normalization or 'imagenet',
  )
  section = {'name': model_name, **fields}
  problems = config_checks.field_problems(preprocessing)
  problems += models.section_problems(section, config_lib.FLAG)
  if problems:
    raise ValueError('; '.join(p.replace(config_lib.FLAG, '--') for p in problems))
  config = config_lib.defaults()
  config.update(
      dict(
          preprocessing,
          augment='none',
          dataset='imagenet2012',
          eval_split='validation',
          eval_batch_size=64,
      )
  )
  config.model = ml_collections.ConfigDict(section)
  model = models.create(model_name, num_classes=num_classes, **fields)
  variables = pretrained.load(path, model, image_size=config.image_size, frozen=True)
  names = label_names or (
      imagenet.class_names()
      if num_classes == imagenet.NUM_CLASSES
      else tuple(str(i) for i in range(num_classes))
  )
  transform = data_settings.EvalTransform(
      crop_ratio=preprocessing['eval_crop_ratio'],
      image_size=preprocessing['image_size'],
      normalization=preprocessing['normalization'],
  )
  return Run(config, transform, model, variables, names, None, path)


def load(
    *,
    workdir: str | None = None,
    init_from: str | None = None,
    step: int | None = None,
    use_ema: bool = True,
    model: str | None = None,
    num_classes: int | None = None,
    image_size: int | None = None,
    eval_crop_ratio: float | None = None,
    normalization: str | None = None,
    data_dir: str | None = None,
) -> Run:
  """A run's checkpoint (`workdir`, at `step`, reading datasets from `data_dir` where given) or
  published weights (`init_from`, with `model` and the preprocessing arguments of
  `load_weights`): exactly one of the two."""
  if workdir is not None and init_from is None:
    return load_run(workdir, step, use_ema=use_ema, data_dir=data_dir)
  if workdir is not None or init_from is None:
    raise ValueError(
        'Give either --workdir=RUN or --init_from=WEIGHTS (hf-hub:ORG/NAME, or a '
        'file with --model=NAME).'
    )
  weights = load_weights(
      init_from,
      model,
      num_classes=num_classes,
      image_size=image_size,
      eval_crop_ratio=eval_crop_ratio,
      normalization=normalization,
  )
  weights.config.data_dir = data_dir
  return weights


@dataclasses.dataclass(frozen=True)
class Prediction:
  """The `top_k` classes of one image, most probable first: (index, name, probability)."""

  path: str
  top_k: list[tuple[int, str, float]]

  def to_json(self) -> dict:
    return {
        'file': shown(self.path),
        'top_k': [{'class': i, 'name': name, 'probability': p} for i, name, p in self.top_k],
    }


def image_paths(arguments: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
  """The image files that `arguments` (files, folders, globs) name, and those that name none."""
  paths, missing = [], []
  for argument in arguments:
    if os.path.isdir(argument):
      found = sorted(
          os.path.join(root, name)
          for root, _, names in os.walk(argument)
          for name in names
          if name.lower().endswith(folder.IMAGE_EXTENSIONS)
      )
    elif os.path.exists(argument):
      found = [argument]
    else:
      found = sorted(glob.glob(argument, recursive=True))
    if found:
      paths.extend(found)
    elif os.path.isdir(argument):
      kinds = '/'.join(folder.IMAGE_EXTENSIONS)
      missing.append((argument, f'the folder holds no {kinds} images'))
    else:
      missing.append((argument, 'no such file, folder of images or matching glob'))
  return paths, missing


def shown(path: str) -> str:
  """`path` printable whatever its bytes: those that are not UTF-8 as backslash escapes."""
  return os.fsencode(path).decode('utf-8', 'backslashreplace')


def read_image_file(path: str) -> bytes:
  """The bytes of the image file `path`; ValueError, without reading, for anything but a regular
  file (a named pipe or a device would block or never end) or a file over `MAX_IMAGE_BYTES`."""
  try:
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), 'rb') as f:
      info = os.fstat(f.fileno())
      if not stat.S_ISREG(info.st_mode):
        raise ValueError('not a regular file')
      data = b'' if info.st_size > MAX_IMAGE_BYTES else f.read(MAX_IMAGE_BYTES + 1)
  except OSError as e:
    raise ValueError(e.strerror or str(e)) from e
  if info.st_size > MAX_IMAGE_BYTES or len(data) > MAX_IMAGE_BYTES:
    raise ValueError(f'larger than {MAX_IMAGE_BYTES >> 20} MiB, more than an image file holds')
  return data


def decode_for_model(path: str, transform: data_settings.EvalTransform) -> np.ndarray:
  """The image file at `path` as the model sees it: (S, S, 3) float32, preprocessed by the
  evaluation `transform`. Raises ValueError for a file that cannot be read (`read_image_file`),
  tf.errors.OpError for one that is not an image."""
  image = tf.io.decode_image(
      tf.constant(read_image_file(path)), channels=3, expand_animations=False
  )
  return input_pipeline.eval_image(image, transform).numpy()


def predict(
    run: Run, paths: Sequence[str], *, top_k: int = 5, batch_size: int = 32
) -> Iterator[Prediction | tuple[str, str]]:
  """Yields, per path in order, its `Prediction`, or (path, reason) when it cannot be read.

  Batches are padded to `batch_size`, so one program serves all; it is at most the number of
  paths (a larger one would only allocate padding).
  """
  if top_k < 1 or batch_size < 1:
    raise ValueError(f'top_k={top_k} and batch_size={batch_size} must be >= 1.')
  batch_size = min(batch_size, max(len(paths), 1))
  if not run.class_names:
    raise ValueError(
        f'{run.source} has no classifier head (headless weights): it gives features '
        '(vit_jax.evaluate) or is fine-tuned (configs/finetune.py), but predicts no classes.'
    )
  top_k = min(top_k, len(run.class_names))
  # `apply` returns the output alone where no collection is mutable.
  probabilities = jax.jit(
      lambda v, x: jax.nn.softmax(cast(jax.Array, run.model.apply(v, x, train=False)))
  )

  def classify(batch_paths, images):
    padded = np.zeros((batch_size,) + images[0].shape, np.float32)
    padded[: len(images)] = images
    probs = np.asarray(probabilities(run.variables, padded))[: len(images)]
    for path, p in zip(batch_paths, probs):
      best = np.argsort(-p)[:top_k]
      yield Prediction(path, [(int(i), run.class_names[i], float(p[i])) for i in best])

  batch_paths, images = [], []
  for path in paths:
    try:
      images.append(decode_for_model(path, run.eval_transform))
      batch_paths.append(path)
    except (tf.errors.OpError, ValueError) as e:
      message = getattr(e, 'message', str(e)).strip().splitlines()[0]
      yield path, re.sub(r'\{\{.*?\}\}\s*|\s*\[Op:.*$', '', message)
      continue
    if len(images) == batch_size:
      yield from classify(batch_paths, images)
      batch_paths, images = [], []
  if images:
    yield from classify(batch_paths, images)
