"""Chaos: actors killed (SIGKILL) and frozen (SIGSTOP, then SIGCONT) many times, also while
the rate limiter holds inserts back, against a central-mode server. The server survives, stores
nothing but whole episodes, and drops (peer_lost) exactly the open episodes of the actors
killed whose last chunk never came: no live or briefly frozen actor's. Restarted actors rejoin.
Counts, never times (every wait is bounded)."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
from _subprocess_env import subprocess_env
from _waiting import wait_until

from memoire import ReplayMemoryServer
from memoire.rate_limiter import SampleToInsertRatio

STEPS = 40  # every episode's length
CHUNK = 4
PEER_TIMEOUT = 1.0
TEMPLATES = (
    np.zeros([4], np.float32),
    np.zeros([], np.int64),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([0], np.uint8),
)

# A central-mode actor: episodes of STEPS steps, a step every 5 ms, until killed.
ACTOR = r"""
import sys, time, numpy as np
from memoire import ReplayMemoryClient
pull, rep, uuid, steps, chunk = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
c = ReplayMemoryClient(None, rep, pull, uuid, mode="central", chunk_size=chunk, timeout=600,
                       keepalive=0.1)
print("up", flush=True)
while True:
    c.new_episode()
    for t in range(steps):
        c.add_entry(np.full(4, t, np.float32), t % 3, 1.0, 0.5, 0.0)
        time.sleep(0.005)
    c.close_episode()
"""


class _Actor:
    def __init__(self, ep, uuid):
        self.uuid = uuid
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ACTOR, ep["pull"], ep["rep"], str(uuid), str(STEPS), str(CHUNK)],
            stdout=subprocess.PIPE,
            env=subprocess_env(),
            cwd=tempfile.gettempdir(),
        )
        assert self.proc.stdout.readline().strip() == b"up"


def _dropped_episode(message):
    """(actor uuid, episode) of a server's "dropped episode E from UUID: ..." warning."""
    episode, rest = message.split("dropped episode ")[1].split(" from ", 1)
    return int(rest.split(":")[0], 16), int(episode)


def _lost_lines(records):
    """The messages of the server's peer_lost warnings among log records."""
    messages = (r.getMessage() for r in records)
    return [m for m in messages if "peer_lost" in m and "not heard from" in m]


def test_central_server_survives_actors_killed_and_frozen_under_a_limiter(caplog):
    caplog.set_level(logging.WARNING, logger="memoire.server")
    rng = random.Random(24)
    limiter = SampleToInsertRatio(1.0, STEPS, (-200.0, 400.0))
    held = threading.Event()  # set: nobody samples, the limiter holds inserts back
    with ReplayMemoryServer(
        *TEMPLATES, 100_000, None, rate_limiter=limiter, peer_timeout=PEER_TIMEOUT
    ) as srv:
        ep = srv.start()
        stop = threading.Event()

        def sampler():
            while not stop.is_set():
                if held.is_set():
                    time.sleep(0.01)
                    continue
                try:
                    srv.sample(16, timeout=0.05)
                except TimeoutError:
                    pass

        threading.Thread(target=sampler, daemon=True).start()
        incarnation = [0]

        def start(k):
            incarnation[0] += 1
            return _Actor(ep, ((k + 1) << 32) | incarnation[0])

        actors = [start(k) for k in range(3)]
        killed = {}  # uuid -> the episode open at the server when it was killed
        try:
            for event in range(20):
                k = rng.randrange(3)
                a = actors[k]
                held.set() if event % 5 in (2, 3) else held.clear()  # some events under a hold
                # Killed mid-episode once the server has its episode open (under a hold, a
                # new incarnation may not have one yet: then it is frozen instead).
                if rng.random() < 0.5 and wait_until(
                    lambda: a.uuid in {u for u, _, _ in srv.open_episodes()},
                    "a.uuid in {u for u, _, _ in srv.open_episodes()}",
                    timeout=3.0,
                    fail=False,
                ):
                    open_ep = {u: e for u, e, _ in srv.open_episodes()}.get(a.uuid)
                    a.proc.kill()
                    a.proc.wait(30)
                    if open_ep is not None:
                        killed[a.uuid] = open_ep
                    actors[k] = start(k)  # a restarted actor rejoins
                else:
                    os.kill(a.proc.pid, signal.SIGSTOP)
                    time.sleep(0.2 * PEER_TIMEOUT)
                    os.kill(a.proc.pid, signal.SIGCONT)
                time.sleep(0.1)
            held.clear()
            # Every killed actor's episode is settled: stored (its last chunk was on its way)
            # or dropped; the live ones go on storing.
            stored_before = srv.stats().get("episodes_in", 0)
            assert wait_until(
                lambda: srv.stats().get("episodes_in", 0) > stored_before + 6,
                "srv.stats().get('episodes_in', 0) > stored_before + 6",
                timeout=60,
            )
            assert wait_until(
                lambda: not set(killed) & {u for u, _, _ in srv.open_episodes()},
                "not set(killed) & {u for u, _, _ in srv.open_episodes()}",
            )
            # The ingest counts a drop when it closes the episode; its warning is logged just
            # after, by the server's thread: wait for every counted drop's line.
            assert wait_until(
                lambda: (
                    len(_lost_lines(caplog.records)) == srv.stats()["rejected"].get("peer_lost", 0)
                ),
                "len(_lost_lines(caplog.records)) == srv.stats()['rejected'].get('peer_lost', 0)",
            )
            stop.set()
            s = srv.stats()
            records = list(caplog.records)
            committed, lost_records = srv.take_stored_episodes()
        finally:
            stop.set()
            for a in actors:
                a.proc.kill()
                a.proc.wait(30)
        assert lost_records == 0
        stored = {(u, e) for u, e, _, _ in committed}
        assert all(rows == STEPS for _, _, rows, _ in committed)  # whole episodes only
        assert s["memory_size"] == STEPS * s["memory_episodes"] == STEPS * len(committed)
        # The drops, as (actor, episode): only killed actors', each its last episode, never one
        # stored; and every killed actor's episode open at its death was stored (its last chunk
        # was on its way) or dropped. An actor may close the episode read as open just before
        # the kill lands and open the next (this test once failed that way, once in 18 runs,
        # when it compared actors only): then that next one is the one dropped.
        dropped = {_dropped_episode(m) for m in _lost_lines(records)}
        live_then = {a.uuid for a in actors}
        assert {u for u, _ in dropped} <= set(killed), (dropped, killed)
        assert not {u for u, _ in dropped} & live_then
        assert not dropped & stored
        for u in {u for u, _ in dropped}:
            last = max(e for v, e in dropped | stored if v == u)
            assert [e for v, e in dropped if v == u] == [last], (u, dropped, stored)
        for u, e in killed.items():
            assert (u, e) in stored or any(v == u and d >= e for v, d in dropped), (u, e)
        assert s["rejected"].get("peer_lost", 0) == len(dropped)
        assert set(s["rejected"]) <= {"peer_lost"}, s["rejected"]
        assert len(killed) >= 5


ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.dopamine
@pytest.mark.slow
def test_distributed_learner_survives_actors_killed_and_frozen(tmp_path):
    """A CartPole learner under a rate limiter, its actors started by endpoint; actors are
    SIGKILLed (and restarted: they rejoin) and SIGSTOPped/SIGCONTed many times, some while the
    learner holds inserts back. The learner finishes with exit 0, stores only whole episodes,
    and drops only killed actors' open episodes."""
    import re

    base = str(tmp_path)
    gin = os.path.join(ROOT, "configs", "dqn_cartpole_jax_distributed.gin")
    small = [
        "Runner.num_iterations = 1",
        "Runner.training_steps = 1500",
        "Runner.evaluation_steps = 20",
        "JaxDQNAgent.min_replay_history = 100",
        "ClassicControlDQNNetwork.hidden_units = 16",
        "DistributedConfig.publish_period = 50",
        "DistributedConfig.samples_per_insert = 8.0",
        "DistributedConfig.keepalive = 0.1",
        f"DistributedConfig.peer_timeout = {PEER_TIMEOUT}",
        "DistributedConfig.episodes_ahead = 1000",  # actors run on: mostly mid-episode
    ]
    cmd = [sys.executable, "-m", "memoire.cli", "train", "--base_dir", base]
    cmd += ["--gin_files", gin, "--gin_bindings", "DistributedConfig.spawn_actors = False"]
    for b in small:
        cmd += ["--gin_bindings", b]
    learner = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=base,
        env=subprocess_env(),
    )
    lines: list = []
    threading.Thread(
        target=lambda: lines.extend(iter(learner.stdout.readline, "")), daemon=True
    ).start()
    actors: dict = {}
    killed: set = set()
    rng = random.Random(7)
    try:
        assert wait_until(
            lambda: any("actors started by endpoint" in x for x in lines),
            "any('actors started by endpoint' in x for x in lines)",
            timeout=150,
        )
        m = re.search(
            r"experience (\S+), parameters (\S+)\)",
            next(x for x in lines if "actors started by endpoint" in x),
        )
        experience, params = m.group(1).rstrip(","), m.group(2)
        ids = iter(range(1, 1000))

        def start(slot):
            aid = next(ids)
            acmd = [sys.executable, "-m", "memoire.cli", "actor", "--gin_files", gin]
            acmd += ["--experience", experience, "--params", params, "--actor_id", str(aid)]
            acmd += ["--seed", str(aid), "--chunk_size", "4", "--keepalive", "0.1"]
            acmd += ["--episodes_ahead", "1000"]
            for b in small:
                acmd += ["--gin_bindings", b]
            actors[slot] = (
                aid,
                subprocess.Popen(
                    acmd,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd=base,
                    env=subprocess_env(),
                ),
            )

        for slot in range(3):
            start(slot)
        for _ in range(20):
            if learner.poll() is not None:
                break
            time.sleep(rng.uniform(0.3, 0.8))
            slot = rng.randrange(3)
            aid, proc = actors[slot]
            if rng.random() < 0.5:
                proc.kill()
                proc.wait(30)
                killed.add(aid)
                start(slot)
            else:
                os.kill(proc.pid, signal.SIGSTOP)
                time.sleep(0.2 * PEER_TIMEOUT)
                os.kill(proc.pid, signal.SIGCONT)
        assert learner.wait(timeout=300) == 0, "".join(lines[-40:])
    finally:
        for _, p in actors.values():
            if p.poll() is None:
                p.kill()
            p.wait(30)
        if learner.poll() is None:
            learner.kill()
            learner.wait(30)
    said = "".join(lines)
    # The learner's closing line: "experience: N episodes stored (rows = actor steps in each);
    # C chunks and K keepalives received, R rejected (peer_lost R)".
    closing = re.search(r"experience: (\d+) episodes stored \((.*?)\); .* (\d+) rejected(.*)", said)
    assert closing, said[-3000:]
    rejected = dict(re.findall(r"(\w+) (\d+)", closing.group(4).split(";")[0]))
    counters = {"rejected": {k: int(v) for k, v in rejected.items()}}
    assert sum(counters["rejected"].values()) == int(closing.group(3))
    dropped = {
        int(u, 16) & 0xFFFFFFFF
        for u in re.findall(r"dropped episode \d+ from ([0-9a-f]+): not heard from", said)
    }
    assert dropped <= killed, (dropped, killed)  # never a live or briefly frozen actor's
    assert counters["rejected"].get("peer_lost", 0) == len(dropped) <= len(killed)
    assert set(counters["rejected"]) <= {"peer_lost"}, counters["rejected"]
    assert len(killed) >= 5
    # Whole episodes only: every stored episode's rows match the steps its actor took (up to
    # the one offset the buffer's layout adds to every episode).
    assert closing.group(2).endswith(" in each"), closing.group(0)  # one offset for all
    assert int(closing.group(1)) > 20, closing.group(0)
