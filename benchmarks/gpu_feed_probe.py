"""Where a JAX learner's time goes with the device feed (a diagnostic, next to bench_gpu_feed.py).

Prints, for Feed(ReplayMemory, B, device=<jax device>): the rate of get_batch alone (what one
sampler thread can draw), the rate of next(feed) with no learner (what the feed delivers), a
profile of next(feed) on the learner's thread (cProfile, top entries by own time), and the
JAX step's rate fed by it for a few (threads, device_slots) against the fixed batch, in the
same run. Needs memoire, numpy and JAX.

    python benchmarks/gpu_feed_probe.py [--batch 32] [--fill 5000] [--seconds 1]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu_feed import fields, jax_learner, make_memory, run_jax  # noqa: E402

from memoire.feed import Feed  # noqa: E402


def main(argv=None):
    import jax

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--fill", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args(argv)
    b = args.batch
    rem = make_memory(args.fill, 1)
    dev = jax.devices()[0]
    print(f"jax {jax.__version__} {dev}, B={b}, load {os.getloadavg()}", flush=True)

    t = time.perf_counter()
    for _ in range(200):
        rem.get_batch(b)
    print(f"get_batch alone: {200 / (time.perf_counter() - t):.0f} batches/s", flush=True)

    for threads in (2, 4):
        with Feed(rem, b, depth=4, threads=threads, device=dev) as feed:
            for _ in range(50):
                x = fields(next(feed))
                feed.release()  # nothing reads it: its slot goes back at once
            jax.block_until_ready(x)
            t = time.perf_counter()
            for _ in range(500):
                x = fields(next(feed))
                feed.release()  # nothing reads it: its slot goes back at once
            jax.block_until_ready(x)
            rate = 500 / (time.perf_counter() - t)
            print(f"next(feed) alone, threads={threads}: {rate:.0f} batches/s", flush=True)
            if threads == 2:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(300):
                    x = fields(next(feed))
                    feed.release()
                prof.disable()
                jax.block_until_ready(x)
                pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(14)

    params, opt, step = jax_learner()
    target = jax.tree_util.tree_map(lambda x: x.copy(), params)
    learner = (params, opt, target, step)
    fixed = jax.device_put(fields(rem.get_batch(b)))
    for rnd in range(2):
        base = run_jax(lambda: fixed, args.seconds, learner)
        line = [f"round {rnd}: fixed {base:.0f} steps/s"]
        for threads, slots in ((2, 3), (4, 3), (4, 6)):
            with Feed(rem, b, depth=4, threads=threads, device=dev, device_slots=slots) as feed:
                r = run_jax(lambda: fields(next(feed)), args.seconds, learner, feed.release)
            line.append(f"threads={threads} slots={slots}: {r / base:.3f}x")
        print("; ".join(line), flush=True)


if __name__ == "__main__":
    main()
