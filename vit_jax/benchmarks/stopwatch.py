"""Timed blocks of work that alternate between contenders (each a `run(n)` doing n steps) sharing
one machine, so that drift in its speed slows them alike; and their report."""

import dataclasses
import os
import statistics
import time
from typing import Callable, Sequence


def load_average() -> str:
  """The 1-, 5- and 15-minute load averages, to judge how busy the machine was."""
  return ' '.join(f'{x:.2f}' for x in os.getloadavg())


@dataclasses.dataclass
class Timing:
  """Wall-clock and process CPU seconds per step of each timed block, in the order they ran."""

  block_wall_s: tuple[float, ...]
  block_cpu_s: tuple[float, ...]

  @property
  def wall_s(self) -> float:
    """The median block's wall-clock seconds per step."""
    return statistics.median(self.block_wall_s)

  @property
  def cpu_s(self) -> float:
    """The median block's process CPU seconds per step."""
    return statistics.median(self.block_cpu_s)


def paired_ratios(ours: Timing, theirs: Timing) -> list[float]:
  """Their time over ours, block by block: each pair ran back to back, so drift in the
  machine's speed over the run cancels out of every ratio."""
  return [t / o for o, t in zip(ours.block_wall_s, theirs.block_wall_s)]


def time_blocks(
    runs: Sequence[Callable[[int], None]],
    *,
    steps: int,
    warmups: Sequence[int],
    repeats: int,
    cpu_clocks: Sequence[Callable[[], float]] | None = None,
    settle: Callable[[], None] = lambda: None,
) -> list[Timing]:
  """Per-step wall and CPU seconds (`cpu_clocks[i]`, default this process's) of each `run(n)`,
  their blocks alternating, each after `settle()` and `warmups[i]` untimed steps."""
  cpu_clocks = cpu_clocks or [time.process_time] * len(runs)
  wall: list[list[float]] = [[] for _ in runs]
  cpu: list[list[float]] = [[] for _ in runs]
  for _ in range(repeats):
    for i, run in enumerate(runs):
      settle()
      run(warmups[i])
      start_wall, start_cpu = time.perf_counter(), cpu_clocks[i]()
      run(steps)
      wall[i].append((time.perf_counter() - start_wall) / steps)
      cpu[i].append((cpu_clocks[i]() - start_cpu) / steps)
  return [Timing(tuple(w), tuple(c)) for w, c in zip(wall, cpu)]


def report(key: str, value: str) -> None:
  """Prints one `key: value` line of a benchmark's report, keys aligned."""
  print(f'{key + ":":<20}{value}', flush=True)
