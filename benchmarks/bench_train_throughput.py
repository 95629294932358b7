"""Environment steps per second of JAX DQN CartPole: one process vs learner + 2 actors.

Runs the configurations one after the other on this machine with the same settings and prints
training-phase env steps/s (from episodes.csv, iterations after the first, so start-up and
compilation are left out): one process on memoire's replay buffer and on Dopamine's, and the
learner with 2 actors (distributed training needs memoire's buffer: experience goes into it
through the native chunk ingest), with the ratios distributed / local and memoire / Dopamine.
Each run's replay.csv names the memory it used; the script checks it.

    PYTHONPATH=$PWD python benchmarks/bench_train_throughput.py [--iterations 6]

``--baseline DIR`` (an older checkout with its own ``.venv``, e.g. a clone of an earlier commit
after ``make bootstrap``) instead alternates the distributed run between this tree and the
baseline (its interpreter, its installed memoire, its configs) ``--repeats`` times each and
prints the ratio this / baseline.
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def steps_per_second(run_dir):
    rows = [
        r
        for r in csv.DictReader(open(os.path.join(run_dir, "episodes.csv")))
        if r["phase"] == "train" and int(r["iteration"]) >= 1
    ]
    by_iter = {}
    for r in rows:
        by_iter.setdefault(int(r["iteration"]), []).append(r)
    steps = seconds = 0.0
    for it_rows in by_iter.values():
        times = [float(r["wall_time"]) for r in it_rows]
        steps += sum(int(r["length"]) for r in it_rows[1:])
        seconds += max(times) - min(times)
    return steps / seconds


MEMORIES = {
    "memoire": "memoire.dopamine_compat.jax_replay_buffer.ReplayBuffer",
    "dopamine": "dopamine.jax.replay_memory.replay_buffer.ReplayBuffer",
}


def run(
    config,
    base,
    iterations,
    replay,
    python=sys.executable,
    module="memoire.commands.train",
    root=ROOT,
    pythonpath=ROOT,
):
    cmd = [
        python,
        "-m",
        module,
        "--gin_files",
        os.path.join(root, "configs", config),
        "--base_dir",
        base,
        "--replay",
        replay,
        "--gin_bindings",
        f"Runner.num_iterations = {iterations}",
        "--gin_bindings",
        "Runner.fine_grained_print_to_console = False",
    ]
    env = dict(os.environ, PYTHONPATH=pythonpath)
    # cwd: not this checkout, whose memoire/ `-m` would import for the baseline
    subprocess.run(
        cmd,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=1200,
        cwd=os.path.dirname(base),
    )
    run_dir = os.path.join(base, "setting_0", "run_0")
    used = {r["memory"] for r in csv.DictReader(open(os.path.join(run_dir, "replay.csv")))}
    if used != {MEMORIES[replay]}:
        raise RuntimeError(f"{config} --replay {replay} ran on {used}")
    return steps_per_second(run_dir)


def against_baseline(baseline: str, iterations: int, repeats: int) -> None:
    """Alternates the distributed run between this tree and the checkout ``baseline``."""
    python = os.path.join(baseline, ".venv", "bin", "python")
    module = (
        "memoire.commands.train"
        if os.path.isdir(os.path.join(baseline, "memoire", "experiments"))
        else "memoire.train"
    )
    config = "dqn_cartpole_jax_distributed.gin"
    rates = {"this": [], "baseline": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(repeats):
            rates["this"].append(run(config, os.path.join(tmp, f"this_{k}"), iterations, "memoire"))
            # the baseline imports its own installed memoire: nothing of this tree on its path
            rates["baseline"].append(
                run(
                    config,
                    os.path.join(tmp, f"base_{k}"),
                    iterations,
                    "memoire",
                    python=python,
                    module=module,
                    root=baseline,
                    pythonpath="",
                )
            )
            print(
                f"round {k}: this {rates['this'][-1]:8.1f}  baseline "
                f"{rates['baseline'][-1]:8.1f} env steps/s",
                flush=True,
            )
    this, base = sum(rates["this"]) / repeats, sum(rates["baseline"]) / repeats
    print(f"learner + 2 actors, this tree:  {this:8.1f} env steps/s (mean of {repeats})")
    print(f"learner + 2 actors, baseline:   {base:8.1f} env steps/s (mean of {repeats})")
    print(f"ratio this/baseline: {this / base:5.2f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument(
        "--baseline",
        help="an older checkout (with its .venv) to compare the "
        "distributed run against (alternating runs)",
    )
    p.add_argument("--repeats", type=int, default=3, help="alternating rounds with --baseline")
    args = p.parse_args()
    if args.baseline:
        against_baseline(args.baseline, args.iterations, args.repeats)
        return
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, config, replay in (
            ("memoire local", "dqn_cartpole_jax_local.gin", "memoire"),
            ("dopamine local", "dqn_cartpole_jax_local.gin", "dopamine"),
            ("memoire distributed", "dqn_cartpole_jax_distributed.gin", "memoire"),
        ):
            rates[name] = run(
                config, os.path.join(tmp, name.replace(" ", "_")), args.iterations, replay
            )
            print(f"{name:20s} {rates[name]:8.1f} env steps/s", flush=True)
    print(
        f"ratio distributed/local (memoire): "
        f"{rates['memoire distributed'] / rates['memoire local']:5.2f}"
    )
    print(
        f"ratio memoire/dopamine (local):    "
        f"{rates['memoire local'] / rates['dopamine local']:5.2f}"
    )


if __name__ == "__main__":
    main()
