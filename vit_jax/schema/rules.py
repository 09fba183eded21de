"""The rules a config field is checked against: each a predicate and the words that say what is
valid (`vit_jax.schema.config.FIELDS` gives every field one). Free of JAX and TensorFlow: it reads only
the light modules that name what a field may hold.
"""

import dataclasses
import math
from typing import Any, Callable, Iterable

from vit_jax.schema import augment_spec
from vit_jax.schema import dataset_names as datasets
from vit_jax.schema import eval_set_names
from vit_jax.schema import normalization


@dataclasses.dataclass(frozen=True)
class Rule:
  """What one field accepts: a predicate, and the words that tell a user what is valid;
  `unset`: what '' stands for where it stands for a value."""

  accepts: Callable[[Any], bool]
  describe: Callable[[], str]
  unset: str = ''

  @property
  def valid(self) -> str:
    return self.describe()


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer(low: int | None = None, high: int | None = None) -> Rule:
  """An int (not a bool) of at least `low` and at most `high`."""

  def words() -> str:
    if high is None:
      return 'an integer' if low is None else f'an integer >= {low}'
    return f'an integer in [{low}, {high}]'

  return Rule(
      lambda v: isinstance(v, int)
      and not isinstance(v, bool)
      and (low is None or v >= low)
      and (high is None or v <= high),
      words,
  )


def number(
    low: float,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
) -> Rule:
  """A finite number in the interval; `optional` also accepts None (unset)."""

  def accepts(v):
    if v is None:
      return optional
    return (
        _is_number(v)
        and (v > low if low_open else v >= low)
        and (v < high if high_open else v <= high)
    )

  if high == math.inf:
    words = f'a number {">" if low_open else ">="} {low:g}'
  else:
    words = f'a number in {"(" if low_open else "["}{low:g}, {high:g}{")" if high_open else "]"}'
  return Rule(accepts, lambda: words + (', or None (unset)' if optional else ''))


def choice(values: Iterable[Any], *, unset: str = '') -> Rule:
  """One of `values`; with `unset`, also '' meaning what `unset` says."""
  values = tuple(values)
  words = f'one of {list(values)}'
  if not unset:
    return Rule(lambda v: v in values, lambda: words)
  return Rule(lambda v: v == '' or v in values, lambda: f"'' ({unset}) or {words}", unset)


def text(*, empty: bool = False, optional: bool = False) -> Rule:
  """A string (non-empty unless `empty`); `optional` also accepts None."""
  return Rule(
      lambda v: (v is None and optional) or (isinstance(v, str) and (empty or bool(v))),
      lambda: ('a string' if empty else 'a non-empty string') + (' or None' if optional else ''),
  )


def boolean(*, optional: bool = False) -> Rule:
  """True or false; `optional` also accepts None (unset: decided automatically)."""
  return Rule(
      lambda v: isinstance(v, bool) or (v is None and optional),
      lambda: 'true or false' + (', or None (unset: automatic)' if optional else ''),
  )


PROBABILITY = number(0.0, 1.0)
RATE_BELOW_ONE = number(0.0, 1.0, high_open=True)
NAMES = Rule(
    lambda v: isinstance(v, (tuple, list)) and all(isinstance(n, str) for n in v),
    lambda: 'a tuple of parameter names',
)


def _is_normalization(value: Any) -> bool:
  """Whether `value` is a normalisation; numbers in its form that are out of range raise the
  ValueError that names them."""
  if isinstance(value, str) and normalization.numbers(value) is not None:
    normalization.mean_std(value)
    return True
  return value in normalization.NORMALIZATIONS


def normalization_rule(*, unset: str = '') -> Rule:
  """A name of `normalization.NORMALIZATIONS`, or per-channel numbers 'R,G,B/R,G,B' (mean/std);
  with `unset`, also '' meaning what `unset` says."""
  words = f"one of {list(normalization.NORMALIZATIONS)}, or numbers 'R,G,B/R,G,B' (mean/std)"
  return Rule(
      lambda v: (bool(unset) and v == '') or _is_normalization(v),
      lambda: f"'' ({unset}) or {words}" if unset else words,
      unset,
  )


def _is_randaugment(spec: Any) -> bool:
  if not isinstance(spec, str):
    return False
  if spec:
    augment_spec.parse_randaugment(spec)  # Its ValueError says what is wrong with the spec.
  return True


def _is_eval_sets(specs: Any) -> bool:
  eval_set_names.parse_all(specs)  # Its ValueError names the bad set and what is valid.
  return True


DATASET = Rule(datasets.named, lambda: 'a non-empty string')
EVAL_SETS = Rule(
    _is_eval_sets,
    lambda: "a tuple of test-set names 'DATASET[:SPLIT]' "
    "(vit_jax/evaluators/eval_sets.py), e.g. ('imagenet2012_real', 'imagenet_v2')",
)
RANDAUGMENT = Rule(
    _is_randaugment, lambda: "'' (off) or a timm spec such as 'rand-m9-mstd0.5-inc1'"
)
