"""End-to-end network throughput: 2 actor processes -> one learner, against raw pyzmq PUSH/PULL
moving the same bytes (same frames, same message sizes, same number of actor processes) in the
same run.

    PYTHONPATH=$PWD python benchmarks/bench_network.py [--seconds 3] [--mode both]

For each state layout (float32[4] and uint8[84,84,4]) it reports transitions per second and the
ratio memoire / raw pyzmq:

- central mode (what a Dopamine agent uses): actors stream episodes of `--episode` entries with
  ``ReplayMemoryClient(mode="central").add_entries`` in chunks of `--chunk` rows; the server
  stores them in its memory and the learner (the main process) calls ``server.sample(batch)``
  under a rate limit of `--spi` sampled rows per stored row (1: every stored transition is
  delivered once on average; 0: no sampling, ingest only). A transition counts once it is
  stored and sampled (``min(stored, sampled / spi)``). The learner's batch (`--batch`) defaults
  to the chunk's rows, so at spi=1 it samples once per chunk stored: raw pyzmq hands its learner
  one chunk's rows per message, and the ratio measures ingest, not the Python call rate of
  small-batch sampling (a batch of 32 costs a Python call per 32 rows, 8 per 256-row chunk).
  Raw pyzmq: each actor resends exactly the frames of one CHUNK message (the header frame built
  by memoire.codec.encode from the same rows, then s, a, r, p, v, i, init_w, uuid, episode,
  index, multiplier) with copy=False; the learner receives and counts rows. Where a chunk's
  frames are large (uint8[84,84,4]: 7 MB), memoire's actors also send one empty closing chunk
  per episode (close_episode), which raw does not.
- cache mode (the seed's design): actors fill local memories and push_cache() in a loop; the
  learner calls ``server.get_batch(cache_size, out=...)`` (every row used once). Raw pyzmq:
  exactly the frames of one of memoire's cache messages (header, prev and next stacks of
  every field, weight, prob, done, id, normaliser), sent again and again.

Raw pyzmq does nothing with what it receives, so the ratio is the whole cost of memoire's
codec, checks, storage (central) or cache ring (cache) and batch assembly.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np
import zmq

CTX = mp.get_context("spawn")
N_ACTORS = 2


def templates(state_shape, state_dtype):
    return (np.zeros(state_shape, state_dtype), np.zeros([], np.int64), np.zeros([], np.float32),
            np.zeros([], np.float32), np.zeros([], np.float32), np.zeros([], np.float32),
            np.zeros([0], np.uint8))


def episode_rows(state_shape, state_dtype, steps, seed=0):
    """s, a, r, p, v, i, init_w of one episode of `steps` entries."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 255, (steps,) + tuple(state_shape)).astype(state_dtype)
    return (s, np.zeros(steps, np.int64), np.ones(steps, np.float32),
            np.full(steps, 0.5, np.float32), np.zeros(steps, np.float32),
            np.zeros((steps, 0), np.uint8), np.ones(steps, np.float32))


def _fill(rem, state_shape, state_dtype, steps=2000):
    rem.new_episode()
    rem.add_entries(*episode_rows(state_shape, state_dtype, steps))
    rem.close_episode()


def _raw_push(endpoint, frames, stop, ready):
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


# ---------------------------------------------------------------------------- actors

def cache_actor(ep, state_shape, state_dtype, cache_size, stop, ready):
    from memoire import ReplayMemoryClient

    with ReplayMemoryClient(None, ep["rep"], ep["pull"], timeout=10) as c:
        c.rem.cache_size = cache_size
        _fill(c.rem, state_shape, state_dtype)
        ready.set()
        while not stop.is_set():
            c.push_cache()


def raw_cache_actor(endpoint, state_shape, state_dtype, cache_size, stop, ready):
    from memoire import ReplayMemory

    from memoire.client import cache_message

    rem = ReplayMemory(*templates(state_shape, state_dtype), 4000)
    rem.cache_size = cache_size
    _fill(rem, state_shape, state_dtype)
    frames = cache_message(rem, 1)  # exactly the frames of one of memoire's caches
    _raw_push(endpoint, frames, stop, ready)


def central_actor(ep, state_shape, state_dtype, episode, chunk, stop, ready):
    from memoire import ReplayMemoryClient

    rows = episode_rows(state_shape, state_dtype, episode)
    with ReplayMemoryClient(None, ep["rep"], ep["pull"], mode="central", chunk_size=chunk,
                            timeout=10) as c:
        ready.set()
        while not stop.is_set():
            c.new_episode()
            try:
                c.add_entries(*rows)
                c.close_episode()
            except TimeoutError:
                pass


def raw_central_actor(endpoint, state_shape, state_dtype, chunk, stop, ready):
    from memoire import codec

    rows = episode_rows(state_shape, state_dtype, chunk)
    values = dict(zip(("s", "a", "r", "p", "v", "i", "init_w"), rows))
    values.update({"uuid": np.array(7, np.uint64), "episode": np.array(1, np.int64),
                   "index": np.array(0, np.int64), "multiplier": np.array(1.0, np.float32)})
    frames = codec.encode(codec.Msg.CHUNK, values)  # exactly the frames of a memoire chunk
    _raw_push(endpoint, frames, stop, ready)


def _start(target, args_for):
    stop, readies = CTX.Event(), [CTX.Event() for _ in range(N_ACTORS)]
    procs = [CTX.Process(target=target, args=args_for(stop, r)) for r in readies]
    for p in procs:
        p.start()
    for r in readies:
        if not r.wait(60):
            raise RuntimeError("an actor did not start")
    return stop, procs


def _stop(stop, procs):
    stop.set()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()


# ---------------------------------------------------------------------------- runs

def run_cache(state_shape, state_dtype, args):
    from memoire import ReplayMemoryServer

    cs = args.cache_size
    with ReplayMemoryServer(*templates(state_shape, state_dtype), 4000, None, n_caches=64) as srv:
        srv.rem.cache_size = cs
        ep = srv.start()
        stop, procs = _start(cache_actor, lambda s, r: (ep, state_shape, state_dtype, cs, s, r))
        out = None
        try:
            def window(seconds):
                nonlocal out
                rows, t0 = 0, time.monotonic()
                while time.monotonic() - t0 < seconds:
                    try:
                        out = srv.get_batch(cs, timeout=0.1, out=out)
                        rows += len(out)
                    except RuntimeError:
                        pass
                return rows / (time.monotonic() - t0)
            window(0.5)  # warm up
            return window(args.seconds)
        finally:
            _stop(stop, procs)


def run_central(state_shape, state_dtype, args):
    from memoire import ReplayMemoryServer

    batch = args.batch or args.chunk
    with ReplayMemoryServer(*templates(state_shape, state_dtype), args.capacity, None) as srv:
        ep = srv.start()
        stop, procs = _start(central_actor, lambda s, r: (ep, state_shape, state_dtype,
                                                          args.episode, args.chunk, s, r))
        try:
            def window(seconds):
                t0 = time.monotonic()
                base = srv.rows_in
                sampled = 0
                while time.monotonic() - t0 < seconds:
                    stored = srv.rows_in - base
                    if args.spi > 0 and stored * args.spi >= sampled + batch:
                        srv.sample(batch)
                        sampled += batch
                    else:
                        srv.wait_rows_in(srv.rows_in + 1, 0.01)
                dt = time.monotonic() - t0
                stored = srv.rows_in - base
                return (stored if args.spi == 0 else min(stored, sampled / args.spi)) / dt
            window(1.0)  # warm up
            return window(args.seconds)
        finally:
            _stop(stop, procs)


def run_raw(actor, actor_args, rows_per_message, seconds):
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.rcvhwm = 64
    pull.linger = 0
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    stop, procs = _start(actor, lambda s, r: (endpoint,) + tuple(actor_args) + (s, r))
    try:
        def window(seconds):
            rows, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < seconds:
                if pull.poll(100):
                    pull.recv_multipart(copy=False)
                    rows += rows_per_message
            return rows / (time.monotonic() - t0)
        window(0.5)
        return window(seconds)
    finally:
        _stop(stop, procs)
        pull.close()
        ctx.term()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--mode", choices=("central", "cache", "both"), default="both")
    ap.add_argument("--cache_size", type=int, default=128, help="rows per cache (cache mode)")
    ap.add_argument("--chunk", type=int, default=256, help="rows per episode chunk (central)")
    ap.add_argument("--episode", type=int, default=1024, help="entries per episode (central)")
    ap.add_argument("--capacity", type=int, default=20000, help="server memory (central)")
    ap.add_argument("--batch", type=int, default=0,
                    help="learner batch (central; 0: the chunk's rows, see the docstring)")
    ap.add_argument("--spi", type=float, default=1.0,
                    help="sampled rows per stored row (central; 0: ingest only)")
    ap.add_argument("--states", default="both", choices=("float", "atari", "both"))
    args = ap.parse_args(argv)
    states = []
    if args.states in ("float", "both"):
        states.append(((4,), np.float32))
    if args.states in ("atari", "both"):
        states.append(((84, 84, 4), np.uint8))
    modes = ("central", "cache") if args.mode == "both" else (args.mode,)
    print(f"{'mode':<8} {'state':<16} {'memoire tr/s':>13} {'raw pyzmq tr/s':>15} {'ratio':>6}")
    for mode in modes:
        for shape, dtype in states:
            if mode == "central":
                m = run_central(shape, dtype, args)
                r = run_raw(raw_central_actor, (shape, dtype, args.chunk), args.chunk, args.seconds)
            else:
                m = run_cache(shape, dtype, args)
                r = run_raw(raw_cache_actor, (shape, dtype, args.cache_size), args.cache_size,
                            args.seconds)
            name = f"{np.dtype(dtype).name}{list(shape)}"
            print(f"{mode:<8} {name:<16} {m:13.0f} {r:15.0f} {m / r:6.2f}", flush=True)


if __name__ == "__main__":
    main()
