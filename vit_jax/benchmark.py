r"""Training and inference throughput of a config's model, optionally against timm.

  python -m vit_jax.benchmark --config=configs/vit.py:variant=Ti/4 --batch=64 --vs_timm
  python -m vit_jax.benchmark --family_table --batch=32
  python -m vit_jax.benchmark --layers_table --layers_models=cait_xxs24,deepvit_32b --batch=4
  python -m vit_jax.benchmark --config=configs/vit.py:variant=B/16 --dtype=bfloat16 --batch=256
  python -m vit_jax.benchmark --input_pipeline --batch=96 --vs_timm \
      --config=configs/deit.py:variant=S,dataset=folder:/path/to/images
  python -m vit_jax.benchmark --config=configs/vit.py:variant=L/16 --memory_only --devices=8 \
      --config.mesh.fsdp=8
  python -m vit_jax.benchmark --device_report --report_json=/tmp/device_report.json

A training step is `vit_jax.training.steps`'s (forward, loss, gradients, optimizer update, metrics) on
random images; an inference step is a jitted forward pass with train=False. Every step is blocked
on until its results exist. Steps run in blocks of `--steps`, each after `--warmup` untimed steps;
the reported time per step is the median over `--repeats` blocks of each block's mean. Contenders
(ours and timm, or a family and its plain ViT) alternate block by block in this one process, so a
busy machine slows them alike; compare ratios, and read absolute numbers with the load average.
The spread of the blocks, and of the ratios of blocks that ran back to back, is printed too: a
wide spread means a noisy machine, and a number worth measuring again.

Besides images/s it prints compile times, XLA's memory account of the compiled training step, the
peak host (and, where the runtime reports it, device) memory, XLA's FLOP count of a step and the
achieved FLOP/s; with a known peak (`--peak_tflops`, or `device_report.PEAK_TFLOPS` for bfloat16 on
accelerators) also the model FLOPs utilisation. `--layers_table` measures deep models with and
without scan-over-layers and remat, each combination in a fresh process. `--input_pipeline` times
the training input pipeline instead, alone (`vit_jax.benchmarks.input_speed`). `--device_report` checks
and measures what the accelerator at hand runs, in one table (`vit_jax.benchmarks.device_report`): every
family's bfloat16 training, cuDNN against XLA attention, ViT-B/16's images/s and MFU, and the input
pipeline against the step's need.

`--memory_only` runs nothing: for a mesh of `--devices` devices with the config's `mesh.fsdp`, it
prints what one device holds (parameters, optimizer state, EMA, all of the training state, in
their `vit_jax.parallel.sharding` layouts) and XLA's account of the compiled training step (arguments,
temporaries, all live at once), compiled for as many forced CPU devices from abstract shapes. So
what fits on a GPU or TPU can be seen on a laptop before renting it; the state's bytes are exact
on every backend, the temporaries are the CPU compiler's (an accelerator's fusions differ).
"""

import dataclasses
import json
import os
import re
import resource
import subprocess
import sys
import time
from typing import Any, Callable

from absl import app
from absl import flags
from ml_collections import config_flags

from vit_jax import config as config_lib
from vit_jax.benchmarks import stopwatch

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/vit.py:variant=Ti/4', 'Training configuration file.', lock_config=False)
_BATCH = flags.DEFINE_integer('batch', None, "Batch size (default: the config's batch_size).")
_STEPS = flags.DEFINE_integer('steps', 5, 'Timed steps per block.')
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed steps before every timed block.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed blocks per contender; the median counts.')
_MODEL = flags.DEFINE_string('model', None, 'Registry name replacing config.model.name (the '
                             "config's model overrides are dropped).")
_IMAGE_SIZE = flags.DEFINE_integer('image_size', None, "Input resolution (default: the config's).")
_DTYPE = flags.DEFINE_enum('dtype', None, ['float32', 'bfloat16', 'float16'],
                           "Computation dtype (default: the config's); parameters stay float32 "
                           '(timm: autocast).')
_NUM_CLASSES = flags.DEFINE_integer('num_classes', 10, 'Classes of the random labels.')
_THREADS = flags.DEFINE_integer('threads', None, 'Run on the first N CPUs only, for XLA and torch '
                                'alike (default: every CPU this process may use).')
_CPU_TUNING = flags.DEFINE_bool('cpu_tuning', True, 'Apply vit_jax.runtime.configure() as the '
                                'training command does; --nocpu_tuning measures stock settings.')
_VS_TIMM = flags.DEFINE_bool('vs_timm', False, "Also time timm's VisionTransformer of the same "
                             'depth, width, heads, patch and image size with torch AdamW.')
flags.DEFINE_alias('vs-timm', 'vs_timm')
_INFERENCE = flags.DEFINE_bool('inference', True, 'Also time inference steps.')
_FAMILY_TABLE = flags.DEFINE_bool('family_table', False, "Time each family's training step next "
                                  'to a plain ViT of equal width, depth and heads.')
_FAMILY_MODELS = flags.DEFINE_list('family_models', None, 'Registry names for --family_table, '
                                   'at --image_size (default: FAMILY_MODELS, each at its own).')
_LAYERS_TABLE = flags.DEFINE_bool('layers_table', False, 'Time and size the training step of '
                                  '--layers_models with scan_layers and remat off and on.')
_LAYERS_MODELS = flags.DEFINE_list('layers_models', ['cait_xxs24', 'deepvit_32b'],
                                   'Registry names for --layers_table (at --image_size, default '
                                   '224 there).')
_LAYERS_ROW = flags.DEFINE_string('layers_row', None, 'MODEL:SCAN:REMAT (0 or 1): one row of '
                                  '--layers_table, printed as JSON (used by --layers_table).')
_MEMORY_ONLY = flags.DEFINE_bool('memory_only', False, 'Print what one device of a mesh of '
                                  '--devices devices (config.mesh.fsdp of them in each fsdp '
                                  'group) holds for a training step, from compilation alone on '
                                  'as many forced CPU devices: nothing is allocated or run.')
_DEVICES = flags.DEFINE_integer('devices', None, 'Devices of the mesh sized by --memory_only '
                                '(default: config.mesh.fsdp).')
_PEAK_TFLOPS = flags.DEFINE_float('peak_tflops', None, "The device's peak TFLOP/s at --dtype, "
                                  'for model FLOPs utilisation (default: PEAK_TFLOPS).')
_INPUT_PIPELINE = flags.DEFINE_bool('input_pipeline', False, 'Time the training input pipeline '
                                    'alone (vit_jax.benchmarks.input_speed): images/s and the time to a '
                                    'first batch; with --vs_timm beside timm\'s transforms and a '
                                    'torch DataLoader on the same images.')
_LATE_STEP = flags.DEFINE_integer('late_step', None, '--input_pipeline: the late start step whose '
                                  'first batch is timed (default: the first step after 100,000 '
                                  'consumed examples).')
_DATA_DIR = flags.DEFINE_string('data_dir', None, "TFDS data directory (default: the config's).")
_DEVICE_REPORT = flags.DEFINE_bool('device_report', False, 'Check and measure what this '
                                   'accelerator runs (vit_jax.benchmarks.device_report): one table, also '
                                   'written as JSON to --report_json.')
_REDUCED = flags.DEFINE_bool('reduced', None, '--device_report at tiny sizes (default: on CPU).')
_REPORT_JSON = flags.DEFINE_string('report_json', 'device_report.json',
                                   '--device_report: where the table is written as JSON.')

# One model per family at its native resolution (the /4 and SA-conv models are CIFAR-sized).
FAMILY_MODELS = {'deit_ti16': 224, 'cait_ti4': 32, 'deepvit_ti4': 32, 't2t_vit_t_14': 224,
                 't2t_vit_14': 224, 'sa_conv_quadratic': 32, 'sa_conv_gaussian': 32,
                 'sa_conv_learned': 32, 'sa_conv_learned_content': 32}


def peak_host_memory_mib() -> float:
  """Peak resident set size of this process so far (ru_maxrss is in KiB on Linux)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_device_memory() -> str:
  """Peak bytes in use on the first device, where its runtime reports them (not on CPU)."""
  import jax  # pylint: disable=g-import-not-at-top
  stats = jax.devices()[0].memory_stats()
  if not stats or 'peak_bytes_in_use' not in stats:
    return 'n/a (not reported by this device)'
  return f'{stats["peak_bytes_in_use"] / 2 ** 20:.0f} MiB'


@dataclasses.dataclass
class Contender:
  """A model that takes training and inference steps, each blocked on until done."""
  name: str
  train_steps: Callable[[int], None]
  infer_steps: Callable[[int], None]
  compile_s: dict[str, float] = dataclasses.field(default_factory=dict)
  model: Any = None
  num_params: int = 0
  train_flops: float | None = None  # XLA's count for one training step.
  train_memory_mib: dict[str, float] = dataclasses.field(default_factory=dict)


def benchmark_config(config, *, batch: int, image_size: int, dtype: str | None,
                     model_name: str | None):
  """A copy of `config` with the benchmark's batch, image size, model and dtype.

  The compute dtype ends up in `config.dtype` alone (`config.create_model` gives it to every
  model), so the tables' models, which replace `config.model`, keep it.
  """
  config = config.copy_and_resolve_references()
  config.batch_size = batch
  config.image_size = image_size
  config.dtype = dtype or config.model.get('dtype') or config.dtype
  if model_name is not None:
    config.model = type(config.model)({'name': model_name})
  elif 'dtype' in config.model:
    del config.model['dtype']
  return config


def compiled_memory_bytes(compiled) -> dict[str, int]:
  """XLA's memory account of a compiled computation, per device: its arguments, temporaries,
  and everything live at once (donated arguments are reused by the outputs)."""
  memory = compiled.memory_analysis()
  if memory is None:
    return {}
  total = (memory.temp_size_in_bytes + memory.argument_size_in_bytes
           + memory.output_size_in_bytes - memory.alias_size_in_bytes)
  return {'arguments': memory.argument_size_in_bytes, 'temp': memory.temp_size_in_bytes,
          'total': total}


def compiled_memory_mib(compiled) -> dict[str, float]:
  """`compiled_memory_bytes`' temporaries and total in MiB."""
  memory = compiled_memory_bytes(compiled)
  return {key: memory[key] / 2**20 for key in ('temp', 'total') if key in memory}


def jax_contender(config, num_classes: int, name: str | None = None,
                  inference: bool = True) -> Contender:
  """Our model under `vit_jax.training.steps`'s training step, jitted with the state donated."""
  # pylint: disable=g-import-not-at-top
  import jax
  import jax.numpy as jnp
  import numpy as np
  from vit_jax.benchmarks import device_report
  from vit_jax.training import optim
  from vit_jax.training import steps
  # pylint: enable=g-import-not-at-top
  model = config_lib.create_model(config, num_classes)
  schedule = optim.learning_rate_schedule(optim.ScheduleSettings.from_config(config), max(int(config.total_steps), 2), 1)
  tx = optim.create_optimizer(optim.OptimizerSettings.from_config(config), schedule, model)
  rng = np.random.default_rng(0)
  size, batch_size = config.image_size, config.batch_size
  batch = {'image': jnp.asarray(rng.standard_normal((batch_size, size, size, 3), np.float32)),
           'label': jnp.asarray(rng.integers(0, num_classes, batch_size, np.int32))}
  start = time.perf_counter()
  state = jax.block_until_ready(jax.jit(lambda: steps.init_state(
      model, tx, steps.init_rngs(config.seed), image_size=config.image_size,
      ema=bool(config.ema_decay)))())
  compile_s = {'init': time.perf_counter() - start}

  start = time.perf_counter()
  lowered = jax.jit(steps.make_train_step(model, tx, steps.StepSettings.from_config(config), num_classes),
                    donate_argnums=0).lower(state, batch)
  compile_s['lower'] = time.perf_counter() - start
  start = time.perf_counter()
  train_step = lowered.compile()
  compile_s['train'] = time.perf_counter() - start

  def forward(params, batch_stats, images):
    variables = {'params': params, **({'batch_stats': batch_stats} if batch_stats else {})}
    return steps.classifier_logits(model.apply(variables, images, train=False))

  infer = None
  if inference:
    start = time.perf_counter()
    infer = jax.jit(forward).lower(state.params, state.batch_stats, batch['image']).compile()
    compile_s['inference'] = time.perf_counter() - start
  holder = {'state': state}

  def train_steps(n: int) -> None:
    for _ in range(n):
      holder['state'], metrics = train_step(holder['state'], batch)
      jax.block_until_ready((holder['state'], metrics))

  def infer_steps(n: int) -> None:
    for _ in range(n):
      state = holder['state']
      jax.block_until_ready(infer(state.params, state.batch_stats, batch['image']))

  return Contender(name or config.model.name, train_steps, infer_steps, compile_s, model,
                   sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params)),
                   device_report.compiled_flops(train_step), compiled_memory_mib(train_step))


def byte_size(count: int) -> str:
  """'1.5 GiB', '20.0 MiB', '3.2 KiB'."""
  for unit, size in (('GiB', 2**30), ('MiB', 2**20)):
    if count >= size:
      return f'{count / size:,.1f} {unit}'
  return f'{count / 2**10:,.1f} KiB'


def memory_per_device(config, num_classes: int) -> dict[str, int]:
  """Bytes that one device of a (data × fsdp) mesh over every device holds for a training step.

  The training state's parts from their shapes and layouts (`vit_jax.parallel.sharding`), and XLA's
  account of the compiled step: its arguments (state and batch), its temporaries, and all that
  is live at once (the state is donated, so outputs reuse it). Abstract evaluation and
  compilation only: no array is allocated, so any model can be sized on any machine.
  """
  # pylint: disable=g-import-not-at-top
  import jax
  import jax.numpy as jnp
  from vit_jax.parallel import sharding
  from vit_jax.training import optim
  from vit_jax.training import steps
  # pylint: enable=g-import-not-at-top
  model = config_lib.create_model(config, num_classes)
  tx = optim.create_optimizer(optim.OptimizerSettings.from_config(config), optim.learning_rate_schedule(optim.ScheduleSettings.from_config(config), 2, 1), model)
  mesh = sharding.make_mesh(config.mesh.fsdp)
  state = jax.eval_shape(lambda: steps.init_state(
      model, tx, steps.init_rngs(config.seed), image_size=config.image_size,
      ema=bool(config.ema_decay)))
  layout = sharding.fsdp_shardings(state, mesh, config.mesh.fsdp_min_size)
  size, batch_size = config.image_size, config.batch_size
  spread = sharding.batch_sharding(mesh)
  batch = {'image': jax.ShapeDtypeStruct((batch_size, size, size, 3), jnp.float32,
                                         sharding=spread),
           'label': jax.ShapeDtypeStruct((batch_size,), jnp.int32, sharding=spread)}
  step = steps.sharded_train_step(model, tx, steps.StepSettings.from_config(config), num_classes, mesh, layout)
  memory = compiled_memory_bytes(step.lower(sharding.abstract(state, layout), batch,
                                             None).compile())
  parts = {name: sharding.bytes_per_device(getattr(state, name), getattr(layout, name))
           for name in ('params', 'opt_state', 'ema', 'batch_stats')}
  return {**parts, 'state': sharding.bytes_per_device(state, layout),
          'all_params': sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params)),
          'num_params': sum(x.size for x in jax.tree.leaves(state.params)),
          **memory}


def run_memory(config, *, num_classes: int) -> dict[str, int]:
  """Prints `memory_per_device` of the config's model on this process's mesh."""
  import jax  # pylint: disable=g-import-not-at-top
  devices, fsdp = jax.device_count(), config.mesh.fsdp
  stopwatch.report('model', f'{config.model.name} {config_lib.model_overrides(config.model)}')
  stopwatch.report('mesh', f'data {devices // fsdp} x fsdp {fsdp} = {devices} devices '
                   f'({jax.devices()[0].platform}; XLA\'s account on this backend)')
  stopwatch.report('batch', f'{config.batch_size} x {config.image_size}x{config.image_size}x3 '
                   f'({config.batch_size // devices} per device), dtype {config.dtype}, '
                   f'optimizer {config.optimizer}, mu_dtype {config.mu_dtype or "as parameters"}')
  sizes = memory_per_device(config, num_classes)
  per_device = lambda key: f'{byte_size(sizes[key])} per device'
  stopwatch.report('parameters', f'{per_device("params")}, of {byte_size(sizes["all_params"])} '
                   f'({sizes["num_params"]:,} parameters)')
  stopwatch.report('optimizer state', per_device('opt_state'))
  if sizes['ema'] or sizes['batch_stats']:
    stopwatch.report('EMA', per_device('ema'))
    stopwatch.report('batch statistics', per_device('batch_stats'))
  stopwatch.report('training state', per_device('state'))
  stopwatch.report('XLA step memory', f'{per_device("total")} live at once: arguments '
                   f'{byte_size(sizes["arguments"])} (state and batch), temporaries '
                   f'{byte_size(sizes["temp"])}')
  return sizes


def timm_contender(config, model, num_classes: int) -> Contender:
  """timm's `VisionTransformer` shaped like `model`, with torch AdamW under the config's recipe."""
  from vit_jax.models import deit, vit  # pylint: disable=g-import-not-at-top
  if type(model) not in (vit.VisionTransformer, deit.DeiT) or getattr(model, 'distilled', False):
    raise ValueError(f'--vs_timm compares plain ViT/DeiT models; {config.model.name} '
                     f'({type(model).__name__}) has no timm twin here.')
  if config.optimizer != 'adamw':
    raise ValueError(f'--vs_timm needs optimizer=adamw; got {config.optimizer!r}.')
  import torch  # pylint: disable=g-import-not-at-top
  from vit_jax.benchmarks import timm_reference  # pylint: disable=g-import-not-at-top
  timm = timm_reference.import_timm()
  from timm.models import vision_transformer  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  dtype = getattr(torch, np.dtype(model.dtype).name)
  torch.manual_seed(0)
  net = vision_transformer.VisionTransformer(
      img_size=config.image_size, patch_size=model.patch_size, num_classes=num_classes,
      embed_dim=model.hidden_size, depth=model.depth, num_heads=model.num_heads,
      mlp_ratio=(model.mlp_dim or 4 * model.hidden_size) / model.hidden_size,
      qkv_bias=model.qkv_bias, drop_rate=model.dropout_rate,
      attn_drop_rate=model.attention_dropout_rate, drop_path_rate=model.drop_path_rate)
  net.train()
  no_decay = tuple(config.no_decay_names)
  decay = [p for n, p in net.named_parameters()
           if p.ndim > 1 and not any(part in no_decay for part in n.split('.'))]
  decay_ids = {id(p) for p in decay}
  rest = [p for p in net.parameters() if id(p) not in decay_ids]
  optimizer = torch.optim.AdamW(
      [{'params': decay, 'weight_decay': config.weight_decay}, {'params': rest, 'weight_decay': 0}],
      lr=config.base_lr, betas=(config.b1, config.b2), eps=config.eps)
  loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
  generator = torch.Generator().manual_seed(0)
  images = torch.randn(config.batch_size, 3, config.image_size, config.image_size,
                       generator=generator)
  labels = torch.randint(0, num_classes, (config.batch_size,), generator=generator)
  autocast = lambda: torch.autocast('cpu', dtype=dtype, enabled=dtype != torch.float32)

  def train_steps(n: int) -> None:
    for _ in range(n):
      optimizer.zero_grad(set_to_none=True)
      with autocast():
        loss = loss_fn(net(images).float(), labels)
      loss.backward()
      if config.grad_clip_norm:
        torch.nn.utils.clip_grad_norm_(net.parameters(), config.grad_clip_norm)
      optimizer.step()

  def infer_steps(n: int) -> None:
    net.eval()
    with torch.inference_mode(), autocast():
      for _ in range(n):
        net(images)
    net.train()

  return Contender(f'timm {timm.__version__}', train_steps, infer_steps, model=net,
                   num_params=sum(p.numel() for p in net.parameters()))


def time_interleaved(contenders: list[Contender], *, kind: str, steps: int, warmup: int,
                     repeats: int) -> list[stopwatch.Timing]:
  """Per-step timings of each contender, their blocks of `steps` steps alternating.

  Every block starts with `warmup` untimed steps: the contenders share one process heap, and a
  step that must first fault in memory the other contender's steps took over (seconds for a
  ViT-Ti training step's gigabyte of temporaries on a VM) measures the allocator, not the model.
  """
  runs = [c.train_steps if kind == 'train' else c.infer_steps for c in contenders]
  return stopwatch.time_blocks(runs, steps=steps, warmups=[warmup] * len(runs), repeats=repeats)


def threads_description() -> str:
  """How many CPUs XLA (and torch) may use."""
  text = f'{len(os.sched_getaffinity(0))} CPUs'
  if 'torch' in sys.modules:
    text += f', torch intra-op threads {sys.modules["torch"].get_num_threads()}'
  return text


def run_single(config, *, num_classes: int, steps: int, warmup: int, repeats: int,
               vs_timm: bool, inference: bool) -> dict[str, float]:
  """Benchmarks the config's model (and timm's twin); prints and returns images/s and ratios."""
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  stopwatch.report('model', f'{config.model.name} {config_lib.model_overrides(config.model)}')
  stopwatch.report('batch', f'{config.batch_size} x {config.image_size}x{config.image_size}x3, '
                   f'dtype {config.dtype}, {num_classes} classes')
  stopwatch.report('device', f'{device.device_kind} ({device.platform}), jax {jax.__version__}, '
                   f'XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r}')
  stopwatch.report('load average', f'{stopwatch.load_average()} (start)')
  ours = jax_contender(config, num_classes)
  stopwatch.report('parameters', f'{ours.num_params:,}')
  compile_s = ours.compile_s
  stopwatch.report('compile', f'train {compile_s["train"]:.1f} s (+ trace {compile_s["lower"]:.1f}'
                   f' s), inference {compile_s["inference"]:.1f} s, init {compile_s["init"]:.1f} s')
  if ours.train_memory_mib:
    stopwatch.report('XLA train memory', f'{ours.train_memory_mib["total"]:.0f} MiB live at once, '
                     f'of which {ours.train_memory_mib["temp"]:.0f} MiB temporaries')
  stopwatch.report('peak host memory',
                   f'{peak_host_memory_mib():.0f} MiB RSS (ours, after compiling)')
  contenders = [ours]
  if vs_timm:
    contenders.append(timm_contender(config, ours.model, num_classes))
  stopwatch.report('threads', threads_description())
  results = {}
  for kind in ('train', 'inference') if inference else ('train',):
    timings = time_interleaved(contenders, kind=kind, steps=steps, warmup=warmup,
                               repeats=repeats)
    for label, timing in zip(('ours', 'timm'), timings):
      images_per_s = config.batch_size / timing.wall_s
      results[f'{kind}_{label}_images_per_s'] = images_per_s
      blocks = f'{1e3 * min(timing.block_wall_s):.0f}-{1e3 * max(timing.block_wall_s):.0f}'
      stopwatch.report(f'{kind} {label}',
                       f'{images_per_s:.1f} images/s ({1e3 * timing.wall_s:.0f} ms/step, '
                       f'{1e3 * timing.cpu_s:.0f} ms CPU/step; median of {repeats} x {steps} '
                       f'steps, blocks {blocks} ms/step)')
    if kind == 'train' and ours.train_flops:
      stopwatch.report('train FLOPs', flops_report(ours.train_flops, timings[0].wall_s, device,
                                                   config.dtype))
    if vs_timm:
      ratio = results[f'{kind}_ours_images_per_s'] / results[f'{kind}_timm_images_per_s']
      results[f'{kind}_ratio'] = ratio
      paired = stopwatch.paired_ratios(*timings)
      stopwatch.report(f'{kind} ratio', f'{ratio:.2f}x timm images/s ({contenders[1].name}); '
                       f'block pairs {min(paired):.2f}-{max(paired):.2f}x')
    stopwatch.report('load average', f'{stopwatch.load_average()} (after {kind})')
  stopwatch.report('peak host memory', f'{peak_host_memory_mib():.0f} MiB RSS'
                   + (' (both frameworks)' if vs_timm else ''))
  stopwatch.report('peak device memory', peak_device_memory())
  return results


def peak_tflops(device, dtype: str) -> float | None:
  """--peak_tflops, else the table's bfloat16 peak of the device (None on CPU or unknown)."""
  if _PEAK_TFLOPS.value:
    return _PEAK_TFLOPS.value
  if dtype != 'bfloat16':
    return None
  from vit_jax.benchmarks import device_report  # pylint: disable=g-import-not-at-top
  return device_report.peak_tflops(device.device_kind)


def flops_report(flops: float, step_s: float, device, dtype: str) -> str:
  """FLOPs per step, achieved TFLOP/s and, with a known peak, model FLOPs utilisation."""
  achieved = flops / step_s / 1e12
  text = f'{flops / 1e9:.4g} GFLOP/step (XLA count), {achieved:.3g} TFLOP/s achieved'
  peak = peak_tflops(device, dtype)
  if peak:
    text += f', MFU {100 * achieved / peak:.1f} % of {peak:.0f} TFLOP/s'
  return text


def plain_vit_twin(model, image_size: int) -> tuple[dict[str, Any], int, int]:
  """Overrides of `vit_ti4` for a plain ViT with the model's width, depth, heads and MLP, and
  the patch size whose token count is nearest the model's; also both token counts."""
  # pylint: disable=g-import-not-at-top
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from vit_jax.models import vit
  # pylint: enable=g-import-not-at-top
  width = model.hidden_size
  depth = getattr(model, 'depth', None) or model.num_layers
  heads = model.num_heads if width % model.num_heads == 0 else 1
  mlp_dim = getattr(model, 'mlp_dim', None) or getattr(model, 'intermediate_size', None)
  if isinstance(model, vit.VisionTransformer):  # Tokens entering the first main block.
    shapes = []

    def record(next_fun, args, kwargs, context):
      if context.method_name == '__call__' and re.fullmatch(r'blocks_\d+', context.module.name
                                                             or ''):
        shapes.append(args[0].shape)
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
      jax.eval_shape(model.init, jax.random.PRNGKey(0),
                     jnp.zeros((1, image_size, image_size, 3)))
    tokens = shapes[0][1]
  else:  # SA-conv attends over the downsampled pixel grid.
    tokens = (image_size // getattr(model, 'downsample', 1)) ** 2
  patches = [p for p in range(1, image_size + 1) if image_size % p == 0]
  patch = min(patches, key=lambda p: abs((image_size // p) ** 2 + 1 - tokens))
  overrides = {'hidden_size': width, 'depth': depth, 'num_heads': heads, 'patch_size': patch,
               'mlp_dim': mlp_dim or 4 * width}
  return overrides, tokens, (image_size // patch) ** 2 + 1


def run_family_table(config, *, sizes: dict[str, int], num_classes: int, steps: int,
                     warmup: int, repeats: int) -> list[dict[str, Any]]:
  """Each model (at its image size) next to a plain ViT of equal width, depth and heads.

  The FLOP ratio (XLA's counts of the two training steps) tells architecture from overhead: a
  time ratio near the FLOP ratio is the family's extra arithmetic, not slower code; "per FLOP"
  is their quotient, the family's time per FLOP relative to ViT's.
  """
  import ml_collections  # pylint: disable=g-import-not-at-top
  stopwatch.report('batch', f'{config.batch_size} images, dtype {config.dtype}')
  stopwatch.report('threads', threads_description())
  stopwatch.report('load average', f'{stopwatch.load_average()} (start)')
  print(f'{"model":<25}{"size":>5}{"width":>6}{"depth":>6}{"heads":>6}{"tokens":>7}{"ms/step":>9}'
        f'{"ViT tokens":>11}{"ViT ms":>8}{"ratio":>7}{"FLOP ratio":>11}{"per FLOP":>9}'
        '  load average', flush=True)
  rows = []
  for name, size in sizes.items():
    family_config = config.copy_and_resolve_references()
    family_config.image_size = size
    family_config.model = ml_collections.ConfigDict({'name': name})
    family = jax_contender(family_config, num_classes, inference=False)
    overrides, tokens, vit_tokens = plain_vit_twin(family.model, size)
    vit_config = family_config.copy_and_resolve_references()
    vit_config.model = ml_collections.ConfigDict({'name': 'vit_ti4', **overrides})
    plain = jax_contender(vit_config, num_classes, name='vit', inference=False)
    family_time, vit_time = time_interleaved([family, plain], kind='train', steps=steps,
                                             warmup=warmup, repeats=repeats)
    row = {'model': name, 'image_size': size, 'width': overrides['hidden_size'],
           'depth': overrides['depth'], 'heads': family.model.num_heads, 'tokens': tokens,
           'step_s': family_time.wall_s,
           'vit_tokens': vit_tokens, 'vit_step_s': vit_time.wall_s,
           'ratio': family_time.wall_s / vit_time.wall_s,
           'flop_ratio': (family.train_flops / plain.train_flops
                          if family.train_flops and plain.train_flops else float('nan'))}
    rows.append(row)
    print(f'{name:<25}{size:>5}{row["width"]:>6}{row["depth"]:>6}{row["heads"]:>6}{tokens:>7}'
          f'{1e3 * row["step_s"]:>9.0f}{vit_tokens:>11}{1e3 * row["vit_step_s"]:>8.0f}'
          f'{row["ratio"]:>7.2f}{row["flop_ratio"]:>11.2f}'
          f'{row["ratio"] / row["flop_ratio"]:>9.2f}  {stopwatch.load_average()}', flush=True)
  return rows


def layers_row(config, name: str, scan: bool, remat: bool, *, num_classes: int, steps: int,
               warmup: int) -> dict[str, Any]:
  """`name` with scan_layers/remat as given: init, trace and compile time, step time, memory."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  config = config.copy_and_resolve_references()
  config.model = ml_collections.ConfigDict({'name': name, 'scan_layers': scan, 'remat': remat})
  cpu = time.process_time()
  contender = jax_contender(config, num_classes, inference=False)
  compile_cpu_s = time.process_time() - cpu
  timing = time_interleaved([contender], kind='train', steps=steps, warmup=warmup, repeats=1)[0]
  return {'model': name, 'scan': int(scan), 'remat': int(remat),
          'init_s': contender.compile_s['init'], 'trace_s': contender.compile_s['lower'],
          'compile_s': contender.compile_s['train'], 'compile_cpu_s': compile_cpu_s,
          'step_s': timing.wall_s, 'xla_total_mib': contender.train_memory_mib.get('total', 0.0),
          'xla_temp_mib': contender.train_memory_mib.get('temp', 0.0),
          'peak_rss_mib': peak_host_memory_mib(), 'load': os.getloadavg()[0]}


def run_layers_table(config, *, names: list[str]) -> list[dict[str, Any]]:
  """Each model with scan_layers and remat off and on, one fresh process per combination."""
  stopwatch.report('batch', f'{config.batch_size} x {config.image_size}x{config.image_size}x3, '
                   f'dtype {config.dtype}')
  stopwatch.report('threads', threads_description())
  print(f'{"model":<16}{"scan":>5}{"remat":>6}{"init s":>8}{"trace s":>8}{"compile s":>10}'
        f'{"(CPU s)":>9}{"s/step":>8}{"XLA MiB":>9}{"(temp)":>8}{"RSS MiB":>9}  load',
        flush=True)
  forwarded = [a for a in sys.argv[1:] if not a.startswith(('--layers_table', '--layers_row'))]
  forwarded += [f'--batch={config.batch_size}', f'--image_size={config.image_size}']
  rows = []
  for name in names:
    for scan in (0, 1):
      for remat in (0, 1):
        result = subprocess.run(
            [sys.executable, '-m', 'vit_jax.benchmark', *forwarded,
             f'--layers_row={name}:{scan}:{remat}'], capture_output=True, text=True, check=False)
        if result.returncode:
          print(f'{name:<16}{scan:>5}{remat:>6}  failed: '
                f'{result.stderr.strip().splitlines()[-1:]}', flush=True)
          continue
        row = json.loads(result.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f'{name:<16}{scan:>5}{remat:>6}{row["init_s"]:>8.1f}{row["trace_s"]:>8.1f}'
              f'{row["compile_s"]:>10.1f}{row["compile_cpu_s"]:>9.1f}{row["step_s"]:>8.2f}'
              f'{row["xla_total_mib"]:>9.0f}{row["xla_temp_mib"]:>8.0f}'
              f'{row["peak_rss_mib"]:>9.0f}  {row["load"]:.1f}', flush=True)
  return rows


def parse_layers_row(value: str) -> tuple[str, bool, bool]:
  """'MODEL:SCAN:REMAT' -> (model, scan, remat); raises UsageError for anything else."""
  parts = value.split(':')
  if len(parts) != 3 or parts[1] not in ('0', '1') or parts[2] not in ('0', '1'):
    raise app.UsageError(f'--layers_row={value!r} must be MODEL:SCAN:REMAT with 0 or 1 for each '
                         'switch, e.g. cait_xxs24:1:0.')
  return parts[0], parts[1] == '1', parts[2] == '1'


def _prepare_process() -> None:
  """What must happen before JAX or torch start: CPUs, forced devices, runtime flags, timm."""
  if _THREADS.value is not None:
    cpus = sorted(os.sched_getaffinity(0))
    if not 1 <= _THREADS.value <= len(cpus):
      raise app.UsageError(f'--threads={_THREADS.value} must be in [1, {len(cpus)}].')
    os.sched_setaffinity(0, cpus[:_THREADS.value])  # XLA sizes its thread pool from this.
  if _MEMORY_ONLY.value:  # Before JAX starts: the mesh's devices, forced on the CPU backend.
    devices = _DEVICES.value or _CONFIG.value.mesh.fsdp
    if devices < 1:
      raise app.UsageError(f'--devices={devices} must be >= 1.')
    os.environ['JAX_PLATFORMS'] = 'cpu'
    os.environ['XLA_FLAGS'] = (f'{os.environ.get("XLA_FLAGS", "")} '
                               f'--xla_force_host_platform_device_count={devices}').strip()
  from vit_jax import runtime  # pylint: disable=g-import-not-at-top
  runtime.quiet_library_logs()  # After the CPUs are chosen: it loads TensorFlow.
  if _CPU_TUNING.value:
    runtime.configure()
  if _VS_TIMM.value:
    try:
      from vit_jax.benchmarks import timm_reference  # pylint: disable=g-import-not-at-top
      timm_reference.import_timm()
      import torch  # pylint: disable=g-import-not-at-top
      if _INPUT_PIPELINE.value:
        import psutil  # pylint: disable=g-import-not-at-top,unused-import
    except ImportError as e:
      raise app.UsageError(f'--vs_timm needs torch and timm installed ({e}).') from e
    torch.set_num_threads(len(os.sched_getaffinity(0)))


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  for name in ('steps', 'repeats', 'late_step'):
    if flags.FLAGS[name].value is not None and flags.FLAGS[name].value < 1:
      raise app.UsageError(f'--{name}={flags.FLAGS[name].value} must be >= 1.')
  if _INPUT_PIPELINE.value:
    from vit_jax.benchmarks import input_speed  # pylint: disable=g-import-not-at-top
    if _VS_TIMM.value:
      try:
        input_benchmark.check_vs_timm(_CONFIG.value)
      except ValueError as e:
        raise app.UsageError(str(e)) from e
  _prepare_process()
  if _DEVICE_REPORT.value:
    from vit_jax.benchmarks import device_report  # pylint: disable=g-import-not-at-top
    device_report.run(reduced=_REDUCED.value, json_path=_REPORT_JSON.value)
    return
  config = _CONFIG.value
  if _DATA_DIR.value:
    config.data_dir = _DATA_DIR.value
  if _INPUT_PIPELINE.value:
    config = benchmark_config(config, batch=_BATCH.value or config.batch_size,
                              image_size=_IMAGE_SIZE.value or config.image_size, dtype=None,
                              model_name=None)
    input_benchmark.run(config, steps=_STEPS.value, warmup=_WARMUP.value, repeats=_REPEATS.value,
                        vs_timm=_VS_TIMM.value, late_step=_LATE_STEP.value)
    return
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  for flag in (_LAYERS_MODELS, _FAMILY_MODELS):
    unknown = [n for n in flag.value or () if n not in models.names()]
    if unknown:
      raise app.UsageError(f'--{flag.name}: unknown models {unknown}; registered: '
                           f'{sorted(models.names())}.')
  deep = _LAYERS_TABLE.value or _LAYERS_ROW.value  # ImageNet-sized models: smaller defaults.
  config = benchmark_config(config, batch=_BATCH.value or (8 if deep else config.batch_size),
                            image_size=_IMAGE_SIZE.value or (224 if deep else config.image_size),
                            dtype=_DTYPE.value, model_name=_MODEL.value)
  timing = dict(num_classes=_NUM_CLASSES.value, steps=_STEPS.value, warmup=_WARMUP.value,
                repeats=_REPEATS.value)
  if _MEMORY_ONLY.value:
    from vit_jax.parallel import sharding  # pylint: disable=g-import-not-at-top
    import jax  # pylint: disable=g-import-not-at-top
    try:
      sharding.check_mesh(config.mesh.fsdp, jax.device_count())
    except ValueError as e:
      raise app.UsageError(str(e)) from e
    run_memory(config, num_classes=_NUM_CLASSES.value)
  elif _LAYERS_ROW.value:
    name, scan, remat = parse_layers_row(_LAYERS_ROW.value)
    print(json.dumps(layers_row(config, name, scan, remat, num_classes=_NUM_CLASSES.value,
                                steps=_STEPS.value, warmup=_WARMUP.value)))
  elif _LAYERS_TABLE.value:
    run_layers_table(config, names=_LAYERS_MODELS.value)
  elif _FAMILY_TABLE.value:
    sizes = ({name: config.image_size for name in _FAMILY_MODELS.value} if _FAMILY_MODELS.value
             else FAMILY_MODELS)
    run_family_table(config, sizes=sizes, **timing)
  else:
    run_single(config, vs_timm=_VS_TIMM.value, inference=_INFERENCE.value, **timing)


if __name__ == '__main__':
  app.run(main)
