"""memoire's Dopamine JAX ReplayBuffer against Dopamine 4.1.2's, side by side in one run.

Atari-like stream: uint8[84, 84] frames, stack 4, capacity 100,000 (both buffers), batch 32,
episodes of about 1,000 steps. Measures add throughput while filling, then uniform sampling, then
prioritized sampling followed by a priority update (Dopamine's Rainbow loop), and prints ratios.

    PYTHONPATH=. python benchmarks/bench_dopamine_jax.py [--fill 20000] [--samples 300]
"""

import argparse
import time

import numpy as np
from dopamine.jax.replay_memory import accumulator, elements, replay_buffer, samplers

from memoire.dopamine_compat import jax_replay_buffer as mj


def build(kind, prio, cap, horizon):
    if kind == "dopamine":
        acc = accumulator.TransitionAccumulator(stack_size=4, update_horizon=horizon, gamma=0.99)
        dist = (
            samplers.PrioritizedSamplingDistribution(0, max_capacity=cap)
            if prio
            else samplers.UniformSamplingDistribution(0)
        )
        return replay_buffer.ReplayBuffer(acc, dist, batch_size=32, max_capacity=cap)
    acc = mj.TransitionAccumulator(4, horizon, 0.99)
    dist = (
        mj.PrioritizedSamplingDistribution(0, max_capacity=cap)
        if prio
        else mj.UniformSamplingDistribution(0)
    )
    return mj.ReplayBuffer(acc, dist, batch_size=32, max_capacity=cap)


def steps(n, seed=0):
    rng = np.random.default_rng(seed)
    # Frames with structure (snappy compresses real Atari frames well; pure noise would not).
    base = rng.integers(0, 255, size=(16, 84, 84), dtype=np.uint8)
    out = []
    for t in range(n):
        frame = base[t % 16].copy()
        frame[t % 84] = t % 251
        out.append(elements.TransitionElement(frame, t % 18, 1.0, (t + 1) % 1000 == 0))
    return out


def timed(fn, n):
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def run(prio, fill, samples, cap, horizon):
    data = steps(fill)
    res = {}
    for kind in ("dopamine", "memoire"):
        buf = build(kind, prio, cap, horizon)
        kw = {"priority": 1.0} if prio else {}
        t0 = time.perf_counter()
        for s in data:
            buf.add(s, **kw)
        add = (time.perf_counter() - t0) / fill
        if prio:
            rng = np.random.default_rng(1)

            def step(buf=buf, rng=rng):
                _, meta = buf.sample(with_sample_metadata=True)
                buf.update(meta.keys, priorities=rng.random(32) + 0.1)

            sample = timed(step, samples)
        else:
            sample = timed(buf.sample, samples)
        res[kind] = (add, sample)
    name = "prioritized (sample+update)" if prio else "uniform"
    d, m = res["dopamine"], res["memoire"]
    print(
        f"{name:28s} add/step: dopamine {d[0] * 1e6:8.1f} us  memoire {m[0] * 1e6:6.1f} us  "
        f"ratio {d[0] / m[0]:6.1f}x"
    )
    print(
        f"{'':28s} sample32: dopamine {d[1] * 1e6:8.1f} us  memoire {m[1] * 1e6:6.1f} us  "
        f"ratio {d[1] / m[1]:6.1f}x"
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fill", type=int, default=20000, help="steps added (capacity stays 100k)")
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--capacity", type=int, default=100000)
    p.add_argument("--horizon", type=int, default=1)
    a = p.parse_args()
    print(
        f"uint8[84,84] stack 4, horizon {a.horizon}, capacity {a.capacity}, "
        f"{a.fill} steps added, batch 32"
    )
    for prio in (False, True):
        run(prio, a.fill, a.samples, a.capacity, a.horizon)


if __name__ == "__main__":
    main()
