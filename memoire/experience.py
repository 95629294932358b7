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

import collections
import logging
import os
import threading
import time
from typing import Callable, Deque, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import zmq

from memoire import codec, transport
from memoire.codec import Msg
from memoire.protocol import (
    CHUNK_INFO,
    CHUNK_LAST,
    CHUNK_SCALARS,
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


_COPY_THRESHOLD = zmq.COPY_THRESHOLD  # pyzmq copies smaller frames at send, even with copy=False


class ChunkStream:
    """Streams one actor's episodes as chunk messages: the one chunk sender (an actor of a
    distributed run, and :class:`memoire.ReplayMemoryClient` in central mode).

    Rows are staged, ``chunk_rows`` to a message; each message carries the stream's ``uuid``,
    the episode's number, the chunk's ``index`` in it and the episode's ``multiplier``, and
    :meth:`end_episode` sends the episode's last chunk (flagged, with an optional ``info``).

    Args:
      row_spec: ``[(name, dtype, row_shape)]``, the receiving ingest's ``row_spec``.
      send: called with the frames of each message (a list of bytes-like, or ``zmq.Frame``
        with `zero_copy`); returns False when the message could not be sent (the episode is
        then abandoned: its later chunks are not sent, and the receiver drops it). Without
        `zero_copy` the frames view a stage that the next rows overwrite, so ``send`` must copy
        them (pyzmq's ``send_multipart`` does by default).
      chunk_rows: rows per message (>= 1); an episode end also sends.
      uuid: the actor's id (uint64); random by default.
      keepalive: seconds (None: none): while an episode is open and nothing went out for this
        long, a :class:`Keepalive` thread sends a KEEPALIVE through `try_send`.
      try_send: sends frames without blocking (False when the queue is full); required with
        `keepalive`. Data sends and keepalives never run at once (`lock`).
      lock: held around every send and keepalive (default: the stream's own); an owner that
        sends other messages on the same socket passes the lock that guards it.
      zero_copy: frames of at least ``zmq.COPY_THRESHOLD`` bytes are handed to ``send`` as
        tracked ``zmq.Frame`` views of the stage (for ``copy=False`` sends); a stage is reused
        once ZeroMQ is done with it.
      hold_full: a full chunk waits for the next row (or the episode's end), so an episode's
        last chunk carries rows and no empty closing message is sent.
      timeout: seconds :meth:`add_rows` waits for ZeroMQ to finish reading the caller's arrays
        (with `zero_copy`).
      first_episode: the first episode's number (a stream that takes over from another of the
        same uuid goes on counting).

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
        *,
        lock: Optional[threading.Lock] = None,
        zero_copy: bool = False,
        hold_full: bool = False,
        timeout: float = transport.DEFAULT_TIMEOUT,
        first_episode: int = 0,
    ):
        if int(chunk_rows) < 1:
            raise ValueError(f"chunk_rows: expected >= 1, got {chunk_rows}")
        if keepalive is not None and try_send is None:
            raise ValueError("keepalive: expected a try_send (a send that never blocks)")
        self._spec = [
            (str(name), np.dtype(dtype), tuple(int(d) for d in shape))
            for name, dtype, shape in row_spec
        ]
        self._names = {name for name, _, _ in self._spec}
        self._send = send
        self._rows = int(chunk_rows)
        self._zero_copy = bool(zero_copy)
        self._hold_full = bool(hold_full)
        self._timeout = float(timeout)
        widest = max([dtype.itemsize * int(np.prod(shape)) for _, dtype, shape in self._spec] + [4])
        self._small = self._rows * widest < _COPY_THRESHOLD  # ZeroMQ copies such chunks anyway
        self.uuid = int.from_bytes(os.urandom(8), "little") if uuid is None else int(uuid)
        self._in_flight: Deque[tuple] = collections.deque()  # (tracker, stage) being sent
        self._free_stages: list = []
        self._stage = self._new_stage()
        self._staged = 0
        self._episode = int(first_episode)
        self._index = 0
        self._episode_rows = 0  # rows of the open episode sent
        self._broken = False  # a send failed: the rest of this episode is not sent
        self.episodes_sent = 0
        self.rows_sent = 0
        self._lock = threading.Lock() if lock is None else lock
        self.keepalive: Optional[Keepalive] = None
        if keepalive is not None:
            self.keepalive = Keepalive(
                self.uuid,
                try_send,
                self._lock,
                keepalive,
                active=lambda: self._index > 0 and not self._broken,
            )

    @property
    def episode(self) -> int:
        """The open episode's number (0, 1, ... for this uuid)."""
        return self._episode

    @property
    def open_rows(self) -> int:
        """Rows of the open episode, sent or staged."""
        return self._episode_rows + self._staged

    def close(self) -> None:
        """Stops the keepalive thread (call before the socket closes)."""
        if self.keepalive is not None:
            self.keepalive.close()

    def add(self, row: Mapping[str, object]) -> bool:
        """Appends one row (a value per column, cast to the column's dtype and shape); sends a
        full chunk. Returns False when a send failed (this episode is lost).

        Raises:
          ValueError: a column missing, unknown or of the wrong shape (nothing is staged).
        """
        if row.keys() != self._names:
            raise ValueError(f"row: expected the columns {sorted(self._names)}, got {sorted(row)}")
        values = []
        for name, dtype, shape in self._spec:
            value = np.asarray(row[name])
            if value.shape != shape:
                raise ValueError(
                    f"{name}: expected {dtype}{list(shape)}, got {value.dtype}{list(value.shape)}"
                )
            values.append(value)
        if self._staged == self._rows:  # held full (hold_full): more rows came
            self._flush(flags=0, info=None)
        for (name, _, _), value in zip(self._spec, values):
            self._stage[name][self._staged] = value
        self._staged += 1
        if self._staged == self._rows and not self._hold_full:
            self._flush(flags=0, info=None)
        return not self._broken

    def add_rows(self, columns: Mapping[str, object]) -> bool:
        """Appends n rows at once: a value per column with a leading axis of n (cast to the
        column's dtype). Whole chunks of the caller's arrays are sent as they are, without a
        staging copy; with `zero_copy` the call returns once ZeroMQ no longer reads them.
        Returns False when a send failed or ZeroMQ did not finish within `timeout` (this
        episode is lost).

        Raises:
          ValueError: a column missing, unknown, or of another shape (nothing is staged).
        """
        if columns.keys() != self._names:
            raise ValueError(
                f"rows: expected the columns {sorted(self._names)}, got {sorted(columns)}"
            )
        arrays = {}
        n = None
        for name, dtype, shape in self._spec:
            x = np.asarray(columns[name])
            n = len(x) if n is None and x.ndim > len(shape) else n
            if n is None or x.shape != (n,) + shape:
                raise ValueError(
                    f"{name}: expected {dtype.name}{['n'] + list(shape)} (n = {n}), got "
                    f"{x.dtype.name}{list(x.shape)}"
                )
            arrays[name] = x if x.dtype == dtype else x.astype(dtype)  # as staging would
        # Held back for end_episode's flag when its frames are small (ZeroMQ would copy them
        # anyway); else a whole last chunk goes at once (and end_episode sends an empty one).
        defer = self._hold_full and self._small
        start, trackers = 0, []
        while start < n and not self._broken:
            if self._staged == self._rows:
                self._flush(flags=0, info=None)
            left = n - start
            if self._staged == 0 and (left > self._rows or (left == self._rows and not defer)):
                end = start + self._rows
                trackers.append(
                    self._send_chunk({k: x[start:end] for k, x in arrays.items()}, 0, None)
                )
                start = end
                continue
            take = min(left, self._rows - self._staged)
            for name, x in arrays.items():
                self._stage[name][self._staged : self._staged + take] = x[start : start + take]
            self._staged += take
            start += take
            if self._staged == self._rows and not self._hold_full:
                self._flush(flags=0, info=None)
        deadline = time.monotonic() + self._timeout
        for t in trackers:  # the caller may change its arrays once ZeroMQ is done
            if t is None:
                continue
            try:
                t.wait(max(0.0, deadline - time.monotonic()))
            except zmq.NotDone:
                self._broken = True
        return not self._broken

    def end_episode(
        self,
        terminal: bool,
        info: Optional[Sequence[float]] = None,
        *,
        multiplier: float = 1.0,
        flags: int = 0,
    ) -> bool:
        """Sends the episode's last chunk (the receiver then stores the episode) and starts the
        next episode. ``info``: (return, length, terminated), handed to the receiver's owner;
        ``multiplier``: the episode's weight multiplier; ``flags``: further ``CHUNK_*`` flags
        (a memory's ``CHUNK_UPDATE_VALUE``, ``CHUNK_UPDATE_WEIGHT``). Returns False when the
        episode was lost (a send failed)."""
        flags |= CHUNK_LAST | (CHUNK_TERMINAL if terminal else 0)
        ok = self._flush(flags=flags, info=info, multiplier=multiplier)
        if ok:
            self.episodes_sent += 1
        self._next_episode()
        return ok

    def abandon(self) -> None:
        """Drops the open episode: its staged rows are not sent, and the receiver drops what
        it got of it once the next episode's chunks come."""
        if self._index > 0:
            self._next_episode()
        self._staged = 0
        self._episode_rows = 0
        self._broken = False

    def _next_episode(self) -> None:
        self._episode += 1
        self._index = 0
        self._episode_rows = 0
        self._broken = False

    def _new_stage(self) -> dict:
        """Staging arrays of one chunk: a set ZeroMQ has finished sending, or new ones."""
        while self._in_flight and (self._in_flight[0][0] is None or self._in_flight[0][0].done):
            self._free_stages.append(self._in_flight.popleft()[1])
        if len(self._in_flight) > 128:  # a stuck peer: forget the oldest (ZeroMQ keeps its own)
            self._in_flight.popleft()
        if self._free_stages:
            return self._free_stages.pop()
        return {name: np.zeros((self._rows, *shape), dtype) for name, dtype, shape in self._spec}

    def _flush(self, flags: int, info: Optional[Sequence[float]], multiplier: float = 1.0) -> bool:
        n, self._staged = self._staged, 0
        if self._broken:
            return False
        stage = self._stage
        tracker = self._send_chunk(
            {name: arr[:n] for name, arr in stage.items()}, flags, info, multiplier
        )
        if self._zero_copy:  # reused once ZeroMQ is done with it
            self._in_flight.append((tracker, stage))
            self._stage = self._new_stage()
        return not self._broken

    def _send_chunk(
        self,
        arrays: Mapping[str, np.ndarray],
        flags: int,
        info: Optional[Sequence[float]],
        multiplier: float = 1.0,
    ) -> Optional[zmq.MessageTracker]:
        """Encodes and sends one chunk of `arrays` (its rows); sets `_broken` when the send
        failed. Returns the tracker of its zero-copy frames (None: none, or nothing sent)."""
        values = dict(arrays)
        meta = (self.uuid, self._episode, self._index, multiplier)
        values.update(
            {
                name: np.array(x, dtype)  # 0-d arrays: the native encoder
                for (name, dtype), x in zip(CHUNK_SCALARS, meta)
            }
        )
        if info is not None:
            name, dtype, size = CHUNK_INFO
            values[name] = np.asarray(info, dtype).reshape(size)
        frames = codec.encode(Msg.CHUNK, values, flags=flags)
        tracked = []
        if self._zero_copy:
            for k in range(1, len(frames)):
                if frames[k].nbytes >= _COPY_THRESHOLD:
                    frames[k] = zmq.Frame(frames[k], track=True)
                    tracked.append(frames[k])
        with self._lock:
            ok = self._send(frames)
            if self.keepalive is not None:
                self.keepalive.sent()
        if not ok:
            self._broken = True
            return None
        n = len(next(iter(arrays.values())))
        self._index += 1
        self._episode_rows += n
        self.rows_sent += n
        return zmq.MessageTracker(*tracked) if tracked else None


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
