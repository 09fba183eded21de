r"""Test sets, and few-shot and linear-probe evaluation of frozen features, for any run or weights.

  python -m vit_jax.evaluate --workdir=/tmp/vit          # both evaluators, on the embedded digits
  python -m vit_jax.evaluate --workdir=/tmp/vit --evaluators=fewshot --datasets=digits,cifar10
  python -m vit_jax.evaluate --init_from=deit_small_patch16_224-cd65a155.pth --model=deit_s16 \
      --datasets=folder:/data/flowers --out_dir=/tmp/deit_s_probe
  python -m vit_jax.evaluate --init_from=hf-hub:timm/deit_small_patch16_224.fb_in1k \
      --datasets=cifar10 --out_dir=/tmp/deit_s_probe
  python -m vit_jax.evaluate --init_from=deit_small_patch16_224-cd65a155.pth --model=deit_s16 \
      --eval_sets=imagenet2012:validation,imagenet2012_real,imagenet_v2,imagenet_a,imagenet_r \
      --out_dir=/tmp/deit_s_test_sets

`--eval_sets` scores the model's own predictions on test sets named as `config.eval_sets` names
them (`vit_jax.evaluators.eval_sets`: ReaL multi-label, ImageNet-A/-R on their 200 classes); given alone it
runs only those, with `--evaluators` both. A run's EMA weights are read where it kept them.

The evaluators are those of `vit_jax.evaluators` (the ones training runs periodically through
`config.evaluators`), on the pre-logits of images preprocessed as the run or weights evaluate.
TFDS datasets are read from the run's `data_dir` (weights: TFDS's default data directory).
Metrics are printed and merged into OUT_DIR/results.json and TensorBoard event files in OUT_DIR
(default: the run's --workdir) at the checkpoint's step.
"""

import functools
import sys
from typing import Any

from vit_jax import runtime  # pylint: disable=g-bad-import-order
runtime.quiet_library_logs()  # First: TensorFlow (loaded by the imports below) starts quietly.

from absl import app
from absl import flags
from absl import logging
from clu import metric_writers
import tensorflow as tf

from vit_jax.data import input_pipeline
from vit_jax.evaluators import eval_sets as eval_sets_lib
from vit_jax import evaluators as evaluators_lib
from vit_jax.parallel import sharding
from vit_jax.weights import inference
from vit_jax.training import workdir as workdir_lib

def define_flags() -> dict[str, Any]:
  """The command's flags, defined when it runs (importing the module defines none, so it imports
  beside the other commands)."""
  return {
      'load': inference.define_flags(),
      'evaluators': flags.DEFINE_list('evaluators', list(evaluators_lib.EVALUATORS),
                                      f'Any of {", ".join(evaluators_lib.EVALUATORS)} (default: '
                                      'both, unless --eval_sets is given).'),
      'eval_sets': flags.DEFINE_list(
          'eval_sets', [], "Test sets 'DATASET[:SPLIT]' to score the model's predictions on, "
          'e.g. imagenet2012_real,imagenet_v2,imagenet_a (vit_jax/evaluators/eval_sets.py).'),
      'datasets': flags.DEFINE_list(
          'datasets', ['digits'], "Datasets: 'digits', TFDS names, 'folder:/path/to/images'."),
      'train_split': flags.DEFINE_string('train_split', 'train',
                                         'Split the classifiers are fitted on.'),
      'test_split': flags.DEFINE_string('test_split', 'test', 'Split they are scored on.'),
      'shots': flags.DEFINE_list('shots', ['1', '5', '10', '25'],
                                 'Few-shot: examples per class.'),
      'seeds': flags.DEFINE_integer('seeds', 3, 'Few-shot: draws of the shots, averaged.'),
      'out_dir': flags.DEFINE_string('out_dir', None, 'Where results.json and TensorBoard files '
                                     'go (default: --workdir; required with --init_from).'),
  }


def settings(name: str, flag: dict[str, Any]) -> dict:
  """The flags' settings of evaluator `name`."""
  common = {'datasets': tuple(flag['datasets'].value), 'train_split': flag['train_split'].value,
            'test_split': flag['test_split'].value}
  if name == 'fewshot':
    given = flag['shots'].value
    try:
      shots = tuple(int(k) for k in given)
    except ValueError:
      raise ValueError(f'--shots={",".join(given)} must be integers.') from None
    return {**common, 'shots': shots, 'seeds': flag['seeds'].value}
  return common


def main(argv, flag: dict[str, Any]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  tf.config.set_visible_devices([], 'GPU')  # tf.data only: the accelerators belong to JAX.
  try:
    set_names = flag['eval_sets'].value
    try:
      eval_sets_lib.parse_all(set_names)  # The names, before reading any weights.
    except ValueError as e:
      raise ValueError(f'--eval_sets: {e}.') from None
    evaluator_names = (flag['evaluators'].value if flag['evaluators'].present or not set_names
                       else [])
    evaluators = {name: evaluators_lib.create(name, settings(name, flag))
                  for name in evaluator_names}
    run = flag['load']()
    out_dir = flag['out_dir'].value or (run.source if run.step is not None else None)
    if out_dir is None:
      raise ValueError('--init_from needs --out_dir=DIR for results.json.')
    num_classes = len(run.class_names)
    data = input_pipeline.DataSettings.from_config(run.config)
    eval_sets = eval_sets_lib.checked(set_names, data, num_classes=num_classes)
    metrics = (eval_sets_lib.evaluate_variables(
        eval_sets, run.model, run.variables, data, sharding.MeshSettings.from_config(run.config),
        num_classes) if eval_sets else {})
    for name, evaluator in evaluators.items():
      metrics.update(evaluator.run(run.model, run.variables, data))
  except ValueError as e:
    logging.debug('Stopped by an error.', exc_info=True)
    sys.exit(f'error: {e}')
  for key, value in metrics.items():
    print(f'{key:40s} {value:.4g}')
  out = workdir_lib.Workdir(out_dir)
  results_file = out.write_results({**out.results(), **metrics})
  writer = metric_writers.SummaryWriter(out_dir)  # TensorBoard; the lines above are printed.
  writer.write_scalars(run.step or 0, metrics)
  writer.close()
  print(f'Wrote {len(metrics)} metrics of {run.source} (step {run.step}) to {results_file}.')


if __name__ == '__main__':
  app.run(functools.partial(main, flag=define_flags()))
