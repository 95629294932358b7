"""Multi-process tests on 127.0.0.1 with OS-chosen ports: actors in spawned processes feed one
server; counts are exact; a killed actor harms nobody; a client outlives a server restart."""

import multiprocessing as mp
import os
import queue
import signal
import time

import numpy as np
import pytest
from _waiting import wait_until

from memoire import ReplayMemoryClient, ReplayMemoryServer

TEMPLATES = (
    np.zeros([4], np.float32),
    np.zeros([], np.int64),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([0], np.uint8),
)
CTX = mp.get_context("spawn")


def _episode_rows(k, length):
    s = np.tile(np.arange(length, dtype=np.float32)[:, None], (1, 4)) + 1000 * k
    return (
        s,
        np.arange(length),
        np.ones(length, np.float32),
        np.full(length, 0.5, np.float32),
        np.zeros(length, np.float32),
        np.zeros((length, 0), np.uint8),
        np.ones(length, np.float32),
    )


def cache_actor(ep, actor, episodes, length, out):
    with ReplayMemoryClient(
        ep["pub"], ep["rep"], ep["pull"], input_uuid=actor + 1, timeout=5, seed=actor
    ) as c:
        for k in range(episodes):
            c.rem.new_episode()
            s, a, r, p, v, i, w = _episode_rows(k, length + k % 3)
            c.rem.add_entries(s, a, r, p, v, i, w)
            c.rem.close_episode()
            c.update_counter()
            assert c.push_cache() == 0
        out.put(("done", actor))


def central_actor(ep, actor, episodes, length, out, hang=False):
    with ReplayMemoryClient(
        ep["pub"],
        ep["rep"],
        ep["pull"],
        input_uuid=actor + 1,
        timeout=5,
        mode="central",
        chunk_size=7,
    ) as c:
        for k in range(episodes):
            c.new_episode()
            c.add_entries(*_episode_rows(k, length))
            if hang:  # mid-episode: chunks sent, never closed
                out.put(("hanging", actor))
                time.sleep(60)
            c.close_episode()
            c.update_counter()
        out.put(("done", actor))


def _reports(out, n, timeout=120, procs=()):
    """n reports from the actors, waiting at most `timeout` seconds in all (spawning and
    importing on a loaded 2-core machine can take long; the bound only catches a hang)."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        try:
            got.append(out.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            states = [(p.pid, p.exitcode) for p in procs]
            raise AssertionError(
                f"{len(got)} of {n} actor reports within {timeout} s; "
                f"got {got}; actors (pid, exitcode): {states}"
            ) from None
    return got


def _join(procs):
    for p in procs:
        p.join(30)
        assert p.exitcode == 0, p.exitcode


def test_cache_mode_actors_feed_a_learner_with_exact_counts():
    n_actors, episodes, length = 3, 8, 10
    with ReplayMemoryServer(*TEMPLATES, 1000, "tcp://127.0.0.1:*", n_caches=64, seed=0) as srv:
        srv.rem.cache_size = 16
        ep = srv.start()
        out = CTX.Queue()
        procs = [
            CTX.Process(target=cache_actor, args=(ep, a, episodes, length, out))
            for a in range(n_actors)
        ]
        for p in procs:
            p.start()
        batches = 0
        # The learner samples while the actors push.
        deadline = time.monotonic() + 60
        while batches < n_actors * episodes and time.monotonic() < deadline:
            try:
                b = srv.get_batch(16, timeout=0.5)
            except RuntimeError:
                continue
            batches += 1
            assert b.prev[0].shape == (16, 1, 4) and np.isfinite(b.importance_weights(0.4)).all()
            assert set(np.unique(b.uuid)) <= {1, 2, 3}
        assert sorted(_reports(out, n_actors)) == [("done", a) for a in range(n_actors)]
        _join(procs)
        steps = n_actors * sum(length + k % 3 for k in range(episodes))
        assert srv.total_episodes == n_actors * episodes
        assert srv.total_steps == steps
        assert srv.total_caches == n_actors * episodes
        assert batches == n_actors * episodes  # every cache row used exactly once


@pytest.mark.slow
def test_central_mode_kill_9_mid_episode_leaves_others_intact():
    episodes, length = 5, 20
    with ReplayMemoryServer(*TEMPLATES, 5000, "tcp://127.0.0.1:*", n_caches=4, seed=0) as srv:
        ep = srv.start()
        # The victim reports on a queue of its own: a process killed while its queue's feeder
        # thread holds the queue's shared write lock would block every other writer for good.
        victim_out, out = CTX.Queue(), CTX.Queue()
        victim = CTX.Process(target=central_actor, args=(ep, 9, 1, length, victim_out, True))
        victim.start()
        assert _reports(victim_out, 1) == [("hanging", 9)]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        procs = [
            CTX.Process(target=central_actor, args=(ep, a, episodes, length, out)) for a in range(2)
        ]
        for p in procs:
            p.start()
        assert sorted(_reports(out, 2, procs=procs)) == [("done", 0), ("done", 1)]
        _join(procs)
        wait_until(
            lambda: srv.stats().get("episodes_in", 0) >= 2 * episodes,
            "the server to store both actors' episodes",
        )
        stats = srv.stats()
        assert stats["episodes_in"] == 2 * episodes and stats["steps_in"] == 2 * episodes * length
        assert srv.rem.num_episode() == 2 * episodes and srv.rem.size == 2 * episodes * length
        assert srv.total_episodes == 2 * episodes and srv.total_steps == 2 * episodes * length
        # The learner samples and updates priorities; the dead actor's rows are nowhere.
        b = srv.sample(64)
        assert (b.prev[0][:, 0, 0] < 1000 * episodes).all() and srv.update_priorities(
            b.id, np.full(64, 2.0)
        ) > 0
        # The victim's unfinished episode is staged apart (or lost in its socket when killed).
        assert stats["open_streams"] <= 1


def restarting_client(ep, out, restarted):
    with ReplayMemoryClient(
        None, ep["rep"], ep["pull"], input_uuid=77, timeout=5, retries=6, mode="central"
    ) as c:
        for k in range(6):
            c.new_episode()
            c.add_entries(*_episode_rows(k, 5))
            c.close_episode()
            totals = c.update_counter()
            out.put(("counter", k, totals["total_episodes"]))
            if k == 2:  # the parent restarts the server meanwhile
                assert restarted.wait(120), "the server was not restarted"
        out.put(("done", 77))


def test_client_survives_server_restart():
    srv = ReplayMemoryServer(*TEMPLATES, 1000, "tcp://127.0.0.1:*", n_caches=4)
    ep = srv.start()
    out = CTX.Queue()
    restarted = CTX.Event()
    proc = CTX.Process(target=restarting_client, args=(ep, out, restarted))
    proc.start()
    try:
        got = _reports(out, 3)
        assert [g[2] for g in got] == [1, 2, 3]
        srv.close()  # the server goes away (its context ended: its ports are free again)...
        # ...and comes back on the same ports.
        srv = ReplayMemoryServer(*TEMPLATES, 1000, ep["pub"], n_caches=4)
        ep2 = srv.start(ep["rep"], ep["pull"])
        assert ep2 == ep
        restarted.set()
        got = _reports(out, 4)
        assert got[-1] == ("done", 77)
        # The restarted server learns the client's cumulative count at once.
        assert [g[2] for g in got[:3]] == [4, 5, 6]
        _join([proc])
        # The episodes sent after the restart.
        wait_until(lambda: srv.rem.num_episode() >= 3, "the restarted server to store 3 episodes")
        assert srv.rem.num_episode() == 3
    finally:
        srv.close()
        if proc.is_alive():
            proc.kill()
