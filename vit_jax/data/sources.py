"""Datasets by name: the digits, an image folder or a TFDS dataset (prepared on first use), their
image and label features, splits and per-process sub-splits."""

import dataclasses
import socket
import threading
import time
from typing import Any, Mapping
import urllib.parse
import urllib.request

import tensorflow_datasets as tfds

from vit_jax.process import runtime
from vit_jax.data import convert
from vit_jax.schema import dataset_names
from vit_jax.data import digits
from vit_jax.data import folder
from vit_jax.schema import data as data_settings
from vit_jax.data import storage


# How long a dataset's download host may take to accept a connection before the download is
# deemed unable to start (TFDS's own retries take minutes to give up).
DOWNLOAD_PROBE_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class Source:
  """A resolved dataset: its builder and the feature keys of image and label."""

  builder: tfds.core.DatasetBuilder
  image_key: str
  label_key: str
  label_set_key: str | None = None  # A Sequence(ClassLabel) of each example's labels (ReaL).

  @property
  def name(self) -> str:
    return self.builder.name

  @property
  def random_access(self) -> bool:
    """True if stored as ArrayRecord: read by example index."""
    return convert.has_array_record(self.builder)

  @property
  def streamable(self) -> bool:
    """True unless stored as ArrayRecord only, which `as_dataset` cannot read."""
    return self.builder.info.available_file_formats() != {convert.ARRAY_RECORD}

  def image_feature(self) -> tfds.features.Image:
    return self.builder.info.features[self.image_key]


def resolve(
    data: data_settings.DataSettings,
    dataset: str | None = None,
    label_key: str | None = None,
    label_set_key: str | None = None,
    *,
    splits: Mapping[str, str] | None = None,
) -> Source:
  """Finds (and prepares, if needed) the builder of `dataset` (default `data.dataset`), its image
  and label the supervised keys or `label_key`; `label_set_key`: several labels per example."""
  name = data.dataset if dataset is None else dataset
  storage.check_location(data.data_dir)
  try:
    with runtime.quiet_preparation():  # No progress bars in a run's log.
      builder = _prepared_builder(data, name, splits)
  except Exception as e:  # TFDS's JSON or proto error. pylint: disable=broad-except
    damaged = storage.damaged_info(e)
    if damaged is None:
      raise
    raise damaged from None
  storage.check_complete(builder, name)
  storage.check_readable(builder)
  keys = builder.info.supervised_keys
  image_key, supervised_label = (
      keys
      if (isinstance(keys, tuple) and len(keys) == 2 and all(isinstance(k, str) for k in keys))
      else ('image', 'label')
  )
  label_key = label_key or supervised_label
  features = builder.info.features
  if not (
      image_key in features
      and isinstance(features[image_key], tfds.features.Image)
      and label_key in features
      and isinstance(features[label_key], tfds.features.ClassLabel)
  ):
    raise ValueError(
        f'Dataset {name!r} is not an image-classification dataset: it needs an Image '
        f'feature and a ClassLabel feature, but its features are {features}.'
    )
  if label_set_key is not None and not (
      label_set_key in features
      and isinstance(features[label_set_key], tfds.features.Sequence)
      and isinstance(features[label_set_key].feature, tfds.features.ClassLabel)
  ):
    raise ValueError(
        f'Dataset {name!r} has no feature {label_set_key!r} holding a sequence of '
        f'class labels; its features are {features}.'
    )
  return Source(builder, image_key, label_key, label_set_key)


def _prepared_builder(
    data: data_settings.DataSettings, name: str, splits: Mapping[str, str] | None = None
) -> tfds.core.DatasetBuilder:
  """The builder of dataset `name`, prepared on first use (an image folder with a directory for
  each of `splits`)."""
  if name == dataset_names.DIGITS:
    return digits.prepare(data.data_dir)
  if name.startswith(dataset_names.FOLDER_PREFIX):
    return folder.prepare(
        name[len(dataset_names.FOLDER_PREFIX) :],
        data.data_dir,
        skip_unreadable=data.skip_unreadable_images,
        splits=splits,
    )
  try:
    builder = tfds.builder(name, data_dir=data.data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    message = (
        f'Unknown dataset {name!r}. Valid: {dataset_names.DIGITS!r} (embedded), '
        f"'{dataset_names.FOLDER_PREFIX}/path/to/images' (your own images) or any TFDS dataset "
        "name, e.g. 'cifar10', 'cifar100', 'imagenet2012' (tfds.list_builders())."
    )
    raise ValueError(message) from None
  storage.check_preparable(builder, name)
  _prepare_tfds(builder)
  return builder


def _prepare_tfds(builder: tfds.core.DatasetBuilder) -> None:
  """Prepares a TFDS dataset on first use; where that fails, one error that says how to (at once
  where its download cannot start: TFDS's retries take minutes to give up)."""
  if builder.is_prepared():
    return
  name, root = builder.name, builder.data_dir_root
  manual = builder.MANUAL_DOWNLOAD_INSTRUCTIONS
  what = 'its download cannot start'
  # TFDS's own download only (`tfds.testing.mock_data` makes it a no-op that needs no network).
  downloads = type(builder).download_and_prepare.__module__.startswith('tensorflow_datasets.core')
  probe = downloads and not manual and not _has_downloads(builder)
  reason = _unreachable_host(builder) if probe else None
  if reason is None:
    try:
      builder.download_and_prepare(file_format=convert.ARRAY_RECORD)
      return
    except Exception as e:  # No network, no write access... pylint: disable=broad-except
      what = 'TFDS cannot download it' if manual else 'preparing it failed'
      reason = f'{type(e).__name__}: {(str(e).strip().splitlines() or [""])[0][:300]}'
  if manual:
    how = (
        f'Put its archives in {root}/downloads/manual ({" ".join(manual.split())}), then run '
        f'`tfds build {name} --data_dir={root} --file_format=array_record`'
    )
  else:
    how = (
        f'Prepare it once where the network is reachable, `tfds build {name} '
        f'--data_dir={root} --file_format=array_record` (copy that directory here if this '
        'machine is offline)'
    )
  raise ValueError(
      f'Dataset {name!r} is not prepared in data_dir={root}, and {what} ({reason}). '
      f'{how}, then train with --config.data_dir={root}.'
  )


def _has_downloads(builder: tfds.core.DatasetBuilder) -> bool:
  """Whether TFDS may find `builder`'s archives on disk already: its download folder, the manual
  folder or the shared (legacy) one under the data dir holds a file."""
  downloads = builder.data_dir_root / 'downloads'
  folders = (downloads, downloads / builder.name, downloads / 'manual')
  return any(f.is_file() for folder in folders if folder.is_dir() for f in folder.iterdir())


def _unreachable_host(builder: tfds.core.DatasetBuilder) -> str | None:
  """'HOST:PORT (why)' for a host that `builder`'s downloads need (its own, or the proxy that
  stands for it) and that does not accept a connection within `DOWNLOAD_PROBE_SECONDS`; None where
  every one does, or the builder lists no URLs."""
  proxies = urllib.request.getproxies()
  ports = {'http': 80, 'https': 443, 'ftp': 21}
  hosts = set()
  for url in builder.url_infos or {}:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ports or not parts.hostname:
      continue
    if parts.scheme in proxies and not urllib.request.proxy_bypass(parts.hostname):
      parts = urllib.parse.urlsplit(proxies[parts.scheme])
      if not parts.hostname:
        continue
    hosts.add((parts.hostname, parts.port or ports.get(parts.scheme, 80)))
  refusals: dict[tuple[str, int], str | None] = {}  # None where it answered, else why not.

  def connect(host: str, port: int) -> None:
    try:
      socket.create_connection((host, port), timeout=DOWNLOAD_PROBE_SECONDS).close()
      refusals[host, port] = None
    except OSError as e:
      refusals[host, port] = f'{type(e).__name__}: {e}'

  # Daemon threads bound the name lookup too, which no socket timeout covers.
  probes = [threading.Thread(target=connect, args=h, daemon=True) for h in sorted(hosts)]
  for probe in probes:
    probe.start()
  deadline = time.monotonic() + DOWNLOAD_PROBE_SECONDS
  for probe in probes:
    probe.join(max(0.0, deadline - time.monotonic()))
  for host, port in sorted(hosts):
    why = refusals.get((host, port), f'no answer within {DOWNLOAD_PROBE_SECONDS:g} s')
    if why is not None:
      return f'{host}:{port} unreachable: {why}'
  return None


def check_split(source: Source, split: str) -> None:
  """Raises ValueError if `split` names a split that the dataset does not have."""
  known = list(source.builder.info.splits.keys())
  if not known:  # Split metadata unavailable (a mocked dataset): reading will tell.
    return
  for part in split.split('+'):
    base = part.split('[')[0].strip()
    if base not in known:
      raise ValueError(
          f'Dataset {source.name!r} has no split {base!r} (in {split!r}); valid '
          f"splits: {known}, optionally sliced, e.g. '{known[0]}[:90%]'."
      )


def num_examples(source: Source, split: Any) -> int:
  """Number of examples in `split` (a split name, slice or per-process sub-split)."""
  try:
    return source.builder.info.splits[split].num_examples
  except KeyError:  # No split metadata (a mocked dataset): count the records.
    records = source.builder.as_dataset(
        split=split, decoders={source.image_key: tfds.decode.SkipDecoding()}
    )
    count = int(records.cardinality())
    return count if count >= 0 else int(records.reduce(0, lambda n, _: n + 1))


def process_split(split: str, process_index: int, process_count: int) -> Any:
  return tfds.split_for_jax_process(split, process_index=process_index, process_count=process_count)
