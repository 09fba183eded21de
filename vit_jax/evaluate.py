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
them (`vit_jax.evaluators.eval_sets`: ReaL multi-label, ImageNet-A/-R on their 200 classes);
given alone it runs only those, with `--evaluators` both. A run's EMA weights are read where it kept them.

The evaluators are those of `vit_jax.evaluators` (the ones training runs periodically through
`config.evaluators`), on the pre-logits of images preprocessed as the run or weights evaluate.
TFDS datasets are read from the run's `data_dir` (weights: TFDS's default data directory).
Metrics are printed and merged into OUT_DIR/results.json and TensorBoard event files in OUT_DIR
(default: the run's --workdir) at the checkpoint's step.
"""

from absl import flags

from vit_jax import extensions
from vit_jax import runtime
from vit_jax.weights import source_flags

_LOAD = source_flags.define()
flags.adopt_module_key_flags(source_flags)  # Listed by --help with the command's own.
_EVALUATORS = flags.DEFINE_list(
    'evaluators',
    None,
    "Any of fewshot, linear_probe, or an evaluator of your own that the run's config.json "
    'imports (default: all of them, unless --eval_sets is given).',
)
flags.register_validator(
    'evaluators',
    lambda names: names is None or len(names) > 0,
    'must name at least one of fewshot, linear_probe (or be left out for both).',
)
_EVAL_SETS = flags.DEFINE_list(
    'eval_sets',
    [],
    "Test sets 'DATASET[:SPLIT]' to score the model's predictions on, e.g. "
    'imagenet2012_real,imagenet_v2,imagenet_a (vit_jax/evaluators/eval_sets.py).',
)
_DATASETS = flags.DEFINE_list(
    'datasets', ['digits'], "Datasets: 'digits', TFDS names, 'folder:/path/to/images'."
)
flags.register_validator(
    'datasets', lambda names: len(names) > 0, "must name at least one dataset, e.g. 'digits'."
)
_TRAIN_SPLIT = flags.DEFINE_string('train_split', 'train', 'Split the classifiers are fitted on.')
_TEST_SPLIT = flags.DEFINE_string('test_split', 'test', 'Split they are scored on.')
_SHOTS = flags.DEFINE_list('shots', ['1', '5', '10', '25'], 'Few-shot: examples per class.')
flags.register_validator(
    'shots',
    lambda shots: bool(shots) and all(k.isdigit() and int(k) >= 1 for k in shots),
    'must be one or more integers >= 1, e.g. 1,5,10,25.',
)
_SEEDS = flags.DEFINE_integer('seeds', 3, 'Few-shot: draws of the shots, averaged.', lower_bound=1)
_OUT_DIR = flags.DEFINE_string(
    'out_dir',
    None,
    'Where results.json and TensorBoard files go '
    '(default: --workdir; required with --init_from).',
)
extensions.define_allow_imports_flag()  # Reading a run imports its modules only with it.
flags.adopt_module_key_flags(extensions)
RESULTS_ROOM = 'write access and room for results.json and TensorBoard files (--out_dir)'


def settings(name: str) -> dict:
  """The flags' settings of evaluator `name`."""
  common = {
      'datasets': tuple(_DATASETS.value),
      'train_split': _TRAIN_SPLIT.value,
      'test_split': _TEST_SPLIT.value,
  }
  if name != 'fewshot':
    return common
  shots = tuple(int(k) for k in _SHOTS.value)  # Integers >= 1: checked with the flags.
  return {**common, 'shots': shots, 'seeds': _SEEDS.value}


def main(argv) -> None:
  del argv
  # pylint: disable=g-import-not-at-top
  from vit_jax import evaluators
  from vit_jax.data import storage
  from vit_jax.evaluators import eval_sets
  from vit_jax.evaluators import standalone
  from vit_jax.workdir import disk_writes
  from vit_jax.workdir import reader
  from vit_jax.workdir import run_files
  # pylint: enable=g-import-not-at-top
  try:
    eval_sets.parse_all(_EVAL_SETS.value)  # The names, before reading any weights.
  except ValueError as e:
    raise ValueError(f'--eval_sets: {e}.') from None
  if flags.FLAGS.workdir:  # The run's evaluators of your own (its config.json `imports`) first.
    reader.import_recorded_modules(flags.FLAGS.workdir)
  names = _EVALUATORS.value or ([] if _EVAL_SETS.value else list(evaluators.EVALUATORS))
  frozen = [evaluators.create(name, settings(name)) for name in names]
  if _OUT_DIR.value:  # Before reading any weights.
    disk_writes.check_writable(_OUT_DIR.value, RESULTS_ROOM, directory=True)
  with storage.runs_read_only():  # The data dir a run names is read, never written.
    run = _LOAD()
    out_dir = _OUT_DIR.value or (run.source if run.step is not None else None)
    if out_dir is None:
      raise ValueError('--init_from needs --out_dir=DIR for results.json.')
    if not _OUT_DIR.value:  # The run's own directory, before evaluating.
      disk_writes.check_writable(out_dir, RESULTS_ROOM, directory=True)
    disk_writes.check_files(out_dir, run_files.RESULTS_FILES, RESULTS_ROOM)
    standalone.evaluate_weights(run, _EVAL_SETS.value, frozen, out_dir)


if __name__ == '__main__':
  runtime.run(main)
