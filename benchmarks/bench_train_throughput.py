"""Environment steps per second of JAX DQN CartPole: one process vs learner + 2 actors, each on
memoire's replay buffer and on Dopamine's.

Runs the four configurations one after the other on this machine with the same settings and
prints training-phase env steps/s (from episodes.csv, iterations after the first, so start-up
and compilation are left out), the ratio distributed / local per buffer, and the ratio
memoire / Dopamine per layout. Each run's replay.csv names the memory it used; the script
checks it.

    PYTHONPATH=$PWD python benchmarks/bench_train_throughput.py [--iterations 6] [--replay memoire]

It first times the learner's ingestion alone: one ``add`` per transition vs ``add_batch`` of
64-transition chunks into memoire's JAX ReplayBuffer (``--ingest_only`` stops there).
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def steps_per_second(run_dir):
    rows = [r for r in csv.DictReader(open(os.path.join(run_dir, "episodes.csv")))
            if r["phase"] == "train" and int(r["iteration"]) >= 1]
    by_iter = {}
    for r in rows:
        by_iter.setdefault(int(r["iteration"]), []).append(r)
    steps = seconds = 0.0
    for it_rows in by_iter.values():
        times = [float(r["wall_time"]) for r in it_rows]
        steps += sum(int(r["length"]) for r in it_rows[1:])
        seconds += max(times) - min(times)
    return steps / seconds


MEMORIES = {"memoire": "memoire.dopamine_compat.jax_replay_buffer.ReplayBuffer",
            "dopamine": "dopamine.jax.replay_memory.replay_buffer.ReplayBuffer"}


def run(config, base, iterations, replay):
    cmd = [sys.executable, "-m", "memoire.experiments.train", "--gin_files",
           os.path.join(ROOT, "configs", config), "--base_dir", base, "--replay", replay,
           "--gin_bindings", f"Runner.num_iterations = {iterations}",
           "--gin_bindings", "Runner.fine_grained_print_to_console = False"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=1200)
    run_dir = os.path.join(base, "setting_0", "run_0")
    used = {r["memory"] for r in csv.DictReader(open(os.path.join(run_dir, "replay.csv")))}
    if used != {MEMORIES[replay]}:
        raise RuntimeError(f"{config} --replay {replay} ran on {used}")
    return steps_per_second(run_dir)


def ingest_rates(n=20000, chunk=64, repeats=3):
    """Transitions/s into memoire's JAX ReplayBuffer (CartPole shapes, episodes of 50 steps):
    one ``add`` per transition (what the learner did) vs one ``add_batch`` per chunk."""
    import time

    import numpy as np

    from memoire.dopamine_compat import jax_replay_buffer as mj

    rng = np.random.default_rng(0)
    obs = rng.normal(size=(n, 4))
    act = rng.integers(2, size=n).astype(np.int32)
    rew = rng.normal(size=n).astype(np.float32)
    end = np.zeros(n, bool)
    end[49::50] = True
    term = end & (rng.random(n) < 0.5)

    def fresh():
        return mj.ReplayBuffer(mj.TransitionAccumulator(1, 1, 0.99),
                               mj.UniformSamplingDistribution(0), batch_size=128,
                               max_capacity=50000)

    def single():
        buf = fresh()
        for i in range(n):
            buf.add(mj.TransitionElement(obs[i], act[i], rew[i], term[i], end[i]))

    def bulk():
        buf = fresh()
        for i in range(0, n, chunk):
            buf.add_batch(obs[i:i + chunk], act[i:i + chunk], rew[i:i + chunk],
                          term[i:i + chunk], end[i:i + chunk])

    best = {}
    for name, fn in (("single", single), ("bulk", bulk)):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best[name] = n / min(times)
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--ingest_only", action="store_true",
                   help="only the add vs add_batch ingestion micro-benchmark")
    p.add_argument("--replay", action="append", choices=sorted(MEMORIES),
                   help="buffers to run (repeatable; default both)")
    args = p.parse_args()
    rates = ingest_rates()
    print(f"ingest into memoire's buffer, add per transition: {rates['single']:10.0f} /s")
    print(f"ingest into memoire's buffer, add_batch of 64:    {rates['bulk']:10.0f} /s")
    print(f"ingest ratio add_batch/add:                       {rates['bulk'] / rates['single']:10.1f}")
    if args.ingest_only:
        return
    replays = args.replay or ["memoire", "dopamine"]
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for replay in replays:
            for layout, config in (("local", "dqn_cartpole_jax_local.gin"),
                                   ("distributed", "dqn_cartpole_jax_distributed.gin")):
                rates[replay, layout] = run(config, os.path.join(tmp, f"{replay}_{layout}"),
                                            args.iterations, replay)
    for replay in replays:
        local, dist = rates[replay, "local"], rates[replay, "distributed"]
        print(f"{replay:8s} replay, local (1 process):   {local:8.1f} env steps/s")
        print(f"{replay:8s} replay, learner + 2 actors:  {dist:8.1f} env steps/s")
        print(f"{replay:8s} replay, ratio distributed/local: {dist / local:5.2f}")
    if len(replays) == 2:
        for layout in ("local", "distributed"):
            print(f"{layout:11s} ratio memoire/dopamine: "
                  f"{rates['memoire', layout] / rates['dopamine', layout]:5.2f}")


if __name__ == "__main__":
    main()
