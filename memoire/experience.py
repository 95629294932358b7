"""The sending end of memoire's one experience path: an actor's episodes as chunk messages.

An actor appends rows (one environment step each) to a :class:`ChunkStream`; every
``chunk_rows`` rows go out as one CHUNK message (memoire's codec: a header frame and one frame
per column, no pickle), and :meth:`ChunkStream.end_episode` sends the last chunk of the episode.
The receiving end is one native ingest (``memoire._core.ChunkIngest``) that checks the chunks
and commits each finished episode whole into its store: memoire's ``ReplayMemory`` (a
``ReplayMemoryServer`` in central mode), Dopamine's TF buffers
(``OutOfGraphReplayBuffer.chunk_ingest``) or Dopamine's JAX buffer
(``ReplayBuffer.chunk_ingest``). The same messages travel over ``tcp://``, ``ipc://`` or
``inproc://`` sockets.

A chunk's columns are the ingest's ``row_spec`` (for Dopamine's buffers: observation, action,
reward, terminal, ...), plus ``uuid`` (the actor), ``episode``, ``index`` (the chunk's place in
its episode), ``multiplier`` and, on the last chunk, an optional ``info`` (return, length,
terminated) that the receiver hands back with the stored episode. See core/chunk_ingest.h for
the receiver's rules.

Liveness: a stream built with ``keepalive`` seconds sends a KEEPALIVE message (its uuid) from a
:class:`Keepalive` thread whenever an episode is open and nothing went out for that long; the
receiving ingest drops the open episode of an actor it has not heard from for its
``peer_timeout`` (killed, frozen), never another actor's. ZeroMQ's own heartbeats are not used
(see :class:`memoire.transport.Heartbeat`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import zmq

from memoire import codec, transport
from memoire.codec import Msg
from memoire.protocol import (
    CHUNK_INFO,
    CHUNK_LAST,
    CHUNK_TERMINAL,
    INGEST_REJECTED,
    KEEPALIVE_SCALARS,
)


def keepalive_frames(uuid: int) -> list:
    """The frames of a KEEPALIVE message of the actor `uuid` (uint64)."""
    ((name, dtype),) = KEEPALIVE_SCALARS
    return codec.encode(Msg.KEEPALIVE, {name: np.array(int(uuid), dtype)})


class Keepalive:
    """Keeps an idle data channel heard: a daemon thread that sends a KEEPALIVE of `uuid`
    whenever `active()` and nothing went out for `interval` seconds (checked every
    ``interval / 2``).

    Args:
      uuid: the actor's id, as in its chunks.
      try_send: sends frames without blocking; False when it could not (a full queue: data is
        waiting to be read anyway). Called with `lock` held.
      lock: guards the socket; every data send holds it and then calls :meth:`sent`. A data
        send that blocks holds it, and the keepalive is skipped meanwhile.
      interval: seconds, > 0.
      active: whether keepalives are wanted now (an episode is open); default always.

    Thread-safe (:meth:`sent` from the sending thread, :meth:`close` from any).
    """

    def __init__(
        self,
        uuid: int,
        try_send: Callable[[list], bool],
        lock: threading.Lock,
        interval: float,
        active: Callable[[], bool] = lambda: True,
    ):
        if not (float(interval) > 0):
            raise ValueError(f"keepalive: expected seconds > 0, got {interval!r}")
        self.interval = float(interval)
        self._frames = keepalive_frames(uuid)
        self._try_send = try_send
        self._lock = lock
        self._active = active
        self._last = time.monotonic()
        self.sent_count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memoire-keepalive", daemon=True)
        self._thread.start()

    def sent(self) -> None:
        """A data message went out now."""
        self._last = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.interval / 2):
            if time.monotonic() - self._last < self.interval or not self._active():
                continue
            if not self._lock.acquire(blocking=False):
                continue  # a data send is under way
            try:
                if self._stop.is_set():
                    return
                if self._try_send(self._frames):
                    self._last = time.monotonic()
                    self.sent_count += 1
            except Exception:  # noqa: BLE001 - a closed socket: the owner is closing
                return
            finally:
                self._lock.release()

    def close(self) -> None:
        """Stops the thread (before the owner closes the socket)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5 * self.interval + 1)


log = logging.getLogger(__name__)


def log_returned(logger: logging.Logger, ingest) -> int:
    """Says, in one line each, which actors the chunk `ingest` hears from again after it
    dropped their open episode for silence (``peer_timeout``: a partition that healed, a
    frozen process that woke): how long they were silent and what they lost. The first ten,
    then every thousandth (a flood of made-up actors does not flood the log). Returns how
    many came back."""
    returned = ingest.take_returned()
    for uuid, silent, episode, episodes, rows, count in returned:
        if count <= 10 or count % 1000 == 0:
            lost = (
                f"episode {episode}" if episodes == 1 else f"{episodes} episodes (last {episode})"
            )
            logger.warning(
                "actor %08x back after %.1f s without a word; lost to peer_timeout (%g s): its "
                "open %s, %d rows received (its chunks of it still on the way are dropped)",
                uuid & 0xFFFFFFFF,
                silent,
                ingest.peer_timeout,
                lost,
                rows,
            )
    return len(returned)


class ChunkStream:
    """Streams one actor's episodes, one row at a time, as chunk messages.

    Args:
      row_spec: ``[(name, dtype, row_shape)]``, the receiving ingest's ``row_spec``.
      send: called with the frames of each message (a list of bytes-like); returns False when
        the message could not be sent (the episode is then abandoned: its later chunks are not
        sent, and the receiver drops its stream). The frames view a stage that the next rows
        overwrite, so ``send`` must copy them (pyzmq's ``send_multipart`` does by default).
      chunk_rows: rows per message (>= 1); an episode end also sends.
      uuid: the actor's id (uint64); random by default.
      keepalive: seconds (None: none): while an episode is open and nothing went out for this
        long, a :class:`Keepalive` thread sends a KEEPALIVE through `try_send`.
      try_send: sends frames without blocking (False when the queue is full); required with
        `keepalive`. Data sends and keepalives never run at once (a lock).

    Not thread-safe: one actor thread owns a stream; :meth:`close` stops its keepalive.
    """

    def __init__(
        self,
        row_spec: Sequence[tuple],
        send: Callable[[list], bool],
        chunk_rows: int = 64,
        uuid: Optional[int] = None,
        keepalive: Optional[float] = None,
        try_send: Optional[Callable[[list], bool]] = None,
    ):
        if int(chunk_rows) < 1:
            raise ValueError(f"chunk_rows: expected >= 1, got {chunk_rows}")
        if keepalive is not None and try_send is None:
            raise ValueError("keepalive: expected a try_send (a send that never blocks)")
        self._spec = [
            (str(name), np.dtype(dtype), tuple(int(d) for d in shape))
            for name, dtype, shape in row_spec
        ]
        self._send = send
        self._rows = int(chunk_rows)
        self.uuid = int.from_bytes(os.urandom(8), "little") if uuid is None else int(uuid)
        self._stage = {
            name: np.zeros((self._rows, *shape), dtype) for name, dtype, shape in self._spec
        }
        self._staged = 0
        self._episode = 0
        self._index = 0
        self._broken = False  # a send failed: the rest of this episode is not sent
        self.episodes_sent = 0
        self.rows_sent = 0
        self._lock = threading.Lock()
        self.keepalive: Optional[Keepalive] = None
        if keepalive is not None:
            self.keepalive = Keepalive(
                self.uuid, try_send, self._lock, keepalive, active=lambda: self._index > 0
            )

    def close(self) -> None:
        """Stops the keepalive thread (call before the socket closes)."""
        if self.keepalive is not None:
            self.keepalive.close()

    def add(self, row: Mapping[str, object]) -> bool:
        """Appends one row (a value per column, cast to the column's dtype and shape); sends a
        full chunk. Returns False when a send failed (this episode is lost)."""
        if row.keys() != self._stage.keys():
            raise ValueError(f"row: expected the columns {sorted(self._stage)}, got {sorted(row)}")
        for name, dtype, shape in self._spec:
            value = np.asarray(row[name])
            if value.shape != shape:
                raise ValueError(
                    f"{name}: expected {dtype}{list(shape)}, got {value.dtype}{list(value.shape)}"
                )
            self._stage[name][self._staged] = value
        self._staged += 1
        if self._staged == self._rows:
            return self._flush(flags=0, info=None)
        return not self._broken

    def end_episode(self, terminal: bool, info: Optional[Sequence[float]] = None) -> bool:
        """Sends the episode's last chunk (the receiver then stores the episode) and starts the
        next episode. ``info``: (return, length, terminated), handed to the receiver's owner.
        Returns False when the episode was lost (a send failed)."""
        ok = self._flush(flags=CHUNK_LAST | (CHUNK_TERMINAL if terminal else 0), info=info)
        if ok:
            self.episodes_sent += 1
        self._episode += 1
        self._index = 0
        self._broken = False
        return ok

    def _flush(self, flags: int, info: Optional[Sequence[float]]) -> bool:
        n, self._staged = self._staged, 0
        if self._broken:
            return False
        values = {name: self._stage[name][:n] for name, _, _ in self._spec}
        values.update(
            {
                "uuid": np.array(self.uuid, np.uint64),
                "episode": np.array(self._episode, np.int64),
                "index": np.array(self._index, np.int64),
                "multiplier": np.array(1.0, np.float32),
            }
        )
        if info is not None:
            name, dtype, size = CHUNK_INFO
            values[name] = np.asarray(info, dtype).reshape(size)
        frames = codec.encode(Msg.CHUNK, values, flags=flags)
        with self._lock:
            ok = self._send(frames)
            if self.keepalive is not None:
                self.keepalive.sent()
        if not ok:
            self._broken = True
            return False
        self._index += 1
        self.rows_sent += n
        return True


class ExperienceReceiver:
    """The receiving end on a socket: every message goes into ``ingest`` (with the GIL
    released, straight from libzmq when memoire's native message paths are on), and
    :meth:`poll` returns the episodes stored since the last call.

    Args:
      ingest: a ``memoire._core.ChunkIngest`` (over any store).
      sock: a PULL socket the owner bound or connected; the receiver reads it, the owner
        closes it.

    Not thread-safe: the owner's thread polls (a learner paces its training steps by what
    :meth:`poll` returns). Rejected chunks are counted by the ingest (``counters()``) and
    logged, sparsely under a flood; a message that is no chunk counts as ``not_chunk``.
    """

    def __init__(self, ingest, sock: zmq.Socket):
        self.ingest = ingest
        self._sock = sock
        self._native = transport.native_libzmq()
        self.not_chunk = 0

    def _listen(self) -> None:
        for reason, count, detail in self.ingest.listen():
            transport.log_dropped(log, "an episode", reason, count, detail)

    def poll(self, timeout: float) -> List[Tuple[int, int, int, Optional[tuple]]]:
        """Waits up to ``timeout`` seconds for messages and takes what is queued. Returns the
        episodes stored since the last call, oldest first: ``[(uuid, episode, rows, info)]``
        (``info``: the actor's (return, length, terminated), or None).

        Each call is a read: the ingest's liveness counts the time in it (and gaps between
        calls up to a cap) and drops the open episode of an actor silent past its
        ``peer_timeout``. Not calling it (a learner held back by its rate limiter) counts
        nothing against the actors."""
        self.ingest.reap()
        ms = max(0, int(timeout * 1000))
        other = None
        if self._native:
            _, _, rejected, other = self.ingest.receive(self._sock.underlying, ms, 64)
            for reason, count, detail in rejected:
                transport.log_dropped(log, "a chunk", reason, count, detail)
        else:
            self._listen()
            if self._sock.poll(ms):
                frames = self._sock.recv_multipart(copy=False)
                got = self.ingest.ingest(frames)
                if got is None:
                    other = frames
                elif got[0] == INGEST_REJECTED and got[2] is not None:
                    transport.log_dropped(log, "a chunk", got[2], got[3], got[4])
            self._listen()
        if other is not None:
            self.not_chunk += 1
            transport.log_dropped(
                log, "a message", "not_chunk", self.not_chunk, "it is no episode chunk"
            )
        log_returned(log, self.ingest)
        records, dropped = self.ingest.take_committed()
        if dropped:
            log.warning("%d stored episodes were not reported (poll more often)", dropped)
        return records
