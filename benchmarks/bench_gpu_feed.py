"""A GPU learner's step rate fed by replay, as a ratio to the same step on a fixed device batch.

A Nature-DQN train step (three conv layers 32x8x8/4, 64x4x4/2, 64x3x3/1, dense 512, 18 actions,
Huber TD loss against a target network, Adam; plain jax.numpy, no flax/optax) on uint8 stacks of
four 84x84 frames, jitted. Ways to feed it, measured in interleaved rounds in one run (the
machine's absolute rate moves between runs; each round's rate is divided by the fixed batch's
rate of the same round, and the median ratio is reported):

  fixed            the step on one batch already on the device (the reference, 1.0)
  inline           ReplayMemory.get_batch(B) + jax.device_put on the learner's thread
  host feed + put  Feed(memory, B) host batches + jax.device_put on the learner's thread
  device feed      Feed(memory, B, device=<jax device>): the device path (ring of device
                   slots a native copy thread fills, handed to JAX by DLPack)
  JAX face, ...    the same over memoire's JAX-face ReplayBuffer where it imports (Dopamine),
                   with and without stack_on_device

With PyTorch importable (``--torch``), the same for an eager PyTorch step of the same net:
fixed, inline (``torch.from_numpy(...).to(device)``), device feed (``device="cuda"``).

The replay is a memoire.ReplayMemory of random uint8[84, 84] frames (frame_stack 4, episodes of
1,000), cache_flags keeping what the step reads (state, action, reward, next state; weight,
prob, done and id always travel). Needs only memoire, numpy and JAX (PyTorch for its rows).

    python benchmarks/bench_gpu_feed.py [--batch 32 256] [--rounds 3] [--seconds 3] \\
        [--fill 20000] [--depth 4] [--threads 2] [--torch] [--out results.json]

On a CPU (JAX's CPU backend; the device path then uses the host stand-in for the copy engine)
it runs end to end with ``--rounds 1 --seconds 1 --fill 3000 --batch 8``: a check that the
script works, not a measurement.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import numpy as np

FRAME = (84, 84)
STACK = 4
ACTIONS = 18
EPISODE = 1000


# ---- replay ----


def make_memory(n: int, seed: int = 0):
    from memoire import ReplayMemory

    rem = ReplayMemory(
        np.zeros(FRAME, np.uint8),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([0], np.uint8),
        max(n, 2 * EPISODE),
    )
    rem.seed(seed)
    rem.frame_stack = STACK
    flags = np.zeros(14, bool)
    flags[[0, 1, 2, 7]] = True  # prev state, action, reward; next state
    rem.cache_flags = flags
    rng = np.random.default_rng(seed)
    for start in range(0, n, EPISODE):
        k = min(EPISODE, n - start)
        rem.new_episode()
        rem.add_entries(
            rng.integers(0, 255, (k,) + FRAME, dtype=np.uint8),
            rng.integers(0, ACTIONS, k).astype(np.int64),
            rng.random(k, dtype=np.float32),
            np.full(k, 0.5, np.float32),
            np.zeros(k, np.float32),
            np.zeros((k, 0), np.uint8),
            np.ones(k, np.float32),
        )
        rem.close_episode()
    return rem


def fields(batch):
    """(state uint8[B, 4, 84, 84], action int64[B, 4], reward f32[B, 4], next_state, done)
    of a memoire Batch: the step's inputs (prev stacks end at the sampled entry)."""
    return (batch.prev[0], batch.prev[1], batch.prev[2], batch.next[0], batch.done)


# ---- the JAX learner ----


def jax_learner(seed: int = 0):
    """(init params, jitted step(params, opt, target, s, a, r, s2, done) -> (params, opt))."""
    import jax
    import jax.numpy as jnp

    def conv(x, w, stride):
        return jax.lax.conv_general_dilated(
            x, w, (stride, stride), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    def q_values(p, s):
        x = jnp.transpose(s, (0, 2, 3, 1)).astype(jnp.float32) / 255.0  # [B, 84, 84, 4]
        x = jax.nn.relu(conv(x, p["c1"], 4) + p["b1"])
        x = jax.nn.relu(conv(x, p["c2"], 2) + p["b2"])
        x = jax.nn.relu(conv(x, p["c3"], 1) + p["b3"])
        x = jax.nn.relu(x.reshape(x.shape[0], -1) @ p["d1"] + p["e1"])
        return x @ p["d2"] + p["e2"]

    def init(key):
        shapes = {
            "c1": (8, 8, STACK, 32),
            "c2": (4, 4, 32, 64),
            "c3": (3, 3, 64, 64),
            "d1": (7 * 7 * 64, 512),
            "d2": (512, ACTIONS),
        }
        keys = jax.random.split(key, len(shapes))
        p = {}
        for k, (name, shape) in zip(keys, shapes.items()):
            fan_in = int(np.prod(shape[:-1]))
            p[name] = jax.random.normal(k, shape, jnp.float32) * np.sqrt(2.0 / fan_in)
        for b, n in (("b1", 32), ("b2", 64), ("b3", 64), ("e1", 512), ("e2", ACTIONS)):
            p[b] = jnp.zeros(n, jnp.float32)
        return p

    def loss(p, target, s, a, r, s2, done):
        q = q_values(p, s)
        q_a = jnp.take_along_axis(q, (a[:, -1] % ACTIONS).astype(jnp.int32)[:, None], 1)[:, 0]
        next_q = q_values(target, s2).max(axis=1)
        y = r[:, -1] + 0.99 * (1.0 - done.astype(jnp.float32)) * next_q
        err = q_a - jax.lax.stop_gradient(y)
        return jnp.mean(jnp.where(jnp.abs(err) < 1.0, 0.5 * err**2, jnp.abs(err) - 0.5))

    def step(params, opt, target, s, a, r, s2, done):
        grads = jax.grad(loss)(params, target, s, a, r, s2, done)
        m, v, t = opt
        t = t + 1
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
        lr = 6.25e-5 * jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        params = jax.tree_util.tree_map(
            lambda p, m, v: p - lr * m / (jnp.sqrt(v) + 1.5e-4), params, m, v
        )
        return params, (m, v, t)

    params = init(jax.random.PRNGKey(seed))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    opt = (zeros, zeros, jnp.zeros([], jnp.float32))
    return params, opt, jax.jit(step, donate_argnums=(0, 1))


def run_jax(take, seconds: float, learner, warmup: int = 5) -> float:
    """Steps/s of the jitted step fed by take() -> the step's 5 inputs (device arrays)."""
    import jax

    params, opt, target, step = learner
    params = jax.tree_util.tree_map(lambda x: x.copy(), params)
    opt = jax.tree_util.tree_map(lambda x: x.copy(), opt)
    for _ in range(warmup):
        params, opt = step(params, opt, target, *take())
    jax.block_until_ready(params)
    n, start = 0, time.perf_counter()
    while True:
        params, opt = step(params, opt, target, *take())
        n += 1
        if n % 16 == 0 and time.perf_counter() - start > seconds:
            break
    jax.block_until_ready(params)
    return n / (time.perf_counter() - start)


# ---- the PyTorch learner ----


def torch_learner(device, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(STACK, 32, 8, 4),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 4, 2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, 1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(7 * 7 * 64, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, ACTIONS),
    ).to(device)
    target_net = copy.deepcopy(net)
    params = list(net.parameters())
    # Adam as the JAX step has it, written out (torch.optim imports torch._dynamo, which needs
    # sympy: not everywhere).
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    count = [0]

    def step(s, a, r, s2, done):
        q = net(s.float() / 255.0)
        q_a = q.gather(1, (a[:, -1] % ACTIONS).long()[:, None])[:, 0]
        with torch.no_grad():
            y = r[:, -1] + 0.99 * (1.0 - done.float()) * target_net(s2.float() / 255.0).max(1)[0]
        loss = torch.nn.functional.smooth_l1_loss(q_a, y)
        for p in params:
            p.grad = None
        loss.backward()
        count[0] += 1
        lr = 6.25e-5 * (1 - 0.999 ** count[0]) ** 0.5 / (1 - 0.9 ** count[0])
        with torch.no_grad():
            for p, (m, v) in zip(params, moments):
                m.mul_(0.9).add_(p.grad, alpha=0.1)
                v.mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                p.addcdiv_(m, v.sqrt().add_(1.5e-4), value=-lr)

    return step


def run_torch(take, seconds: float, step, device, warmup: int = 5) -> float:
    import torch

    def sync():
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(warmup):
        step(*take())
    sync()
    n, start = 0, time.perf_counter()
    while True:
        step(*take())
        n += 1
        if n % 16 == 0 and time.perf_counter() - start > seconds:
            break
    sync()
    return n / (time.perf_counter() - start)


# ---- the JAX face (needs Dopamine) ----


def jax_face_buffer(n: int, batch: int):
    """memoire's JAX-face ReplayBuffer with n Atari-like transitions, or None where it does not
    import (it needs dopamine-rl)."""
    try:
        from memoire.dopamine_compat import jax_replay_buffer as jrb
    except ImportError:
        return None
    acc = jrb.TransitionAccumulator(stack_size=STACK, update_horizon=1, gamma=0.99)
    buf = jrb.ReplayBuffer(
        acc, jrb.UniformSamplingDistribution(seed=0), batch_size=batch, max_capacity=n + 10
    )
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 255, (EPISODE,) + FRAME, dtype=np.uint8)
    for i in range(n):
        buf.add(
            jrb.TransitionElement(frames[i % EPISODE], i % ACTIONS, 0.5, False, i % EPISODE == 0)
        )
    return buf


def face_fields(e):
    """The JAX face's ReplayElement as the step's inputs ([B, 84, 84, 4] -> [B, 4, 84, 84])."""
    import jax.numpy as jnp

    return (
        jnp.moveaxis(e.state, -1, 1),
        jnp.broadcast_to(e.action[:, None], (e.action.shape[0], STACK)),
        jnp.broadcast_to(e.reward[:, None].astype(jnp.float32), (e.reward.shape[0], STACK)),
        jnp.moveaxis(e.next_state, -1, 1),
        e.is_terminal,
    )


# ---- main ----


def measure(ways, rounds: int, seconds: float):
    """{name: [ratio to 'fixed' per round]} and {name: [steps/s per round]}, interleaved."""
    rates = {name: [] for name in ways}
    for _ in range(rounds):
        for name, fn in ways.items():
            rates[name].append(fn(seconds))
            print(f"    {name:<38} {rates[name][-1]:9.1f} steps/s", flush=True)
    ratios = {name: [r / f for r, f in zip(rs, rates["fixed"])] for name, rs in rates.items()}
    return ratios, rates


def jax_ways(args, batch: int, rem, face):
    import jax

    from memoire.feed import Feed

    dev = jax.devices()[0]
    learner = jax_learner()
    params, opt, step = learner
    target = jax.tree_util.tree_map(lambda x: x.copy(), params)
    learner = (params, opt, target, step)
    fixed = jax.device_put(fields(rem.get_batch(batch)))
    feeds = []

    def run(take):
        return lambda seconds: run_jax(take, seconds, learner)

    ways = {"fixed": run(lambda: fixed)}
    ways["inline get_batch + device_put"] = run(
        lambda: jax.device_put(fields(rem.get_batch(batch)))
    )
    host = Feed(rem, batch, depth=args.depth, threads=args.threads, seed=1)
    feeds.append(host)
    ways["host feed + device_put"] = run(lambda: jax.device_put(fields(next(host))))
    devfeed = Feed(rem, batch, depth=args.depth, threads=args.threads, seed=2, device=dev)
    feeds.append(devfeed)
    ways["device feed (ReplayMemory)"] = run(lambda: fields(next(devfeed)))
    if face is not None:
        f1 = Feed(face, batch, depth=args.depth, threads=args.threads, seed=3, device=dev)
        f2 = Feed(
            face,
            batch,
            depth=args.depth,
            threads=args.threads,
            seed=3,
            device=dev,
            stack_on_device=True,
        )
        feeds += [f1, f2]
        ways["device feed (JAX face)"] = run(lambda: face_fields(next(f1)))
        ways["device feed (JAX face, stack_on_dev)"] = run(lambda: face_fields(next(f2)))
    return ways, feeds


def torch_ways(args, batch: int, rem, device: str):
    import torch

    from memoire.feed import Feed

    step = torch_learner(device)
    fixed = tuple(
        torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in fields(rem.get_batch(batch))
    )
    feeds = []

    def run(take):
        return lambda seconds: run_torch(take, seconds, step, device)

    ways = {"fixed": run(lambda: fixed)}
    ways["inline get_batch + .to(device)"] = run(
        lambda: tuple(torch.from_numpy(x).to(device) for x in fields(rem.get_batch(batch)))
    )
    devfeed = Feed(rem, batch, depth=args.depth, threads=args.threads, seed=2, device=device)
    feeds.append(devfeed)
    ways["device feed (ReplayMemory)"] = run(lambda: fields(next(devfeed)))
    return ways, feeds


def report(title, ratios, rates):
    print(f"  {title}: median ratio to fixed (steps/s)")
    for name in ratios:
        print(
            f"    {name:<38} {statistics.median(ratios[name]):6.3f}x"
            f"  ({statistics.median(rates[name]):9.1f} steps/s)"
        )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--fill", type=int, default=20000)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--torch", action="store_true", help="also the PyTorch step")
    ap.add_argument("--torch-device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--no-face", action="store_true", help="skip the JAX face rows")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    import jax

    import memoire

    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(
        f"memoire {memoire.__version__}, jax {jax.__version__} ({jax.devices()[0]}), "
        f"numpy {np.__version__}, python {sys.version.split()[0]}, "
        f"{os.cpu_count()} cpus, load {' '.join(load)}",
        flush=True,
    )
    results = {"load_before": load, "jax_device": str(jax.devices()[0]), "runs": {}}
    t0 = time.perf_counter()
    rem = make_memory(args.fill)
    print(f"  filled {args.fill} entries in {time.perf_counter() - t0:.1f} s", flush=True)
    face = None
    if not args.no_jax and not args.no_face:
        t0 = time.perf_counter()
        face = jax_face_buffer(min(args.fill, 20000), args.batch[0])
        if face is None:
            print("  (JAX face rows skipped: memoire.dopamine_compat does not import here)")
        else:
            print(f"  JAX face filled in {time.perf_counter() - t0:.1f} s", flush=True)
    for batch in args.batch:
        if not args.no_jax:
            ways, feeds = jax_ways(args, batch, rem, face)
            print(f"JAX, B={batch}", flush=True)
            try:
                ratios, rates = measure(ways, args.rounds, args.seconds)
            finally:
                for f in feeds:
                    f.close()
            report(f"JAX B={batch}", ratios, rates)
            results["runs"][f"jax B={batch}"] = {"ratios": ratios, "rates": rates}
        if args.torch:
            try:
                import torch
            except ImportError:
                print("  (PyTorch rows skipped: torch does not import)")
                continue
            device = args.torch_device or ("cuda" if torch.cuda.is_available() else "cpu")
            ways, feeds = torch_ways(args, batch, rem, device)
            print(f"PyTorch ({device}), B={batch}", flush=True)
            try:
                ratios, rates = measure(ways, args.rounds, args.seconds)
            finally:
                for f in feeds:
                    f.close()
            report(f"PyTorch B={batch}", ratios, rates)
            results["runs"][f"torch B={batch}"] = {"ratios": ratios, "rates": rates}
    with open("/proc/loadavg") as f:
        results["load_after"] = f.read().split()[:3]
    print(f"load after: {' '.join(results['load_after'])}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
