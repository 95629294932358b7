"""What a JAX learner waits on: Dopamine's Nature-DQN train step fed four ways, in one run.

For each batch size B, the same jitted step (dopamine.jax.agents.dqn.dqn_agent.train on
NatureDQNNetwork, 84x84 uint8 frames, stack 4, 18 actions, Adam) runs
  alone     on one batch already on the device (the ceiling),
  inline    on memoire's JAX ReplayBuffer: sample() then jax.device_put, on the learner's thread,
  feed      on memoire.feed.Feed(device='jax'): native threads sample ahead, the copy to the
            device runs one step ahead,
  dopamine  on Dopamine 4.1.2's JAX ReplayBuffer: sample() then jax.device_put.
Each is reported as steps/s and as a ratio to `alone` (1.0 = replay costs the learner nothing).
`--stack-compare` instead times only the device feed with and without `stack_on_device`
(distinct frames travel once, stacks assembled on the device): the learner thread's time to
obtain a batch ready on the device and the bytes each batch moves host -> device, in
alternating rounds, medians.
It also reports the learner thread's time to obtain each batch (sample + device_put issue
inline, next(feed) for the feed), which on CPU is the figure that matters: there the "device"
is the same cores, so a step cannot overlap anything but the sampling. Configurations are
timed in interleaved rounds and the median kept, since the machine may be shared.

    PYTHONPATH=. nice -n 10 python benchmarks/bench_learner_feed.py \\
        [--fill 20000] [--steps 10,3] [--batch-sizes 32,256] [--depth 4] [--threads 1] [--rounds 3]
        [--stack-compare]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

# The same Atari-like stream as the buffer benchmark (this script's folder is on sys.path).
from bench_dopamine_jax import steps as atari_steps  # noqa: E402
from dopamine.jax import networks
from dopamine.jax.agents.dqn import dqn_agent
from dopamine.jax.replay_memory import accumulator, replay_buffer, samplers

from memoire.dopamine_compat import jax_replay_buffer as mj
from memoire.feed import Feed

NUM_ACTIONS = 18
STACK = 4


def build_buffers(fill: int, capacity: int):
    data = atari_steps(fill)
    ours = mj.ReplayBuffer(
        mj.TransitionAccumulator(STACK, 1, 0.99),
        mj.UniformSamplingDistribution(0),
        batch_size=32,
        max_capacity=capacity,
    )
    theirs = replay_buffer.ReplayBuffer(
        accumulator.TransitionAccumulator(stack_size=STACK, update_horizon=1, gamma=0.99),
        samplers.UniformSamplingDistribution(0),
        batch_size=32,
        max_capacity=capacity,
    )
    for s in data:
        ours.add(s)
        theirs.add(s)
    return ours, theirs


class Learner:
    """Dopamine's DQN train step with its own parameters and optimizer state."""

    def __init__(self):
        self.net = networks.NatureDQNNetwork(num_actions=NUM_ACTIONS)
        self.params = self.net.init(jax.random.PRNGKey(0), x=np.zeros((84, 84, STACK), np.uint8))
        self.target = self.params
        self.opt = dqn_agent.create_optimizer("adam")
        self.opt_state = self.opt.init(self.params)

    def step(self, b) -> jax.Array:
        self.opt_state, self.params, loss = dqn_agent.train(
            self.net,
            self.params,
            self.target,
            self.opt,
            self.opt_state,
            b.state,
            b.action,
            b.next_state,
            b.reward,
            b.is_terminal,
            0.99,
            "huber",
        )
        return loss


def run_batch_size(
    ours, theirs, batch_size: int, steps: int, depth: int, threads: int, rounds: int
):
    """Per-step seconds of each feed (the median over `rounds` interleaved rounds of `steps`
    steps: the machine may be shared), and the learner thread's seconds per batch obtained."""
    learner = Learner()
    fixed = jax.device_put(ours.sample(batch_size))
    for _ in range(3):  # compile and warm up
        learner.step(fixed).block_until_ready()
    feed = Feed(ours, batch_size, depth=depth, threads=threads, seed=1, device="jax")
    waits = {"inline": [], "feed": [], "dopamine": []}

    def obtained(name, get):
        def f():
            t = time.perf_counter()
            b = get()
            waits[name].append(time.perf_counter() - t)
            return b

        return f

    feeds = {
        "alone": lambda: fixed,
        "inline": obtained("inline", lambda: jax.device_put(ours.sample(batch_size))),
        "feed": obtained("feed", lambda: next(feed)),
        "dopamine": obtained("dopamine", lambda: jax.device_put(theirs.sample(batch_size))),
    }
    # The device feed's batches are lent: each goes back once the step's loss is ready.
    release = {"feed": feed.release}
    for name, get in feeds.items():  # untimed: a new argument layout would compile here
        for _ in range(2):
            loss = learner.step(get())
            release.get(name, lambda after: None)(loss)
            loss.block_until_ready()
    for w in waits.values():
        w.clear()
    per_step = {name: [] for name in feeds}
    for _ in range(rounds):
        for name, get in feeds.items():
            loss = None
            start = time.perf_counter()
            for _ in range(steps):
                loss = learner.step(get())
                release.get(name, lambda after: None)(loss)
            loss.block_until_ready()
            per_step[name].append((time.perf_counter() - start) / steps)
    feed.close()
    return (
        {k: statistics.median(v) for k, v in per_step.items()},
        {k: statistics.median(v) for k, v in waits.items()},
    )


def obtain_only(
    ours, theirs, batch_size: int, n: int, depth: int, threads: int, step_s: float
) -> dict:
    """Median seconds for the learner's thread to obtain one batch when its step leaves the
    host's cores free, as a step on an accelerator does (simulated by sleeping `step_s`
    between batches): host batches and device batches, each way."""
    out = {}

    def median_of(get):
        get()
        ts = []
        for _ in range(n):
            time.sleep(step_s)
            t = time.perf_counter()
            b = get()
            ts.append(time.perf_counter() - t)
            del b
        return statistics.median(ts)

    out["inline sample"] = median_of(lambda: ours.sample(batch_size))
    with Feed(ours, batch_size, depth=depth, threads=threads, seed=1) as feed:
        out["feed, host"] = median_of(lambda: next(feed))
    out["dopamine sample"] = median_of(lambda: theirs.sample(batch_size))
    out["inline + device_put"] = median_of(
        lambda: jax.block_until_ready(jax.device_put(ours.sample(batch_size)))
    )
    with Feed(ours, batch_size, depth=depth, threads=threads, seed=1, device="jax") as feed:
        out["feed, device"] = median_of(lambda: _take_device(feed))
    return out


def _take_device(feed):
    """The device feed's next batch, ready on the device; lent, and given back at once (nothing
    reads it)."""
    batch = jax.block_until_ready(next(feed))
    feed.release()
    return batch


def stack_compare(
    ours, batch_size: int, n: int, depth: int, threads: int, step_s: float, rounds: int
) -> dict:
    """{mode: (median learner seconds per device batch, median bytes moved per batch)} for the
    device feed stacking on the host ("host stacks") and on the device ("device stacks"),
    timed in alternating rounds of n batches (each batch waited for until ready on the device,
    the step off the host's cores: a sleep of step_s between batches)."""
    modes = {"host stacks": False, "device stacks": True}
    times = {m: [] for m in modes}
    sent = {m: [] for m in modes}
    for r in range(rounds):
        for mode, on_device in modes.items() if r % 2 == 0 else reversed(modes.items()):
            with Feed(
                ours,
                batch_size,
                depth=depth,
                threads=threads,
                seed=1 + r,
                device="jax",
                stack_on_device=on_device,
            ) as feed:
                for _ in range(3):  # compile the device gather for the usual shapes
                    _take_device(feed)
                for _ in range(n):
                    time.sleep(step_s)
                    t = time.perf_counter()
                    _take_device(feed)
                    times[mode].append(time.perf_counter() - t)
                    sent[mode].append(feed.last_transfer_bytes)
    return {m: (statistics.median(times[m]), statistics.median(sent[m])) for m in modes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fill", type=int, default=20000, help="transitions stored")
    ap.add_argument("--batch-sizes", default="32,256")
    ap.add_argument("--steps", default="10,3", help="timed steps per round, per batch size")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median kept)")
    ap.add_argument(
        "--obtain", type=int, default=200, help="batches timed with the step off the host (a sleep)"
    )
    ap.add_argument("--step-ms", type=float, default=10.0, help="that sleep")
    ap.add_argument(
        "--stack-compare",
        action="store_true",
        help="only the device feed with and without stack_on_device (--obtain batches/round)",
    )
    args = ap.parse_args()
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    steps = [int(x) for x in args.steps.split(",")]
    steps += [steps[-1]] * (len(sizes) - len(steps))
    print(
        f"device: {jax.devices()[0]} (jax {jax.__version__}); fill {args.fill}, "
        f"depth {args.depth}, threads {args.threads}"
    )
    t = time.perf_counter()
    ours, theirs = build_buffers(args.fill, max(args.fill, 1000))
    print(f"filled both buffers in {time.perf_counter() - t:.1f} s")
    if args.stack_compare:
        print(
            f"device feed, learner's median ms per batch ready on the device (step off the "
            f"host: a {args.step_ms} ms sleep) and bytes moved host -> device per batch, "
            f"{args.rounds} alternating rounds of {args.obtain} batches"
        )
        for b in sizes:
            got = stack_compare(
                ours, b, args.obtain, args.depth, args.threads, args.step_ms / 1e3, args.rounds
            )
            (th, bh), (td, bd) = got["host stacks"], got["device stacks"]
            print(
                f"{b:>4} host stacks {th * 1e3:.3f} ms {bh / 1e6:.3f} MB | device stacks "
                f"{td * 1e3:.3f} ms {bd / 1e6:.3f} MB | time x{td / th:.2f}, bytes x{bd / bh:.3f}"
            )
        return
    print("learner ms/batch: the learner thread's median time to obtain a batch (on the device)")
    print(f"{'B':>4} {'feed':<9} {'steps/s':>8} {'x alone':>8} {'learner ms/batch':>17}")
    for b, n in zip(sizes, steps):
        res, wait = run_batch_size(ours, theirs, b, n, args.depth, args.threads, args.rounds)
        for name in ("alone", "inline", "feed", "dopamine"):
            got = f"{wait[name] * 1e3:9.3f}" if name in wait else f"{'-':>9}"
            print(f"{b:>4} {name:<9} {1 / res[name]:>8.2f} {res['alone'] / res[name]:>7.2f}x {got}")
    print(
        f"learner thread's median ms to obtain one batch, its step off the host's cores "
        f"(a {args.step_ms} ms sleep):"
    )
    for b in sizes:
        got = obtain_only(
            ours, theirs, b, args.obtain, args.depth, args.threads, args.step_ms / 1e3
        )
        print(f"{b:>4} " + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in got.items()))


if __name__ == "__main__":
    main()
