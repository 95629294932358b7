"""Cost of the non-finite rule on the add path: one build, two memories side by side, one
refusing NaN/inf rewards, probs and values (the default) and one with ``allow_nonfinite`` (no
scan), each adding the same batches in turn; the ratio of their best times.

    PYTHONPATH=. python benchmarks/bench_nonfinite.py [--rows 20000] [--repeats 60]

Tiny rows (state float32[4]) make the scan's share the largest it can be.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from memoire import ReplayMemory

TEMPLATES = (
    np.zeros([4], np.float32),
    np.zeros([], np.int64),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([0], np.uint8),
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=20_000, help="rows per add_entries call")
    p.add_argument("--repeats", type=int, default=60, help="timed rounds (best one counts)")
    args = p.parse_args()
    n = args.rows
    batch = (
        np.ones((n, 4), np.float32),
        np.zeros(n, np.int64),
        np.ones(n, np.float32),
        np.full(n, 0.5, np.float32),
        np.zeros(n, np.float32),
        np.zeros((n, 0), np.uint8),
        np.ones(n, np.float32),
    )
    memories = {}
    for allow in (False, True):
        memories[allow] = ReplayMemory(*TEMPLATES, 5 * n)
        memories[allow].allow_nonfinite = allow
    best = {False: float("inf"), True: float("inf")}
    for _ in range(args.repeats):
        for allow, m in memories.items():
            m.new_episode()
            t = time.perf_counter()
            for _ in range(4):
                m.add_entries(*batch)
            best[allow] = min(best[allow], time.perf_counter() - t)
            m.close_episode(do_update_value=False, do_update_weight=False)
    rate = {k: 4 * n / v / 1e6 for k, v in best.items()}
    print(
        f"add_entries, {n} rows a call: checked {rate[False]:.1f} M rows/s, "
        f"allow_nonfinite {rate[True]:.1f} M rows/s, ratio {rate[False] / rate[True]:.2f}"
    )


if __name__ == "__main__":
    main()
