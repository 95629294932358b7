"""Dead peers noticed in seconds: ZeroMQ heartbeats on memoire's sockets, and a server that
drops the open episode of an actor whose connection closed (killed, or frozen past the
heartbeat timeout) while a live actor's episode goes on. Bounded waits; assertions on counts,
never on time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
import zmq
from _subprocess_env import subprocess_env

from memoire import ReplayMemoryServer
from memoire.experience import ChunkStream
from memoire.transport import DEFAULT_HEARTBEAT, ConnectionWatch, Heartbeat, open_socket

TEMPLATES = (
    np.zeros([4], np.float32),
    np.zeros([], np.int64),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([0], np.uint8),
)
FAST = Heartbeat(interval=0.2, timeout=1.0, ttl=2.0)

# An actor that opens an episode (two chunks, no last one), says so, then hangs: killed or
# frozen, it never closes its socket.
ACTOR = r"""
import sys, time, numpy as np, zmq
from memoire.experience import ChunkStream
from memoire.transport import open_socket
spec = eval(sys.argv[2], {"dtype": np.dtype})
ctx = zmq.Context()
sock = open_socket(ctx, zmq.PUSH, sys.argv[1], "Conn")
stream = ChunkStream(spec, lambda f: sock.send_multipart(f) or True, chunk_rows=2)
row = {"s": np.ones(4, np.float32), "a": 1, "r": 0.5, "p": 0.5, "v": 0.0,
       "i": np.zeros(0, np.uint8), "init_w": 1.0}
for _ in range(4):
    stream.add(row)
print("open", flush=True)
time.sleep(600)
"""


def _until(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def _spec_text(srv) -> str:
    return repr(
        [(n, f"dtype('{np.dtype(d).str}')", tuple(s)) for n, d, s in srv._central.ingest.row_spec]
    ).replace('"', "")


class _LiveActor:
    """An actor in a thread that keeps one long episode open, a chunk every 20 ms."""

    def __init__(self, srv, endpoint):
        self._ctx = zmq.Context()
        self._sock = open_socket(self._ctx, zmq.PUSH, endpoint, "Conn")
        self._stream = ChunkStream(
            srv._central.ingest.row_spec,
            lambda f: self._sock.send_multipart(f) or True,
            chunk_rows=1,
        )
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        row = {
            "s": np.ones(4, np.float32),
            "a": 1,
            "r": 0.5,
            "p": 0.5,
            "v": 0.0,
            "i": np.zeros(0, np.uint8),
            "init_w": 1.0,
        }
        while not self.stop.is_set():
            self._stream.add(row)
            time.sleep(0.02)
        self._stream.end_episode(terminal=True)

    def finish(self):
        self.stop.set()
        self._thread.join(30)
        self._sock.close(linger=5000)
        self._ctx.term()


def _start_actor(srv, endpoint):
    proc = subprocess.Popen(
        [sys.executable, "-c", ACTOR, endpoint, _spec_text(srv)],
        stdout=subprocess.PIPE,
        env=subprocess_env(),
        cwd=tempfile.gettempdir(),  # not the checkout, whose memoire/ has no extension
    )
    assert proc.stdout.readline().strip() == b"open"
    return proc


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_dead_actor_is_noticed_and_its_open_episode_dropped(how):
    """SIGKILL: the kernel closes the connection at once. SIGSTOP: the connection stays up,
    and only the heartbeat (the frozen actor answers no PING) closes it."""
    with ReplayMemoryServer(*TEMPLATES, 10000, None, heartbeat=FAST) as srv:
        ep = srv.start()
        live = _LiveActor(srv, ep["pull"])
        proc = _start_actor(srv, ep["pull"])
        try:
            assert _until(lambda: srv.stats()["open_streams"] == 2)
            os.kill(proc.pid, getattr(signal, how))
            assert _until(lambda: srv.stats()["rejected"].get("peer_lost", 0) == 1)
            s = srv.stats()
            assert s["peer_disconnects"] == 1 and s["peer_connects"] == 2
            assert s["open_streams"] == 1  # the live actor's episode is still open
            live.finish()
            assert _until(lambda: srv.stats().get("episodes_in", 0) == 1)
            assert set(srv.stats()["rejected"]) == {"peer_lost"}
        finally:
            live.stop.set()
            proc.kill()
            proc.wait(30)


def test_without_heartbeats_a_frozen_actor_keeps_its_connection():
    """The control of the SIGSTOP case: with heartbeats off, nothing notices a frozen peer
    (only stream_timeout would, after 600 s)."""
    with ReplayMemoryServer(*TEMPLATES, 10000, None, heartbeat=None) as srv:
        ep = srv.start()
        proc = _start_actor(srv, ep["pull"])
        try:
            assert _until(lambda: srv.stats()["open_streams"] == 1)
            os.kill(proc.pid, signal.SIGSTOP)
            # As long as the heartbeat case waits at most (interval + timeout + grace), twice.
            assert not _until(
                lambda: srv.stats().get("peer_disconnects", 0) > 0,
                timeout=2 * (FAST.interval + 2 * FAST.timeout),
            )
            assert srv.stats()["open_streams"] == 1
        finally:
            proc.kill()
            proc.wait(30)


def test_every_socket_gets_the_default_heartbeat():
    ctx = zmq.Context()
    try:
        for kind in (zmq.PUSH, zmq.PULL, zmq.REQ, zmq.PUB):
            sock = open_socket(ctx, kind, "tcp://127.0.0.1:*", "Bind")
            assert sock.getsockopt(zmq.HEARTBEAT_IVL) == int(DEFAULT_HEARTBEAT.interval * 1000)
            assert sock.getsockopt(zmq.HEARTBEAT_TIMEOUT) == int(DEFAULT_HEARTBEAT.timeout * 1000)
            assert sock.getsockopt(zmq.HEARTBEAT_TTL) == int(DEFAULT_HEARTBEAT.ttl * 1000)
            sock.close(0)
        off = open_socket(ctx, zmq.PUSH, "tcp://127.0.0.1:*", "Bind", heartbeat=None)
        assert off.getsockopt(zmq.HEARTBEAT_IVL) == 0
        off.close(0)
    finally:
        ctx.term()


@pytest.mark.parametrize(
    "kwargs", [dict(interval=0), dict(timeout=-1.0), dict(ttl=10000.0), dict(interval="1")]
)
def test_bad_heartbeat_settings_raise(kwargs):
    with pytest.raises(ValueError, match="heartbeat"):
        Heartbeat(**kwargs)


def test_connection_watch_counts_opens_and_closes():
    ctx = zmq.Context()
    pull = open_socket(ctx, zmq.PULL, "tcp://127.0.0.1:*", "Bind")
    watch = ConnectionWatch(pull)
    try:
        pushes = [
            open_socket(ctx, zmq.PUSH, pull.getsockopt(zmq.LAST_ENDPOINT).decode(), "Conn")
            for _ in range(3)
        ]
        for p in pushes:
            p.send(b"x")
        assert _until(lambda: (watch.poll(), watch.open)[1] == 3)
        pushes[0].close(0)
        assert _until(lambda: (watch.poll(), watch.closed)[1] == 1)
        assert watch.open == 2 and watch.opened == 3 and watch.last_closed is not None
        for p in pushes[1:]:
            p.close(0)
    finally:
        watch.close()
        pull.close(0)
        ctx.term()


def test_a_learner_notices_when_all_its_actors_are_gone():
    """The distributed learner's check for actors started by endpoint: a killed actor's
    connection closes, and once none is left for the grace period the learner says so."""
    from memoire.experiments import distributed as dist

    sockets = dist.LearnerSockets(dist.DistributedConfig(transport="zmq"))
    procs = []
    try:
        assert not sockets.actors_gone(grace=0.0)  # none has connected yet: still waiting
        script = (
            "import sys, time, zmq; c = zmq.Context(); s = c.socket(zmq.PUSH); "
            "s.connect(sys.argv[1]); s.send(b'x'); print('up', flush=True); "
            "time.sleep(600)"
        )
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", script, sockets.endpoints["experience"]],
                    stdout=subprocess.PIPE,
                    env=subprocess_env(),
                    cwd=tempfile.gettempdir(),
                )
            )
            assert procs[-1].stdout.readline().strip() == b"up"
        assert _until(lambda: (sockets.actors_gone(0.0), sockets._watch.open)[1] == 2)
        os.kill(procs[0].pid, signal.SIGKILL)
        assert _until(lambda: (sockets.actors_gone(0.0), sockets._watch.closed)[1] == 1)
        assert not sockets.actors_gone(grace=0.0)  # one is left
        os.kill(procs[1].pid, signal.SIGKILL)
        assert _until(lambda: sockets.actors_gone(grace=0.2))
    finally:
        for p in procs:
            p.kill()
            p.wait(30)
        sockets.close()
