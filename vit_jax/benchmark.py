r"""Measures a config's model and the machine at hand; `--mode` picks what is measured.

  python -m vit_jax.benchmark --config=configs/vit.py:variant=Ti/4 --batch=64 --vs_timm
  python -m vit_jax.benchmark --config=configs/vit.py:variant=B/16 --dtype=bfloat16 --batch=256
  python -m vit_jax.benchmark --mode=family_table --batch=32
  python -m vit_jax.benchmark --mode=layers_table --layers_models=cait_xxs24,deepvit_32b --batch=4
  python -m vit_jax.benchmark --mode=memory --config=configs/vit.py:variant=L/16 --devices=8 \
      --config.mesh.fsdp=8
  python -m vit_jax.benchmark --mode=input_pipeline --batch=96 --vs_timm \
      --config=configs/deit.py:variant=S,dataset=folder:/path/to/images
  python -m vit_jax.benchmark --mode=device_report --report_json=/tmp/device_report.json
  python -m vit_jax.benchmark --mode=device_report --report_rows=attention,throughput

Modes:
  step            (default) images/s of the training step and of inference, compile times, XLA's
                  memory and FLOP counts, MFU with a known peak; with --vs_timm beside timm's
                  twin (`vit_jax.benchmarks.training_step`)
  family_table    each family's training step next to a plain ViT of equal width, depth and heads
  layers_table    deep models' training step with scan-over-layers and remat off and on, each in
                  a fresh process (`vit_jax.benchmarks.tables`)
  memory          what one device of a mesh of --devices devices holds for a training step, from
                  compilation alone on as many forced CPU devices (`vit_jax.benchmarks.memory`)
  input_pipeline  the training input pipeline alone: images/s and time to a first batch; with
                  --vs_timm beside timm's transforms in a torch DataLoader
                  (`vit_jax.benchmarks.input_speed`)
  device_report   what this accelerator runs, in one table (`vit_jax.benchmarks.device_report`)

Steps run in blocks of `--steps`, each after `--warmup` untimed steps; the time per step is the
median over `--repeats` blocks. Contenders alternate block by block in this one process, so a busy
machine slows them alike: compare ratios, and read absolute numbers with the load average.
"""

import json
import os
import re
import sys

from absl import flags
from ml_collections import config_flags

from vit_jax.process import runtime

MODES = ('step', 'family_table', 'layers_table', 'memory', 'input_pipeline', 'device_report')

_MODE = flags.DEFINE_enum('mode', 'step', MODES, 'What to measure (see above).')
_CONFIG = config_flags.DEFINE_config_file(
    'config',
    os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'vit.py:variant=Ti/4'),
    'Training configuration file (default: configs/vit.py:variant=Ti/4).',
    lock_config=False,
)
_BATCH = flags.DEFINE_integer(
    'batch', None, "Batch size (default: the config's batch_size).", lower_bound=1
)
_STEPS = flags.DEFINE_integer('steps', 5, 'Timed steps per block.', lower_bound=1)
_WARMUP = flags.DEFINE_integer(
    'warmup', 2, 'Untimed steps before every timed block.', lower_bound=0
)
_REPEATS = flags.DEFINE_integer(
    'repeats', 3, 'Timed blocks per contender; the median counts.', lower_bound=1
)
_MODEL = flags.DEFINE_string(
    'model',
    None,
    "Registry name replacing config.model.name (the config's model overrides are dropped).",
)
_IMAGE_SIZE = flags.DEFINE_integer(
    'image_size', None, "Input resolution (default: the config's).", lower_bound=1
)
_DTYPE = flags.DEFINE_enum(
    'dtype',
    None,
    ['float32', 'bfloat16', 'float16'],
    "Computation dtype (default: the config's); parameters stay float32 (timm: autocast).",
)
_NUM_CLASSES = flags.DEFINE_integer(
    'num_classes', 10, 'Classes of the random labels.', lower_bound=1
)
_THREADS = flags.DEFINE_integer(
    'threads',
    None,
    'Run on the first N CPUs only, for XLA and torch alike (default: every CPU this process '
    'may use).',
    lower_bound=1,
)
_CPU_TUNING = flags.DEFINE_bool(
    'cpu_tuning',
    True,
    'Apply vit_jax.process.runtime.configure() as the training command does; --nocpu_tuning '
    'measures stock settings.',
)
_VS_TIMM = flags.DEFINE_bool(
    'vs_timm',
    False,
    "step, input_pipeline: also time timm's twin (a VisionTransformer of the same shape with "
    'torch AdamW; its transforms in a DataLoader).',
)
flags.DEFINE_alias('vs-timm', 'vs_timm')
_INFERENCE = flags.DEFINE_bool('inference', True, 'step: also time inference steps.')
_PEAK_TFLOPS = flags.DEFINE_float(
    'peak_tflops',
    None,
    "step: the device's peak TFLOP/s at --dtype, for model FLOPs utilisation (default: "
    'device_report.PEAK_TFLOPS for bfloat16).',
)
flags.register_validator(
    'peak_tflops',
    lambda peak: peak is None or peak > 0,
    'must be > 0 (TFLOP/s of the device at --dtype).',
)
_FAMILY_MODELS = flags.DEFINE_list(
    'family_models',
    None,
    'family_table: registry names, at --image_size (default: tables.FAMILY_MODELS, each at its '
    'own).',
)
flags.register_validator(
    'family_models',
    lambda names: names is None or len(names) > 0,
    'must name at least one registry model (or be left out for tables.FAMILY_MODELS).',
)
_LAYERS_MODELS = flags.DEFINE_list(
    'layers_models',
    ['cait_xxs24', 'deepvit_32b'],
    'layers_table: registry names (at --image_size, default 224).',
)
flags.register_validator(
    'layers_models', lambda names: len(names) > 0, 'must name at least one registry model.'
)
_LAYERS_ROW = flags.DEFINE_string(
    'layers_row',
    None,
    'layers_table: MODEL:SCAN:REMAT (0 or 1), one row, printed as JSON (the table runs one '
    'process each).',
)
flags.register_validator(
    'layers_row',
    lambda row: row is None or re.fullmatch(r'[\w.-]+:[01]:[01]', row) is not None,
    'must be MODEL:SCAN:REMAT with 0 or 1 for each switch, e.g. cait_xxs24:1:0.',
)
_DEVICES = flags.DEFINE_integer(
    'devices',
    None,
    'memory: devices of the mesh (default: config.mesh.fsdp).',
    lower_bound=1,
)
_LATE_STEP = flags.DEFINE_integer(
    'late_step',
    None,
    'input_pipeline: the late start step whose first batch is timed (default: the first step '
    'after 100,000 consumed examples).',
    lower_bound=1,
)
_DATA_DIR = flags.DEFINE_string('data_dir', None, "TFDS data directory (default: the config's).")
_REDUCED = flags.DEFINE_bool('reduced', None, 'device_report: tiny sizes (default: on CPU).')
_REPORT_JSON = flags.DEFINE_string(
    'report_json', 'device_report.json', 'device_report: where the table is written as JSON.'
)
_REPORT_ROWS = flags.DEFINE_list(
    'report_rows',
    None,
    'device_report: the groups of rows to measure, of families, attention, throughput, input '
    '(default: every group).',
)


def _before_libraries() -> None:
  """What must precede JAX and torch: the CPUs to run on, the mesh's forced CPU devices."""
  if _THREADS.value is not None:
    cpus = sorted(os.sched_getaffinity(0))
    if not 1 <= _THREADS.value <= len(cpus):
      raise ValueError(f'--threads={_THREADS.value} must be in [1, {len(cpus)}].')
    os.sched_setaffinity(0, cpus[: _THREADS.value])  # XLA sizes its thread pool from this.
  if _MODE.value == 'memory':
    devices = _DEVICES.value or _CONFIG.value.mesh.fsdp
    if devices < 1:
      raise ValueError(f'--devices={devices} must be >= 1.')
    os.environ['JAX_PLATFORMS'] = 'cpu'
    os.environ['XLA_FLAGS'] = (
        f'{os.environ.get("XLA_FLAGS", "")} --xla_force_host_platform_device_count={devices}'
    ).strip()


def _layers_row_command(row: str) -> list[str]:
  """This command with the same flags, measuring one row of the layers table."""
  forwarded = [a for a in sys.argv[1:] if not a.startswith(('--mode', '--layers_row'))]
  return [sys.executable, '-m', 'vit_jax.benchmark', *forwarded, f'--layers_row={row}']


def main(argv) -> None:
  del argv
  mode, config = _MODE.value, _CONFIG.value
  if mode == 'device_report':  # Its model rows need neither TensorFlow nor timm.
    from vit_jax.benchmarks import device_report  # pylint: disable=g-import-not-at-top

    if _CPU_TUNING.value:
      runtime.configure()
    device_report.run(
        reduced=_REDUCED.value,
        json_path=_REPORT_JSON.value,
        groups=tuple(_REPORT_ROWS.value or device_report.GROUPS),
    )
    return
  # pylint: disable=g-import-not-at-top
  from vit_jax import models
  from vit_jax.benchmarks import input_speed
  from vit_jax.benchmarks import memory
  from vit_jax.benchmarks import tables
  from vit_jax.benchmarks import training_step
  # pylint: enable=g-import-not-at-top
  if _VS_TIMM.value:
    if mode == 'input_pipeline':
      input_speed.check_vs_timm(config)
    training_step.import_torch_and_timm()
  if _CPU_TUNING.value:
    runtime.configure()
  if _DATA_DIR.value:
    config.data_dir = _DATA_DIR.value
  if _MODEL.value is not None and _MODEL.value not in models.names():
    raise ValueError(f'--model={_MODEL.value!r}: unknown; registered: {sorted(models.names())}.')
  for flag in (_LAYERS_MODELS, _FAMILY_MODELS):
    unknown = [n for n in flag.value or () if n not in models.names()]
    if unknown:
      raise ValueError(
          f'--{flag.name}: unknown models {unknown}; registered: {sorted(models.names())}.'
      )
  deep = mode == 'layers_table' or _LAYERS_ROW.value  # ImageNet-sized models: smaller defaults.
  config = training_step.benchmark_config(
      config,
      batch=_BATCH.value or (8 if deep else config.batch_size),
      image_size=_IMAGE_SIZE.value or (224 if deep else config.image_size),
      dtype=None if mode == 'input_pipeline' else _DTYPE.value,
      model_name=None if mode == 'input_pipeline' else _MODEL.value,
  )
  timing = dict(steps=_STEPS.value, warmup=_WARMUP.value, repeats=_REPEATS.value)
  if _LAYERS_ROW.value:
    name, scan, remat = _LAYERS_ROW.value.split(':')
    print(
        json.dumps(
            tables.layers_row(
                config,
                name,
                scan == '1',
                remat == '1',
                num_classes=_NUM_CLASSES.value,
                steps=_STEPS.value,
                warmup=_WARMUP.value,
            )
        )
    )
  elif mode == 'step':
    training_step.run_single(
        config,
        num_classes=_NUM_CLASSES.value,
        vs_timm=_VS_TIMM.value,
        inference=_INFERENCE.value,
        peak_tflops=_PEAK_TFLOPS.value,
        **timing,
    )
  elif mode == 'family_table':
    sizes = (
        {name: config.image_size for name in _FAMILY_MODELS.value}
        if _FAMILY_MODELS.value
        else tables.FAMILY_MODELS
    )
    tables.run_family_table(config, sizes=sizes, num_classes=_NUM_CLASSES.value, **timing)
  elif mode == 'layers_table':
    tables.run_layers_table(config, names=_LAYERS_MODELS.value, row_command=_layers_row_command)
  elif mode == 'memory':
    memory.run_memory(config, num_classes=_NUM_CLASSES.value)
  elif mode == 'input_pipeline':
    input_speed.run(config, vs_timm=_VS_TIMM.value, late_step=_LATE_STEP.value, **timing)


if __name__ == '__main__':
  runtime.run(main, before_libraries=_before_libraries)
