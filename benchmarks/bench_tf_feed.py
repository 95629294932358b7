"""What Dopamine's TF learner waits on for a batch: memoire's out-of-graph buffer with the
prefetching feed off (prefetch_depth 0, today's synchronous sampling) and on, side by side.

Atari-size batches: uint8[84, 84] frames, stack 4, batch 32, ``--fill`` transitions stored
(capacity = fill). Two buffers with the same contents, one per setting; each timed call is
the learner thread's time to obtain one batch, followed by a simulated learner step
(``--step-ms`` of sleep: the step of an accelerator leaves the CPU to the sampler threads):

  sample      ``sample_transition_batch()`` (DQN), and for the prioritized buffer the same
              followed by ``set_priority`` on its indices (Rainbow's order);
  in-graph    ``sess.run`` of an op on Dopamine's WrappedReplayBuffer tensors: Dopamine's
              in-graph sample, which calls ``sample_transition_batch`` through
              tf.numpy_function (graph mode, TF 2.x ``tf.compat.v1``).

With ``--e2e N``, also end to end: ``memoire train`` of Dopamine's TF DQN on Pong
(configs/atari/tf_dqn.gin against tf_dqn_feed.gin, shortened by gin bindings), N runs of
each, alternating, env steps/s of each run's last iteration (median).

Settings are timed in alternating rounds (off/on, then on/off); per round the median per
call, reported as the median over rounds and as the ratio off / on (> 1: the feed saves the
learner that much). Run on a shared machine: compare the ratios, not the absolute times.

    PYTHONPATH=. nice -n 10 python benchmarks/bench_tf_feed.py \\
        [--fill 100000] [--calls 200] [--rounds 4] [--step-ms 5] [--depth 4] [--threads 1]
        [--e2e 2]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from memoire.dopamine_compat import OutOfGraphPrioritizedReplayBuffer, OutOfGraphReplayBuffer

SHAPE = (84, 84)
STACK = 4
BATCH = 32


def make(cls, fill, depth, threads):
    """A buffer of ``fill`` Atari-like transitions (the same for every call)."""
    buf = cls(
        observation_shape=SHAPE,
        stack_size=STACK,
        replay_capacity=fill,
        batch_size=BATCH,
        seed=0,
        prefetch_depth=depth,
        prefetch_threads=threads,
    )
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (256,) + SHAPE, dtype=np.uint8)
    chunk = 1000
    for start in range(0, fill, chunk):
        n = min(chunk, fill - start)
        idx = np.arange(start, start + n)
        prio = {"priorities": np.ones(n)} if buf._PRIORITIZED else {}
        buf.add_batch(
            frames[idx % 256],
            (idx % 18).astype(np.int32),
            rng.standard_normal(n).astype(np.float32),
            (idx % 997 == 996).astype(np.uint8),
            **prio,
        )
    return buf


def learner_ms(fetch, calls, step_s):
    """Median ms the learner's thread spends in ``fetch()``, one simulated step after each."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fetch()
        times.append(time.perf_counter() - t0)
        if step_s:
            time.sleep(step_s)
    return statistics.median(times) * 1e3


def compare(label, fetch_off, fetch_on, args):
    """Alternating rounds of both settings; prints and returns (off ms, on ms)."""
    for fetch in (fetch_off, fetch_on):  # warm up (the feed starts here)
        learner_ms(fetch, 10, args.step_ms / 1e3)
    per = {"off": [], "on": []}
    for r in range(args.rounds):
        order = [("off", fetch_off), ("on", fetch_on)]
        for name, fetch in order if r % 2 == 0 else order[::-1]:
            per[name].append(learner_ms(fetch, args.calls, args.step_ms / 1e3))
    off, on = statistics.median(per["off"]), statistics.median(per["on"])
    print(f"{label:<44} {off:>10.3f} {on:>10.3f} {off / on:>8.1f}x", flush=True)
    return off, on


def sampler(buf, prioritized):
    rng = np.random.default_rng(1)

    def fetch():
        batch = buf.sample_transition_batch()
        if prioritized:
            buf.set_priority(batch[7], rng.random(BATCH).astype(np.float32) + 0.1)

    return fetch


def in_graph(buf, prioritized):
    """A fetch running Dopamine's in-graph sample on ``buf`` (and, prioritized, its
    tf_set_priority on the sampled indices, in the same session run as Rainbow does)."""
    import tensorflow as tf
    from dopamine.tf.replay_memory import circular_replay_buffer as dcrb
    from dopamine.tf.replay_memory import prioritized_replay_buffer as dprb

    graph = tf.Graph()
    with graph.as_default():
        wrapper_cls = (
            dprb.WrappedPrioritizedReplayBuffer if prioritized else dcrb.WrappedReplayBuffer
        )
        wrapper = wrapper_cls(
            observation_shape=SHAPE,
            stack_size=STACK,
            replay_capacity=buf._replay_capacity,
            batch_size=BATCH,
            wrapped_memory=buf,
        )
        # A small op that needs the whole sample (the numpy_function's outputs are made
        # whole), without fetching the 1.8 MB states back into Python.
        op = tf.reduce_sum(wrapper.indices) + tf.cast(tf.shape(wrapper.states)[0], tf.int32)
        if prioritized:
            with tf.control_dependencies([op]):
                update = wrapper.tf_set_priority(
                    wrapper.indices, 1.0 + tf.abs(tf.cast(wrapper.rewards, tf.float32))
                )
            op = [op, update]
    sess = tf.compat.v1.Session(graph=graph)
    return lambda: sess.run(op)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
E2E_BINDINGS = [
    "Runner.num_iterations = 2",
    "Runner.training_steps = 1500",
    "Runner.evaluation_steps = 0",
    "DQNAgent.min_replay_history = 500",
    "WrappedReplayBuffer.replay_capacity = 20000",
]


def e2e_steps_per_s(gin_name, base):
    """Env steps/s of the last iteration of a short ``memoire train`` run of ``gin_name``."""
    args = [sys.executable, "-m", "memoire.cli", "train", "--base_dir", base, "--gin_files"]
    args.append(os.path.join(ROOT, "configs", "atari", gin_name))
    for b in E2E_BINDINGS:
        args += ["--gin_bindings", b]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env, check=True)
    rates = re.findall(r"(\d+) steps/s", out.stdout + out.stderr)
    return float(rates[-1])


def e2e(runs):
    rates = {"tf_dqn.gin": [], "tf_dqn_feed.gin": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(runs):
            order = list(rates) if r % 2 == 0 else list(rates)[::-1]
            for name in order:
                rates[name].append(e2e_steps_per_s(name, os.path.join(tmp, f"{name}{r}")))
    off, on = statistics.median(rates["tf_dqn.gin"]), statistics.median(rates["tf_dqn_feed.gin"])
    print(
        f"{'TF DQN Pong env steps/s (end to end)':<44} {off:>10.1f} {on:>10.1f} {on / off:>8.2f}x"
    )
    print(f"  runs: off {rates['tf_dqn.gin']}, on {rates['tf_dqn_feed.gin']} (ratio: on / off)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fill", type=int, default=100_000, help="transitions stored")
    parser.add_argument("--calls", type=int, default=200, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=5.0, help="simulated learner step")
    parser.add_argument("--depth", type=int, default=4, help="prefetch_depth when on")
    parser.add_argument("--threads", type=int, default=1, help="prefetch_threads when on")
    parser.add_argument("--no-graph", action="store_true", help="skip the in-graph rows")
    parser.add_argument("--e2e", type=int, default=0, help="end-to-end runs of each (Pong)")
    parser.add_argument("--no-micro", action="store_true", help="only the end-to-end rows")
    args = parser.parse_args()
    print(
        f"uint8{list(SHAPE)} stack {STACK} batch {BATCH}, {args.fill:,} stored, feed depth "
        f"{args.depth} threads {args.threads}, {args.step_ms} ms simulated step, "
        f"{args.rounds} rounds x {args.calls} calls"
    )
    print(f"{'learner ms per batch':<44} {'feed off':>10} {'feed on':>10} {'off/on':>9}")
    for cls, prioritized in (
        ()
        if args.no_micro
        else ((OutOfGraphReplayBuffer, False), (OutOfGraphPrioritizedReplayBuffer, True))
    ):
        kind = "prioritized" if prioritized else "uniform"
        off = make(cls, args.fill, 0, 1)
        on = make(cls, args.fill, args.depth, args.threads)
        what = "sample + set_priority" if prioritized else "sample_transition_batch"
        compare(f"{kind}: {what}", sampler(off, prioritized), sampler(on, prioritized), args)
        if not args.no_graph:
            compare(
                f"{kind}: in-graph (WrappedReplayBuffer)",
                in_graph(off, prioritized),
                in_graph(on, prioritized),
                args,
            )
        on.stop_prefetch()
        del off, on
    if args.e2e:
        e2e(args.e2e)


if __name__ == "__main__":
    main()
