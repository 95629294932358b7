"""Resident memory of a server under growth attacks (many open episodes, growing ones).

    PYTHONPATH=. python benchmarks/hostile_rss.py --tree installed   # the venv's memoire
    PYTHONPATH=. python benchmarks/hostile_rss.py --tree .           # this checkout's

Each attack runs against a fresh server process (loopback, OS-picked ports) whose memory holds
10,000 entries of 56 bytes as sent (s float32[8], a int64, r, p, v float32, no info, init_w),
with the server's default limits; the server's memoire comes from `--tree` (a folder put first
on its PYTHONPATH, or ``installed``). The attacker speaks the wire protocol only.

- ``empty chunks``: 300,000 zero-row chunks under one sender (an episode never closed).
- ``open streams``: 400 senders each open an episode with one chunk of 10,000 rows.
- ``replies N x sample(B)``: N callers each ask the hosted memory for ``sample(B)`` (a
  refused ask gets a small error reply).

Prints one markdown row per attack: RSS (MiB, /proc/PID/status VmRSS) before and after, and
what the server's stats() say it holds afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import zmq

from memoire import codec
from memoire.bench.memory import proc_status
from memoire.codec import Msg
from memoire.remote import RemoteObject

SERVER = r"""
import json, sys
import numpy as np
from memoire import ReplayMemoryServer
t = (np.zeros([8], np.float32), np.zeros([], np.int64), np.zeros([], np.float32),
     np.zeros([], np.float32), np.zeros([], np.float32), np.zeros([], np.float32),
     np.zeros([0], np.uint8))
srv = ReplayMemoryServer(*t, 10000, None, seed=0)
for _ in range(10):
    n = 1000
    srv.rem.new_episode()
    srv.rem.add_entries(np.ones((n, 8), np.float32), np.zeros(n, np.int64),
                        np.ones(n, np.float32), np.full(n, 0.5, np.float32),
                        np.zeros(n, np.float32), np.zeros((n, 0), np.uint8),
                        np.ones(n, np.float32))
    srv.rem.close_episode()
print(json.dumps(srv.start()), flush=True)
sys.stdin.read()  # until the benchmark closes stdin
srv.close()
"""


def rss_mib(pid: int) -> float:
    return proc_status("VmRSS", pid) / 2**20


def chunk(uuid: int, episode: int, index: int, n: int) -> list:
    values = {
        "s": np.ones((n, 8), np.float32),
        "a": np.zeros(n, np.int64),
        "r": np.ones(n, np.float32),
        "p": np.full(n, 0.5, np.float32),
        "v": np.zeros(n, np.float32),
        "i": np.zeros((n, 0), np.uint8),
        "init_w": np.ones(n, np.float32),
        "uuid": np.array(uuid, np.uint64),
        "episode": np.array(episode, np.int64),
        "index": np.array(index, np.int64),
        "multiplier": np.array(1.0, np.float32),
    }
    return codec.encode(Msg.CHUNK, values)


class Server:
    def __init__(self, tree: str):
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        if tree != "installed":
            env["PYTHONPATH"] = os.path.abspath(tree)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd="/",
        )
        self.endpoints = json.loads(self.proc.stdout.readline())
        self.stats_rpc = RemoteObject(self.endpoints["rep"], "memory", timeout=120, retries=0)

    def stats(self) -> dict:
        return self.stats_rpc.call("stats")

    def wait_chunks(self, n: int, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while self.stats().get("chunks", 0) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server took fewer than {n} chunks in {timeout} s")
            time.sleep(0.2)

    def close(self) -> None:
        self.stats_rpc.close()
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def push_all(endpoint: str, messages) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.linger = 5000
    sock.sndhwm = 1000
    sock.connect(endpoint)
    for m in messages:
        sock.send_multipart(m, copy=False)
    sock.close()
    ctx.term()


def empty_chunks(srv: Server, n: int = 300_000) -> None:
    push_all(srv.endpoints["pull"], (chunk(666, 1, k, 0) for k in range(n)))
    srv.wait_chunks(n)


def open_streams(srv: Server, n: int = 400, rows: int = 10_000) -> None:
    push_all(srv.endpoints["pull"], (chunk(1000 + u, 1, 0, rows) for u in range(n)))
    srv.wait_chunks(n)


def replies(srv: Server, callers: int, batch: int) -> None:
    for _ in range(callers):
        rpc = RemoteObject(srv.endpoints["rep"], "memory", timeout=120, retries=0)
        try:
            rpc.call("sample", batch)
        except ValueError:
            pass  # refused (max_batch)
        finally:
            rpc.close()


def held(stats: dict) -> str:
    keys = ("open_streams", "open_stream_bytes", "reply_cache_bytes")
    parts = [f"{k}={stats[k]}" for k in keys if k in stats]
    rejected = stats.get("rejected", {})
    if rejected:
        parts.append("rejected=" + ",".join(f"{k}:{v}" for k, v in sorted(rejected.items())))
    return " ".join(parts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--tree",
        default=".",
        help="memoire source folder of the server, or 'installed' (default: .)",
    )
    p.add_argument("--callers", type=int, default=60)
    args = p.parse_args()
    attacks = [
        ("empty chunks 300000 x 0 rows", empty_chunks),
        ("open streams 400 x 10000 rows", open_streams),
        (f"replies {args.callers} x sample(200000)", lambda s: replies(s, args.callers, 200_000)),
        (f"replies {args.callers} x sample(16384)", lambda s: replies(s, args.callers, 16384)),
    ]
    print(f"server memoire: {args.tree}")
    print("| attack | RSS before (MiB) | RSS after (MiB) | growth (MiB) | server holds |")
    print("|---|---|---|---|---|")
    for name, attack in attacks:
        srv = Server(args.tree)
        try:
            srv.stats()
            before = rss_mib(srv.proc.pid)
            attack(srv)
            time.sleep(1.0)
            after = rss_mib(srv.proc.pid)
            print(
                f"| {name} | {before:.0f} | {after:.0f} | {after - before:+.0f} | "
                f"{held(srv.stats())} |",
                flush=True,
            )
        finally:
            srv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
