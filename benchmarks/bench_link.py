"""A learner on another host, across a real link, against the same learner on the server's host.

Two hosts on this machine (network namespaces joined by a veth link shaped by ``tc tbf`` to
each --rates value, tests/helpers/_netns.py; needs root): a server host holding central memories of
Atari-like transitions (uint8[84, 84] frames, stack 4, multi-step 1) and serving sampling
streams on its link address, and a learner host taking ``SamplingStream`` batches of B=32
(rows in the messages: each distinct frame once). Each memory is served twice, without keys
and with CURVE keys (what a run across hosts should use), so the cost of encryption shows
beside the plain stream; with recorded screens (--frames ale or a .npy) a memory that
compresses its states (LZ4: the stream sends its stored blocks) is served too.

For each way, in interleaved rounds (medians):

  batches/s        batches the learner took per second (no training step: the stream's rate)
  bytes/batch      what crossed the link per batch (the learner's end of the link counts
                   every frame in: ZeroMQ, CURVE, TCP/IP and Ethernet headers included)
  link             bytes/s on the link / the link's rate (bytes/s): 1.0 is a full link
  busiest threads  the learner's and the server's busiest threads over the window, each as
                   its CPU time / wall time (1.0: a whole core): where the CPU is the bound,
                   this names the thread. Learner: memoire-feed, a connection's receiving
                   thread (checks the batch, decodes LZ4 states, stacks), memoire-helper, the
                   thread that stacks half of a large batch, ZMQbg/IO/k, a ZeroMQ I/O thread
                   (the kernel's copy and, with keys, libsodium's decryption). Server:
                   memoire-rows, a sampler thread (draws and copies the distinct rows; stored
                   LZ4 blocks go as they are), python, the stream worker (encodes and queues
                   each batch), ZMQbg/IO/k (the kernel's copy, and encryption)

"one host" rows run the same learner on the server's host: over loopback TCP with rows in
the messages (the same work without a link), and through shared memory (the one-host default).

    sudo .venv/bin/python benchmarks/bench_link.py [--rates 1e9,1e10] [--frames ale] \\
        [--connections 1,2] [--seconds 3] [--rounds 3] [--fill 10000] [--threads 1]

Needs memoire, numpy, pyzmq, root and iproute2 (ip, tc); --frames ale needs dopamine-rl and
ale-py (benchmarks/_ale_frames.py records the screens once).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "helpers"))

from bench_remote_sampling import FRAME, fill  # noqa: E402

BATCH = 32


# ---------------------------------------------------------------------------------------------
# The processes on the hosts.


def _say(kind: str, value) -> None:
    print(json.dumps({kind: value}), flush=True)


def thread_cpu() -> dict:
    """{thread name: CPU seconds} of this process's threads (names summed)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # ended since the listing
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _templates():
    from memoire.bench.ingest import templates

    return templates(FRAME, np.uint8)


def serve(args: dict) -> None:
    """Server host: one ReplayMemoryServer per (memory, keys), each streaming on
    ``args['bind']`` and on loopback (the one-host learner). Answers ``cpu`` lines on stdin
    with its threads' CPU seconds."""
    from memoire.server import ReplayMemoryServer
    from memoire.transport import CurveKeys

    frames = None if args["frames"] is None else np.load(args["frames"])
    keyed = CurveKeys(
        secret_file=f"{args['keys']}/server.key_secret",
        authorized_dir=f"{args['keys']}/authorized",
    )
    servers, eps = [], {}
    memories = ["raw"] + (["compressed"] if frames is not None else [])
    for memory in memories:
        for keys in ("plain", "curve"):
            srv = ReplayMemoryServer(
                *_templates(),
                args["fill"],
                pub_endpoint=None,
                keys=keyed if keys == "curve" else None,
                compress_states=memory == "compressed",
            )
            fill(srv.rem, args["fill"], frames)
            servers.append(srv)
            for where, host in (("link", args["bind"]), ("loopback", "127.0.0.1")):
                ep = srv.start_stream(f"tcp://{host}:*", threads=args["threads"])
                eps[f"{memory}/{keys}/{where}"] = ep
    _say("ready", eps)
    for line in sys.stdin:
        if line.strip() != "cpu":
            break
        _say("cpu", thread_cpu())
    for srv in servers:
        srv.close()


def _rx_bytes(device: str) -> int:
    with open(f"/sys/class/net/{device}/statistics/rx_bytes") as f:
        return int(f.read())


def learn(args: dict) -> None:
    """Learner host: for each ``run`` line on stdin (a JSON way: endpoint, connections,
    shared memory), opens the stream, warms it, says ``window``, waits for ``go``, takes
    batches for ``seconds`` and says what it measured."""
    from memoire.stream import SamplingStream
    from memoire.transport import CurveKeys

    keys = CurveKeys(
        secret_file=f"{args['keys']}/client.key_secret",
        server_public_file=f"{args['keys']}/server.key",
    )
    device = args.get("device")
    _say("ready", {})
    for line in sys.stdin:
        if not line.startswith("run "):
            break
        way = json.loads(line[4:])
        with SamplingStream(
            way["endpoint"],
            BATCH,
            keys=keys if way["curve"] else None,
            timeout=60,
            credit=args["credit"],
            depth=max(4, way["connections"]),
            connections=way["connections"],
            shared_memory=way["shm"],
        ) as stream:
            t = time.perf_counter()
            while time.perf_counter() - t < 0.5:  # warm: rings made, credit flowing
                next(stream)
            _say("window", {})
            if sys.stdin.readline().strip() != "go":
                break
            rx0 = _rx_bytes(device) if device else 0
            cpu0 = thread_cpu()
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < args["seconds"]:
                next(stream)
                n += 1
            wall = time.perf_counter() - t0
            cpu1 = thread_cpu()
            rx = (_rx_bytes(device) - rx0) if device else 0
        _say(
            "result",
            {
                "batches": n,
                "wall": wall,
                "rx": rx,
                "cpu": {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1},
            },
        )


# ---------------------------------------------------------------------------------------------
# The driver (root namespace).


class Proc:
    """A role of this script on a test host, spoken to in JSON lines."""

    def __init__(self, hosts, host: str, role: str, args: dict):
        from _subprocess_env import subprocess_env

        self.proc = hosts.popen(
            host,
            [sys.executable, os.path.abspath(__file__), role, json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=subprocess_env(),
        )

    def read(self, kind: str, timeout: float = 600.0):
        got: list = []

        def read():
            for line in self.proc.stdout:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if kind in record:
                    got.append(record[kind])
                    return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        if not got:
            raise SystemExit(f"no {kind!r} from {self.proc.args[-2]} (exit {self.proc.poll()})")
        return got[0]

    def tell(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()


def _keys(folder: str) -> None:
    import shutil

    from memoire import transport

    transport.generate_keys(folder, "server")
    transport.generate_keys(os.path.join(folder, "authorized"), "client")
    for name in ("client.key", "client.key_secret"):
        shutil.copy(os.path.join(folder, "authorized", name), os.path.join(folder, name))
    os.remove(os.path.join(folder, "authorized", "client.key_secret"))


def _measure(learner: Proc, server: Proc, way: dict) -> dict:
    learner.tell("run " + json.dumps(way))
    learner.read("window")
    server.tell("cpu")
    s0 = server.read("cpu")
    learner.tell("go")
    got = learner.read("result")
    server.tell("cpu")
    s1 = server.read("cpu")
    got["server_cpu"] = {k: s1[k] - s0.get(k, 0.0) for k in s1}
    return got


def _busiest(cpu: dict, wall: float, most: int = 2) -> str:
    top = sorted(cpu.items(), key=lambda kv: -kv[1])[:most]
    return ", ".join(f"{name} {seconds / wall:.2f}" for name, seconds in top)


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="1e9,1e10", help="link rates, bits/s, comma-separated")
    ap.add_argument("--frames", default="random", help="random, ale, or a .npy of screens")
    ap.add_argument("--connections", default="1,2", help="connections per stream, a list")
    ap.add_argument("--seconds", type=float, default=3.0, help="timed window per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fill", type=int, default=10000, help="transitions per memory")
    ap.add_argument("--threads", type=int, default=1, help="the server's sampler threads")
    ap.add_argument("--credit", type=int, default=32)
    args = ap.parse_args(argv)

    import tempfile

    import _netns

    reason = _netns.unavailable()
    if reason:
        raise SystemExit(reason)
    frames = None
    if args.frames == "ale":
        import _ale_frames

        frames = _ale_frames.recorded()
    elif args.frames != "random":
        frames = args.frames
    folder = tempfile.mkdtemp(prefix="memoire-bench-link-")
    _keys(folder)
    connections = [int(c) for c in args.connections.split(",")]
    load = _loadavg()
    rows = []  # (rate or None, way name, results)
    for rate in [None] + [float(r) for r in args.rates.split(",")]:
        with _netns.TestHosts(("server", "learner"), rate=rate or 1e9) as hosts:
            server = Proc(
                hosts,
                "server",
                "serve",
                {
                    "bind": hosts.address("server"),
                    "frames": frames,
                    "keys": folder,
                    "fill": args.fill,
                    "threads": args.threads,
                },
            )
            eps = server.read("ready")
            on_link = rate is not None
            learner = Proc(
                hosts,
                "learner" if on_link else "server",
                "learn",
                {
                    "keys": folder,
                    "seconds": args.seconds,
                    "credit": args.credit,
                    "device": hosts.device("learner", "server") if on_link else None,
                },
            )
            learner.read("ready")
            ways = {}
            for memory in ("raw", "compressed"):
                for keys in ("plain", "curve"):
                    ep = eps.get(f"{memory}/{keys}/{'link' if on_link else 'loopback'}")
                    if ep is None:
                        continue
                    for c in connections:
                        ways[f"{memory} {keys}, {c} conn"] = dict(
                            endpoint=ep, curve=keys == "curve", connections=c, shm=False
                        )
                    if not on_link and keys == "plain":
                        ways[f"{memory} {keys}, shared memory"] = dict(
                            endpoint=ep, curve=False, connections=1, shm=True
                        )
            results = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, way in ways.items():
                    results[name].append(_measure(learner, server, way))
            learner.tell("end")
            server.tell("end")
            for name in ways:
                rows.append((rate, name, results[name]))
    print(
        f"Atari-like uint8[84, 84], stack 4, B={BATCH}, {args.fill} stored per memory, credit "
        f"{args.credit}, {args.threads} sampler thread(s); {args.frames} frames; "
        f"{args.rounds} rounds of {args.seconds} s (medians); cpus: {os.cpu_count()}; loadavg "
        f"at start {load}, at end {_loadavg()}"
    )
    print(
        f"{'link':>9} {'way':<32} {'batches/s':>9} {'kB/batch':>9} {'link':>5}   "
        "busiest threads: learner | server (CPU s / s)"
    )
    for rate, name, got in rows:
        k = sorted(range(len(got)), key=lambda i: got[i]["batches"] / got[i]["wall"])
        mid = got[k[len(k) // 2]]
        per_s = mid["batches"] / mid["wall"]
        rx = mid["rx"] / max(mid["batches"], 1)
        link = (mid["rx"] / mid["wall"]) / (rate / 8) if rate else float("nan")
        label = "one host" if rate is None else f"{rate / 1e9:g} Gbit/s"
        print(
            f"{label:>9} {name:<32} {per_s:9.0f} "
            f"{(rx / 1e3 if rate else float('nan')):9.0f} {link:5.2f}   "
            f"{_busiest(mid['cpu'], mid['wall'])} | {_busiest(mid['server_cpu'], mid['wall'])}"
            "   rounds: " + ", ".join(f"{g['batches'] / g['wall']:.0f}" for g in got)
        )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] in ("serve", "learn"):
        {"serve": serve, "learn": learn}[sys.argv[1]](json.loads(sys.argv[2]))
    else:
        main()
