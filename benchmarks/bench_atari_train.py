"""Training env steps per second on Atari: ``memoire train`` (memoire's replay buffer, memoire's
runner with trackers) against Dopamine's own runner (``dopamine.discrete_domains.train``,
Dopamine's buffer), same gin file, same bindings, alternating runs.

Both runs are Dopamine Runners, so both log Dopamine's own statistic
``train_average_steps_per_second`` (steps of a training phase / its wall time, agent training
included) in ``logs/log_<i>``; the script reads it from there for both, leaves out the first
iteration (JAX compilation) and compares the mean of the others. Runs alternate
(memoire, dopamine, dopamine, memoire, ...) so that a slow spell of the machine hits both.

    PYTHONPATH=$PWD nice -n 10 python benchmarks/bench_atari_train.py [--repeats 2] \\
        [--iterations 3] [--steps 2000] [--gin_file configs/atari/dqn.gin]

Prints each run's figure and the ratio memoire / Dopamine (> 1: memoire train is faster).

``--versus feed`` compares memoire's synchronous sampling with the same run trained from the
prefetching feed (``FEED_BINDINGS``, docs/FEED.md) instead of Dopamine's runner; the ratio is
then feed / synchronous.
"""

import argparse
import glob
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# memoire's JAX agents trained from the prefetching feed (docs/FEED.md).
FEED_BINDINGS = [
    "import memoire.dopamine_compat.jax_agents",
    "MemoireJaxDQNAgent.prefetch_depth = 4",
    "MemoireJaxDQNAgent.prefetch_threads = 1",
    "MemoireJaxDQNAgent.prefetch_to_device = True",
]


def bindings(args) -> list[str]:
    return [
        f"Runner.num_iterations = {args.iterations}",
        f"Runner.training_steps = {args.steps}",
        f"JaxDQNAgent.min_replay_history = {args.min_replay}",
        "ReplayBuffer.max_capacity = 100_000",
        "Runner.fine_grained_print_to_console = False",
        f"atari_lib.create_atari_environment.game_name = '{args.game}'",
    ]


def run(who: str, base: str, args) -> tuple[list[float], float]:
    """Runs one experiment; returns (steps/s of each iteration after the first, wall seconds)."""
    if who in ("memoire", "feed"):
        cmd = [
            sys.executable,
            "-m",
            "memoire.commands.train",
            "--base_dir",
            base,
            "--gin_files",
            args.gin_file,
        ]
        log_dir = os.path.join(base, "setting_0", "run_0", "logs")
    else:
        cmd = [
            sys.executable,
            "-m",
            "dopamine.discrete_domains.train",
            f"--base_dir={base}",
            f"--gin_files={args.gin_file}",
        ]
        log_dir = os.path.join(base, "logs")
    for b in bindings(args) + (FEED_BINDINGS if who == "feed" else []):
        cmd += ["--gin_bindings", b]
    # The memoire this interpreter imports (installed, or a tree built by scripts/dev_build.sh).
    import memoire

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(memoire.__file__)))
    start = time.time()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{who} failed:\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
    wall = time.time() - start
    last = max(glob.glob(os.path.join(log_dir, "log_*")), key=lambda p: int(p.rsplit("_", 1)[1]))
    with open(last, "rb") as f:
        logged = pickle.load(f)
    rates = [
        float(logged[f"iteration_{i}"]["train_average_steps_per_second"][0])
        for i in range(1, args.iterations)
    ]
    return rates, wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gin_file", default=os.path.join(ROOT, "configs", "atari", "dqn.gin"))
    p.add_argument("--repeats", type=int, default=2, help="runs of each, alternating")
    p.add_argument("--iterations", type=int, default=3, help="the first is left out")
    p.add_argument("--steps", type=int, default=2000, help="agent steps per iteration")
    p.add_argument(
        "--min_replay",
        type=int,
        default=500,
        help="JaxDQNAgent.min_replay_history: training runs in timed iterations",
    )
    p.add_argument("--game", default="Pong")
    p.add_argument(
        "--versus",
        choices=("dopamine", "feed"),
        default="dopamine",
        help="the alternative: Dopamine's runner and buffer, or memoire with the feed on",
    )
    args = p.parse_args()
    if args.iterations < 2:
        p.error("--iterations must be >= 2 (the first is left out)")
    other = args.versus
    results: dict[str, list[float]] = {"memoire": [], other: []}
    order = []
    for k in range(args.repeats):
        order += ["memoire", other] if k % 2 == 0 else [other, "memoire"]
    with tempfile.TemporaryDirectory() as tmp:
        for i, who in enumerate(order):
            rates, wall = run(who, os.path.join(tmp, f"{i}_{who}"), args)
            results[who] += rates
            print(
                f"{who:>8}: {' '.join(f'{r:.1f}' for r in rates)} steps/s "
                f"(iterations 2..{args.iterations}; run {wall:.0f} s)",
                flush=True,
            )
    m = statistics.mean(results["memoire"])
    d = statistics.mean(results[other])
    if other == "feed":
        head = f"memoire train with the feed {d:.1f} steps/s, without {m:.1f}: ratio {d / m:.3f}x"
    else:
        head = (
            f"memoire train {m:.1f} steps/s, Dopamine's runner {d:.1f} steps/s: ratio {m / d:.3f}x"
        )
    print(
        f"{head} ({os.path.relpath(args.gin_file, ROOT)}, {args.game}, "
        f"{args.repeats} run(s) each, {args.steps} steps x {args.iterations - 1} timed "
        "iteration(s))"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
