"""Distributed ingest: 1, 2 or 4 actor processes pushing transitions to one learner.

memoire: each actor fills a local memory through ReplayMemoryClient and calls push_cache() in
a loop; the learner's ReplayMemoryServer receives the caches and the learner draws them with
get_batch(cache_size), counting rows. raw pyzmq: each actor sends exactly the frames of one of
memoire's cache messages (header and arrays, copy=False) on a PUSH socket, again and again,
and the learner receives them on PULL, doing nothing else: the ceiling of the transport for
the same bytes.

Both sets of actors start once per actor count and wait on their own event; the timing
alternates between the two systems (a warm-up, a timed window, a drain), several repetitions,
medians. Only loopback addresses and OS-chosen ports; every loop is bounded in time.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import List, Sequence

import numpy as np

from memoire.bench.harness import Measurement

import zmq  # noqa: F401  (ImportError here: the suite runs without the ingest rows)
from memoire import ReplayMemoryClient, ReplayMemoryServer  # noqa: F401  (same)

CTX = mp.get_context("spawn")
CACHE_SIZE = 128
CAPACITY = 4000


def _templates(shape, dtype):
    return (np.zeros(shape, dtype), np.zeros([], np.int64), np.zeros([], np.float32),
            np.zeros([], np.float32), np.zeros([], np.float32), np.zeros([], np.float32),
            np.zeros([0], np.uint8))


def _fill(rem, shape, dtype, steps=2000):
    rng = np.random.default_rng(0)
    rem.new_episode()
    s = rng.integers(0, 255, (steps, *shape)).astype(dtype)
    rem.add_entries(s, np.zeros(steps, np.int64), np.ones(steps, np.float32),
                    np.full(steps, 0.5, np.float32), np.zeros(steps, np.float32),
                    np.zeros((steps, 0), np.uint8), np.ones(steps, np.float32))
    rem.close_episode()


def _memoire_actor(ep, shape, dtype, go, stop, ready):
    from memoire import ReplayMemoryClient

    with ReplayMemoryClient(None, ep["rep"], ep["pull"], timeout=10) as c:
        c.rem.cache_size = CACHE_SIZE
        _fill(c.rem, shape, dtype)
        ready.set()
        deadline = time.monotonic() + 3600
        while not stop.is_set() and time.monotonic() < deadline:
            if go.is_set():
                c.push_cache()
            else:
                go.wait(0.05)


def _raw_actor(endpoint, shape, dtype, go, stop, ready):
    import zmq

    from memoire import ReplayMemory
    from memoire.client import cache_message

    rem = ReplayMemory(*_templates(shape, dtype), CAPACITY)
    rem.cache_size = CACHE_SIZE
    _fill(rem, shape, dtype)
    frames = cache_message(rem, 1)  # exactly the frames of one of memoire's caches
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.sndhwm = 64
    push.sndtimeo = 200
    push.linger = 0
    push.connect(endpoint)
    ready.set()
    deadline = time.monotonic() + 3600
    while not stop.is_set() and time.monotonic() < deadline:
        if not go.is_set():
            go.wait(0.05)
            continue
        try:
            push.send_multipart(frames, copy=False)
        except zmq.Again:
            pass
    push.close()
    ctx.term()


def _start(target, args_of, n):
    go, stop = CTX.Event(), CTX.Event()
    readies = [CTX.Event() for _ in range(n)]
    procs = [CTX.Process(target=target, args=(*args_of, go, stop, r), daemon=True)
             for r in readies]
    for p in procs:
        p.start()
    for r in readies:
        if not r.wait(120):
            raise RuntimeError("an actor process did not start within 120 s")
    return go, stop, procs


def _stop(stop, procs):
    stop.set()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()


def _window(go, receive, seconds: float) -> float:
    """Seconds per transition received during one timed window (after a 0.2 s warm-up)."""
    go.set()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.2:
        receive()
    rows, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        rows += receive()
    elapsed = time.monotonic() - t0
    go.clear()
    t1 = time.monotonic()
    while time.monotonic() - t1 < 0.2:  # drain what is in flight
        receive()
    return elapsed / max(rows, 1)


def ingest_workload(actors: Sequence[int] = (1, 2, 4), *, repeats: int = 3,
                    seconds: float = 1.0,
                    shapes=(((4,), np.float32), ((84, 84, 4), np.uint8))) -> List[Measurement]:
    """memoire vs raw pyzmq, transitions per second at the learner, per actor count."""
    import zmq

    out: List[Measurement] = []
    for shape, dtype in shapes:
        for n in actors:
            label = (f"ingest {'x'.join(map(str, shape))} {np.dtype(dtype).name} "
                     f"{n} actor{'s' if n > 1 else ''} cache{CACHE_SIZE}")
            with ReplayMemoryServer(*_templates(shape, dtype), CAPACITY, None,
                                    n_caches=64) as srv:
                srv.rem.cache_size = CACHE_SIZE
                ep = srv.start()
                ctx = zmq.Context()
                pull = ctx.socket(zmq.PULL)
                pull.rcvhwm = 64
                pull.linger = 0
                port = pull.bind_to_random_port("tcp://127.0.0.1")
                m_go, m_stop, m_procs = _start(_memoire_actor, (ep, shape, dtype), n)
                r_go, r_stop, r_procs = _start(
                    _raw_actor, (f"tcp://127.0.0.1:{port}", shape, dtype), n)

                def recv_memoire():
                    try:
                        return len(srv.get_batch(CACHE_SIZE, timeout=0.1))
                    except RuntimeError:  # no cache within the timeout
                        return 0

                def recv_raw():
                    if pull.poll(100):
                        pull.recv_multipart(copy=False)
                        return CACHE_SIZE
                    return 0

                sec = {"memoire": [], "raw pyzmq PUSH/PULL": []}
                try:
                    for r in range(repeats):
                        order = [("memoire", m_go, recv_memoire),
                                 ("raw pyzmq PUSH/PULL", r_go, recv_raw)]
                        for name, go, recv in (order if r % 2 == 0 else order[::-1]):
                            sec[name].append(_window(go, recv, seconds))
                finally:
                    _stop(m_stop, m_procs)
                    _stop(r_stop, r_procs)
                    pull.close()
                    ctx.term()
                out += [Measurement(label, name, s) for name, s in sec.items()]
    return out
