"""End-to-end network throughput: 2 actor processes -> one learner's get_batch, against raw
pyzmq PUSH/PULL moving the same bytes in the same run.

    PYTHONPATH=. python benchmarks/bench_network.py [--seconds 3] [--cache_size 128]

For each state layout (float32[4] and uint8[84,84,4]) it reports transitions per second:
- memoire: actors fill local memories, then push_cache() in a loop; the learner calls
  server.get_batch(cache_size) (every row used once: reuse_cache=False) and counts rows.
- raw pyzmq: actors send the same frames (one cache's arrays, copy=False) on PUSH; the learner
  receives them on PULL and counts rows, doing nothing else.
The ratio memoire / raw is the overhead of the codec, checks, cache ring and batch assembly.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np
import zmq

CTX = mp.get_context("spawn")


def templates(state_shape, state_dtype):
    return (np.zeros(state_shape, state_dtype), np.zeros([], np.int64), np.zeros([], np.float32),
            np.zeros([], np.float32), np.zeros([], np.float32), np.zeros([], np.float32),
            np.zeros([0], np.uint8))


def _fill(rem, state_shape, state_dtype, steps=2000):
    rng = np.random.default_rng(0)
    rem.new_episode()
    s = rng.integers(0, 255, (steps,) + tuple(state_shape)).astype(state_dtype)
    rem.add_entries(s, np.zeros(steps, np.int64), np.ones(steps, np.float32),
                    np.full(steps, 0.5, np.float32), np.zeros(steps, np.float32),
                    np.zeros((steps, 0), np.uint8), np.ones(steps, np.float32))
    rem.close_episode()


def memoire_actor(ep, state_shape, state_dtype, stop, ready):
    from memoire import ReplayMemoryClient

    with ReplayMemoryClient(None, ep["rep"], ep["pull"], timeout=10) as c:
        _fill(c.rem, state_shape, state_dtype)
        ready.set()
        while not stop.is_set():
            c.push_cache()


def raw_actor(endpoint, state_shape, state_dtype, cache_size, stop, ready):
    from memoire import ReplayMemory

    rem = ReplayMemory(*templates(state_shape, state_dtype), 4000)
    _fill(rem, state_shape, state_dtype)
    prev, nxt, w, p, d, i = rem._sample(cache_size)  # the same arrays a cache carries
    frames = [b"x" * 32] + [a for a in prev + nxt] + [w, p, d, i]
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.sndhwm = 64
    push.sndtimeo = 200
    push.linger = 0
    push.connect(endpoint)
    ready.set()
    while not stop.is_set():
        try:
            push.send_multipart(frames, copy=False)
        except zmq.Again:
            pass
    push.close()
    ctx.term()


def run_memoire(state_shape, state_dtype, cache_size, seconds):
    from memoire import ReplayMemoryServer

    with ReplayMemoryServer(*templates(state_shape, state_dtype), 4000, None, n_caches=64) as srv:
        srv.rem.cache_size = cache_size
        ep = srv.start()
        stop, readies = CTX.Event(), [CTX.Event() for _ in range(2)]
        procs = [CTX.Process(target=memoire_actor, args=(ep, state_shape, state_dtype, stop, r))
                 for r in readies]
        for p in procs:
            p.start()
        for r in readies:
            if not r.wait(60):
                raise RuntimeError("an actor did not start")
        rows, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < 0.5:  # warm up
            try:
                srv.get_batch(cache_size, timeout=0.1)
            except RuntimeError:
                pass
        rows, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            try:
                rows += len(srv.get_batch(cache_size, timeout=0.1))
            except RuntimeError:
                pass
        rate = rows / (time.monotonic() - t0)
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        return rate


def run_raw(state_shape, state_dtype, cache_size, seconds):
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.rcvhwm = 64
    pull.linger = 0
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    stop, readies = CTX.Event(), [CTX.Event() for _ in range(2)]
    procs = [CTX.Process(target=raw_actor, args=(f"tcp://127.0.0.1:{port}", state_shape,
                                                 state_dtype, cache_size, stop, r))
             for r in readies]
    for p in procs:
        p.start()
    for r in readies:
        if not r.wait(60):
            raise RuntimeError("an actor did not start")
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.5:
        if pull.poll(100):
            pull.recv_multipart(copy=False)
    rows, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        if pull.poll(100):
            pull.recv_multipart(copy=False)
            rows += cache_size
    rate = rows / (time.monotonic() - t0)
    stop.set()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    pull.close()
    ctx.term()
    return rate


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--cache_size", type=int, default=128)
    args = ap.parse_args(argv)
    print(f"{'state':<16} {'memoire tr/s':>14} {'raw pyzmq tr/s':>16} {'ratio':>7}  MB/s(raw)")
    for shape, dtype in (((4,), np.float32), ((84, 84, 4), np.uint8)):
        m = run_memoire(shape, dtype, args.cache_size, args.seconds)
        r = run_raw(shape, dtype, args.cache_size, args.seconds)
        row_bytes = 2 * np.prod(shape) * np.dtype(dtype).itemsize + 2 * (8 + 4 * 4) + 4 + 8 + 1 + 8
        name = f"{np.dtype(dtype).name}{list(shape)}"
        print(f"{name:<16} {m:14.0f} {r:16.0f} {m / r:7.2f}  {r * row_bytes / 1e6:.0f}", flush=True)


if __name__ == "__main__":
    main()
