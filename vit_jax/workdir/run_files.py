"""The files of a run's work directory, by name, and config.json's text.

WORKDIR/
  run.lock                 the lock of the run writing here (`vit_jax.training.run_writer`)
  config.json              the resolved config (`RunWriter.start` writes `config_json`,
                           `Workdir.config` reads; `imports`: the modules of your own it
                           uses, `vit_jax.process.extensions`)
  dataset.json             what the run's data was (its classes by name, its split sizes) and
                           eval_images.npz, its first eval images as the model sees them: side
                           commands read these, not the data, which need not stay
  checkpoints/<step>/      orbax: `state` (the training state) and `meta` ({'model': name,
                           'checksums': of the state's arrays, checked by every read})
  unreadable_checkpoints/  checkpoints that resuming found unreadable, set aside with reason.txt
  results.json             final metrics of the run and of `vit_jax.evaluate` (`write_results`)
  results.lock             the lock under which each writer merges its metrics into results.json
  .pin-*/                  a checkpoint of a live run pinned while a side command reads it
  eval_report.json         what `eval_only` scored (`write_json`)
  analysis/                `vit_jax.analyze`'s figures, analysis.json and pruned runs
  events.out.tfevents.*    TensorBoard summaries
"""

import json

import ml_collections

from vit_jax.process import extensions

LOCK_FILE = 'run.lock'
CONFIG_FILE = 'config.json'
CHECKPOINT_DIR = 'checkpoints'
DATASET_FILE = 'dataset.json'
EVAL_IMAGES_FILE = 'eval_images.npz'
RECORDED_EVAL_IMAGES = 64  # How many a run records: what analysis averages over by default.
UNREADABLE_DIR = 'unreadable_checkpoints'  # Beside CHECKPOINT_DIR: checkpoints set aside.
RESULTS_FILE = 'results.json'
RESULTS_LOCK_FILE = 'results.lock'
RESULTS_FILES = (RESULTS_FILE, RESULTS_LOCK_FILE)  # What a writer of results writes.
RUN_FILES = (LOCK_FILE, CONFIG_FILE, DATASET_FILE, EVAL_IMAGES_FILE, *RESULTS_FILES)  # A run's.
RESULTS_STEPS = 'steps'  # In results.json: the step each metric was measured at.
ANALYSIS_DIR = 'analysis'
ROOM = 'write access and room for its config, logs and checkpoints'  # What a run needs.


def config_json(config: ml_collections.ConfigDict) -> str:
  """The config.json of a run of `config`: the config, and under `imports` the modules outside
  vit_jax that registered what it uses (`extensions.recorded_imports`), when there are any."""
  imports = extensions.recorded_imports(config)
  if not imports:
    return config.to_json_best_effort(indent=2)
  return json.dumps(
      {**json.loads(config.to_json_best_effort()), extensions.IMPORTS: imports}, indent=2
  )
