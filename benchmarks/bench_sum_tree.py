"""Sum-tree work of memoire's three prioritized stores at 1,000,000 entries, for two source
trees side by side (e.g. before and after a change to cpp/core/sum_tree.*).

Each store holds 1,000,000 small entries (float32[4] states, so the tree dominates) with
random priorities; one op is a draw of 256 indices by priority and an update of 256
priorities:

- ``memory``: ReplayMemory ``_sample(256)`` (stratified Find, plus its small gather) and
  ``update_weights``;
- ``tf``: OutOfGraphPrioritizedReplayBuffer ``sample_index_batch(256)`` (stratified draws with
  validity checks) and ``set_priority`` (exact sums);
- ``jax``: the JAX face's store ``query`` (Dopamine's descent) and ``update`` (Dopamine's
  add-deltas rule).

Each tree runs in its own subprocess (its ``memoire`` on PYTHONPATH), alternating A, B, A, B
for ``--rounds`` rounds; a round reports the median microseconds per op of ``--reps`` timed
blocks. Prints per store the median over rounds for each tree and the ratio B / A.

    nice env PYTHONPATH=. python benchmarks/bench_sum_tree.py --trees /path/to/before . \\
        [--rounds 5] [--reps 7] [--n 1000000]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

BATCH = 256
OPS = 200  # ops per timed block


def _median_us(op, reps):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(OPS):
            op()
        times.append((time.perf_counter() - t) / OPS * 1e6)
    return statistics.median(times)


CHUNK = 100_000  # entries per bulk add while filling


def time_memory(n, reps, rng):
    from memoire import ReplayMemory  # pylint: disable=g-import-not-at-top

    m = ReplayMemory(
        np.zeros([4], np.float32),
        np.zeros([], np.int64),
        *(np.zeros([], np.float32) for _ in range(4)),
        np.zeros([0], np.uint8),
        n,
    )
    m.new_episode()
    for start in range(0, n, CHUNK):
        k = min(CHUNK, n - start)
        z = np.zeros(k, np.float32)
        m.add_entries(
            np.zeros((k, 4), np.float32),
            np.zeros(k, np.int64),
            z,
            z,
            z,
            np.zeros((k, 0), np.uint8),
            rng.uniform(0.1, 2.0, k).astype(np.float32),
        )
    m.close_episode()
    m_ids = np.arange(n, dtype=np.int64)

    def memory_op():
        m._sample(BATCH)
        m.update_weights(rng.choice(m_ids, BATCH), rng.uniform(0.1, 2.0, BATCH).astype(np.float32))

    return _median_us(memory_op, reps)


def time_tf(n, reps, rng):
    from memoire.dopamine_compat import OutOfGraphPrioritizedReplayBuffer  # pylint: disable=g-import-not-at-top

    tf = OutOfGraphPrioritizedReplayBuffer((4,), 1, n, BATCH, observation_dtype=np.float32, seed=0)
    for start in range(0, n, CHUNK):
        k = min(CHUNK, n - start)
        tf.add_batch(
            np.zeros((k, 4), np.float32),
            np.zeros(k, np.int32),
            np.zeros(k, np.float32),
            np.zeros(k, np.uint8),
            priorities=rng.uniform(0.1, 2.0, k),
        )

    def tf_op():
        idx = tf.sample_index_batch(BATCH)
        tf.set_priority(np.asarray(idx, np.int32), rng.uniform(0.1, 2.0, BATCH))

    return _median_us(tf_op, reps)


def time_jax(n, reps, rng):
    from memoire.dopamine_compat import jax_replay_buffer as jrb  # pylint: disable=g-import-not-at-top

    dist = jrb.PrioritizedSamplingDistribution(0, max_capacity=n)
    jb = jrb.ReplayBuffer(
        jrb.TransitionAccumulator(1, 1, 0.99), dist, batch_size=BATCH, max_capacity=n
    )
    for start in range(0, n, CHUNK):
        k = min(CHUNK, n - start)
        jb.add_batch(
            np.zeros((k, 4), np.float32),
            np.zeros(k, np.int32),
            np.zeros(k),
            np.zeros(k, bool),
            priorities=rng.uniform(0.1, 2.0, k),
        )
    store = dist._store()

    def jax_op():
        keys, _ = store.query(rng.uniform(0.0, store.tree_root, BATCH))
        store.update(np.asarray(keys, np.int64), rng.uniform(0.1, 2.0, BATCH))

    return _median_us(jax_op, reps)


def child(n, reps):
    """Runs in the subprocess: builds the three stores (one at a time) and times them."""
    rng = np.random.default_rng(0)
    out = {name: fn(n, reps, rng) for name, fn in STORES.items()}
    print("RESULT " + json.dumps(out), flush=True)


STORES = {"memory": time_memory, "tf": time_tf, "jax": time_jax}


def run_tree(tree, n, reps):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    got = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", "--n", str(n), "--reps", str(reps)],
        cwd=os.path.abspath(tree),
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    lines = [x for x in got.stdout.splitlines() if x.startswith("RESULT ")]
    if got.returncode or not lines:
        sys.exit(f"{tree}: failed\n{got.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", nargs=2, default=[".", "."], metavar=("A", "B"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args.n, args.reps)
    runs = {0: [], 1: []}
    for _ in range(args.rounds):
        for t in (0, 1):
            runs[t].append(run_tree(args.trees[t], args.n, args.reps))
            print(f"tree {'AB'[t]}: {runs[t][-1]}", flush=True)
    print(f"\nmicroseconds per op (draw {BATCH} + update {BATCH}), median of {args.rounds} rounds")
    print(f"A = {args.trees[0]}, B = {args.trees[1]}")
    print("| store | A median | B median | B / A | A best | B best | B / A |")
    print("|---|---|---|---|---|---|---|")
    for store in STORES:
        a = statistics.median(r[store] for r in runs[0])
        b = statistics.median(r[store] for r in runs[1])
        a_best = min(r[store] for r in runs[0])
        b_best = min(r[store] for r in runs[1])
        print(
            f"| {store} | {a:.1f} | {b:.1f} | {b / a:.3f} | {a_best:.1f} | {b_best:.1f} | "
            f"{b_best / a_best:.3f} |"
        )


if __name__ == "__main__":
    main()
