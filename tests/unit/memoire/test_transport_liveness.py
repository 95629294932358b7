"""Liveness without ZeroMQ heartbeats.

The hazard: libzmq 4.3.5 (pyzmq 27's wheels) aborts the process when a socket with heartbeat
timers, whose input a full receive queue stopped, loses its peer (zeromq/libzmq#3937, #4767).
A raw pyzmq PULL configured as memoire configured its receivers before (small receive queue,
HEARTBEAT_IVL/TIMEOUT/TTL) dies of SIGABRT; memoire's sockets as configured now survive the
same sequence. Then memoire's own liveness: actors send keepalives on their data channel, and a
server drops exactly the open episode of an actor it has not heard from (killed or frozen),
never a live one's. Every repro runs in child processes; bounded waits; assertions on counts,
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
from _waiting import wait_until

from memoire import ReplayMemoryServer
from memoire.experience import ChunkStream
from memoire.transport import RECEIVE_HWM, ConnectionWatch, Heartbeat, open_socket

TEMPLATES = (
    np.zeros([4], np.float32),
    np.zeros([], np.int64),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([0], np.uint8),
)
PEER_TIMEOUT = 1.0  # seconds of listening
KEEPALIVE = 0.1

# A PUSH that floods its peer with 64 KiB messages until killed.
FLOOD = r"""
import sys, zmq
c = zmq.Context(); s = c.socket(zmq.PUSH); s.connect(sys.argv[1])
print("up", flush=True)
while True:
    s.send(b"x" * 65536)
"""

# The reader: a PULL configured the old way ("raw": memoire's former DEFAULT_HEARTBEAT, a small
# receive queue) or by memoire's open_socket now ("memoire"). It lets a flooding peer fill its
# queue (its input stops), has the peer killed with SIGKILL, waits past a few heartbeat
# intervals, then reads what is left. Prints how many it read.
READER = r"""
import subprocess, sys, time, zmq
how, flood = sys.argv[1], sys.argv[2]
ctx = zmq.Context()
if how == "raw":
    pull = ctx.socket(zmq.PULL)
    pull.rcvhwm = 4
    pull.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    pull.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
    pull.setsockopt(zmq.HEARTBEAT_TTL, 10000)
    pull.bind("tcp://127.0.0.1:*")
else:
    from memoire.transport import open_socket
    pull = open_socket(ctx, zmq.PULL, "tcp://127.0.0.1:*", "Bind")
endpoint = pull.getsockopt(zmq.LAST_ENDPOINT).decode()
peer = subprocess.Popen([sys.executable, "-c", flood, endpoint], stdout=subprocess.PIPE)
assert peer.stdout.readline().strip() == b"up"
pull.recv()
time.sleep(0.5)  # the flood fills the receive queue: libzmq stops reading the connection
peer.kill()
peer.wait()
time.sleep(2.5)  # a couple of heartbeat intervals with the peer gone
n = 1
while pull.poll(2000):
    pull.recv()
    n += 1
print("read", n, flush=True)
"""


def _read_after_peer_death(how: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", READER, how, FLOOD],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
        cwd=tempfile.gettempdir(),
    )


@pytest.mark.skipif(
    zmq.zmq_version_info() > (4, 3, 5), reason="the hazard is documented on libzmq <= 4.3.5"
)
def test_libzmq_aborts_a_heartbeat_receiver_whose_full_queue_loses_its_peer():
    """The bug memoire avoids (zeromq/libzmq#3937): the reading process dies of SIGABRT."""
    out = _read_after_peer_death("raw")
    assert out.returncode == -signal.SIGABRT, (out.returncode, out.stderr[-2000:])
    assert "stream_engine_base.cpp" in out.stderr


def test_memoires_receiving_socket_survives_the_same_sequence():
    out = _read_after_peer_death("memoire")
    assert out.returncode == 0, out.stderr[-2000:]
    # What was queued is read, the dead peer's messages still in the kernel's buffers too.
    got = int(out.stdout.split()[-1])
    assert got > 1 + RECEIVE_HWM, out.stdout


def test_no_socket_runs_heartbeats_and_receivers_queue_little():
    ctx = zmq.Context()
    try:
        for kind in (zmq.PUSH, zmq.PULL, zmq.REQ, zmq.PUB, zmq.SUB, zmq.ROUTER, zmq.DEALER):
            sock = open_socket(ctx, kind, "tcp://127.0.0.1:*", "Bind")
            assert sock.getsockopt(zmq.HEARTBEAT_IVL) == 0
            if kind not in (zmq.PUSH, zmq.PUB):
                assert sock.rcvhwm == RECEIVE_HWM
            sock.close(0)
        for kind in (zmq.PULL, zmq.SUB, zmq.REQ, zmq.ROUTER):
            with pytest.raises(ValueError, match="heartbeat: refused on a receiving socket"):
                open_socket(ctx, kind, "tcp://127.0.0.1:*", "Bind", heartbeat=Heartbeat())
        push = open_socket(ctx, zmq.PUSH, "tcp://127.0.0.1:*", "Bind", heartbeat=Heartbeat())
        assert push.getsockopt(zmq.HEARTBEAT_IVL) == 1000
        push.close(0)
        with pytest.raises(ValueError, match="rcvhwm"):
            open_socket(ctx, zmq.PULL, "tcp://127.0.0.1:*", "Bind", rcvhwm=0)
    finally:
        ctx.term()


# An actor that opens an episode (two chunks, no last one), says so, then idles mid-episode:
# its keepalive thread keeps it heard until it is killed or frozen.
ACTOR = r"""
import sys, time, numpy as np, zmq
from memoire.experience import ChunkStream
from memoire.transport import open_socket
spec = eval(sys.argv[2], {"dtype": np.dtype})
ctx = zmq.Context()
sock = open_socket(ctx, zmq.PUSH, sys.argv[1], "Conn")
def try_send(frames):
    try:
        sock.send_multipart(frames, zmq.NOBLOCK)
        return True
    except zmq.Again:
        return False
stream = ChunkStream(spec, lambda f: sock.send_multipart(f) or True, chunk_rows=2,
                     keepalive=float(sys.argv[3]), try_send=try_send)
row = {"s": np.ones(4, np.float32), "a": 1, "r": 0.5, "p": 0.5, "v": 0.0,
       "i": np.zeros(0, np.uint8), "init_w": 1.0}
for _ in range(4):
    stream.add(row)
print("open", flush=True)
time.sleep(600)
"""


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
        [sys.executable, "-c", ACTOR, endpoint, _spec_text(srv), str(KEEPALIVE)],
        stdout=subprocess.PIPE,
        env=subprocess_env(),
        cwd=tempfile.gettempdir(),  # not the checkout, whose memoire/ has no extension
    )
    assert proc.stdout.readline().strip() == b"open"
    return proc


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_dead_or_frozen_actor_loses_its_open_episode_and_no_other(how):
    """An idle actor's keepalives keep its episode open; killed or frozen, it falls silent and
    its episode, and only its, is dropped; the live actor's episode is stored whole."""
    with ReplayMemoryServer(*TEMPLATES, 10000, None, peer_timeout=PEER_TIMEOUT) as srv:
        ep = srv.start()
        live = _LiveActor(srv, ep["pull"])
        proc = _start_actor(srv, ep["pull"])
        try:
            wait_until(lambda: srv.stats()["open_streams"] == 2, "srv.stats()['open_streams'] == 2")
            # Idle mid-episode for three peer timeouts: its keepalives keep it.
            assert not wait_until(
                lambda: srv.stats()["rejected"].get("peer_lost", 0) > 0,
                "a peer lost",
                timeout=3 * PEER_TIMEOUT,
                fail=False,
            )
            assert srv._central.ingest.counters()["keepalives"] >= 3
            os.kill(proc.pid, getattr(signal, how))
            wait_until(
                lambda: srv.stats()["rejected"].get("peer_lost", 0) == 1,
                "srv.stats()['rejected'].get('peer_lost', 0) == 1",
            )
            s = srv.stats()
            assert s["open_streams"] == 1  # the live actor's episode is still open
            assert s["peer_connects"] == 2
            live.finish()
            wait_until(
                lambda: srv.stats().get("episodes_in", 0) == 1,
                "srv.stats().get('episodes_in', 0) == 1",
            )
            assert set(srv.stats()["rejected"]) == {"peer_lost"}
        finally:
            live.stop.set()
            proc.kill()
            proc.wait(30)


def test_an_actor_frozen_shorter_than_the_timeout_keeps_its_episode():
    with ReplayMemoryServer(*TEMPLATES, 10000, None, peer_timeout=5.0) as srv:
        ep = srv.start()
        proc = _start_actor(srv, ep["pull"])
        try:
            wait_until(lambda: srv.stats()["open_streams"] == 1, "srv.stats()['open_streams'] == 1")
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(1.0)  # a fifth of the timeout
            os.kill(proc.pid, signal.SIGCONT)
            before = srv._central.ingest.counters()["keepalives"]
            wait_until(
                lambda: srv._central.ingest.counters()["keepalives"] > before + 2,
                "srv._central.ingest.counters()['keepalives'] > before + 2",
            )
            assert srv.stats()["open_streams"] == 1
            assert "peer_lost" not in srv.stats()["rejected"]
        finally:
            proc.kill()
            proc.wait(30)


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
        wait_until(lambda: (watch.poll(), watch.open)[1] == 3, "(watch.poll(), watch.open)[1] == 3")
        pushes[0].close(0)
        wait_until(
            lambda: (watch.poll(), watch.closed)[1] == 1, "(watch.poll(), watch.closed)[1] == 1"
        )
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
        wait_until(
            lambda: (sockets.actors_gone(0.0), sockets._watch.open)[1] == 2,
            "(sockets.actors_gone(0.0), sockets._watch.open)[1] == 2",
        )
        os.kill(procs[0].pid, signal.SIGKILL)
        wait_until(
            lambda: (sockets.actors_gone(0.0), sockets._watch.closed)[1] == 1,
            "(sockets.actors_gone(0.0), sockets._watch.closed)[1] == 1",
        )
        assert not sockets.actors_gone(grace=0.0)  # one is left
        os.kill(procs[1].pid, signal.SIGKILL)
        wait_until(lambda: sockets.actors_gone(grace=0.2), "sockets.actors_gone(grace=0.2)")
    finally:
        for p in procs:
            p.kill()
            p.wait(30)
        sockets.close()
