"""Environment steps per second of JAX DQN CartPole: one process vs learner + 2 actors.

Runs both configurations one after the other on this machine with the same settings and
prints training-phase env steps/s (from episodes.csv, iterations after the first, so start-up
and compilation are left out) and the ratio distributed / local.

    PYTHONPATH=. python benchmarks/bench_train_throughput.py [--iterations 6]
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


def run(config, base, iterations):
    cmd = [sys.executable, "-m", "memoire.train", "--gin_files",
           os.path.join(ROOT, "configs", config), "--base_dir", base,
           "--gin_bindings", f"Runner.num_iterations = {iterations}",
           "--gin_bindings", "Runner.fine_grained_print_to_console = False"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=1200)
    return steps_per_second(os.path.join(base, "setting_0", "run_0"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=6)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        local = run("dqn_cartpole_jax_local.gin", os.path.join(tmp, "local"), args.iterations)
        dist = run("dqn_cartpole_jax_distributed.gin", os.path.join(tmp, "dist"),
                   args.iterations)
    print(f"local (1 process):        {local:8.1f} env steps/s")
    print(f"learner + 2 actors:       {dist:8.1f} env steps/s")
    print(f"ratio distributed/local:  {dist / local:8.2f}")


if __name__ == "__main__":
    main()
