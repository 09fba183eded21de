r"""Classifies image files with a trained run or published weights, printing the top classes.

  python -m vit_jax.predict --workdir=/tmp/vit seven.png 'digits/*.png' more_digits/
  python -m vit_jax.predict --init_from=deit_small_patch16_224-cd65a155.pth --model=deit_s16 \
      cat.jpg --top_k=3 --json
  python -m vit_jax.predict --init_from=hf-hub:timm/deit_small_patch16_224.fb_in1k cat.jpg

Arguments are image files, folders (searched recursively for .jpg/.jpeg/.png) or quoted globs.
Images are preprocessed exactly as the run evaluates (`input_pipeline.eval_image` with the run's
config), or for weights as their published ImageNet evaluation (`--image_size`,
`--eval_crop_ratio`, `--normalization`; Hub weights: their config.json's), and classified in
batches of `--batch_size`. Classes are named by the run's dataset (folder names, TFDS label names,
digits 0-9), by Hub weights' `label_names`, or, for other 1,000-class weights, by the ImageNet
label file inside tensorflow-datasets. A file that cannot be read is reported on one line of
stderr and skipped; the exit status is 1 only when no image could be read.
"""

import dataclasses
import functools
import glob
import json
import os
import re
import sys
from typing import Any, Iterator, Sequence

from vit_jax import runtime  # pylint: disable=g-bad-import-order
runtime.quiet_library_logs()  # First: TensorFlow (loaded by the imports below) starts quietly.

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np
import tensorflow as tf

from vit_jax.weights import inference
from vit_jax.data import input_pipeline
from vit_jax.data import folder



def define_flags() -> dict[str, Any]:
  """The command's flags, defined when it runs (importing the module defines none, so it imports
  beside the other commands)."""
  return {'load': inference.define_flags(),
          'top_k': flags.DEFINE_integer('top_k', 5, 'Classes printed per image.'),
          'batch_size': flags.DEFINE_integer('batch_size', 32, 'Images per forward pass.'),
          'json': flags.DEFINE_bool('json', False, 'Print one JSON document, not text lines.')}


@dataclasses.dataclass(frozen=True)
class Prediction:
  """The `top_k` classes of one image, most probable first: (index, name, probability)."""
  path: str
  top_k: list[tuple[int, str, float]]

  def to_json(self) -> dict:
    return {'file': self.path, 'top_k': [{'class': i, 'name': name, 'probability': p}
                                         for i, name, p in self.top_k]}


def image_paths(arguments: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
  """The image files that `arguments` (files, folders, globs) name, and those that name none."""
  paths, missing = [], []
  for argument in arguments:
    if os.path.isdir(argument):
      found = sorted(os.path.join(root, name) for root, _, names in os.walk(argument)
                     for name in names if name.lower().endswith(folder.IMAGE_EXTENSIONS))
    elif os.path.exists(argument):
      found = [argument]
    else:
      found = sorted(glob.glob(argument, recursive=True))
    if found:
      paths.extend(found)
    else:
      missing.append((argument, 'no such file, folder of images or matching glob'))
  return paths, missing


def decode_for_model(path: str, config) -> np.ndarray:
  """The image file at `path` as the model sees it: (S, S, 3) float32, preprocessed as `config`
  evaluates. Raises tf.errors.OpError for a file that is not a readable image."""
  image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
  transform = input_pipeline.EvalTransform.from_config(config)
  return input_pipeline.eval_image(image, transform).numpy()


def predict(run: inference.Run, paths: Sequence[str], *, top_k: int = 5, batch_size: int = 32
            ) -> Iterator[Prediction | tuple[str, str]]:
  """Yields, per path in order, its `Prediction`, or (path, reason) when it cannot be read.

  Batches are padded to `batch_size`, so one program serves all.
  """
  if top_k < 1 or batch_size < 1:
    raise ValueError(f'top_k={top_k} and batch_size={batch_size} must be >= 1.')
  top_k = min(top_k, len(run.class_names))
  probabilities = jax.jit(lambda v, x: jax.nn.softmax(run.model.apply(v, x, train=False)))

  def classify(batch_paths, images):
    padded = np.zeros((batch_size,) + images[0].shape, np.float32)
    padded[:len(images)] = images
    probs = np.asarray(probabilities(run.variables, padded))[:len(images)]
    for path, p in zip(batch_paths, probs):
      best = np.argsort(-p)[:top_k]
      yield Prediction(path, [(int(i), run.class_names[i], float(p[i])) for i in best])

  batch_paths, images = [], []
  for path in paths:
    try:
      images.append(decode_for_model(path, run.config))
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


def main(argv, flag: dict[str, Any]) -> None:
  tf.config.set_visible_devices([], 'GPU')  # Decoding only: the accelerators belong to JAX.
  if not argv[1:]:
    raise app.UsageError('Name at least one image file, folder or glob.')
  try:
    run = flag['load']()
    paths, failures = image_paths(argv[1:])
    for path, reason in failures:
      print(f'skipped {path}: {reason}', file=sys.stderr)
    predictions = []
    for result in predict(run, paths, top_k=flag['top_k'].value,
                          batch_size=flag['batch_size'].value):
      if isinstance(result, Prediction):
        predictions.append(result)
        if not flag['json'].value:
          print(f'{result.path}: ' + ', '.join(f'{name} {p:.3f}' for _, name, p in result.top_k))
      else:
        failures.append(result)
        print(f'skipped {result[0]}: {result[1]}', file=sys.stderr)
  except ValueError as e:
    logging.debug('Stopped by an error.', exc_info=True)
    sys.exit(f'error: {e}')
  if flag['json'].value:
    print(json.dumps({'source': run.source, 'model': run.config.model.name,
                      'predictions': [p.to_json() for p in predictions],
                      'skipped': [{'file': f, 'reason': r} for f, r in failures]}, indent=1))
  if not predictions:
    sys.exit(1)


if __name__ == '__main__':
  app.run(functools.partial(main, flag=define_flags()))
