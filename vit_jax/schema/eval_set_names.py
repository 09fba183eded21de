"""Test sets by name (`config.eval_sets`), read without TensorFlow or JAX: what a name
'DATASET[:SPLIT]' reads and how it is scored, so that a config's names are checked before anything
is imported (`vit_jax.evaluators.eval_sets` reads and scores them)."""

import dataclasses
from typing import Any, Sequence

from vit_jax.schema import dataset_names as datasets

SCORINGS = ('top1', 'real', 'imagenet_a', 'imagenet_r')


@dataclasses.dataclass(frozen=True)
class Published:
  """A published ImageNet test set: its labelled splits (the first is the default), its scoring
  and the features holding its label (and its ReaL labels)."""

  splits: tuple[str, ...]
  scoring: str
  label_key: str | None = None  # None: the dataset's supervised label.
  label_set_key: str | None = None


PUBLISHED = {
    'imagenet2012': Published(('validation', 'train'), 'top1'),
    'imagenet2012_real': Published(
        ('validation',), 'real', label_key='original_label', label_set_key='real_label'
    ),
    'imagenet_v2': Published(('test',), 'top1'),
    'imagenet_a': Published(('test',), 'imagenet_a'),
    'imagenet_r': Published(('test',), 'imagenet_r'),
    'imagenet_sketch': Published(('test',), 'top1'),
}


@dataclasses.dataclass(frozen=True)
class EvalSetName:
  """One test set by name: the dataset and split it reads and how it is scored (`SCORINGS`)."""

  name: str  # As written in the list: the prefix of its metrics.
  dataset: str
  split: str
  scoring: str = 'top1'
  label_key: str | None = None
  label_set_key: str | None = None

  @property
  def reads(self) -> tuple[Any, ...]:
    """What it reads and scores: two sets alike here give the same metrics."""
    return (self.dataset, self.split, self.scoring, self.label_key, self.label_set_key)


def _known_dataset(name: str) -> str:
  """`name` if it names a dataset (its TFDS builder is registered); ValueError otherwise."""
  if name == datasets.DIGITS or name.startswith(datasets.FOLDER_PREFIX):
    return name
  if datasets.unknown(name.split('/')[0]):
    raise ValueError(
        f'unknown dataset {name!r}; valid: {list(PUBLISHED)}, any TFDS dataset name '
        f"(tfds.list_builders()), '{datasets.DIGITS}' or '{datasets.FOLDER_PREFIX}/path/to/images'"
        ', each optionally followed by :SPLIT'
    )
  return name


def parse(spec: str, *, dataset: str = '', eval_split: str = 'test') -> EvalSetName:
  """The set `spec` names ('DATASET[:SPLIT]'), whose default split is `eval_split` where DATASET
  is the run's `dataset`; ValueError for an unknown dataset or a published set's unknown split."""
  if not isinstance(spec, str) or not spec.strip():
    raise ValueError(f"{spec!r} is not a set name; write 'DATASET[:SPLIT]', e.g. 'imagenet_v2'")
  is_folder = spec.startswith(datasets.FOLDER_PREFIX)
  rest = spec[len(datasets.FOLDER_PREFIX) :] if is_folder else spec
  name, _, split = rest.partition(':')
  name = (datasets.FOLDER_PREFIX if is_folder else '') + name.strip()
  if name in ('', datasets.FOLDER_PREFIX):
    raise ValueError(f'{spec!r} names no dataset')
  _known_dataset(name)
  published = PUBLISHED.get(name.split('/')[0])
  split = split.strip() or (
      eval_split if name == dataset else published.splits[0] if published else 'test'
  )
  if published is None:
    return EvalSetName(spec, name, split)
  for part in split.split('+'):
    if part.split('[')[0].strip() not in published.splits:
      raise ValueError(
          f'{spec!r}: {name} has no labelled split {part!r}; valid: '
          f'{list(published.splits)}, optionally sliced, e.g. '
          f"'{name}:{published.splits[0]}[:1000]'"
      )
  return EvalSetName(
      spec, name, split, published.scoring, published.label_key, published.label_set_key
  )


def parse_all(
    specs: Sequence[str], *, dataset: str = '', eval_split: str = 'test'
) -> tuple[EvalSetName, ...]:
  """The sets of a list of names (`parse`); ValueError naming the first bad or repeated one."""
  if isinstance(specs, str) or not isinstance(specs, (tuple, list)):
    raise ValueError(
        f"must be a tuple of set names, e.g. ('imagenet2012_real', 'imagenet_v2'); "
        f'got {specs!r}'
    )
  repeated = sorted({spec for spec in specs if list(specs).count(spec) > 1})
  if repeated:
    raise ValueError(f'names {repeated} more than once')
  return tuple(parse(spec, dataset=dataset, eval_split=eval_split) for spec in specs)
