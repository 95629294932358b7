"""memoire vs Dopamine (dopamine-rl 4.1.2) TF-era replay buffers, in one run.

Atari-like setting: uint8[84, 84] observations, stack 4, capacity 100,000, batch 32, update
horizons 1 and 3. Measures add, sample_transition_batch, and prioritized sample +
set_priority, and prints per-call times and the ratio (Dopamine time / memoire time).

    PYTHONPATH=. python benchmarks/bench_dopamine_tf.py [--fill 30000] [--samples 300]
"""

import argparse
import gc
import time

import numpy as np
from dopamine.tf.replay_memory import circular_replay_buffer as dopamine_crb
from dopamine.tf.replay_memory import prioritized_replay_buffer as dopamine_prb

from memoire.dopamine_compat import OutOfGraphPrioritizedReplayBuffer, OutOfGraphReplayBuffer

CAPACITY = 100_000
SHAPE = (84, 84)
STACK = 4
BATCH = 32


def stream(n, seed=0):
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (64,) + SHAPE, dtype=np.uint8)
    actions = rng.integers(0, 18, n)
    rewards = rng.standard_normal(n)
    terminals = rng.random(n) < 1e-3
    return [
        (frames[i % 64], int(actions[i]), float(rewards[i]), bool(terminals[i])) for i in range(n)
    ]


def time_adds(buf, steps, prioritized):
    t0 = time.perf_counter()
    if prioritized:
        for obs, a, r, t in steps:
            buf.add(obs, a, r, t, 1.0)
    else:
        for obs, a, r, t in steps:
            buf.add(obs, a, r, t)
    return (time.perf_counter() - t0) / len(steps)


def time_calls(fn, n):
    fn()  # warm up
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def run(horizon, fill, samples):
    steps = stream(fill)
    kw = dict(
        observation_shape=SHAPE,
        stack_size=STACK,
        replay_capacity=CAPACITY,
        batch_size=BATCH,
        update_horizon=horizon,
        gamma=0.99,
    )
    rows = []
    for label, ours_cls, theirs_cls, prioritized in [
        ("uniform", OutOfGraphReplayBuffer, dopamine_crb.OutOfGraphReplayBuffer, False),
        (
            "prioritized",
            OutOfGraphPrioritizedReplayBuffer,
            dopamine_prb.OutOfGraphPrioritizedReplayBuffer,
            True,
        ),
    ]:
        result = {}
        for who, cls in [("memoire", ours_cls), ("dopamine", theirs_cls)]:
            buf = cls(**kw)
            add = time_adds(buf, steps, prioritized)
            sample = time_calls(buf.sample_transition_batch, samples)
            entry = {"add": add, "sample": sample}
            if prioritized:
                rng = np.random.default_rng(1)

                def sample_and_update(buf=buf, rng=rng):
                    batch = buf.sample_transition_batch()
                    buf.set_priority(batch[7], rng.random(BATCH).astype(np.float32))

                entry["sample+set_priority"] = time_calls(sample_and_update, samples)
            result[who] = entry
            del buf
            gc.collect()
        for op in result["memoire"]:
            m, d = result["memoire"][op], result["dopamine"][op]
            rows.append((horizon, label, op, m, d, d / m))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fill",
        type=int,
        default=30_000,
        help="transitions added before sampling (capacity stays 100,000)",
    )
    parser.add_argument("--samples", type=int, default=300, help="timed calls per operation")
    parser.add_argument("--horizons", type=int, nargs="+", default=[1, 3])
    args = parser.parse_args()
    print(
        "capacity {:,}  obs uint8{}  stack {}  batch {}  fill {:,}".format(
            CAPACITY, list(SHAPE), STACK, BATCH, args.fill
        )
    )
    print(
        "{:>3} {:<12} {:<20} {:>12} {:>12} {:>8}".format(
            "n", "buffer", "operation", "memoire us", "dopamine us", "ratio"
        )
    )
    for horizon in args.horizons:
        for h, label, op, m, d, ratio in run(horizon, args.fill, args.samples):
            print(
                "{:>3} {:<12} {:<20} {:>12.2f} {:>12.2f} {:>7.1f}x".format(
                    h, label, op, m * 1e6, d * 1e6, ratio
                )
            )


if __name__ == "__main__":
    main()
