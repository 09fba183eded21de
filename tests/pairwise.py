"""Pairwise (all-pairs) combinations: few cases in which every two factors meet in every pair of
their values, for the tests of parts that combine."""

import itertools
from typing import Any, Sequence


def _pairs(case: tuple[Any, ...]) -> set[tuple[int, Any, int, Any]]:
  return {(i, case[i], j, case[j]) for i, j in itertools.combinations(range(len(case)), 2)}


def all_pairs(*factors: Sequence[Any]) -> list[tuple[Any, ...]]:
  """Cases (one value per factor) covering every pair of values of every two factors: greedily,
  the case of the full product that covers the most pairs not covered yet, until none is left."""
  product = list(itertools.product(*factors))
  uncovered = set().union(*(_pairs(case) for case in product))
  cases = []
  while uncovered:
    case = max(product, key=lambda c: len(_pairs(c) & uncovered))
    cases.append(case)
    uncovered -= _pairs(case)
  return cases
