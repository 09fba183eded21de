r"""Runs an ablation grid (configs/ablations.py) and prints one table.

  python -m vit_jax.ablate --config=configs/ablations.py:grid=cait_layerscale --workdir=/tmp/abl

Each variant (the config's `variants`: name -> model fields) trains in WORKDIR/NAME with the
config's recipe, then the table gives per variant: test accuracy, parameters, XLA's FLOPs of one
training step, the training step's time (median of 3 blocks of `--timing_steps` steps, the
variants' blocks alternating in one process after every training) and how many blocks of the
main self-attention stage are "similar" to the one before (DeepViT's collapse metric,
`vit_jax.analysis.collapse`, on `--collapse_images` test images).

With `--seeds=N` every variant trains N times (seeds config.seed … config.seed + N - 1, in
WORKDIR/NAME/seed_K): the table gives the mean test accuracy ± its standard deviation over the
seeds and the mean similar-block count, so a difference can be told from seed noise. A rerun
resumes: finished runs are evaluated again, not retrained.
"""

import sys

from absl import flags
from ml_collections import config_flags

from vit_jax.process import exits
from vit_jax.process import runtime
from vit_jax.training import run_sequence

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'A grid config: configs/ablations.py ' 'with its grid=NAME.', lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    'workdir',
    None,
    'Directory of the runs, one per variant (and seed), and ablation.json.',
    required=True,
)
_TIMING_STEPS = flags.DEFINE_integer(
    'timing_steps',
    5,
    'Training steps per timed block; each ' 'variant runs 3 blocks, alternating with the others.',
    lower_bound=1,
)
_COLLAPSE_IMAGES = flags.DEFINE_integer(
    'collapse_images', 64, 'Test images for the collapse ' 'metric.', lower_bound=1
)
_SEEDS = flags.DEFINE_integer(
    'seeds', 1, 'Trainings per variant, each with its own seed.', lower_bound=1
)
flags.mark_flag_as_required('config')


def main(argv) -> None:
  del argv
  from vit_jax.analysis import ablation  # pylint: disable=g-import-not-at-top

  try:
    with run_sequence.Stopper() as stopper:  # Interruptions stop between trainings.
      rows = ablation.run_grid(
          _CONFIG.value,
          _WORKDIR.value,
          timing_steps=_TIMING_STEPS.value,
          collapse_images=_COLLAPSE_IMAGES.value,
          seeds=_SEEDS.value,
          stopper=stopper,
      )
  except (run_sequence.Interrupted, KeyboardInterrupt) as e:
    print(
        str(e) or 'Interrupted; rerun the same command to resume where it stopped.', file=sys.stderr
    )
    sys.exit(exits.EXIT_PREEMPTED)
  print(ablation.table(rows))


if __name__ == '__main__':
  exits.end_at_once_on_signals(
      'stopped before any training started. Rerun the same command to resume.'
  )
  runtime.run(main)
