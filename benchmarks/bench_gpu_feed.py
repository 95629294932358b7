"""A GPU learner's step rate fed by replay, as a ratio to the same step on a fixed device batch.

A Nature-DQN train step (three conv layers 32x8x8/4, 64x4x4/2, 64x3x3/1, dense 512, 18 actions,
Huber TD loss against a target network, Adam; plain jax.numpy, no flax/optax) on uint8 stacks of
four 84x84 frames, jitted. Ways to feed it, measured in interleaved rounds in one run (the
machine's absolute rate moves between runs; each round's rate is divided by its reference's
rate of the same round, and the median ratio is reported):

  fixed            the step on one batch already on the device (the reference, 1.0)
  inline           ReplayMemory.get_batch(B) + jax.device_put on the learner's thread
  host feed + put  Feed(memory, B) host batches + jax.device_put on the learner's thread
  device feed      Feed(memory, B, device=<jax device>): the device path (slots a native copy
                   thread fills, imported once and lent; feed.release(after=params) per step)
  stream           SamplingStream(endpoint, B, device=<jax device>) from a server in another
                   process on this host: the device ring copies from the server's
                   shared-memory slots (needs pyzmq)

The JAX face (memoire's Dopamine JAX ReplayBuffer, where it imports) is fed the way Dopamine's
agents read it: the same step in Dopamine's layout (state uint8[B, 84, 84, 4] channel-last,
action int32[B], reward float32[B], terminal bool[B]), reading the fields as they are, with its
own fixed-batch reference: the device feed with 1 and ``--threads`` sampler threads, with
stack_on_device, and ``sample()`` + jax.device_put inline.

With PyTorch importable (``--torch``), the same for an eager PyTorch step of the same net:
fixed, inline (``torch.from_numpy(...).to(device)``), device feed (``device="cuda"``), stream;
and on CUDA the step captured as a CUDA graph (``torch.cuda.graph``): on the fixed batch, and
on the device feed with one graph per device slot (its tensors stay at fixed addresses;
``feed.last_slot`` picks the graph).

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
import subprocess
import sys
import time

import numpy as np

FRAME = (84, 84)
STACK = 4
ACTIONS = 18
EPISODE = 1000


# ---- replay ----


TEMPLATES = (
    np.zeros(FRAME, np.uint8),
    np.zeros([], np.int64),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([0], np.uint8),
)


def make_memory(n: int, seed: int = 0, rem=None):
    """A ReplayMemory of n random entries (or `rem`, a server's memory, filled the same way)."""
    from memoire import ReplayMemory

    if rem is None:
        rem = ReplayMemory(*TEMPLATES, max(n, 2 * EPISODE))
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


def jax_learner(seed: int = 0, channel_last: bool = False):
    """(init params, jitted step(params, opt, target, s, a, r, s2, done) -> (params, opt,
    loss)), params and opt donated.

    Memoire's layout (channel_last False): s uint8[B, 4, 84, 84], a and r [B, 4] (the stacks),
    the last entry's used. Dopamine's (True): s uint8[B, 84, 84, 4], a int[B], r float[B]."""
    import jax
    import jax.numpy as jnp

    def conv(x, w, stride):
        return jax.lax.conv_general_dilated(
            x, w, (stride, stride), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    def q_values(p, s):
        x = s if channel_last else jnp.transpose(s, (0, 2, 3, 1))
        x = x.astype(jnp.float32) / 255.0  # [B, 84, 84, 4]
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
        if not channel_last:
            a, r = a[:, -1], r[:, -1]
        q = q_values(p, s)
        q_a = jnp.take_along_axis(q, (a % ACTIONS).astype(jnp.int32)[:, None], 1)[:, 0]
        next_q = q_values(target, s2).max(axis=1)
        y = r + 0.99 * (1.0 - done.astype(jnp.float32)) * next_q
        err = q_a - jax.lax.stop_gradient(y)
        return jnp.mean(jnp.where(jnp.abs(err) < 1.0, 0.5 * err**2, jnp.abs(err) - 0.5))

    def step(params, opt, target, s, a, r, s2, done):
        value, grads = jax.value_and_grad(loss)(params, target, s, a, r, s2, done)
        m, v, t = opt
        t = t + 1
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
        lr = 6.25e-5 * jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        params = jax.tree_util.tree_map(
            lambda p, m, v: p - lr * m / (jnp.sqrt(v) + 1.5e-4), params, m, v
        )
        return params, (m, v, t), value

    params = init(jax.random.PRNGKey(seed))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    opt = (zeros, zeros, jnp.zeros([], jnp.float32))
    return params, opt, jax.jit(step, donate_argnums=(0, 1))


def run_jax(take, seconds: float, learner, release=None, warmup: int = 5) -> float:
    """Steps/s of the jitted step fed by take() -> the step's 5 inputs (device arrays); with
    `release`, release(loss) after each step (a lent batch goes back once its step's loss is
    ready; the loss, not the parameters, which the next step donates)."""
    import jax

    params, opt, target, step = learner
    params = jax.tree_util.tree_map(lambda x: x.copy(), params)
    opt = jax.tree_util.tree_map(lambda x: x.copy(), opt)

    def one(params, opt):
        params, opt, loss = step(params, opt, target, *take())
        if release is not None:
            release(loss)
        return params, opt

    for _ in range(warmup):
        params, opt = one(params, opt)
    jax.block_until_ready(params)
    n, start = 0, time.perf_counter()
    while True:
        params, opt = one(params, opt)
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


def capture(step, inputs):
    """A CUDA graph of step(*inputs) (warmed up on a side stream first, as torch.cuda.graph
    asks): replay() runs the step on what `inputs` hold then."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(*inputs)
    return graph


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
    """The JAX face's ReplayElement as Dopamine's agents read it: the fields as they are."""
    return (e.state, e.action, e.reward, e.next_state, e.is_terminal)


# ---- a server in another process, for the stream rows ----

SERVER = r"""
import sys
sys.path.insert(0, sys.argv[1])
from bench_gpu_feed import TEMPLATES, make_memory
from memoire import ReplayMemoryServer
srv = ReplayMemoryServer(*TEMPLATES, int(sys.argv[2]), pub_endpoint=None, seed=3)
make_memory(int(sys.argv[2]), 3, rem=srv.rem)
ep = srv.start_stream(sys.argv[3], threads=int(sys.argv[4]))
print(ep, flush=True)
sys.stdin.read()  # until the benchmark ends
srv.close()
"""


def start_server(fill: int, threads: int, folder: str):
    """(the server process, its stream endpoint), or (None, why) where it cannot start."""
    try:
        import zmq  # noqa: F401
    except ImportError:
        return None, "pyzmq does not import"
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, here, str(fill), f"ipc://{folder}/stream", str(threads)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        # Not the working directory first on sys.path: a checkout's memoire/ may lack _core.
        env=dict(os.environ, PYTHONSAFEPATH="1"),
    )
    line = proc.stdout.readline().strip()
    if not line.startswith("ipc://"):
        proc.kill()
        return None, f"the server did not start ({line!r})"
    return proc, line


# ---- main ----


def measure(ways, rounds: int, seconds: float, refs=None):
    """{name: [ratio to its reference per round]} and {name: [steps/s per round]}, interleaved.
    `refs`: name -> the reference way's name (default "fixed")."""
    refs = refs or {}
    rates = {name: [] for name in ways}
    for _ in range(rounds):
        for name, fn in ways.items():
            rates[name].append(fn(seconds))
            print(f"    {name:<44} {rates[name][-1]:9.1f} steps/s", flush=True)
    ratios = {
        name: [r / f for r, f in zip(rs, rates[refs.get(name, "fixed")])]
        for name, rs in rates.items()
    }
    return ratios, rates


def jax_ways(args, batch: int, rem, face, stream_ep):
    """(ways, references, feeds to close) for the JAX step at batch size `batch`."""
    import jax

    from memoire.feed import Feed

    dev = jax.devices()[0]

    def learner(channel_last=False):
        params, opt, step = jax_learner(channel_last=channel_last)
        target = jax.tree_util.tree_map(lambda x: x.copy(), params)
        return params, opt, target, step

    plain, dopamine_layout = learner(), learner(channel_last=True)
    fixed = jax.device_put(fields(rem.get_batch(batch)))
    feeds, refs = [], {}

    def run(take, release=None, lrn=plain):
        return lambda seconds: run_jax(take, seconds, lrn, release)

    ways = {"fixed": run(lambda: fixed)}
    ways["inline get_batch + device_put"] = run(
        lambda: jax.device_put(fields(rem.get_batch(batch)))
    )
    host = Feed(rem, batch, depth=args.depth, threads=args.threads, seed=1)
    feeds.append(host)
    ways["host feed + device_put"] = run(lambda: jax.device_put(fields(next(host))))
    devfeed = Feed(rem, batch, depth=args.depth, threads=args.threads, seed=2, device=dev)
    feeds.append(devfeed)
    ways["device feed (ReplayMemory)"] = run(lambda: fields(next(devfeed)), devfeed.release)
    if stream_ep is not None:
        from memoire.stream import SamplingStream

        stream = SamplingStream(stream_ep, batch, device=dev, timeout=60)
        feeds.append(stream)
        name = "stream, shared memory" if stream.shared_memory else "stream, socket"
        ways[f"device feed ({name})"] = run(lambda: fields(next(stream)), stream.release)
    if face is not None:
        face_fixed = jax.device_put(face_fields(face.sample(batch)))
        ways["fixed (face layout)"] = run(lambda: face_fixed, lrn=dopamine_layout)
        for threads in sorted({1, args.threads}):
            f = Feed(face, batch, depth=args.depth, threads=threads, seed=3, device=dev)
            feeds.append(f)
            ways[f"device feed (JAX face, {threads} thr)"] = run(
                lambda f=f: face_fields(next(f)), f.release, dopamine_layout
            )
        f = Feed(
            face,
            batch,
            depth=args.depth,
            threads=args.threads,
            seed=3,
            device=dev,
            stack_on_device=True,
        )
        feeds.append(f)
        ways["device feed (JAX face, stack_on_dev)"] = run(
            lambda: face_fields(next(f)), f.release, dopamine_layout
        )
        ways["inline sample + device_put (JAX face)"] = run(
            lambda: jax.device_put(face_fields(face.sample(batch))),
            lrn=dopamine_layout,
        )
        refs = {name: "fixed (face layout)" for name in ways if "face" in name}
    return ways, refs, feeds


def torch_ways(args, batch: int, rem, device: str, stream_ep):
    import torch

    from memoire.feed import Feed

    step = torch_learner(device)
    fixed = tuple(
        torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in fields(rem.get_batch(batch))
    )
    feeds, refs = [], {}

    def run(take):
        return lambda seconds: run_torch(take, seconds, step, device)

    ways = {"fixed": run(lambda: fixed)}
    ways["inline get_batch + .to(device)"] = run(
        lambda: tuple(torch.from_numpy(x).to(device) for x in fields(rem.get_batch(batch)))
    )
    devfeed = Feed(rem, batch, depth=args.depth, threads=args.threads, seed=2, device=device)
    feeds.append(devfeed)
    ways["device feed (ReplayMemory)"] = run(lambda: fields(next(devfeed)))
    if stream_ep is not None:
        from memoire.stream import SamplingStream

        stream = SamplingStream(stream_ep, batch, device=device, timeout=60)
        feeds.append(stream)
        ways["device feed (stream)"] = run(lambda: fields(next(stream)))
    if device.startswith("cuda"):
        # The step captured once on the fixed batch, and once per device slot of a feed: each
        # slot's tensors stay at their addresses, so its graph reads every batch it holds.
        fixed_graph = capture(step, fixed)
        graph_feed = Feed(rem, batch, depth=args.depth, threads=args.threads, seed=4, device=device)
        feeds.append(graph_feed)
        graphs = {}
        while len(graphs) < graph_feed.device_slots:
            inputs = fields(next(graph_feed))
            graphs.setdefault(graph_feed.last_slot, capture(step, inputs))

        def replay_next():
            next(graph_feed)
            graphs[graph_feed.last_slot].replay()

        ways["fixed (captured step)"] = lambda seconds: run_graph(fixed_graph.replay, seconds)
        ways["device feed (captured step per slot)"] = lambda seconds: run_graph(
            replay_next, seconds
        )
        refs["device feed (captured step per slot)"] = "fixed (captured step)"
    return ways, refs, feeds


def run_graph(replay, seconds: float, warmup: int = 5) -> float:
    """Steps/s of replay() (a captured step's replay, and what feeds it)."""
    import torch

    for _ in range(warmup):
        replay()
    torch.cuda.synchronize()
    n, start = 0, time.perf_counter()
    while True:
        replay()
        n += 1
        if n % 16 == 0 and time.perf_counter() - start > seconds:
            break
    torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def report(title, ratios, rates, refs):
    print(f"  {title}: median ratio to its fixed batch (steps/s)")
    for name in ratios:
        print(
            f"    {name:<44} {statistics.median(ratios[name]):6.3f}x"
            f"  ({statistics.median(rates[name]):9.1f} steps/s, vs {refs.get(name, 'fixed')})"
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
    ap.add_argument("--no-stream", action="store_true", help="skip the stream rows")
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
    server, stream_ep = None, None
    if not args.no_stream:
        import tempfile

        folder = tempfile.mkdtemp(prefix="memoire-bench-")
        server, stream_ep = start_server(args.fill, args.threads, folder)
        if server is None:
            print(f"  (stream rows skipped: {stream_ep})")
            stream_ep = None
    try:
        run_all(args, rem, face, stream_ep, results)
    finally:
        if server is not None:
            server.stdin.close()
            server.wait(30)
    with open("/proc/loadavg") as f:
        results["load_after"] = f.read().split()[:3]
    print(f"load after: {' '.join(results['load_after'])}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return results


def run_all(args, rem, face, stream_ep, results) -> None:
    for batch in args.batch:
        if not args.no_jax:
            ways, refs, feeds = jax_ways(args, batch, rem, face, stream_ep)
            print(f"JAX, B={batch}", flush=True)
            try:
                ratios, rates = measure(ways, args.rounds, args.seconds, refs)
            finally:
                for f in feeds:
                    f.close()
            report(f"JAX B={batch}", ratios, rates, refs)
            results["runs"][f"jax B={batch}"] = {"ratios": ratios, "rates": rates}
        if args.torch:
            try:
                import torch
            except ImportError:
                print("  (PyTorch rows skipped: torch does not import)")
                continue
            device = args.torch_device or ("cuda" if torch.cuda.is_available() else "cpu")
            ways, refs, feeds = torch_ways(args, batch, rem, device, stream_ep)
            print(f"PyTorch ({device}), B={batch}", flush=True)
            try:
                ratios, rates = measure(ways, args.rounds, args.seconds, refs)
            finally:
                for f in feeds:
                    f.close()
            report(f"PyTorch B={batch}", ratios, rates, refs)
            results["runs"][f"torch B={batch}"] = {"ratios": ratios, "rates": rates}


if __name__ == "__main__":
    main()
