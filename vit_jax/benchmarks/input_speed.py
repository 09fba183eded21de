r"""Images/s of the training input pipeline alone, and its time to a first batch; with
`--vs_timm`, timm's transforms and a torch `DataLoader` on the same images beside it.

  python -m vit_jax.benchmark --mode=input_pipeline --batch=96 --vs_timm \
      --config=configs/deit.py:variant=S,dataset=folder:/path/to/images

timm's side is `timm.data.create_transform` with the config's recipe (no colour jitter) in a
`DataLoader` with one worker process per CPU ours may use, repeated augmentation by
`RepeatAugSampler`, reading the same storage (a TFRecord-only dataset: its first `TIMM_RECORDS`
images, in memory). Blocks alternate between the pipelines (median of `--repeats`, range
reported); before each both fill their buffers and fall idle, and the timed one drains `--warmup`
plus twice what it buffers before a window of at least `TIMED_PER_BUFFERED` times that buffer. CPU
time per image counts every thread and, for timm, its workers. Time to the first batch is measured
at step 0 and at `--late_step` (default: after `LATE_EXAMPLES` examples), alternating, after the
first pipeline compiled the augmentation ops.
"""

import dataclasses
import functools
import io
import itertools
import math
import os
import statistics
import time
from typing import Any, Callable, Iterable, Sequence

import jax
import ml_collections

from vit_jax.data import batch_augment
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.data import image_ops
from vit_jax.data import reading
from vit_jax.benchmarks import stopwatch
from vit_jax.data import convert
from vit_jax.data import folder
from vit_jax.schema import dataset_names
from vit_jax.schema import normalization
from vit_jax.schema import setting

LATE_EXAMPLES = 100_000  # Examples consumed before the default --late_step.
TIMM_RECORDS = 4096  # Encoded images timm's side holds when the dataset is not a folder.
_TIMM_PREFETCH_FACTOR = 2  # Batches each DataLoader worker holds ready (torch's default).
TIMED_PER_BUFFERED = 10  # The timed window, in multiples of the most batches a side buffers.


@dataclasses.dataclass
class Pipeline:
  """A source of training batches, and what timing it needs to know."""

  name: str
  take: Callable[[int], None]  # Draws n batches.
  buffered: int  # Batches it may hold ready while idle.
  cpu_clock: Callable[[], float]  # CPU seconds of every process and thread that works for it.
  close: Callable[[], None] = lambda: None  # Stops its workers.


def tf_data_pipeline(name: str, batches: Any, buffered: int) -> Pipeline:
  """A pipeline drawing from the iterator `batches` of a `tf.data` pipeline in this process."""

  def take(n: int) -> None:
    for _ in range(n):
      next(batches)

  return Pipeline(name, take, buffered, time.process_time)


def dataloader_pipeline(
    name: str, dataset: Any, sampler: Iterable[int], *, batch_size: int, workers: int
) -> Pipeline:
  """A torch `DataLoader` of `workers` processes over `sampler`'s epochs, one after another."""
  # pylint: disable=g-import-not-at-top
  import psutil
  import torch
  # pylint: enable=g-import-not-at-top
  loader = torch.utils.data.DataLoader(
      dataset,
      batch_size=batch_size,
      sampler=_Epochs(sampler),
      num_workers=workers,
      prefetch_factor=_TIMM_PREFETCH_FACTOR,
      drop_last=True,
  )
  holder = {'batches': iter(loader)}

  def take(n: int) -> None:
    for _ in range(n):
      next(holder['batches'])

  process = psutil.Process()

  def cpu_seconds() -> float:
    total = 0.0
    for member in (process, *process.children(recursive=True)):
      try:
        times = member.cpu_times()
      except psutil.NoSuchProcess:
        continue
      total += times.user + times.system
    return total

  # The iterator's deletion stops its workers.
  return Pipeline(name, take, _TIMM_PREFETCH_FACTOR * workers, cpu_seconds, holder.clear)


@dataclasses.dataclass(frozen=True)
class Window:
  """Batches drawn untimed, then timed, in each block of a pipeline."""

  warmup: int
  timed: int


def steady_state_windows(pipelines: Sequence[Pipeline], *, steps: int, warmup: int) -> list[Window]:
  """Each pipeline's warm-up (`warmup` + twice what it buffers) and the common timed window (at
  least `TIMED_PER_BUFFERED` times the largest buffer, or `steps`)."""
  timed = max(steps, TIMED_PER_BUFFERED * max(p.buffered for p in pipelines))
  return [Window(warmup + 2 * p.buffered, timed) for p in pipelines]


def measure(
    pipelines: Sequence[Pipeline],
    *,
    steps: int,
    warmup: int,
    repeats: int,
    settle: Callable[[], None] = lambda: None,
) -> list[stopwatch.Timing]:
  """Seconds per batch of each pipeline in steady state, blocks alternating (module docstring)."""
  windows = steady_state_windows(pipelines, steps=steps, warmup=warmup)
  return stopwatch.time_blocks(
      [p.take for p in pipelines],
      steps=windows[0].timed,
      warmups=[w.warmup for w in windows],
      repeats=repeats,
      cpu_clocks=[p.cpu_clock for p in pipelines],
      settle=settle,
  )


def default_late_step(batch_size: int) -> int:
  """The first step after `LATE_EXAMPLES` examples were consumed at `batch_size` per step."""
  return math.ceil(LATE_EXAMPLES / batch_size)


def check_vs_timm(config: ml_collections.ConfigDict) -> None:
  """Raises ValueError if timm's training transform cannot reproduce the config's recipe."""
  if config.augment != 'inception_crop':
    raise ValueError(
        f"--vs_timm needs --config.augment='inception_crop' (timm's training crop); "
        f'got {config.augment!r}.'
    )


def _train_batches(config: ml_collections.ConfigDict, start_step: int = 0) -> Any:
  """`train_iterator` of the config as one process reads it."""
  return input_pipeline.train_iterator(
      setting.build(data_settings.DataSettings, config),
      start_step=start_step,
      process_index=0,
      process_count=1,
  )


def _ours(config: ml_collections.ConfigDict) -> tuple[Pipeline, float]:
  """`train_iterator` from step 0, and the seconds to its first batch (compiling included)."""
  start = time.perf_counter()
  batches = _train_batches(config)
  next(batches)
  first_batch_s = time.perf_counter() - start
  # Its prefetched batches, the batch being assembled and the parallel map's elements in flight.
  return tf_data_pipeline('ours (tf.data)', batches, config.prefetch + 2), first_batch_s


def device_augment_seconds(config: ml_collections.ConfigDict, repeats: int) -> float:
  """Seconds of the training step's share of the recipe (`batch_augment.augment`) on one batch of
  the pipeline's, on JAX's default device: the median of `repeats`, after compiling."""
  batch = next(_train_batches(config))
  settings = setting.build(data_settings.BatchAugment, config)
  augment = jax.jit(lambda images, keys: batch_augment.augment(images, keys, settings))
  images, keys = jax.device_put((batch['image'], batch['augment_key']))
  augment(images, keys).block_until_ready()
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    augment(images, keys).block_until_ready()
    seconds.append(time.perf_counter() - start)
  return statistics.median(seconds)


def _posterize_in_range(image, bits_to_keep, **kwargs):
  """timm's posterize with its bit count clamped to 1..8, as current Pillow requires."""
  from timm.data import auto_augment  # pylint: disable=g-import-not-at-top

  return auto_augment.posterize(image, min(max(int(bits_to_keep), 1), 8), **kwargs)


class _EncodedImages:
  """A map-style dataset of `records`' (encoded image, label), decoded by PIL as `ImageFolder` does."""

  def __init__(self, records: Any, image_key: str, label_key: str, transform: Callable[[Any], Any]):
    self.records, self.transform = records, transform
    self.image_key, self.label_key = image_key, label_key

  def __len__(self) -> int:
    return len(self.records)

  def __getitem__(self, index: int):
    from PIL import Image  # pylint: disable=g-import-not-at-top

    record = self.records[index]
    image = Image.open(io.BytesIO(record[self.image_key])).convert('RGB')
    return self.transform(image), int(record[self.label_key])


class _Epochs:
  """A sampler's epochs one after another, without end (each reshuffled)."""

  def __init__(self, sampler: Iterable[int]):
    self.sampler = sampler

  def __iter__(self):
    for epoch in itertools.count():
      if hasattr(self.sampler, 'set_epoch'):
        self.sampler.set_epoch(epoch)
      yield from self.sampler


def _timm_images(config: ml_collections.ConfigDict, transform: Callable[[Any], Any]):
  """The train split's images for timm, from ours' storage (module docstring)."""
  split = config.train_split.split('[')[0]
  if config.dataset.startswith(dataset_names.FOLDER_PREFIX):
    import torchvision  # pylint: disable=g-import-not-at-top

    root = folder.scan(config.dataset[len(dataset_names.FOLDER_PREFIX) :]).root
    return torchvision.datasets.ImageFolder(os.path.join(root, split), transform=transform)
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  builder = tfds.builder(config.dataset, data_dir=config.data_dir)
  image_key, label_key = builder.info.supervised_keys
  decoders = {image_key: tfds.decode.SkipDecoding()}
  if convert.has_array_record(builder):
    records = builder.as_data_source(
        split=config.train_split, decoders=decoders, file_format=convert.ARRAY_RECORD
    )
  else:
    records = list(
        tfds.as_numpy(
            builder.as_dataset(split=config.train_split, decoders=decoders).take(TIMM_RECORDS)
        )
    )
  return _EncodedImages(records, image_key, label_key, transform)


def _timm(config: ml_collections.ConfigDict, workers: int) -> Pipeline:
  """timm's transforms for the config's recipe in a `DataLoader`, as deit's main.py builds it."""
  # pylint: disable=g-import-not-at-top
  import torch
  from vit_jax.benchmarks import timm_reference

  timm = timm_reference.import_timm()
  from timm.data import auto_augment
  from timm.data import create_transform
  from timm.data.distributed_sampler import RepeatAugSampler
  # pylint: enable=g-import-not-at-top
  for name in ('Posterize', 'PosterizeIncreasing', 'PosterizeOriginal'):
    auto_augment.NAME_TO_OP[name] = _posterize_in_range
  mean, std = normalization.mean_std(config.normalization)
  transform = create_transform(
      config.image_size,
      is_training=True,
      scale=image_ops.INCEPTION_CROP_AREA,
      ratio=image_ops.INCEPTION_CROP_RATIO,
      hflip=0.5 if config.flip else 0.0,
      # None turns colour jitter off (timm tests `color_jitter is not None`); its annotation
      # leaves None out.
      color_jitter=None,  # type: ignore[arg-type]
      auto_augment=config.randaugment or None,
      interpolation='bicubic',
      re_prob=config.random_erase_prob,
      re_mode='pixel',
      mean=mean,
      std=std,
  )
  images = _timm_images(config, transform)
  repeats = config.repeated_aug
  sampler = (
      RepeatAugSampler(images, num_replicas=1, rank=0, num_repeats=repeats, selected_round=0)
      if repeats > 1
      else torch.utils.data.RandomSampler(images)
  )
  return dataloader_pipeline(
      f'timm {timm.__version__} (DataLoader)',
      images,
      sampler,
      batch_size=config.batch_size,
      workers=workers,
  )


def wait_until_idle(
    cpu_clock: Callable[[], float],
    *,
    interval_s: float = 0.25,
    idle_cores: float = 0.1,
    timeout_s: float = 60.0,
) -> None:
  """Waits until `cpu_clock` advances by less than `idle_cores` per second: the pipelines have
  filled their buffers and stopped working."""
  deadline = time.perf_counter() + timeout_s
  while time.perf_counter() < deadline:
    before = cpu_clock()
    time.sleep(interval_s)
    if cpu_clock() - before < idle_cores * interval_s:
      return


def time_to_first_batch(config: ml_collections.ConfigDict, start_step: int) -> float:
  """Seconds from `train_iterator(config, start_step=...)` to its first batch."""
  start = time.perf_counter()
  next(_train_batches(config, start_step))
  return time.perf_counter() - start


def _recipe(config: ml_collections.ConfigDict) -> str:
  parts = [config.augment] + (['flip'] if config.flip else [])
  parts += [
      config.randaugment or 'no RandAugment',
      f'random erasing {config.random_erase_prob}',
      f'repeated augmentation x{config.repeated_aug}',
      f'{config.normalization} normalisation',
  ]
  return ', '.join(parts)


def _decodes_per_image(config: ml_collections.ConfigDict) -> str:
  """How many JPEG decodes each training image costs ours (`reading.decodes_crop_window`)."""
  repeats = config.repeated_aug
  if reading.decodes_crop_window(setting.build(data_settings.TrainTransform, config), repeats):
    return '1 of the crop window'
  if repeats > 1:
    return f'1/{repeats} of the whole image (decoded once for its {repeats} copies)'
  return '1 of the whole image'


def _throughput(
    config: ml_collections.ConfigDict,
    ours: Pipeline,
    *,
    workers: int,
    steps: int,
    warmup: int,
    repeats: int,
    vs_timm: bool,
    suffix: str = '',
) -> dict[str, float]:
  """Images/s of `ours` (and timm's on the same recipe) in steady state; prints and returns them."""
  batch = config.batch_size
  pipelines = [ours] + ([_timm(config, workers)] if vs_timm else [])
  settle = (
      functools.partial(wait_until_idle, pipelines[-1].cpu_clock) if vs_timm else (lambda: None)
  )
  windows = steady_state_windows(pipelines, steps=steps, warmup=warmup)
  stopwatch.report(
      'protocol' + suffix,
      ', '.join(
          f'{label}: {w.warmup} batches warm-up, {w.timed} timed'
          for label, w in zip(('ours', 'timm'), windows)
      )
      + f'; {repeats} alternating blocks each',
  )
  timings = measure(pipelines, steps=steps, warmup=warmup, repeats=repeats, settle=settle)
  results = {}
  for label, pipeline, timing in zip(('ours', 'timm'), pipelines, timings):
    images_per_s = batch / timing.wall_s
    results[f'{label}_images_per_s'] = images_per_s
    results[f'{label}_cpu_ms_per_image'] = 1e3 * timing.cpu_s / batch
    slowest, fastest = (batch / t for t in (max(timing.block_wall_s), min(timing.block_wall_s)))
    stopwatch.report(
        label + suffix,
        f'{images_per_s:.1f} images/s, {images_per_s / workers:.1f} '
        f'per core, {1e3 * timing.cpu_s / batch:.2f} ms CPU/image ({pipeline.name}; '
        f'median of {repeats} blocks, range {slowest:.0f}-{fastest:.0f} images/s)',
    )
  copies = ' (each copy loaded and decoded anew)' if config.repeated_aug > 1 else ''
  stopwatch.report(
      'decodes' + suffix,
      f'ours {_decodes_per_image(config)} per image'
      + (f'; timm 1 of the whole image per image{copies}' if vs_timm else ''),
  )
  if vs_timm:
    pipelines[1].close()
    results['ratio'] = results['ours_images_per_s'] / results['timm_images_per_s']
    results['cpu_ratio'] = results['timm_cpu_ms_per_image'] / results['ours_cpu_ms_per_image']
    paired = stopwatch.paired_ratios(*timings)
    stopwatch.report(
        'ratio' + suffix,
        f"{results['ratio']:.2f}x timm's images/s (block pairs "
        f"{min(paired):.2f}-{max(paired):.2f}x); {results['cpu_ratio']:.2f}x timm's "
        'images per CPU second',
    )
  return {f'{key}{suffix.replace(" ", "_")}': value for key, value in results.items()}


def run(
    config: ml_collections.ConfigDict,
    *,
    steps: int,
    warmup: int,
    repeats: int,
    vs_timm: bool,
    late_step: int | None,
) -> dict[str, float]:
  """Benchmarks the training input pipeline (and timm's, with and without repeated augmentation,
  the latter suffixed ' no_repeat'); prints and returns the numbers."""
  if vs_timm:
    check_vs_timm(config)
  late_step = late_step or default_late_step(config.batch_size)
  workers = len(os.sched_getaffinity(0))
  batch = config.batch_size
  stopwatch.report(
      'dataset', f'{config.dataset} ({config.train_split}), data_dir {config.data_dir}'
  )
  if config.augment_on_device is None:  # As a run on an accelerator resolves it.
    config = config.copy_and_resolve_references()
    config.augment_on_device = True
  data = setting.build(data_settings.DataSettings, config)
  on_device = data.train_transform.on_device
  stopwatch.report(
      'batch',
      f'{batch} x {config.image_size}x{config.image_size}x3 '
      + (
          'uint8 and a key per image: RandAugment, normalisation and erasing are the training '
          "step's (batch_augment, timed below on JAX's device)"
          if on_device
          else 'float32'
      ),
  )
  stopwatch.report('recipe', _recipe(config))
  stopwatch.report(
      'workers',
      f'{workers} CPUs: as many tf.data threads'
      + (' and DataLoader worker processes' if vs_timm else ''),
  )
  stopwatch.report('load average', f'{stopwatch.load_average()} (start)')
  ours, cold_s = _ours(config)
  stopwatch.report(
      'first batch',
      f"{cold_s:.1f} s (the process's first pipeline, compiling the " 'augmentation ops)',
  )
  throughput = functools.partial(
      _throughput, workers=workers, steps=steps, warmup=warmup, repeats=repeats, vs_timm=vs_timm
  )
  results = throughput(config, ours)
  del ours  # Stops its threads before the next contenders run.
  if vs_timm and config.repeated_aug > 1:
    plain = config.copy_and_resolve_references()
    plain.repeated_aug = 1
    stopwatch.report('recipe no_repeat', _recipe(plain))
    results.update(throughput(plain, _ours(plain)[0], suffix=' no_repeat'))
  stopwatch.report('load average', f'{stopwatch.load_average()} (after throughput)')
  if on_device:
    device_s = device_augment_seconds(config, repeats)
    results['device_augment_ms_per_batch'] = 1e3 * device_s
    stopwatch.report(
        'on device',
        f'RandAugment, normalisation and erasing of a batch of {batch}: {1e3 * device_s:.1f} ms '
        f'on {jax.devices()[0].device_kind} (median of {repeats}), in the training step',
    )
  settle = functools.partial(wait_until_idle, time.process_time)
  firsts: dict[int, list[float]] = {0: [], late_step: []}
  for _ in range(repeats):
    for step, seconds in firsts.items():
      settle()
      seconds.append(time_to_first_batch(config, step))
  results['first_batch_s'] = statistics.median(firsts[0])
  results['late_first_batch_s'] = statistics.median(firsts[late_step])
  early, late = (', '.join(f'{s:.2f}' for s in firsts[step]) for step in firsts)
  stopwatch.report(
      'first batch',
      f'step 0: {early} s; step {late_step} ({late_step * batch:,} '
      f'examples consumed): {late} s; median ratio '
      f"{results['late_first_batch_s'] / results['first_batch_s']:.2f}x",
  )
  stopwatch.report('load average', f'{stopwatch.load_average()} (end)')
  return results
