"""A config's training and inference steps on random images timed, ours against timm's twin (or a
family against its plain ViT), blocks alternating in one process (`time_interleaved`)."""

import dataclasses
import os
import resource
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.benchmarks import device_report
from vit_jax.benchmarks import stopwatch
from vit_jax.models import deit
from vit_jax.models import vit
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.loop import train
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings
from vit_jax.training import start as start_lib


def peak_host_memory_mib() -> float:
  """Peak resident set size of this process so far (ru_maxrss is in KiB on Linux)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_device_memory() -> str:
  """Peak bytes in use on the first device, where its runtime reports them (not on CPU)."""
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


def benchmark_config(
    config, *, batch: int, image_size: int, dtype: str | None, model_name: str | None
):
  """A copy of `config` with the benchmark's batch, image size, model and dtype.

  The compute dtype ends up in `config.dtype` alone (`models.create_model` gives it to every
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
  """XLA's memory account of a compiled computation, per device (`vit_jax.training.memory`, which
  also refuses a run whose step cannot fit)."""
  from vit_jax.training import memory  # pylint: disable=g-import-not-at-top

  return memory.compiled_bytes(compiled)


def compiled_memory_mib(compiled) -> dict[str, float]:
  """`compiled_memory_bytes`' temporaries and total in MiB."""
  memory = compiled_memory_bytes(compiled)
  return {key: memory[key] / 2**20 for key in ('temp', 'total') if key in memory}


def jax_contender(
    config, num_classes: int, name: str | None = None, inference: bool = True
) -> Contender:
  """Our model under `vit_jax.training.steps`'s training step, jitted with the state donated."""
  settings = setting.build(run_settings.Settings, config)
  schedule = optim.learning_rate_schedule(settings.schedule, max(int(config.total_steps), 2), 1)
  setup = start_lib.for_run(settings, num_classes, schedule)
  model = setup.model
  rng = np.random.default_rng(0)
  size, batch_size = config.image_size, config.batch_size
  batch = {
      'image': jnp.asarray(rng.standard_normal((batch_size, size, size, 3), np.float32)),
      'label': jnp.asarray(rng.integers(0, num_classes, batch_size, np.int32)),
  }
  start = time.perf_counter()
  state = jax.block_until_ready(jax.jit(setup.init)())
  compile_s = {'init': time.perf_counter() - start}

  start = time.perf_counter()
  step = steps.make_train_step(model, setup.tx, settings.step, num_classes)
  lowered = jax.jit(step, donate_argnums=0).lower(state, batch)
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
    if infer is None:
      raise ValueError('This contender was built without its inference step (inference=False).')
    for _ in range(n):
      state = holder['state']
      jax.block_until_ready(infer(state.params, state.batch_stats, batch['image']))

  return Contender(
      name or config.model.name,
      train_steps,
      infer_steps,
      compile_s,
      model,
      sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params)),
      device_report.step_flops(step, state, batch),
      compiled_memory_mib(train_step),
  )


def import_torch_and_timm() -> None:
  """Imports torch and timm for a comparison with timm, torch on every CPU this process may use;
  ValueError where they are not installed."""
  try:
    from vit_jax.benchmarks import timm_reference  # pylint: disable=g-import-not-at-top

    timm_reference.import_timm()
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError(f'--vs_timm needs torch and timm installed ({e}).') from e
  torch.set_num_threads(len(os.sched_getaffinity(0)))


def timm_contender(config, model, num_classes: int) -> Contender:
  """timm's `VisionTransformer` shaped like `model`, with torch AdamW under the config's recipe."""
  if type(model) not in (vit.VisionTransformer, deit.DeiT) or getattr(model, 'distilled', False):
    raise ValueError(
        f'--vs_timm compares plain ViT/DeiT models; {config.model.name} '
        f'({type(model).__name__}) has no timm twin here.'
    )
  if config.optimizer != 'adamw':
    raise ValueError(f'--vs_timm needs optimizer=adamw; got {config.optimizer!r}.')
  import torch  # pylint: disable=g-import-not-at-top
  from vit_jax.benchmarks import timm_reference  # pylint: disable=g-import-not-at-top

  timm = timm_reference.import_timm()
  from timm.models import vision_transformer  # pylint: disable=g-import-not-at-top

  dtype = getattr(torch, np.dtype(model.dtype).name)
  torch.manual_seed(0)
  net = vision_transformer.VisionTransformer(
      img_size=config.image_size,
      patch_size=model.patch_size,
      num_classes=num_classes,
      embed_dim=model.hidden_size,
      depth=model.depth,
      num_heads=model.num_heads,
      mlp_ratio=model.mlp_width / model.hidden_size,
      qkv_bias=model.qkv_bias,
      drop_rate=model.dropout_rate,
      attn_drop_rate=model.attention_dropout_rate,
      drop_path_rate=model.drop_path_rate,
  )
  net.train()
  no_decay = tuple(config.no_decay_names)
  decay = [
      p
      for n, p in net.named_parameters()
      if p.ndim > 1 and not any(part in no_decay for part in n.split('.'))
  ]
  decay_ids = {id(p) for p in decay}
  rest = [p for p in net.parameters() if id(p) not in decay_ids]
  optimizer = torch.optim.AdamW(
      [{'params': decay, 'weight_decay': config.weight_decay}, {'params': rest, 'weight_decay': 0}],
      lr=config.base_lr,
      betas=(config.b1, config.b2),
      eps=config.eps,
  )
  loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
  generator = torch.Generator().manual_seed(0)
  images = torch.randn(
      config.batch_size, 3, config.image_size, config.image_size, generator=generator
  )
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

  return Contender(
      f'timm {timm.__version__}',
      train_steps,
      infer_steps,
      model=net,
      num_params=sum(p.numel() for p in net.parameters()),
  )


def time_interleaved(
    contenders: list[Contender], *, kind: str, steps: int, warmup: int, repeats: int
) -> list[stopwatch.Timing]:
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


def run_single(
    config,
    *,
    num_classes: int,
    steps: int,
    warmup: int,
    repeats: int,
    vs_timm: bool,
    inference: bool,
    peak_tflops: float | None = None,
) -> dict[str, float]:
  """Benchmarks the config's model (and timm's twin); prints and returns images/s and ratios."""
  device = jax.devices()[0]
  stopwatch.report('model', f'{config.model.name} {models.model_overrides(config.model)}')
  stopwatch.report(
      'batch',
      f'{config.batch_size} x {config.image_size}x{config.image_size}x3, '
      f'dtype {config.dtype}, {num_classes} classes',
  )
  stopwatch.report(
      'device',
      f'{device.device_kind} ({device.platform}), jax {jax.__version__}, '
      f'XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r}',
  )
  stopwatch.report('load average', f'{stopwatch.load_average()} (start)')
  ours = jax_contender(config, num_classes)
  stopwatch.report('parameters', f'{ours.num_params:,}')
  compile_s = ours.compile_s
  stopwatch.report(
      'compile',
      f'train {compile_s["train"]:.1f} s (+ trace {compile_s["lower"]:.1f}'
      f' s), inference {compile_s["inference"]:.1f} s, init {compile_s["init"]:.1f} s',
  )
  if ours.train_memory_mib:
    stopwatch.report(
        'XLA train memory',
        f'{ours.train_memory_mib["total"]:.0f} MiB live at once, '
        f'of which {ours.train_memory_mib["temp"]:.0f} MiB temporaries',
    )
  stopwatch.report(
      'peak host memory', f'{peak_host_memory_mib():.0f} MiB RSS (ours, after compiling)'
  )
  contenders = [ours]
  if vs_timm:
    contenders.append(timm_contender(config, ours.model, num_classes))
  stopwatch.report('threads', threads_description())
  results = {}
  for kind in ('train', 'inference') if inference else ('train',):
    timings = time_interleaved(contenders, kind=kind, steps=steps, warmup=warmup, repeats=repeats)
    for label, timing in zip(('ours', 'timm'), timings):
      images_per_s = config.batch_size / timing.wall_s
      results[f'{kind}_{label}_images_per_s'] = images_per_s
      blocks = f'{1e3 * min(timing.block_wall_s):.0f}-{1e3 * max(timing.block_wall_s):.0f}'
      stopwatch.report(
          f'{kind} {label}',
          f'{images_per_s:.1f} images/s ({1e3 * timing.wall_s:.0f} ms/step, '
          f'{1e3 * timing.cpu_s:.0f} ms CPU/step; median of {repeats} x {steps} '
          f'steps, blocks {blocks} ms/step)',
      )
    if kind == 'train' and ours.train_flops:
      peak = peak_tflops or (
          device_report.peak_tflops(device.device_kind) if config.dtype == 'bfloat16' else None
      )
      stopwatch.report('train FLOPs', flops_report(ours.train_flops, timings[0].wall_s, peak))
    if vs_timm:
      ratio = results[f'{kind}_ours_images_per_s'] / results[f'{kind}_timm_images_per_s']
      results[f'{kind}_ratio'] = ratio
      paired = stopwatch.paired_ratios(*timings)
      stopwatch.report(
          f'{kind} ratio',
          f'{ratio:.2f}x timm images/s ({contenders[1].name}); '
          f'block pairs {min(paired):.2f}-{max(paired):.2f}x',
      )
    stopwatch.report('load average', f'{stopwatch.load_average()} (after {kind})')
  stopwatch.report(
      'peak host memory',
      f'{peak_host_memory_mib():.0f} MiB RSS' + (' (both frameworks)' if vs_timm else ''),
  )
  stopwatch.report('peak device memory', peak_device_memory())
  return results


def flops_report(flops: float, step_s: float, peak: float | None) -> str:
  """FLOPs per step, achieved TFLOP/s and, with a known peak TFLOP/s, model FLOPs utilisation."""
  achieved = flops / step_s / 1e12
  text = f'{flops / 1e9:.4g} GFLOP/step (XLA count), {achieved:.3g} TFLOP/s achieved'
  if peak:
    text += f', MFU {100 * achieved / peak:.1f} % of {peak:.0f} TFLOP/s'
  return text
