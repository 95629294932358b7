"""Resident memory of memoire's stores at Dopamine's Atari size (uint8[84, 84] frames, stack 4,
1,000,000 transitions), empty and after adding some transitions: memory follows what is stored,
not the capacity.

Each case runs alone in a fresh process (``python -m memoire.bench.empty_rss CASE FILL``) and
prints one line ``RESULT {json}`` with bytes (VmRSS of /proc/self/status, Linux only):

- ``construct``: growth over building the store (from after imports and the fill's frames);
- ``fill``: growth over adding ``FILL`` transitions (``raw``: their frame bytes, FILL * 84 * 84).

Cases: ``memory`` (:class:`memoire.ReplayMemory`), ``dopamine`` and ``dopamine_prioritized``
(``OutOfGraphReplayBuffer`` / ``OutOfGraphPrioritizedReplayBuffer``), ``jax`` and
``jax_prioritized`` (the JAX ``ReplayBuffer`` with a uniform / prioritized distribution; its
store is built by the first add, which ``construct`` includes), ``server`` (a
:class:`memoire.ReplayMemoryServer` of 1,000,000 entries, started, with its cache ring laid
out; FILL entries streamed in by a central-mode actor in another process), and
``central_actor`` (a ``ReplayMemoryClient(mode="central")`` of such a server, which runs in
another process; FILL entries streamed). Used by tests/unit/memoire/test_memory_growth.py and
benchmarks/bench_empty_rss.py.
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import sys
import time

import numpy as np

from memoire.bench.memory import proc_status

CAPACITY = 1_000_000
OBS = (84, 84)
STACK = 4
EPISODE = 1000  # steps per episode
CHUNK = 500  # steps per add_batch / add_entries call

CASES = (
    "memory",
    "dopamine",
    "dopamine_prioritized",
    "jax",
    "jax_prioritized",
    "server",
    "central_actor",
)


def _rss() -> int:
    gc.collect()
    return proc_status("VmRSS")


def _frames(start: int, k: int, out: np.ndarray) -> np.ndarray:
    """k distinct frames (values 1..251) for steps start, ..., start + k - 1."""
    out[:k] = ((np.arange(k) + start) % 251 + 1).astype(np.uint8)[:, None, None]
    return out[:k]


def _templates():
    """A memoire memory's buffer templates for Atari: state, action, reward, prob, value,
    qvest, info."""
    return (
        np.zeros(OBS, np.uint8),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([0], np.uint8),
    )


def _stream(add, n: int, frames: np.ndarray, new_episode, close_episode) -> None:
    """Adds n steps in episodes of EPISODE through add(frames, k) calls of up to CHUNK steps."""
    done = 0
    while done < n:
        new_episode()
        length = min(EPISODE, n - done)
        for start in range(0, length, CHUNK):
            k = min(CHUNK, length - start)
            add(_frames(done + start, k, frames), k)
        close_episode()
        done += length


def _memory_rows(frames: np.ndarray, k: int) -> tuple:
    zeros = np.zeros(k, np.float32)
    return (frames, np.zeros(k, np.int64), zeros, zeros, zeros, np.zeros((k, 0), np.uint8))


def _case_memory(n: int, frames: np.ndarray) -> dict:
    from memoire import ReplayMemory

    base = _rss()
    m = ReplayMemory(*_templates(), CAPACITY)
    out = {"construct": _rss() - base}
    before = _rss()
    _stream(
        lambda f, k: m.add_entries(*_memory_rows(f, k), np.ones(k, np.float32)),
        n,
        frames,
        m.new_episode,
        m.close_episode,
    )
    out["fill"] = _rss() - before
    out["size"] = int(m.size)
    return out


def _case_dopamine(n: int, frames: np.ndarray, prioritized: bool) -> dict:
    from memoire.dopamine_compat import OutOfGraphPrioritizedReplayBuffer, OutOfGraphReplayBuffer

    cls = OutOfGraphPrioritizedReplayBuffer if prioritized else OutOfGraphReplayBuffer
    base = _rss()
    buf = cls(OBS, STACK, CAPACITY, 32, seed=0)
    out = {"construct": _rss() - base}
    before = _rss()
    for start in range(0, n, CHUNK):
        k = min(CHUNK, n - start)
        terminal = ((np.arange(k) + start) % EPISODE == EPISODE - 1).astype(np.uint8)
        buf.add_batch(
            _frames(start, k, frames),
            np.zeros(k, np.int32),
            np.ones(k, np.float32),
            terminal,
            priorities=np.ones(k) if prioritized else None,
        )
    out["fill"] = _rss() - before
    out["size"] = int(buf.add_count)
    return out


def _case_jax(n: int, frames: np.ndarray, prioritized: bool) -> dict:
    from memoire.dopamine_compat import jax_replay_buffer as jrb

    base = _rss()
    dist = (
        jrb.PrioritizedSamplingDistribution(0, max_capacity=CAPACITY)
        if prioritized
        else jrb.UniformSamplingDistribution(seed=0)
    )
    buf = jrb.ReplayBuffer(
        jrb.TransitionAccumulator(STACK, 1, 0.99), dist, batch_size=32, max_capacity=CAPACITY
    )
    # The store is laid out by the first add (Dopamine learns the shapes from it).
    first = jrb.TransitionElement(np.ones(OBS, np.uint8), 0, 0.0, False, False)
    buf.add(first, **({"priority": 1.0} if prioritized else {}))
    out = {"construct": _rss() - base}
    before = _rss()
    for start in range(0, n, CHUNK):
        k = min(CHUNK, n - start)
        terminal = (np.arange(k) + start) % EPISODE == EPISODE - 1
        buf.add_batch(
            _frames(start, k, frames),
            np.zeros(k, np.int32),
            np.ones(k),
            terminal,
            priorities=np.ones(k) if prioritized else None,
        )
    out["fill"] = _rss() - before
    out["size"] = int(buf.add_count)
    return out


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _actor_child(endpoints: dict, n: int, done, release) -> None:
    """A central-mode actor process: streams n steps to the server, sets `done`, and keeps
    its connection until `release` (closing drops what ZeroMQ has not sent yet)."""
    from memoire import ReplayMemoryClient

    frames = np.empty((CHUNK, *OBS), np.uint8)
    with ReplayMemoryClient(
        None, endpoints["rep"], endpoints["pull"], mode="central", timeout=30
    ) as c:
        _stream(
            lambda f, k: c.add_entries(*_memory_rows(f, k), np.ones(k, np.float32)),
            n,
            frames,
            c.new_episode,
            c.close_episode,
        )
        done.set()
        release.wait(600)


def _server_child(queue, stop, received) -> None:
    """A server process of CAPACITY Atari entries: sends its endpoints, then counts what it
    stored into `received` until `stop`."""
    from memoire import ReplayMemoryServer

    srv = ReplayMemoryServer(*_templates(), CAPACITY, None, seed=0)
    queue.put(srv.start())
    while not stop.wait(0.05):
        received.value = int(srv.rows_in)
    srv.close()


def _case_server(n: int, frames: np.ndarray) -> dict:
    from memoire import ReplayMemoryServer

    del frames  # the actor process makes its own
    base = _rss()
    srv = ReplayMemoryServer(*_templates(), CAPACITY, None, seed=0)
    endpoints = srv.start()
    try:
        srv.get_batch(1, timeout=0)  # lays out the cache ring (there are no caches yet)
    except RuntimeError:
        pass
    out = {"construct": _rss() - base}
    before = _rss()
    ctx = mp.get_context("spawn")
    done, release = ctx.Event(), ctx.Event()
    actor = ctx.Process(target=_actor_child, args=(endpoints, n, done, release))
    actor.start()
    ok = srv.wait_rows_in(n, 600)
    release.set()
    actor.join(60)
    out["fill"] = _rss() - before
    out["size"] = int(srv.rem.size)
    out["ok"] = bool(ok and done.is_set())
    srv.close()
    return out


def _case_central_actor(n: int, frames: np.ndarray) -> dict:
    from memoire import ReplayMemoryClient

    ctx = mp.get_context("spawn")
    queue, stop, received = ctx.Queue(), ctx.Event(), ctx.Value("q", 0)
    server = ctx.Process(target=_server_child, args=(queue, stop, received))
    server.start()
    try:
        endpoints = queue.get(timeout=120)
        base = _rss()
        c = ReplayMemoryClient(
            None, endpoints["rep"], endpoints["pull"], mode="central", timeout=30
        )
        out = {"construct": _rss() - base}
        before = _rss()
        _stream(
            lambda f, k: c.add_entries(*_memory_rows(f, k), np.ones(k, np.float32)),
            n,
            frames,
            c.new_episode,
            c.close_episode,
        )
        out["fill"] = _rss() - before
        out["ok"] = _wait(lambda: received.value >= n, 600)
        out["size"] = int(received.value)
        c.close()
    finally:
        stop.set()
        server.join(60)
    return out


def measure(case: str, n: int) -> dict:
    """Runs one case in this process (see the module docstring); bytes."""
    import memoire  # noqa: F401  (imports settle before the baseline)
    import memoire.dopamine_compat  # noqa: F401

    frames = np.empty((CHUNK, *OBS), np.uint8)
    frames[:] = 1  # touched: its pages are in the baseline
    run = {
        "memory": lambda: _case_memory(n, frames),
        "dopamine": lambda: _case_dopamine(n, frames, False),
        "dopamine_prioritized": lambda: _case_dopamine(n, frames, True),
        "jax": lambda: _case_jax(n, frames, False),
        "jax_prioritized": lambda: _case_jax(n, frames, True),
        "server": lambda: _case_server(n, frames),
        "central_actor": lambda: _case_central_actor(n, frames),
    }[case]
    out = {"case": case, "capacity": CAPACITY, "n": n, "raw": n * OBS[0] * OBS[1]}
    out.update(run())
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in CASES:
        sys.exit(f"usage: python -m memoire.bench.empty_rss {{{','.join(CASES)}}} FILL")
    print("RESULT " + json.dumps(measure(sys.argv[1], int(sys.argv[2]))), flush=True)
