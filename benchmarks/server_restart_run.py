"""A distributed CartPole run whose replay server is killed (SIGKILL) and restarted mid-run.

Two processes, as a user runs them (configs/dqn_cartpole_jax_remote.gin):

  server   memoire serve --buffer jax --gin_files configs/dqn_cartpole_jax_remote.gin
               --arg stack_size=1 --arg update_horizon=1 --arg gamma=0.99 --seed 0
               --checkpoint_dir DIR/server_checkpoints --checkpoint_every S
  learner  memoire train --base_dir DIR/run --gin_files configs/dqn_cartpole_jax_remote.gin
               --gin_bindings "MemoireJaxDQNAgent.replay_endpoint = '<the server's endpoint>'"

Once the learner has finished iteration --kill_after (its replay.csv row) and run
--kill_delay more seconds, the server is killed with SIGKILL, left down --down seconds, and
started again with the same command on the same endpoint; it loads its newest checkpoint and
the learner's calls, resent meanwhile, go through. The run must finish every iteration.

Printed (and written to DIR/summary.json): per iteration, the mean train and eval returns and
episodes (episodes.csv), the env steps and the training env steps/s (replay.csv); the server's
add_count at its last logged checkpoint before the kill and at load after the restart; the
learner's train env steps/s before the kill and after the restart (episodes.csv rows, the
outage excluded) and the time the learner stood still.

    PYTHONPATH=$PWD nice python benchmarks/server_restart_run.py [--dir /tmp/restart_run]
        [--iterations 8] [--training_steps 1000] [--evaluation_steps 500] [--kill_after 3]
        [--kill_delay 3] [--down 5] [--checkpoint_every 5] [--control]

``--control`` runs the same without the kill, for a side-by-side learning curve and rates
(the "kill" and "restart" moments are then the same wall-clock point, not an outage).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "dqn_cartpole_jax_remote.gin")
ENV = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
    TF_CPP_MIN_LOG_LEVEL="3",
    JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"),
)


def start_server(args, log_path, timeout=300.0):
    """``memoire serve`` with `args`; returns (process, endpoint) once it prints ENDPOINT."""
    log = open(log_path, "a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "memoire.cli", "serve"] + args,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=ENV,
        cwd=os.path.dirname(log_path),
    )
    log.close()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and sel.select(max(0.0, deadline - time.monotonic())):
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("ENDPOINT "):
                return proc, line.split()[1]
    finally:
        sel.close()
    proc.kill()
    raise RuntimeError(f"the server did not start; see {log_path}")


def logged_add_counts(log_path, what):
    with open(log_path) as f:
        return [int(n) for n in re.findall(rf"{what} \S+: add_count (\d+)", f.read())]


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def rate(rows, t0, t1):
    """Training env steps/s from episodes.csv train rows ending in [t0, t1]."""
    inside = [
        (float(r["wall_time"]), int(r["env_steps"]))
        for r in rows
        if r["phase"] == "train" and t0 <= float(r["wall_time"]) <= t1
    ]
    if len(inside) < 2:
        return float("nan")
    (ta, sa), (tb, sb) = inside[0], inside[-1]
    return (sb - sa) / max(tb - ta, 1e-9)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp/memoire_server_restart_run")
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--training_steps", type=int, default=1000)
    p.add_argument("--evaluation_steps", type=int, default=500)
    p.add_argument("--kill_after", type=int, default=3, help="iteration finished before the kill")
    p.add_argument("--kill_delay", type=float, default=3.0)
    p.add_argument("--down", type=float, default=5.0, help="seconds the server stays down")
    p.add_argument("--checkpoint_every", type=float, default=5.0)
    p.add_argument(
        "--control",
        action="store_true",
        help="the same run without the kill (the split times are taken all the same)",
    )
    a = p.parse_args()

    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    base_dir = os.path.join(a.dir, "run")
    run_dir = os.path.join(base_dir, "setting_0", "run_0")
    server_args = [
        "--buffer",
        "jax",
        "--gin_files",
        CONFIG,
        "--arg",
        "stack_size=1",
        "--arg",
        "update_horizon=1",
        "--arg",
        "gamma=0.99",
        "--seed",
        "0",
        "--checkpoint_dir",
        os.path.join(a.dir, "server_checkpoints"),
        "--checkpoint_every",
        str(a.checkpoint_every),
    ]
    server_log = os.path.join(a.dir, "server.log")
    server, endpoint = start_server(server_args + ["--rep", "tcp://127.0.0.1:*"], server_log)
    print(f"server at {endpoint}", flush=True)
    train_log = open(os.path.join(a.dir, "train.log"), "w")
    bindings = [
        f"Runner.num_iterations = {a.iterations}",
        f"Runner.training_steps = {a.training_steps}",
        f"Runner.evaluation_steps = {a.evaluation_steps}",
        f"MemoireJaxDQNAgent.replay_endpoint = '{endpoint}'",
    ]
    started = time.time()
    train = subprocess.Popen(
        [sys.executable, "-m", "memoire.cli", "train", f"--base_dir={base_dir}"]
        + [f"--gin_files={CONFIG}"]
        + [f"--gin_bindings={b}" for b in bindings],
        stdout=train_log,
        stderr=subprocess.STDOUT,
        env=ENV,
        cwd=a.dir,
    )
    try:
        replay_csv = os.path.join(run_dir, "replay.csv")
        deadline = time.monotonic() + 3600
        while len(read_csv(replay_csv)) <= a.kill_after:
            if train.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"training ended or stalled; see {a.dir}/train.log")
            time.sleep(0.5)
        time.sleep(a.kill_delay)
        saved = logged_add_counts(server_log, "checkpoint")
        killed_at = time.time()
        if not a.control:
            server.kill()  # SIGKILL: no last checkpoint
            server.wait(30)
            if train.poll() is not None:
                raise RuntimeError("training ended before the kill; ask for more iterations")
            print(f"server killed (SIGKILL) at {killed_at - started:.1f} s", flush=True)
            time.sleep(a.down)
            with open(server_log, "a") as f:
                f.write("---- restart ----\n")
            server, again = start_server(server_args + ["--rep", endpoint], server_log)
            assert again == endpoint, (again, endpoint)
        ready_at = time.time()
        loaded = logged_add_counts(server_log, "loaded checkpoint")
        print(f"server restarted at {ready_at - started:.1f} s, loaded add_count {loaded}")
        rc = train.wait(3600)
        finished = time.time()
    finally:
        if train.poll() is None:
            train.kill()
        server.send_signal(signal.SIGTERM)
        server.wait(120)
        train_log.close()

    episodes = read_csv(os.path.join(run_dir, "episodes.csv"))
    replay = read_csv(os.path.join(run_dir, "replay.csv"))
    # The learner stood still from the kill to its first episode ending after the restart.
    after = [
        float(r["wall_time"])
        for r in episodes
        if r["phase"] == "train" and float(r["wall_time"]) > ready_at
    ]
    per_iteration = []
    previous_time, previous_steps = started, 0
    for row in replay:
        it = int(row["iteration"])
        train_returns = [
            float(r["return"])
            for r in episodes
            if int(r["iteration"]) == it and r["phase"] == "train"
        ]
        eval_returns = [
            float(r["return"])
            for r in episodes
            if int(r["iteration"]) == it and r["phase"] == "eval"
        ]
        wall, steps = float(row["wall_time"]), int(row["env_steps"])
        per_iteration.append(
            dict(
                iteration=it,
                train_return=sum(train_returns) / max(len(train_returns), 1),
                train_episodes=len(train_returns),
                eval_return=sum(eval_returns) / max(len(eval_returns), 1),
                eval_episodes=len(eval_returns),
                env_steps=steps,
                add_count=int(row["add_count"]),
                iteration_s=wall - previous_time,
                # training env steps over the iteration's wall time (its eval phase included)
                env_steps_per_s=(steps - previous_steps) / max(wall - previous_time, 1e-9),
                includes_outage=previous_time <= killed_at <= wall,
            )
        )
        previous_time, previous_steps = wall, steps
    summary = dict(
        exit_code=rc,
        iterations_done=len(replay),
        iterations=a.iterations,
        endpoint=endpoint,
        add_count_last_checkpoint_before_kill=max(saved) if saved else None,
        add_count_loaded_after_restart=loaded[-1] if loaded else None,
        killed_at_s=killed_at - started,
        server_down_s=ready_at - killed_at,
        learner_stalled_s=(min(after) - killed_at) if after else None,
        env_steps_per_s_before_kill=rate(episodes, started, killed_at),
        env_steps_per_s_after_restart=rate(episodes, ready_at, finished),
        per_iteration=per_iteration,
        load=os.getloadavg(),
    )
    with open(os.path.join(a.dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(
        f"{'iter':>4} {'train return':>12} {'eps':>4} {'eval return':>11} {'eps':>4} "
        f"{'env steps':>9} {'add_count':>9} {'seconds':>8} {'steps/s':>8}"
    )
    for r in per_iteration:
        print(
            f"{r['iteration']:>4} {r['train_return']:>12.1f} {r['train_episodes']:>4} "
            f"{r['eval_return']:>11.1f} {r['eval_episodes']:>4} {r['env_steps']:>9} "
            f"{r['add_count']:>9} {r['iteration_s']:>8.1f} {r['env_steps_per_s']:>8.1f}"
            + ("  <- kill+restart" if r["includes_outage"] else "")
        )
    for k, v in summary.items():
        if k != "per_iteration":
            print(f"{k}: {v}")
    return 0 if rc == 0 and len(replay) == a.iterations else 1


if __name__ == "__main__":
    sys.exit(main())
