"""Same seed, same run: JAX DQN on Pong through ``memoire train`` on memoire's replay buffer and
on Dopamine's (``--replay dopamine``) must give identical episodes and losses.

Runs configs/atari/dqn.gin (Dopamine's stock values) twice with the same seed, for 2 iterations
of 5,000 agent steps, training from step 1,000 (a capacity of 50,000 keeps memory small), and
compares per iteration: every training episode's return and length (episodes.csv) and every
HuberLoss the agent logged (its TensorBoard events, one every ``--summary_every`` training
steps). Prints one line per iteration and exits 1 if anything differs.

    PYTHONPATH=$PWD nice -n 10 python benchmarks/same_seed_atari.py [--steps 5000] [--iterations 2]
"""

import argparse
import csv
import glob
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMORIES = {
    "memoire": "memoire.dopamine_compat.jax_replay_buffer.ReplayBuffer",
    "dopamine": "dopamine.jax.replay_memory.replay_buffer.ReplayBuffer",
}


def train(base, replay, args):
    bindings = [
        f"Runner.num_iterations = {args.iterations}",
        f"Runner.training_steps = {args.steps}",
        f"JaxDQNAgent.min_replay_history = {args.min_replay}",
        f"JaxDQNAgent.summary_writing_frequency = {args.summary_every}",
        "ReplayBuffer.max_capacity = 50_000",
        "Runner.fine_grained_print_to_console = False",
        f"atari_lib.create_atari_environment.game_name = '{args.game}'",
    ]
    cmd = [
        sys.executable,
        "-m",
        "memoire.commands.train",
        "--gin_files",
        os.path.join(ROOT, "configs", "atari", "dqn.gin"),
        "--base_dir",
        base,
        "--replay",
        replay,
    ]
    for b in bindings:
        cmd += ["--gin_bindings", b]
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"--replay {replay} failed:\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
    run_dir = os.path.join(base, "setting_0", "run_0")
    used = {r["memory"] for r in csv.DictReader(open(os.path.join(run_dir, "replay.csv")))}
    if used != {MEMORIES[replay]}:
        raise RuntimeError(f"--replay {replay} ran on {used}")
    return run_dir


def episodes(run_dir):
    """``{iteration: [(return, length), ...]}`` of the training episodes."""
    out = {}
    for r in csv.DictReader(open(os.path.join(run_dir, "episodes.csv"))):
        if r["phase"] == "train":
            out.setdefault(int(r["iteration"]), []).append((float(r["return"]), int(r["length"])))
    return out


def losses(run_dir, steps_per_iteration):
    """``{iteration: [(training step, HuberLoss), ...]}`` from the agent's event files."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    out = {}
    for path in sorted(
        glob.glob(os.path.join(run_dir, "**", "events.out.tfevents.*"), recursive=True)
    ):
        for raw in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(raw.numpy())
            for v in event.summary.value:
                if v.tag == "HuberLoss":
                    loss = (
                        float(tf.make_ndarray(v.tensor)) if v.HasField("tensor") else v.simple_value
                    )
                    out.setdefault((event.step - 1) // steps_per_iteration, []).append(
                        (int(event.step), loss)
                    )
    return {k: sorted(v) for k, v in out.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--steps", type=int, default=5000, help="agent steps per iteration")
    p.add_argument("--min_replay", type=int, default=1000)
    p.add_argument("--summary_every", type=int, default=100, help="training steps per loss")
    p.add_argument("--game", default="Pong")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {r: train(os.path.join(tmp, r), r, args) for r in ("memoire", "dopamine")}
        ep = {r: episodes(d) for r, d in runs.items()}
        # Training steps count agent steps here (one per transition), so iteration i holds the
        # losses of steps i*steps+1 .. (i+1)*steps.
        lo = {r: losses(d, args.steps) for r, d in runs.items()}
    same = True
    for it in range(args.iterations):
        e_m, e_d = ep["memoire"].get(it, []), ep["dopamine"].get(it, [])
        l_m, l_d = lo["memoire"].get(it, []), lo["dopamine"].get(it, [])
        ok = e_m == e_d and l_m == l_d and bool(e_m)
        same &= ok

        def mean(e):
            return sum(x for x, _ in e) / len(e) if e else float("nan")

        diff = max((abs(a[1] - b[1]) for a, b in zip(l_m, l_d)), default=0.0)
        print(
            f"iteration {it}: {len(e_m)}/{len(e_d)} episodes, mean return "
            f"{mean(e_m):.2f}/{mean(e_d):.2f}, {len(l_m)}/{len(l_d)} losses "
            f"(last {l_m[-1][1] if l_m else float('nan'):.6g}/"
            f"{l_d[-1][1] if l_d else float('nan'):.6g}, max |diff| {diff:.3g}) "
            f"[memoire/dopamine]: {'identical' if ok else 'DIFFERENT'}"
        )
    print("same seed, same run: " + ("yes" if same else "NO"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
