"""Throughput of memoire's core next to a plain NumPy ring buffer doing the same work.

Measures, for (a) 4-float states and (b) 84x84 uint8 Atari frames with frame_stack 4:
  - add_entry: one Python call per step (memoire) vs one row assignment per field (NumPy);
  - sample: batches of 32 stacked transitions, prev and next stacks of every field
    (memoire: prioritized, stratified; NumPy: uniform indices + fancy indexing of the same
    frame-stacked rows, the same 7 fields);
and the memory per stored Atari entry (memory_bytes / max_step) against the 7056 raw frame
bytes. Each figure is the median of several repetitions; ratios are memoire / NumPy rates.

Usage: PYTHONPATH=. python benchmarks/bench_core.py [--quick]
"""

import argparse
import statistics
import time

import numpy as np

import memoire

FLOAT = np.float32


class NumpyRing:
    """The obvious NumPy replay buffer: one array per field, ring index, fancy-indexed stacks."""

    def __init__(self, templates, capacity, frame_stack, multi_step, seed=0):
        self.cols = [np.zeros((capacity,) + t.shape, t.dtype) for t in templates]
        self.cap = capacity
        self.fs = frame_stack
        self.ms = multi_step
        self.n = 0
        self.rng = np.random.default_rng(seed)

    def add(self, *row):
        k = self.n % self.cap
        for col, x in zip(self.cols, row):
            col[k] = x
        self.n += 1

    def sample(self, batch):
        # Valid ids: a full stack behind and multi_step ahead, inside what is stored (one long
        # episode, so no episode boundaries to respect: less work than memoire does).
        lo = max(0, self.n - self.cap) + self.fs - 1
        hi = self.n - self.ms
        ids = self.rng.integers(lo, hi, size=batch)
        prev = (ids[:, None] + np.arange(1 - self.fs, 1)) % self.cap
        nxt = (prev + self.ms) % self.cap
        return [c[prev] for c in self.cols], [c[nxt] for c in self.cols], ids


def templates(state_shape, state_dtype):
    return [
        np.zeros(state_shape, state_dtype),
        np.zeros([], np.int32),
        np.zeros([], FLOAT),
        np.zeros([], FLOAT),
        np.zeros([], FLOAT),
        np.zeros([], FLOAT),
        np.zeros([0], np.uint8),
    ]


def rate(fn, count, reps):
    """Median calls per second of `fn` over `reps` repetitions of `count` calls."""
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(count):
            fn()
        rates.append(count / (time.perf_counter() - t0))
    return statistics.median(rates)


def bench_case(name, state_shape, state_dtype, capacity, frame_stack, adds, samples, reps):
    tmpl = templates(state_shape, state_dtype)
    rem = memoire.ReplayMemory(*tmpl, capacity)
    rem.seed(0)
    rem.frame_stack = frame_stack
    ring = NumpyRing(tmpl, capacity, frame_stack, 1)
    rng = np.random.default_rng(1)
    if np.issubdtype(state_dtype, np.integer):
        states = rng.integers(0, 255, size=(256,) + state_shape, dtype=state_dtype)
    else:
        states = rng.normal(size=(256,) + state_shape).astype(state_dtype)
    a, r, p, v, i = np.int32(1), FLOAT(0.5), FLOAT(1.0), FLOAT(0.0), tmpl[6]

    # Fill both to capacity with one long episode per `capacity // 4` steps.
    ep_len = max(capacity // 4, frame_stack + 2)
    step = [0]

    def add_memoire():
        k = step[0]
        if k % ep_len == 0:
            if k:
                rem.close_episode()
            rem.new_episode()
        rem.add_entry(states[k & 255], a, r, p, v, i, 1.0)
        step[0] = k + 1

    def add_numpy():
        ring.add(states[ring.n & 255], a, r, p, v, v, i)

    add_rates = (rate(add_memoire, adds, reps), rate(add_numpy, adds, reps))
    while step[0] < capacity:
        add_memoire()
    rem.close_episode()
    while ring.n < capacity:
        add_numpy()

    def sample_memoire():
        rem.get_batch(32)

    def sample_numpy():
        ring.sample(32)

    # Both produce the same stacks: check once that memoire's shapes are what NumPy builds.
    b = rem.get_batch(32)
    prev_np, next_np, _ = ring.sample(32)
    assert b.prev[0].shape == prev_np[0].shape == (32, frame_stack) + state_shape
    assert b.next[0].shape == next_np[0].shape
    sample_rates = (rate(sample_memoire, samples, reps), rate(sample_numpy, samples, reps))
    return name, add_rates, sample_rates, rem


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    scale = 10 if args.quick else 1
    reps = 3 if args.quick else args.reps
    cases = [
        bench_case(
            "4-float states, stack 1",
            (4,),
            FLOAT,
            100_000,
            1,
            200_000 // scale,
            50_000 // scale,
            reps,
        ),
        bench_case(
            "84x84 uint8, stack 4",
            (84, 84),
            np.uint8,
            50_000,
            4,
            100_000 // scale,
            20_000 // scale,
            reps,
        ),
    ]
    print(f"{'case':28} {'op':18} {'memoire/s':>12} {'numpy/s':>12} {'ratio':>7}")
    for name, add_rates, sample_rates, _ in cases:
        for op, (m, n) in (("add_entry", add_rates), ("sample batch 32", sample_rates)):
            print(f"{name:28} {op:18} {m:12,.0f} {n:12,.0f} {m / n:7.2f}")
    rem = cases[1][3]
    per_entry = rem.memory_bytes / rem.max_step
    print(
        f"\nAtari memory per stored entry: {per_entry:,.1f} bytes = {per_entry / 7056:.3f} x "
        f"the 7056 raw frame bytes (entry_size {rem.entry_size}, max_step {rem.max_step})"
    )
    atari_rate = cases[1][2][0]
    print(
        f"targets: Atari batch-32 sampling {atari_rate:,.0f}/s (target >= 5,000/s: "
        f"{'met' if atari_rate >= 5000 else 'MISSED'}); memory per entry "
        f"{'met' if per_entry <= 1.1 * 7056 else 'MISSED'} (<= 1.10 x raw)"
    )


if __name__ == "__main__":
    main()
