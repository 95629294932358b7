"""Distributed ingest: actor processes feeding one learner, memoire against raw pyzmq PUSH/PULL
moving exactly the same frames, in the same run.

- cache mode (the memoire API's design): memoire's actors fill local memories and ``push_cache()`` in a loop;
  the learner (this process) draws ``server.get_batch(cache_size)`` (every row used once).
  Raw pyzmq: each actor resends the frames of one of memoire's cache messages
  (:func:`memoire.client.cache_message`) and the learner receives them.
- central mode (Dopamine's path): memoire's actors stream episodes of `episode` entries with
  ``ReplayMemoryClient(mode="central").add_entries`` in chunks of `chunk` rows; the server
  stores them and the learner calls ``server.sample(batch)`` at `spi` sampled rows per stored
  row (0: ingest only). A transition counts once stored and sampled:
  ``min(stored, sampled / spi)``. The learner's batch defaults to the chunk's rows: raw pyzmq
  hands its learner one chunk's rows per message, so the ratio measures ingest, not the Python
  call rate of small batches. Raw pyzmq: each actor resends the frames of one CHUNK message.

Raw pyzmq's learner does nothing with what it receives, so the ratio is the whole cost of
memoire's sampling at the actor, codec, checks, storage or cache ring, and batch assembly.

Both sets of actors start once per configuration and wait on their own event; the timing
alternates between the systems (warm-up, timed window, drain), several repetitions, medians.
Only loopback addresses and OS-chosen ports; every actor loop ends when told, when its parent
dies, or after an hour.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import time
from typing import Callable, Dict, List, Sequence

import numpy as np
import zmq  # (ImportError here: the suite runs without the ingest rows)

from memoire import ReplayMemoryClient, ReplayMemoryServer
from memoire.bench.harness import Measurement

CTX = mp.get_context("spawn")
ACTOR_DEADLINE_S = 3600
FLOAT, ATARI = ((4,), np.float32), ((84, 84, 4), np.uint8)


@dataclasses.dataclass
class Setup:
    """One configuration: a mode, a state layout and the sizes that shape its messages."""

    mode: str = "cache"  # or "central"
    shape: tuple = (4,)
    dtype: type = np.float32
    actors: int = 2
    cache_size: int = 128  # rows per cache (cache)
    chunk: int = 256  # rows per chunk (central)
    episode: int = 1024  # entries per episode (central)
    capacity: int = 20000  # the server's memory (central)
    batch: int = 0  # the learner's batch (central; 0: the chunk's rows)
    spi: float = 1.0  # sampled rows per stored row (central; 0: ingest only)

    @property
    def rows_per_message(self) -> int:
        return self.cache_size if self.mode == "cache" else self.chunk

    @property
    def label(self) -> str:
        what = (
            f"cache{self.cache_size}"
            if self.mode == "cache"
            else f"central chunk{self.chunk} spi{self.spi:g}"
        )
        return (
            f"ingest {'x'.join(map(str, self.shape))} {np.dtype(self.dtype).name} "
            f"{self.actors} actor{'s' if self.actors > 1 else ''} {what}"
        )


def templates(shape, dtype) -> tuple:
    return (
        np.zeros(shape, dtype),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([0], np.uint8),
    )


def episode_rows(shape, dtype, steps: int, seed: int = 0) -> tuple:
    """s, a, r, p, v, i, init_w of one episode of `steps` entries."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 255, (steps,) + tuple(shape)).astype(dtype)
    return (
        s,
        np.zeros(steps, np.int64),
        np.ones(steps, np.float32),
        np.full(steps, 0.5, np.float32),
        np.zeros(steps, np.float32),
        np.zeros((steps, 0), np.uint8),
        np.ones(steps, np.float32),
    )


def _fill(rem, shape, dtype, steps: int = 2000) -> None:
    rem.new_episode()
    rem.add_entries(*episode_rows(shape, dtype, steps))
    rem.close_episode()


# ---------------------------------------------------------------------------- actors


def _actor_loop(step: Callable[[], None], go, stop, parent: int) -> None:
    deadline = time.monotonic() + ACTOR_DEADLINE_S
    while not stop.is_set() and time.monotonic() < deadline and os.getppid() == parent:
        if go.is_set():
            step()
        else:
            go.wait(0.05)


def _memoire_actor(ep: dict, setup: Setup, go, stop, ready, parent: int) -> None:
    if setup.mode == "cache":
        with ReplayMemoryClient(None, ep["rep"], ep["pull"], timeout=10) as c:
            c.rem.cache_size = setup.cache_size
            _fill(c.rem, setup.shape, setup.dtype)
            ready.set()
            _actor_loop(c.push_cache, go, stop, parent)
        return
    rows = episode_rows(setup.shape, setup.dtype, setup.episode)
    with ReplayMemoryClient(
        None, ep["rep"], ep["pull"], mode="central", chunk_size=setup.chunk, timeout=10
    ) as c:

        def episode():
            c.new_episode()
            try:
                c.add_entries(*rows)
                c.close_episode()
            except TimeoutError:
                pass

        ready.set()
        _actor_loop(episode, go, stop, parent)


def raw_frames(setup: Setup) -> list:
    """Exactly the frames of one of memoire's messages for `setup` (a cache or a chunk)."""
    from memoire import ReplayMemory, codec
    from memoire.client import cache_message

    if setup.mode == "cache":
        rem = ReplayMemory(*templates(setup.shape, setup.dtype), 4000)
        rem.cache_size = setup.cache_size
        _fill(rem, setup.shape, setup.dtype)
        return cache_message(rem, 1)
    values = dict(
        zip(
            ("s", "a", "r", "p", "v", "i", "init_w"),
            episode_rows(setup.shape, setup.dtype, setup.chunk),
        )
    )
    values.update(
        {
            "uuid": np.array(7, np.uint64),
            "episode": np.array(1, np.int64),
            "index": np.array(0, np.int64),
            "multiplier": np.array(1.0, np.float32),
        }
    )
    return codec.encode(codec.Msg.CHUNK, values)


def _raw_actor(endpoint: str, setup: Setup, go, stop, ready, parent: int) -> None:
    frames = raw_frames(setup)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.sndhwm = 64
    push.sndtimeo = 200
    push.linger = 0
    push.connect(endpoint)
    ready.set()

    def send():
        try:
            push.send_multipart(frames, copy=False)
        except zmq.Again:
            pass

    _actor_loop(send, go, stop, parent)
    push.close()
    ctx.term()


class _Actors:
    """`setup.actors` processes of `target`, started once, run while `go` is set."""

    def __init__(self, target, first_arg, setup: Setup):
        self.go, self.stop = CTX.Event(), CTX.Event()
        readies = [CTX.Event() for _ in range(setup.actors)]
        self.procs = [
            CTX.Process(
                target=target,
                daemon=True,
                args=(first_arg, setup, self.go, self.stop, r, os.getpid()),
            )
            for r in readies
        ]
        for p in self.procs:
            p.start()
        for r in readies:
            if not r.wait(120):
                self.close()
                raise RuntimeError("an actor process did not start within 120 s")

    def close(self) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


# ---------------------------------------------------------------------------- learners


def _memoire_learner(srv, setup: Setup) -> Callable[[], float]:
    """A function that receives for a while and returns the transitions it counts."""
    if setup.mode == "cache":
        out = [None]

        def receive():
            try:
                out[0] = srv.get_batch(setup.cache_size, timeout=0.1, out=out[0])
                return len(out[0])
            except RuntimeError:  # no cache within the timeout
                return 0

        return receive
    batch = setup.batch or setup.chunk
    state = {"stored": srv.rows_in, "sampled": 0.0}

    def receive():
        stored = srv.rows_in - state["stored"]
        if setup.spi > 0 and stored * setup.spi >= state["sampled"] + batch:
            srv.sample(batch)
            state["sampled"] += batch
        else:
            srv.wait_rows_in(srv.rows_in + 1, 0.01)
        # What counts is stored and sampled: report the growth of min(stored, sampled / spi).
        now = stored if setup.spi == 0 else min(stored, state["sampled"] / setup.spi)
        grown, state["counted"] = now - state.get("counted", 0.0), now
        return grown

    return receive


def _window(go, receive: Callable[[], float], seconds: float) -> float:
    """Seconds per transition received in a timed window (after a warm-up), then a drain."""
    go.set()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.3:
        receive()
    rows, t0 = 0.0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        rows += receive()
    elapsed = time.monotonic() - t0
    go.clear()
    t1 = time.monotonic()
    while time.monotonic() - t1 < 0.3:  # what is in flight
        receive()
    return elapsed / max(rows, 1.0)


def measure(setup: Setup, repeats: int = 3, seconds: float = 1.0) -> Dict[str, List[float]]:
    """Seconds per transition of memoire and of raw pyzmq for `setup`, one per repetition."""
    sec: Dict[str, List[float]] = {"memoire": [], "raw pyzmq PUSH/PULL": []}
    capacity = setup.capacity if setup.mode == "central" else 4000
    with ReplayMemoryServer(
        *templates(setup.shape, setup.dtype), capacity, None, n_caches=64
    ) as srv:
        srv.rem.cache_size = setup.cache_size
        ep = srv.start()
        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)
        pull.rcvhwm = 64
        pull.linger = 0
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        mem_actors = raw_actors = None
        try:
            mem_actors = _Actors(_memoire_actor, ep, setup)
            raw_actors = _Actors(_raw_actor, f"tcp://127.0.0.1:{port}", setup)

            def raw_receive():
                if pull.poll(100):
                    pull.recv_multipart(copy=False)
                    return setup.rows_per_message
                return 0

            for r in range(repeats):
                order = [
                    ("memoire", mem_actors.go, None),
                    ("raw pyzmq PUSH/PULL", raw_actors.go, raw_receive),
                ]
                for name, go, receive in order if r % 2 == 0 else order[::-1]:
                    receive = receive or _memoire_learner(srv, setup)
                    sec[name].append(_window(go, receive, seconds))
        finally:
            for actors in (mem_actors, raw_actors):
                if actors is not None:
                    actors.close()
            pull.close()
            ctx.term()
    return sec


def ingest_workload(
    actors: Sequence[int] = (1, 2, 4),
    *,
    repeats: int = 3,
    seconds: float = 1.0,
    modes: Sequence[str] = ("cache", "central"),
    states=(FLOAT, ATARI),
) -> List[Measurement]:
    """memoire vs raw pyzmq, seconds per transition at the learner, for each mode, state
    layout and actor count (the suite's rows). Central mode counts stored transitions (spi 0:
    ingest; a learner's own sampling is measured by ``benchmarks/bench_network.py --spi 1``)."""
    out: List[Measurement] = []
    for mode in modes:
        for shape, dtype in states:
            for n in actors:
                setup = Setup(
                    mode=mode,
                    shape=shape,
                    dtype=dtype,
                    actors=n,
                    spi=1.0 if mode == "cache" else 0.0,
                )
                for name, s in measure(setup, repeats, seconds).items():
                    out.append(Measurement(setup.label, name, s))
    return out
