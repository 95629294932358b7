"""Soak: a central-mode server under a rate limiter whose actors are killed (SIGKILL, then
restarted: they rejoin) and frozen (SIGSTOP, then SIGCONT) every few seconds, for N minutes.

    PYTHONPATH=. python benchmarks/soak_liveness.py --minutes 10

The server (this process; loopback, OS-picked ports) holds `--max_step` entries of uint8[84, 84]
frames; a sampler thread samples batches of 32 but pauses for a few seconds now and then, so
the limiter holds inserts back (actors then block in their sends). Actors
(``ReplayMemoryClient``, central mode, keepalive 0.2 s) stream episodes of `--steps` frames in
chunks of 16, a frame every 2 ms. Every `--every` seconds one actor is killed or frozen for
0.3 x peer_timeout. Every 10 s it samples the server's RSS (/proc/self/status VmRSS).

Prints a JSON summary: events, episodes stored, drops by reason, RSS samples (MiB) and whether
only whole episodes were stored (every committed episode has `--steps` rows, and the memory
holds steps x episodes entries until it wraps). Report it with `cat /proc/loadavg`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import memoire
from memoire import ReplayMemoryServer
from memoire.bench.memory import proc_status
from memoire.rate_limiter import SampleToInsertRatio

ACTOR = r"""
import sys, time, numpy as np
from memoire import ReplayMemoryClient
pull, rep, uuid, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = ReplayMemoryClient(None, rep, pull, uuid, mode="central", chunk_size=16, timeout=3600,
                       keepalive=0.2)
frames = np.random.default_rng(uuid & 0xFFFF).integers(0, 256, (steps, 84, 84), np.uint8)
print("up", flush=True)
while True:
    c.new_episode()
    for t in range(steps):
        c.add_entry(frames[t], t % 4, 1.0, 0.5, 0.0)
        time.sleep(0.002)
    c.close_episode()
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--actors", type=int, default=4)
    p.add_argument("--steps", type=int, default=200, help="frames per episode")
    p.add_argument("--every", type=float, default=3.0, help="seconds between events")
    p.add_argument("--max_step", type=int, default=50_000)
    p.add_argument("--peer_timeout", type=float, default=2.0)
    args = p.parse_args()

    templates = (
        np.zeros((84, 84), np.uint8),
        np.zeros([], np.int64),
        *(np.zeros([], np.float32) for _ in range(4)),
        np.zeros([0], np.uint8),
    )
    limiter = SampleToInsertRatio(1.0, 1000, (-2000.0, 4000.0))
    rng = random.Random(24)
    held = threading.Event()
    stop = threading.Event()
    # The actors import the memoire this process runs (not one found from their folder).
    here = os.path.dirname(os.path.dirname(os.path.abspath(memoire.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    with ReplayMemoryServer(
        *templates,
        args.max_step,
        None,
        rate_limiter=limiter,
        peer_timeout=args.peer_timeout,
        max_message_bytes=16 * 84 * 84 * 2,
    ) as srv:
        ep = srv.start()

        def sampler():
            while not stop.is_set():
                if held.is_set():
                    time.sleep(0.01)
                    continue
                try:
                    srv.sample(32, timeout=0.05)
                except TimeoutError:
                    pass

        threading.Thread(target=sampler, daemon=True).start()
        count = [0]

        def start(k):
            count[0] += 1
            uuid = ((k + 1) << 32) | count[0]
            proc = subprocess.Popen(
                [sys.executable, "-c", ACTOR, ep["pull"], ep["rep"], str(uuid), str(args.steps)],
                stdout=subprocess.PIPE,
                env=env,
                cwd=tempfile.gettempdir(),
            )
            proc.stdout.readline()
            return proc

        actors = [start(k) for k in range(args.actors)]
        rss, events = [], {"kill": 0, "freeze": 0, "hold": 0}
        committed_rows = {}
        t0 = time.monotonic()
        next_rss = t0
        try:
            while time.monotonic() - t0 < 60 * args.minutes:
                time.sleep(args.every)
                if rng.random() < 0.2:
                    held.set()
                    events["hold"] += 1
                else:
                    held.clear()
                k = rng.randrange(args.actors)
                if rng.random() < 0.5:
                    actors[k].kill()
                    actors[k].wait(30)
                    actors[k] = start(k)
                    events["kill"] += 1
                else:
                    os.kill(actors[k].pid, signal.SIGSTOP)
                    time.sleep(0.3 * args.peer_timeout)
                    os.kill(actors[k].pid, signal.SIGCONT)
                    events["freeze"] += 1
                records, _ = srv.take_stored_episodes()
                for _, _, rows, _ in records:
                    committed_rows[rows] = committed_rows.get(rows, 0) + 1
                if time.monotonic() >= next_rss:
                    rss.append(round(proc_status("VmRSS") / 2**20, 1))
                    next_rss += 10
            held.clear()
            s = srv.stats()
        finally:
            stop.set()
            for a in actors:
                a.kill()
                a.wait(30)
    stored = s.get("episodes_in", 0)
    print(
        json.dumps(
            {
                "minutes": args.minutes,
                "actors": args.actors,
                "events": events,
                "episodes_stored": stored,
                "steps_stored": s.get("steps_in", 0),
                "rejected": s["rejected"],
                "committed_rows": committed_rows,
                "only_whole_episodes": set(committed_rows) <= {args.steps},
                "memory_size": s["memory_size"],
                "rss_mib": {"first": rss[:3], "max": max(rss), "last": rss[-3:]},
                "loadavg": open("/proc/loadavg").read().split()[:3],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
