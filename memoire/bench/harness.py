"""Timing harness: the same operation on several systems, alternating, several repetitions.

Each repetition times every system once, in a rotated order, for about ``block_seconds``; the
figure kept is the median over repetitions of seconds per operation. Alternating spreads slow
drifts of the machine (other processes, thermal state, page cache) over all systems alike.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Dict, List, Optional


@dataclasses.dataclass
class Measurement:
    """Seconds per operation of one system on one workload."""

    workload: str
    system: str
    seconds: List[float]  # per operation, one per repetition
    items_per_op: int = 1  # transitions (or bytes) moved by one operation
    unit: str = "transitions"

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def throughput(self) -> float:
        """Items per second at the median."""
        return self.items_per_op / self.median


def _calibrate(op: Callable[[], object], block_seconds: float) -> int:
    """How many calls of ``op`` take about ``block_seconds`` (at least 1)."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            op()
        elapsed = time.perf_counter() - start
        if elapsed >= block_seconds / 4 or n >= 1 << 20:
            return max(1, int(n * block_seconds / max(elapsed, 1e-9)))
        n *= 4


def compare(
    workload: str,
    ops: Dict[str, Callable[[], object]],
    *,
    repeats: int = 5,
    block_seconds: float = 0.2,
    items_per_op: int = 1,
    unit: str = "transitions",
    calls: Optional[Dict[str, int]] = None,
) -> List[Measurement]:
    """Times each op in ``ops`` (system name -> zero-argument callable).

    Args:
      repeats: repetitions; each times every system once, in a rotated order.
      block_seconds: target duration of one timed block.
      items_per_op: what one call moves, for throughput columns.
      calls: fixed call counts per system instead of calibration (for ops that consume state,
        like adds into a bounded buffer).
    """
    names = list(ops)
    counts = dict(calls) if calls else {n: _calibrate(ops[n], block_seconds) for n in names}
    seconds: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            op, n = ops[name], counts[name]
            start = time.perf_counter()
            for _ in range(n):
                op()
            seconds[name].append((time.perf_counter() - start) / n)
    return [Measurement(workload, n, seconds[n], items_per_op, unit) for n in names]
