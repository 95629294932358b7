"""The ZeroMQ transport of distributed training: a memoire server in the learner's process.

The learner runs a :class:`memoire.ReplayMemoryServer` (embedded) and hosts on it an
:class:`ExperienceInbox`: actors call its ``put_chunk`` through :class:`memoire.remote.
RemoteObject` (codec-encoded arrays, never pickle; a retried call runs once), and the learner
drains it as its :class:`~.distributed.ExperienceSource`. Parameters go out with the
server's ``pub_bytes`` under topic ``params`` and actors read them with the client's
``sub_bytes``. Actors are separate processes and may run on other machines: all they need are
the server's REP and PUB endpoints (:class:`ActorEndpoints`).

Backpressure: the inbox holds at most ``queue_chunks`` chunks; when full, ``put_chunk``
answers False at once and the actor retries after a short wait, so a slow learner never
blocks the server's worker thread and actors never run ahead without bound.
"""

from __future__ import annotations

import dataclasses
import queue as queue_lib
import struct
import time
from typing import Any, Callable, Optional

import numpy as np

from memoire.experiments.distributed import Chunk, DistributedConfig

PARAMS_TOPIC = "params"
INBOX_NAME = "experience"
_VERSION = struct.Struct("<q")  # parameter version, before the payload


class ExperienceInbox:
    """Chunks from actors, hosted on the learner's server; the learner's ExperienceSource.

    Thread-safe: ``put_chunk`` runs in the server's REP worker, ``get_chunk`` in the learner.
    """

    def __init__(self, capacity_chunks: int):
        self._q: queue_lib.Queue = queue_lib.Queue(maxsize=int(capacity_chunks))
        self.received = 0
        self.refused = 0

    def put_chunk(self, actor_id: int, observation, action, reward, terminal, episode_end,
                  episodes) -> bool:
        """Queues one actor's chunk (arrays as :class:`~.distributed.Chunk` describes).

        Returns:
          False when the inbox is full (the actor should retry), True when queued.

        Raises:
          ValueError: a malformed chunk (the actor sees the same ValueError).
        """
        chunk = Chunk(np.asarray(observation), np.asarray(action), np.asarray(reward),
                      np.asarray(terminal, dtype=bool), np.asarray(episode_end, dtype=bool),
                      np.asarray(episodes, dtype=np.float64).reshape(-1, 3))
        chunk.validate()
        try:
            self._q.put_nowait((int(actor_id), chunk))
        except queue_lib.Full:
            self.refused += 1
            return False
        self.received += 1
        return True

    def get_chunk(self, timeout: float):
        try:
            return self._q.get(timeout=timeout)
        except queue_lib.Empty:
            return None


class ServerParameterPublisher:
    """ParameterPublisher over the server's PUB socket (never blocks: PUB drops for slow
    subscribers, who then get a newer version)."""

    def __init__(self, server):
        self._server = server

    def publish(self, version: int, payload: bytes) -> None:
        self._server.pub_bytes(PARAMS_TOPIC, _VERSION.pack(int(version)) + bytes(payload))


class RemoteExperienceSink:
    """ExperienceSink of an actor: ``put_chunk`` calls on the learner's inbox, retried while
    the inbox is full, until ``should_stop()``."""

    def __init__(self, remote, should_stop: Callable[[], bool], retry_s: float = 0.05,
                 give_up_s: float = 60.0):
        self._remote, self._stop, self._retry = remote, should_stop, retry_s
        self._give_up = give_up_s

    def add_chunk(self, actor_id: int, chunk: Chunk) -> bool:
        """False when told to stop, or when the learner has not answered for ``give_up_s``."""
        silent_since = None
        while not self._stop():
            try:
                ok = self._remote.call("put_chunk", int(actor_id), chunk.observation, chunk.action,
                                       chunk.reward, chunk.terminal, chunk.episode_end,
                                       chunk.episodes)
            except TimeoutError:
                # The request channel already retried; the learner may be restarting.
                silent_since = silent_since or time.monotonic()
                if time.monotonic() - silent_since > self._give_up:
                    return False
                continue
            silent_since = None
            if ok:
                return True
            time.sleep(self._retry)
        return False


@dataclasses.dataclass
class ActorEndpoints:
    """What an actor needs to reach the learner (picklable; also for actors started by hand
    on other machines). ``stop`` is an optional multiprocessing Event set by the learner."""

    rep: str
    pub: str
    stop: Any = None

    def open(self):
        """Connects; returns ``(sink, parameter_source, should_stop, close)``."""
        from memoire.remote import RemoteObject
        from memoire.transport import open_socket
        import zmq

        remote = RemoteObject(self.rep, INBOX_NAME)
        ctx = zmq.Context()
        sub = open_socket(ctx, zmq.SUB, self.pub, "Conn", keys=None, server_side=False)
        params = _SubParams(sub)
        stop = self.stop

        def should_stop() -> bool:
            return stop is not None and stop.is_set()

        def close() -> None:
            remote.close()
            sub.close(linger=0)
            ctx.term()

        return RemoteExperienceSink(remote, should_stop), params, should_stop, close


class _SubParams:
    """ParameterSource on a bare SUB socket (an actor needs no replay client)."""

    def __init__(self, sub):
        import zmq

        self._zmq = zmq
        self._sub = sub
        sub.setsockopt(zmq.SUBSCRIBE, PARAMS_TOPIC.encode())

    def latest(self):
        from memoire.transport import publication

        newest = None
        while True:
            try:
                got = publication(self._sub.recv_multipart(flags=self._zmq.NOBLOCK, copy=False))
            except self._zmq.Again:
                return newest
            if got is None or len(got[1]) < _VERSION.size:
                continue  # not ours or malformed: ignore, never die
            data = got[1]
            (version,) = _VERSION.unpack_from(data)
            newest = (version, data[_VERSION.size:])


@dataclasses.dataclass
class ZmqTransport:
    """The learner's side: the embedded server, its inbox and publisher, and per-actor
    :class:`ActorEndpoints`."""

    server: Any
    source: ExperienceInbox
    publisher: ServerParameterPublisher
    actor_args: list
    stop: Any
    endpoints: dict

    def shutdown(self, procs, timeout_s: float = 10.0) -> None:
        """Stops actors (event, join with a deadline, terminate stragglers), then the server."""
        self.stop.set()
        deadline = time.time() + timeout_s
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.time()))
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        self.server.close()


def make_zmq_transport(config: DistributedConfig, ctx, host: str = "127.0.0.1") -> ZmqTransport:
    """Starts the embedded server (REP and PUB on ``host``, ports chosen by the OS unless the
    config's endpoints name them) and hosts the inbox."""
    from memoire.server import ReplayMemoryServer

    z = np.zeros
    # The server's own memory is not used by this transport (experience goes to the agent's
    # memoire buffer in the learner); it is kept minimal.
    server = ReplayMemoryServer(z([1], np.uint8), z([], np.int32), z([], np.float32),
                                z([], np.float32), z([], np.float32), z([], np.float32),
                                z([0], np.uint8), 8, _endpoint(config.param_endpoint, host), 1)
    inbox = ExperienceInbox(config.queue_chunks)
    server.host(INBOX_NAME, inbox, methods=("put_chunk",))
    eps = server.start(rep_endpoint=_endpoint(config.experience_endpoint, host))
    stop = ctx.Event()
    actor_args = [(ActorEndpoints(eps["rep"], eps["pub"], stop),)
                  for _ in range(config.num_actors)]
    return ZmqTransport(server, inbox, ServerParameterPublisher(server), actor_args, stop, eps)


def _endpoint(configured: Optional[str], host: str) -> str:
    """The configured endpoint, or an OS-chosen port on ``host`` when it is empty or 'auto'."""
    if not configured or configured == "auto":
        return f"tcp://{host}:*"
    return configured
