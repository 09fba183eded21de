r"""Looks inside the attention of a trained run: `python -m vit_jax.analyze --workdir=W`.

Reads W/config.json and the newest checkpoint of W (or --step), runs the model on the first
--num_images images of the eval split and writes PNGs and analysis.json under W/analysis/:

  collapse   cross-layer similarity of attention maps (DeepViT), similar-block count, inter-head
             similarity: collapse.png (one per stage of equally shaped layers)
  maps       the centre token's attention (class token's for class attention) per layer x head,
             averaged over images: maps.png
  rollout    attention rollout of the class / distillation tokens (CaiT: through class attention;
             SA-conv: the centre token) and the last layer's attention of the same tokens,
             alpha-blended over the images: rollout.png
  distance   mean attention distance per head and layer: distance.png
  centres    SA-conv: 50 % / 90 % mass contours of every head for the centre query: centres.png
  pruning    SA-conv Gaussian heads: degenerate heads, the pruned model's size, FLOPs and
             accuracy, and a run in W/analysis/pruned_RULE that the ordinary loop fine-tunes
             (--finetune_steps; analyse it with --workdir=W/analysis/pruned_RULE)

--what=all (default) runs those that apply to the model. The run's EMA weights are analysed where
it kept an EMA (analysis.json says which); --nouse_ema analyses the raw ones.
"""

from absl import flags

from vit_jax.process import extensions
from vit_jax.process import runtime
from vit_jax.weights import source_flags

_WORKDIR = flags.DEFINE_string('workdir', None, 'Work directory of a training run.', required=True)
_WHAT = flags.DEFINE_list(
    'what',
    ['all'],
    'Analyses: all (those that apply to the model), or any ' 'of those listed above.',
)
flags.register_validator(
    'what', lambda names: len(names) > 0, 'must name at least one analysis, or all (the default).'
)
_STEP = flags.DEFINE_integer(
    'step', None, 'Checkpoint step to analyse (default: newest).', lower_bound=0
)
_NUM_IMAGES = flags.DEFINE_integer(
    'num_images',
    None,
    'Eval images to average over (default: as many as a run records of its eval split).',
    lower_bound=1,
)
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 16, 'Images per forward pass.', lower_bound=1)
_WINDOW = flags.DEFINE_integer('window', 11, 'Cells shown around the query pixel.', lower_bound=1)
_THRESHOLD = flags.DEFINE_float(
    'threshold',
    0.9,
    'Similarity (of attention maps, in [0, 1]) above which a block is collapsed.',
    lower_bound=0.0,
    upper_bound=1.0,
)
_NEIGHBOURS = flags.DEFINE_integer(
    'neighbours', 3, 'Largest k of the k-next-block similarity.', lower_bound=1
)
_PRUNING_RULE = flags.DEFINE_enum(
    'pruning_rule',
    'official',
    ['official', 'paper'],
    'Condition-number threshold: official code 1e3, paper 1e5.',
)
_FINETUNE_STEPS = flags.DEFINE_integer(
    'finetune_steps', 0, 'Steps to fine-tune the pruned model (0: only write it).', lower_bound=0
)
_FINETUNE_LR_FACTOR = flags.DEFINE_float(
    'finetune_lr_factor', 0.1, 'Fine-tuning learning rate as a fraction of base_lr.'
)
flags.register_validator(
    'finetune_lr_factor', lambda factor: factor > 0, 'must be > 0 (a fraction of base_lr).'
)
_DATA_DIR = source_flags.define_data_dir()
_USE_EMA = flags.DEFINE_bool(
    'use_ema',
    True,
    "Analyse the run's EMA weights where it kept an " 'EMA; --nouse_ema analyses the raw ones.',
)
extensions.define_allow_imports_flag()  # Reading a run imports its modules only with it.
flags.adopt_module_key_flags(extensions)


def main(argv) -> None:
  del argv
  # pylint: disable=g-import-not-at-top
  from vit_jax.analysis import report as report_lib
  from vit_jax.data import storage
  # pylint: enable=g-import-not-at-top

  with storage.runs_read_only():  # The data dir the run names is read, never written.
    report_lib.analyze(
        _WORKDIR.value,
        _WHAT.value,
        step=_STEP.value,
        num_images=_NUM_IMAGES.value,
        batch_size=_BATCH_SIZE.value,
        window=_WINDOW.value,
        threshold=_THRESHOLD.value,
        neighbours=_NEIGHBOURS.value,
        pruning_rule=_PRUNING_RULE.value,
        finetune_steps=_FINETUNE_STEPS.value,
        finetune_lr_factor=_FINETUNE_LR_FACTOR.value,
        use_ema=_USE_EMA.value,
        data_dir=_DATA_DIR.value,
    )


if __name__ == '__main__':
  runtime.run(main)
