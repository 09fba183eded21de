r"""Any evaluator on a finished run or on published weights: test sets, few-shot and linear
probes of frozen features, or an evaluator of your own.

  python -m vit_jax.evaluate --workdir=/tmp/vit          # fewshot and linear_probe, on the digits
  python -m vit_jax.evaluate --workdir=/tmp/vit --evaluators=fewshot \
      --config.evaluators.fewshot.datasets="('digits', 'cifar10')" \
      --config.evaluators.fewshot.shots=5,10
  python -m vit_jax.evaluate --init_from=deit_small_patch16_224-cd65a155.pth --model=deit_s16 \
      --config.evaluators.fewshot.datasets=folder:/data/flowers \
      --config.evaluators.linear_probe.datasets=folder:/data/flowers --out_dir=/tmp/deit_s_probe
  python -m vit_jax.evaluate --init_from=deit_small_patch16_224-cd65a155.pth --model=deit_s16 \
      --config.eval_sets="('imagenet2012:validation', 'imagenet2012_real', 'imagenet_v2')" \
      --out_dir=/tmp/deit_s_test_sets

Each evaluator takes a run's own settings (its config.json: `evaluators` and `eval_sets`), else
its defaults, and `--config.evaluators.NAME.FIELD=VALUE` (any field of its dataclass, spelled as
in training; `vit_jax.schema.evaluators`) and `--config.eval_sets` override them. `--evaluators`
names those to run: by default fewshot and linear_probe, or test_sets where `--config.eval_sets`
is given. `test_sets` scores the model's own predictions on those sets
(`vit_jax.evaluators.eval_sets`: ReaL multi-label, ImageNet-A/-R on their 200 classes), not the
run's eval split, which the run scored. A run's EMA weights are read where it kept them; the
evaluators of your own that its config.json imports are there with `--import_run_modules`.
TFDS datasets are read from the run's `data_dir` (weights: TFDS's default data directory).
Metrics are printed and merged into OUT_DIR/results.json and TensorBoard event files in OUT_DIR
(default: the run's --workdir) at the checkpoint's step.
"""

import re
import sys
import types
from typing import Any, Mapping, Sequence

from absl import flags
import ml_collections
from ml_collections import config_flags

from vit_jax.schema import config as config_lib
from vit_jax.process import extensions
from vit_jax.process import runtime
from vit_jax.schema import evaluators as evaluator_settings
from vit_jax.weights import source_flags

_EVALUATORS_SECTION = 'evaluators'
_DEFAULT_EVALUATORS = ('fewshot', 'linear_probe')
_TEST_SETS = 'test_sets'


def overridable(argv: Sequence[str]) -> ml_collections.ConfigDict:
  """What `--config.FIELD` sets here: every registered evaluator's section and the run's fields
  they read, with an empty section for each other evaluator `argv` names (checked once imported)."""
  defaults = config_lib.defaults()
  fields = [_EVALUATORS_SECTION, *evaluator_settings.RUN_FIELDS]
  config = ml_collections.ConfigDict({field: defaults[field] for field in fields})
  for arg in argv:
    named = re.match(rf'--?config\.{_EVALUATORS_SECTION}\.(\w+)\.', arg)
    if named and named.group(1) not in config[_EVALUATORS_SECTION]:
      config[_EVALUATORS_SECTION][named.group(1)] = ml_collections.ConfigDict()
  return config


_LOAD = source_flags.define()
flags.adopt_module_key_flags(source_flags)  # Listed by --help with the command's own.
_EVALUATORS = flags.DEFINE_list(
    'evaluators',
    None,
    "Evaluators to run: test_sets, fewshot, linear_probe, or one of your own that the run's "
    'config.json imports (default: fewshot,linear_probe; test_sets with --config.eval_sets).',
)
flags.register_validator(
    'evaluators',
    lambda names: names is None or len(names) > 0,
    'must name at least one of fewshot, linear_probe, test_sets (or be left out).',
)
_CONFIG = config_flags.DEFINE_config_dict(
    'config',
    overridable(sys.argv),
    'Evaluator settings, spelled as in training: --config.evaluators.NAME.FIELD=VALUE (any field '
    "of the evaluator's dataclass) and --config.eval_sets (the test sets' sets).",
    lock_config=False,
    accept_new_attributes=True,  # The fields of a run's own evaluators, checked once imported.
)
_OUT_DIR = flags.DEFINE_string(
    'out_dir',
    None,
    'Where results.json and TensorBoard files go '
    '(default: --workdir; required with --init_from).',
)
extensions.define_allow_imports_flag()  # Reading a run imports its modules only with it.
flags.adopt_module_key_flags(extensions)
RESULTS_ROOM = 'write access and room for results.json and TensorBoard files (--out_dir)'


def given_settings(
    overrides: Mapping[str, Any],
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
  """The `--config.` overrides given as ({evaluator: {field: value}}, {run field: value});
  ValueError naming one that sets neither."""
  sections: dict[str, dict[str, Any]] = {}
  run_fields = {}
  for path, value in overrides.items():
    parts = path.split('.')
    if path in evaluator_settings.RUN_FIELDS:
      run_fields[path] = value
    elif len(parts) == 3 and parts[0] == _EVALUATORS_SECTION and all(parts):
      sections.setdefault(parts[1], {})[parts[2]] = value
    else:
      raise ValueError(
          f'--config.{path}: evaluate reads --config.{_EVALUATORS_SECTION}.NAME.FIELD and '
          f'{", ".join(f"--config.{flag}" for flag in evaluator_settings.RUN_FIELDS)} only.'
      )
  return sections, run_fields


def settings(
    run_config: ml_collections.ConfigDict | None,
    given: Mapping[str, Mapping[str, Any]],
    given_run_fields: Mapping[str, Any],
) -> tuple[dict[str, dict[str, Any]], types.SimpleNamespace]:
  """Each evaluator's settings and the run fields they read: the run's own (`run_config`; None:
  the defaults), with those given on the command line (`given_settings`) over them."""
  config = config_lib.defaults() if run_config is None else run_config
  sections = {
      name: {**dict(config.get(_EVALUATORS_SECTION, {}).get(name) or {}), **given.get(name, {})}
      for name in {*config.get(_EVALUATORS_SECTION, {}), *given}
  }
  run_fields = {flag: config.get(flag) for flag in evaluator_settings.RUN_FIELDS}
  return sections, types.SimpleNamespace(**{**run_fields, **given_run_fields})


def main(argv) -> None:
  del argv
  # pylint: disable=g-import-not-at-top
  from vit_jax import evaluators
  from vit_jax.data import storage
  from vit_jax.evaluators import standalone
  from vit_jax.workdir import disk_writes
  from vit_jax.workdir import reader
  from vit_jax.workdir import run_files
  # pylint: enable=g-import-not-at-top
  overrides = config_flags.get_override_values(flags.FLAGS['config'])
  given, given_run_fields = given_settings(overrides)
  names = _EVALUATORS.value or (
      [_TEST_SETS] if 'eval_sets' in given_run_fields else list(_DEFAULT_EVALUATORS)
  )
  unused = [name for name in given if name not in names]
  if unused:
    raise ValueError(
        f'--config.{_EVALUATORS_SECTION}.{unused[0]} sets an evaluator that is not run: '
        f'--evaluators={",".join(names + unused)} runs it.'
    )
  # The run's settings, and its evaluators of your own (its config.json `imports`), first.
  run_config = reader.Workdir(flags.FLAGS.workdir).config() if flags.FLAGS.workdir else None
  sections, run_fields = settings(run_config, given, given_run_fields)
  # The run scored its own eval split; the weights read may differ.
  own_split = {_TEST_SETS: {'own_split': False}}
  chosen = [
      evaluators.create(name, {**sections.get(name, {}), **own_split.get(name, {})}, run=run_fields)
      for name in names
  ]
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
    standalone.evaluate_weights(run, chosen, out_dir)


if __name__ == '__main__':
  runtime.run(main)
