"""What the learner's thread spends per batch, and the JAX face's sampler threads' scaling: the
CPU figures of the device path (docs/FEED.md), side by side in one run.

1. The learner's thread per ``next(feed)`` (its own CPU time, ``time.thread_time``, and the
   wall time ``next`` takes), B=32 Atari-like batches (uint8[84, 84] frames, stack 4), with a
   sleep standing for the train step (``--step-ms``, default 3 ms, so that the feed keeps up
   and what is measured is the hand-over, not a wait), on JAX's default device (the CPU here,
   through the device path's host stand-in). For a ReplayMemory and memoire's JAX face:

     host batches       Feed(buffer, B): numpy views of a host ring slot (the reference)
     device, release    Feed(buffer, B, device="jax") with feed.release(after) after each step:
                        the slot's arrays, imported once, lent (what the agents do)
     device, no release the same without release: each batch is given back by deleting its
                        arrays, and its slot imported again when it comes round

   And the hand-over alone: next(feed) (+ release) in a tight loop, no step, on a memory of
   uint8[4] states (a feed that never makes the learner wait): the code's own cost, with the
   learner's caches warm.

2. The JAX face's host feed at B=256: batches/s with 1 and 2 sampler threads (``Feed(buffer,
   256, threads=t)``, no step), and the ratio. The threads draw and gather under a shared hold
   of the store's lock.

Rounds are interleaved and medians kept: the machine may be shared (the load is printed).

    PYTHONPATH=. python benchmarks/bench_learner_thread.py [--rounds 5] [--takes 300]
        [--step-ms 3] [--fill 20000] [--scaling-seconds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_gpu_feed import jax_face_buffer, make_memory  # noqa: E402

from memoire.feed import Feed  # noqa: E402


def per_next(feed, takes: int, step_s: float, release: bool):
    """(median thread CPU us, median wall us) per next(feed) (+ release) over `takes`."""
    import jax

    for _ in range(10):  # the slots' first imports are not what is measured
        b = next(feed)
        if release:
            feed.release(after=None)
        del b
        time.sleep(step_s)
    cpu, wall = [], []
    marker = jax.numpy.zeros(())
    for _ in range(takes):
        t0, w0 = time.thread_time(), time.perf_counter()
        b = next(feed)
        if release:
            feed.release(after=marker)  # a ready array: given back at the next take
        cpu.append(time.thread_time() - t0)
        wall.append(time.perf_counter() - w0)
        del b
        time.sleep(step_s)
    return statistics.median(cpu) * 1e6, statistics.median(wall) * 1e6


def learner_thread(args) -> dict:
    rem = make_memory(args.fill)
    face = jax_face_buffer(min(args.fill, 20000), 32)
    sources = {"ReplayMemory": rem}
    if face is not None:
        sources["JAX face"] = face
    ways = {
        "host batches": dict(device=None, release=False),
        "device, release": dict(device="jax", release=True),
        "device, no release": dict(device="jax", release=False),
    }
    got = {(s, w): [] for s in sources for w in ways}
    step_s = args.step_ms / 1000
    for r in range(args.rounds):
        for s, buf in sources.items():
            for w, how in ways.items():
                with Feed(buf, 32, depth=4, threads=1, seed=r, device=how["device"]) as feed:
                    got[(s, w)].append(per_next(feed, args.takes, step_s, how["release"]))
    print(f"1. learner's thread per next(feed), B=32, a {args.step_ms:g} ms sleep as the step")
    print(f"   {'source':<13} {'way':<20} {'CPU us':>8} {'wall us':>8}  (medians of rounds)")
    out = {}
    for (s, w), runs in got.items():
        c = statistics.median(x[0] for x in runs)
        wall = statistics.median(x[1] for x in runs)
        out[f"{s}, {w}"] = {"cpu_us": c, "wall_us": wall}
        print(f"   {s:<13} {w:<20} {c:8.1f} {wall:8.1f}")
    return out


def hand_over(args) -> dict:
    """CPU us per next (+ release) in a tight loop over a tiny-state memory, host vs device."""
    import jax

    from memoire import ReplayMemory
    from memoire.bench.ingest import templates

    rem = ReplayMemory(*templates((4,), np.uint8), 20000)
    rem.frame_stack = 4
    for _ in range(10):
        rem.new_episode()
        rem.add_entries(
            np.zeros((1000, 4), np.uint8),
            np.zeros(1000, np.int64),
            *[np.ones(1000, np.float32)] * 3,
            np.zeros((1000, 0), np.uint8),
            np.ones(1000, np.float32),
        )
        rem.close_episode()
    marker = jax.numpy.zeros(())
    out = {}
    for name, device, release in (("host", None, False), ("device, release", "jax", True)):
        runs = []
        for _ in range(args.rounds):
            with Feed(rem, 32, depth=8, threads=2, device=device) as feed:
                for _ in range(100):
                    next(feed)
                    if release:
                        feed.release(after=marker)
                t0 = time.thread_time()
                for _ in range(3000):
                    next(feed)
                    if release:
                        feed.release(after=marker)
                runs.append((time.thread_time() - t0) / 3000 * 1e6)
        out[name] = statistics.median(runs)
    print(
        f"   hand-over alone (tight loop, uint8[4] states): host {out['host']:.1f} us, "
        f"device with release {out['device, release']:.1f} us"
    )
    return out


def scaling(args) -> dict:
    face = jax_face_buffer(min(args.fill, 20000), 256)
    if face is None:
        print("2. (skipped: the JAX face needs dopamine-rl)")
        return {}
    rates = {1: [], 2: []}
    for _ in range(args.rounds):
        for t in (1, 2):
            with Feed(face, 256, depth=8, threads=t) as feed:
                for _ in range(10):
                    next(feed)
                n, start = 0, time.perf_counter()
                while time.perf_counter() - start < args.scaling_seconds:
                    b = next(feed)
                    del b
                    n += 1
                rates[t].append(n / (time.perf_counter() - start))
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    print("2. the JAX face's host feed, B=256, no step")
    print(f"   1 thread {one:7.1f} batches/s, 2 threads {two:7.1f} batches/s: {two / one:.2f}x")
    return {"1 thread": one, "2 threads": two, "ratio": two / one}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--takes", type=int, default=300)
    ap.add_argument("--step-ms", type=float, default=3.0)
    ap.add_argument("--fill", type=int, default=20000)
    ap.add_argument("--scaling-seconds", type=float, default=2.0)
    ap.add_argument("--only", choices=("thread", "scaling"), default=None)
    args = ap.parse_args(argv)
    import jax

    print(
        f"jax {jax.__version__} ({jax.devices()[0]}), {os.cpu_count()} cpus, "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    if args.only != "scaling":
        learner_thread(args)
        hand_over(args)
    if args.only != "thread":
        scaling(args)
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
