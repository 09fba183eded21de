r"""Classifies image files with a trained run or published weights, printing the top classes.

  python -m vit_jax.predict --workdir=/tmp/vit seven.png 'digits/*.png' more_digits/
  python -m vit_jax.predict --init_from=deit_small_patch16_224-cd65a155.pth --model=deit_s16 \
      cat.jpg --top_k=3 --json
  python -m vit_jax.predict --init_from=hf-hub:timm/deit_small_patch16_224.fb_in1k cat.jpg

Arguments are image files, folders (searched recursively for .jpg/.jpeg/.png) or quoted globs.
Images are preprocessed exactly as the run evaluates (`inference.predict`:
`input_pipeline.eval_image` with the run's config), or for weights as their published ImageNet
evaluation (`--image_size`, `--eval_crop_ratio`, `--normalization`; Hub weights: their
config.json's), and classified in batches of `--batch_size`. Classes are named by the run's dataset (folder names, TFDS label names,
digits 0-9), by Hub weights' `label_names`, or, for other 1,000-class weights, by the ImageNet
label file inside tensorflow-datasets. A file that cannot be read is reported on one line of
stderr and skipped; the exit status is 1 only when no image could be read.
"""

import json
import sys

from absl import flags

from vit_jax.process import extensions
from vit_jax.process import runtime
from vit_jax.weights import source_flags

_LOAD = source_flags.define()
flags.adopt_module_key_flags(source_flags)  # Listed by --help with the command's own.
_TOP_K = flags.DEFINE_integer('top_k', 5, 'Classes printed per image.', lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Images per forward pass.', lower_bound=1)
_JSON = flags.DEFINE_bool('json', False, 'Print one JSON document, not text lines.')
extensions.define_allow_imports_flag()  # Reading a run imports its modules only with it.
flags.adopt_module_key_flags(extensions)


def main(argv) -> None:
  if not argv[1:]:
    raise ValueError('Name at least one image file, folder or glob.')
  if sys.stdout is None:  # Python's when the process started with descriptor 1 closed.
    raise ValueError(
        'standard output is closed, so the predictions would go nowhere; give predict an open '
        'output (e.g. > predictions.txt).'
    )
  # pylint: disable=g-import-not-at-top
  from vit_jax.data import storage
  from vit_jax.weights import inference
  # pylint: enable=g-import-not-at-top

  with storage.runs_read_only():  # The data dir a run names is read, never written.
    run = _LOAD()
  paths, failures = inference.image_paths(argv[1:])
  for path, reason in failures:
    print(f'skipped {inference.shown(path)}: {reason}', file=sys.stderr)
  predictions = []
  for result in inference.predict(run, paths, top_k=_TOP_K.value, batch_size=_BATCH_SIZE.value):
    if isinstance(result, inference.Prediction):
      predictions.append(result)
      if not _JSON.value:
        print(
            f'{inference.shown(result.path)}: '
            + ', '.join(f'{name} {p:.3f}' for _, name, p in result.top_k)
        )
    else:
      failures.append(result)
      print(f'skipped {inference.shown(result[0])}: {result[1]}', file=sys.stderr)
  if _JSON.value:
    print(
        json.dumps(
            {
                'source': run.source,
                'model': run.config.model.name,
                'predictions': [p.to_json() for p in predictions],
                'skipped': [{'file': inference.shown(f), 'reason': r} for f, r in failures],
            },
            indent=1,
        )
    )
  if not predictions:
    sys.exit(1)


if __name__ == '__main__':
  runtime.run(main, takes_arguments=True)
