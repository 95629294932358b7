"""The learner's and the actors' sockets, and what goes between them.

The learner binds a PULL socket for actors' experience chunks and a PUB socket for what it
tells every actor, by topic: parameters (:data:`PARAMS_TOPIC`: the training step as int64,
then :func:`~.params.params_to_bytes`), its table of stored episodes (:data:`STORED_TOPIC`)
and the stop notice (:data:`STOP_TOPIC`). An actor connects a PUSH and a SUB socket to them
(:class:`ActorLink`), from an :class:`ActorEndpoints`.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import shutil
import struct
import tempfile
import time
from typing import Any, Optional

import numpy as np
import zmq

from memoire import transport
from memoire.experiments.distributed.config import DistributedConfig

log = logging.getLogger(__package__)  # one logger for a distributed run's lines

# An actor waits this long for its first connection to the learner before it gives up (the
# learner binds before any actor starts, so a connection comes at once when it is there).
LEARNER_WAIT_S = 5.0
# An actor whose learner takes nothing of it for this long stops (the learner is gone).
LEARNER_SILENCE_S = 60.0

PARAMS_TOPIC = b"params"
STOP_TOPIC = b"stop"
STORED_TOPIC = b"stored"  # uint64 pairs (actor uuid, last episode stored)
MAX_ACTORS = 4096  # actors the learner tells about their stored episodes
PUB_HWM = 16  # publications queued per actor at the learner (parameters, tables, stop)
_VERSION = struct.Struct("<q")  # parameter version, before the payload


class LearnerSockets:
    """The learner's sockets: PULL for actors' experience chunks, PUB for parameters and the
    stop notice. Both bound here; :attr:`endpoints` says where (``experience``, ``params``).
    Owned by the learner's thread; :meth:`close` unbinds and removes an ``ipc://`` folder.

    ``keys``: server-side :class:`memoire.transport.CurveKeys` (from
    :func:`memoire.transport.run_keys`): both sockets then take only actors holding the
    run's client keys, encrypted; :attr:`refused` counts the connections they refused."""

    def __init__(
        self,
        config: DistributedConfig,
        host: str = "127.0.0.1",
        keys: Optional[transport.CurveKeys] = None,
    ):
        self._ctx = zmq.Context()
        self._folder = None
        self._auth = transport.Authenticator(self._ctx, keys) if keys is not None else None
        self.encrypted = keys is not None
        if config.transport == "multiprocessing":
            self._folder = tempfile.mkdtemp(prefix="memoire-ipc-")
            experience = f"ipc://{self._folder}/experience"
            params = f"ipc://{self._folder}/params"
        else:
            experience = _endpoint(config.experience_endpoint, host)
            params = _endpoint(config.param_endpoint, host)
        try:
            # The PULL queues transport.RECEIVE_HWM chunks per actor (what waits beyond that
            # waits in the actors' own send queues); a frozen actor's parameter queue at the
            # PUB holds at most PUB_HWM publications (a slow actor skips to the newest).
            self.pull = transport.open_socket(self._ctx, zmq.PULL, experience, "Bind", keys=keys)
            self.pub = transport.open_socket(
                self._ctx, zmq.PUB, params, "Bind", hwm=PUB_HWM, keys=keys
            )
            self._pub_watch = transport.ConnectionWatch(self.pub)
        except Exception:
            self.close()
            raise
        self.endpoints = {
            "experience": transport.last_endpoint(self.pull),
            "params": transport.last_endpoint(self.pub),
        }
        self._watch = transport.ConnectionWatch(self.pull)
        self._stored: collections.OrderedDict = collections.OrderedDict()  # uuid -> episode
        self._table_sent_at = 0.0

    def publish(self, version: int, payload: bytes) -> None:
        """Sends parameters of training step ``version`` to every actor (slow ones skip to
        the newest)."""
        self.pub.send_multipart([PARAMS_TOPIC, _VERSION.pack(int(version)) + payload])

    def acknowledge(self, stored: list) -> None:
        """Tells actors which of their episodes are stored (``stored``: what
        :meth:`memoire.experience.ExperienceReceiver.poll` returned). The whole table goes out
        when something was stored and at least every 0.5 s, so an actor that joined late or
        missed a message catches up."""
        self.watch()
        for uuid, episode, _, _ in stored:
            uuid = int(uuid)
            self._stored[uuid] = max(int(episode), self._stored.pop(uuid, -1))
            if len(self._stored) > MAX_ACTORS:  # peers are not trusted: the table is bounded
                self._stored.popitem(last=False)  # the actor heard from least recently
        now = time.monotonic()
        if self._stored and (stored or now - self._table_sent_at >= 0.5):
            table = np.array(list(self._stored.items()), np.uint64)
            self.pub.send_multipart([STORED_TOPIC, table.tobytes()])
            self._table_sent_at = now

    def actors_seen(self) -> int:
        """Actor connections opened so far (0: no actor has connected yet)."""
        self._watch.poll()
        return self._watch.opened

    def actors_gone(self, grace: float = transport.PEER_TIMEOUT_S) -> bool:
        """True once actors have connected and every connection has been closed for `grace`
        seconds (they exited or were killed: their kernels close the connections); a
        reconnecting actor comes back within that."""
        self._watch.poll()
        w = self._watch
        return w.opened > 0 and w.open == 0 and time.monotonic() - w.last_closed >= grace

    def watch(self) -> None:
        """Reads both sockets' connection events (the learner's loop does, in
        :meth:`acknowledge`): counts and logs the connections refused for their keys."""
        self._watch.poll()
        self._pub_watch.poll()

    @property
    def refused(self) -> int:
        """Connections both sockets refused (no or wrong CURVE keys), as of the last
        :meth:`watch` (read from any thread)."""
        return self._watch.refused + self._pub_watch.refused

    def stop_actors(self) -> None:
        """Tells actors started by endpoint to finish."""
        self.pub.send_multipart([STOP_TOPIC, b""])

    def close(self) -> None:
        for name in ("_watch", "_pub_watch"):
            if getattr(self, name, None) is not None:
                getattr(self, name).close()
        for name in ("pull", "pub"):
            sock = getattr(self, name, None)
            if sock is not None:
                sock.close(0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


@dataclasses.dataclass
class ActorEndpoints:
    """What an actor needs to reach the learner (picklable; also for actors started by hand
    on other machines). ``stop`` is an optional multiprocessing Event set by the learner."""

    experience: str
    params: str
    queue_chunks: int = 32
    episodes_ahead: int = 1
    stop: Any = None
    keepalive: float = transport.KEEPALIVE_S
    keys: Optional[transport.CurveKeys] = None  # client side, when the learner uses CURVE

    def open(self, actor_id: int = 0) -> "ActorLink":
        """This actor's :class:`ActorLink` (its sockets, connecting); ``actor_id`` names it in
        the learner's records."""
        return ActorLink(self, actor_id)


class NoLearner(ConnectionError):
    """No learner answered at an actor's experience endpoint (:meth:`ActorLink.connect`)."""


class ActorLink:
    """An actor's sockets: PUSH for its chunks, SUB for parameters, the learner's table of
    stored episodes and the stop notice. :attr:`uuid` is the actor's stream id.

    :meth:`connect` waits for the learner's first connection. ``send`` waits while
    ``queue_chunks`` chunks are queued; :meth:`wait_for_learner` waits while ``episodes_ahead``
    finished episodes are not stored. Both give up after ``give_up_s`` seconds without
    progress (the learner is gone: :attr:`gave_up` says so) or on a stop.
    """

    def __init__(
        self,
        endpoints: ActorEndpoints,
        actor_id: int = 0,
        give_up_s: float = LEARNER_SILENCE_S,
    ):
        # the low half names the actor in the learner's records; the high half tells apart
        # actors started with the same id
        self.uuid = (int.from_bytes(os.urandom(4), "little") << 32) | (int(actor_id) & 0xFFFFFFFF)
        self._ctx = zmq.Context()
        keys = dict(keys=endpoints.keys, server_side=False)
        # The experience socket is watched from before it connects (connect() reads whether it
        # did): a watch attached later can miss the connection's one event.
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.linger = 0
        self._push.sndhwm = endpoints.queue_chunks
        if endpoints.keys is not None:
            endpoints.keys.apply_client(self._push)
        self._watch: Optional[transport.ConnectionWatch] = transport.ConnectionWatch(self._push)
        self._push.connect(endpoints.experience)
        self._sub = transport.open_socket(self._ctx, zmq.SUB, endpoints.params, "Conn", **keys)
        self._sub.setsockopt(zmq.SUBSCRIBE, PARAMS_TOPIC)
        self._sub.setsockopt(zmq.SUBSCRIBE, STOP_TOPIC)
        self._sub.setsockopt(zmq.SUBSCRIBE, STORED_TOPIC)
        self.experience = endpoints.experience
        self._event = endpoints.stop
        self._stopped = False
        self.gave_up: Optional[str] = None  # why the link stopped waiting for the learner
        self._newest: Optional[tuple] = None
        self._give_up = give_up_s
        self._ahead = endpoints.episodes_ahead
        self.keepalive = float(endpoints.keepalive)
        self.stored_episode = -1  # the last of this actor's episodes the learner stored

    def connect(self, timeout: float = LEARNER_WAIT_S) -> None:
        """Waits until the experience socket has connected to the learner (seconds).

        Raises:
          NoLearner: nothing accepted a connection at the endpoint within `timeout` seconds,
            or the learner refused this actor's handshake (CURVE keys).
        """
        watch = self._watch
        if watch is None:  # connected before
            return
        try:
            deadline = time.monotonic() + timeout
            while True:
                watch.poll()
                if watch.opened:
                    return
                if watch.refused:
                    raise NoLearner(
                        f"the learner at {self.experience} refused this actor's handshake "
                        "(it takes the run's CURVE keys only)"
                    )
                if time.monotonic() >= deadline:
                    raise NoLearner(
                        f"no learner at {self.experience}: nothing accepted a connection in "
                        f"{timeout:g} s; start the learner first, or check the endpoint"
                    )
                time.sleep(0.01)
        finally:
            watch.close()
            self._watch = None

    def should_stop(self) -> bool:
        self._drain()
        return self._stopped or (self._event is not None and self._event.is_set())

    def send(self, frames: list) -> bool:
        """Queues one chunk message (copied); False on a stop or when the learner took
        nothing for ``give_up_s`` seconds."""

        def sent() -> bool:
            try:
                self._push.send_multipart(frames, flags=zmq.NOBLOCK)
                return True
            except zmq.Again:
                return False

        return self._until(sent, "took no experience")

    def try_send(self, frames: list) -> bool:
        """Queues one message if the queue has room now (a keepalive); never waits."""
        try:
            self._push.send_multipart(frames, flags=zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def wait_for_learner(self, finished: int) -> bool:
        """Waits until at most ``episodes_ahead`` of this actor's ``finished`` episodes
        (numbered from 0) are not stored by the learner. False on a stop or when nothing was
        stored for ``give_up_s`` seconds."""
        return self._until(
            lambda: finished - (self.stored_episode + 1) <= self._ahead, "stored nothing of ours"
        )

    def _until(self, ready, what: str) -> bool:
        """Polls ``ready()`` every few ms: True once it is, False on a stop or after
        ``give_up_s`` seconds (the learner is gone: this link then stops)."""
        since = time.monotonic()
        while not self.should_stop():
            if ready():
                return True
            if time.monotonic() - since > self._give_up:
                self.gave_up = f"the learner at {self.experience} {what} for {self._give_up:g} s"
                log.warning("%s; stopping", self.gave_up)
                self._stopped = True
                return False
            time.sleep(0.002)
        return False

    def latest(self) -> Optional[tuple]:
        """``(version, payload)`` of the newest parameters not yet taken, or None."""
        self._drain()
        got, self._newest = self._newest, None
        return got

    def _drain(self) -> None:
        while True:
            try:
                topic, data = self._sub.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            except ValueError:  # not two frames: not ours
                continue
            if topic == STOP_TOPIC:
                self._stopped = True
            elif topic == STORED_TOPIC and len(data) % 16 == 0:
                table = np.frombuffer(data, np.uint64).reshape(-1, 2)
                mine = table[table[:, 0] == np.uint64(self.uuid), 1]
                if mine.size:
                    self.stored_episode = max(self.stored_episode, int(mine.max()))
            elif topic == PARAMS_TOPIC and len(data) >= _VERSION.size:
                (version,) = _VERSION.unpack_from(data)
                self._newest = (version, data[_VERSION.size :])

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self._push.close(0)
        self._sub.close(0)
        self._ctx.term()


def _endpoint(configured: Optional[str], host: str) -> str:
    """The configured endpoint, or an OS-chosen port on ``host`` when it is empty or 'auto'."""
    if not configured or configured == "auto":
        return f"tcp://{host}:*"
    return configured
