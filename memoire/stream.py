"""A learner's sampling stream: batches of a server's memory, pulled with several in flight.

``RemoteMemory.sample`` makes one synchronous request per batch. A :class:`SamplingStream`
instead opens a stream on the server's stream endpoint (:meth:`memoire.ReplayMemoryServer.
start_stream`) and grants it ``credit`` batches: the server samples and sends them as fast as
it can, each distinct stored row once (an Atari batch of stack 4 carries 5 frames per
transition, not 8), and the learner returns credit as it consumes. On arrival a native thread
(no GIL) stacks each batch into a ring of reusable host buffers (the prefetching feed,
:mod:`memoire.feed`), so ``next(stream)`` is a hand-over::

    server.start_stream("ipc:///tmp/memoire-stream")          # or tcp://host:port
    with SamplingStream(endpoint, batch_size=32) as stream:
        for step in range(num_steps):
            batch = next(stream)                                # memoire.Batch
            ...
            stream.update_priorities(batch.id, new_weights)     # same connection

Batches are exactly :meth:`memoire.ReplayMemory.get_batch`'s: ``prev``/``next`` tuples of 7
arrays ``dtype[B, frame_stack, *shape]`` (None where the server's ``cache_flags`` leave a field
out), ``weight`` float32[B], ``prob`` float64[B], ``done`` bool[B], ``id`` int64[B], plus the
``num_sampleable`` and ``total_weight`` attributes (as :meth:`RemoteMemory.sample`). A stream
is the only sampler of a server's memory seeded with ``seed``: it returns the batches that
memory's ``get_batch`` would, bit for bit, in the same order (with ``connections`` > 1: the
same batches, in the order they arrive). The layout (frame stack, multi-step, cache flags) is
fixed when the stream opens; a later change of the server's frame_stack or multi_step makes the
next batch raise (open a new stream).

In flight: at most ``credit`` batches are granted and unsent or on the wire (per connection),
and ``depth`` more wait stacked in the ring. Over the socket credit goes back
``max(1, credit // 2)`` batches at a time; with shared memory a slot goes back as soon as its
batch is dropped.
Prioritized replay: a priority update is sent at once (or within a few milliseconds when the
receiving thread holds the socket) and applied by the server in order with the stream's other
messages; batches already sampled (at most ``credit + depth``) predate it.

Errors: no batch within ``timeout`` seconds (a dead, stopped or unreachable server) raises
TimeoutError; a restarted server does not know the stream and says so (RuntimeError naming
it) within ``timeout``; a draw the server could not make (nothing sampleable yet) raises
RuntimeError with its reason on the ``next`` that receives it, and the stream goes on.

Transport: ``tcp://`` across hosts, ``ipc://`` on one host, with CURVE keys as every memoire
socket. On one host (``shared_memory``, by default for ``ipc://`` and loopback ``tcp://``) the
server samples each batch straight into a slot of a file in /dev/shm that the learner maps,
in the final layout, and ``next`` hands out views of that slot: no copy on the learner's side,
and no message per batch: the batch's number and slot come through a ring in the same file,
and so do the slots going back (the socket carries the open, pings, priorities and the
server's refusals). One slot per credit; a slot goes back to the server once every array of
its batch is dropped, so a batch the learner keeps holds one slot (holding all ``credit`` of
them makes ``next`` raise RuntimeError). ``depth`` is unused there: the ``credit`` slots are
the ring, of which the server keeps only ``ahead`` (a few) drawn and not yet taken, so that a
batch is read soon after it was written. The learner removes the file's name once mapped, so
a crash leaves nothing. Where the server cannot make the file, or the learner
cannot map it, the rows travel in the messages. There, a server whose memory compresses its
states (``compress_states``) sends each distinct state as its stored LZ4 block (an Atari screen
in about a tenth of its bytes), which this learner's receiving thread decodes
(``compressed_rows`` is then True). Needs memoire's native message path (pyzmq's
libzmq, :func:`memoire.transport.native_libzmq`). One consumer thread per stream.

A learner with a GPU passes ``device`` (as :class:`memoire.feed.Feed`'s): a native thread
copies each batch into a device slot, on one host straight from the server's shared-memory
slot (which goes back to the server once copied), and ``next`` lends the slot's arrays.
"""

from __future__ import annotations

import gc
import logging
import math
import time
import weakref
from typing import Any, Optional

import numpy as np
import zmq

from memoire import _core, codec, transport
from memoire.codec import Msg, ProtocolError
from memoire.feed import Feed, _close_native
from memoire.memory import Batch
from memoire.remote import raise_for_error
from memoire.transport import DEFAULT_TIMEOUT, CurveKeys, native_libzmq, open_socket

__all__ = ["SamplingStream"]

log = logging.getLogger(__name__)

PING_S = 0.5  # while waiting for a batch, the learner pings this often (a restart is noticed)
GOODBYE_LINGER_MS = 250  # at close, how long the goodbye may wait to leave


def _layout_key(layout: dict) -> tuple:
    """What every connection of a stream must agree on: one memory's batch layout, sent the
    same way."""
    return (
        repr(layout["schema"]),
        int(layout["frame_stack"]),
        int(layout["multi_step"]),
        tuple(bool(f) for f in layout["flags"]),
        layout.get("compressed_rows") is True,
    )


def _close_stream(sources, feed_holder: list, socks: list, ctx: zmq.Context) -> None:
    """Stops the receiving threads, then says goodbye and closes the sockets (in that order:
    a thread uses its socket until it is joined)."""
    for source in sources:
        source.stop()
    _close_native(feed_holder)
    for sock in socks:
        try:
            sock.send_multipart(codec.encode(Msg.STREAM, {"op": "close"}), zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            pass  # a full queue to a gone server: nothing to say goodbye to
        # A moment for the goodbye to leave: dropped, it would leave the server's end (its
        # sampler threads, its credit) to the idle timeout. A gone server costs that moment.
        sock.close(linger=GOODBYE_LINGER_MS)
    ctx.term()


class SamplingStream:
    """Batches of a server's memory pulled over a sampling stream (see the module docstring).

    Args:
      endpoint: the server's stream endpoint (:meth:`ReplayMemoryServer.start_stream`).
      batch_size: rows per batch, 1..the server's ``max_batch``.
      credit: batches the server may send ahead, 1..its ``max_credit`` (64 by default); with
        shared memory also the slots (an Atari batch of 32 takes a 1.8 MB slot). More credit
        hides more latency (it mattered on a loaded machine) but lets more batches predate a
        priority update (at most credit + depth).
      depth: batches stacked ahead in the learner's ring (>= 1; unused with shared memory,
        where the server's slots are the ring).
      ahead: with shared memory, the batches the server keeps drawn and not yet taken, at most
        (1..credit; None: the server's sampler threads + 1). Few is faster for a learner
        slower than the server: it reads each batch soon after it was written, from cache (an
        Atari batch copied out of its slot took 0.17 ms that way against 0.35 ms from 32
        batches back, on 2 cores); the rest of the ``credit`` slots are for batches the
        learner holds.
      timeout: seconds to wait for the server's answer to the open and for each batch.
      keys: :class:`memoire.transport.CurveKeys` (client side) when the server uses CURVE.
      max_bytes: the largest message accepted from the server.
      shared_memory: rows through shared memory (the server must be on this host); None: for
        ``ipc://`` and loopback ``tcp://`` endpoints, falling back to the socket when the
        mapping fails.
      connections: rows in messages only (unused with shared memory): the stream's batches
        come over this many connections, each a stream of the server's with ``credit`` of its
        own, received by a native thread each (<= ``depth``). One connection's receive (the
        kernel's copy on ZeroMQ's I/O thread, then the stacking) is what bounds a stream of
        large batches on a learner with cores to spare; every connection is another of each.
        With more than one the batches are still the memory's draws, each exactly once, but
        in the order they arrive (each connection keeps its own order).
      device: where batches go, as :class:`memoire.feed.Feed`'s ``device`` (``"jax"``, a
        ``jax.Device``, ``"cuda"``, ``"cuda:N"``, ``"cpu"``, a ``torch.device``): a native
        thread copies each batch into a device slot, from the server's shared-memory slot
        itself on one host (no copy in between), and ``next`` lends the slot's arrays
        (give them back with :meth:`release`, as the feed's). None: host numpy batches.
      device_slots: the device ring's slots (with ``device``).

    Attributes (fixed at the open): ``shared_memory`` (the batches are views of the server's
    slots), ``connections`` (1 with shared memory), ``compressed_rows`` (over the socket, the
    states arrive as the server's stored LZ4 blocks and are decoded here), ``frame_stack``,
    ``multi_step``, ``cache_flags``.

    Raises:
      ValueError: a bad argument, or one the server refused (batch size, credit).
      TimeoutError: the server did not answer the open within `timeout`.
      RuntimeError: the native message path is off, or the server refused the stream.
    """

    __feed_stream__ = True  # what memoire.feed knows it by (it cannot import this module)

    def __init__(
        self,
        endpoint: str,
        batch_size: int,
        *,
        credit: int = 32,
        depth: int = 4,
        ahead: Optional[int] = None,
        timeout: float = DEFAULT_TIMEOUT,
        keys: Optional[CurveKeys] = None,
        max_bytes: int = codec.DEFAULT_MAX_BYTES,
        shared_memory: Optional[bool] = None,
        connections: int = 1,
        device: Any = None,
        device_slots: int = 3,
    ):
        for name, value in (
            ("batch_size", batch_size),
            ("credit", credit),
            ("depth", depth),
            ("connections", connections),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if connections > depth:
            raise ValueError(
                f"connections: expected <= depth ({depth}): each connection's thread stacks "
                f"into a slot of its own, got {connections}"
            )
        if ahead is not None and (
            isinstance(ahead, bool)
            or not isinstance(ahead, (int, np.integer))
            or not 1 <= ahead <= credit
        ):
            raise ValueError(
                f"ahead: expected None or an int in [1, credit={credit}], got {ahead!r}"
            )
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
        if not native_libzmq():
            raise RuntimeError(
                "SamplingStream needs memoire's native message path (pyzmq's "
                "libzmq as a shared library; MEMOIRE_NATIVE_ZMQ must not be 0)"
            )
        self.endpoint = endpoint
        self._batch_size = int(batch_size)
        self.credit = int(credit)
        self._ahead = None if ahead is None else int(ahead)
        self._timeout, self._max_bytes = timeout, max_bytes
        # One ZeroMQ I/O thread per connection: a connection's receive is one thread's work.
        self._ctx = zmq.Context(io_threads=int(connections))
        self._socks = []

        def connect() -> zmq.Socket:
            sock = open_socket(
                self._ctx,
                zmq.DEALER,
                endpoint,
                "Conn",
                keys=keys,
                server_side=False,
                max_bytes=max_bytes,
            )
            self._socks.append(sock)
            return sock

        auto = shared_memory is None
        shm = not transport.beyond_loopback(endpoint) if auto else bool(shared_memory)
        sources = []
        try:
            sock = connect()
            while True:
                layout = self._open(sock, shm)
                try:
                    source = self._source_of(sock, layout)
                except RuntimeError:
                    if not (auto and shm):
                        raise
                    # Not mappable here (another host?): a new stream over the socket alone,
                    # on a new connection (batches of the first may be on their way).
                    shm = False
                    sock.send_multipart(codec.encode(Msg.STREAM, {"op": "close"}), copy=False)
                    sock.close(0)
                    self._socks.remove(sock)
                    sock = connect()
                    continue
                break
            self.frame_stack = int(layout["frame_stack"])
            self.multi_step = int(layout["multi_step"])
            self.cache_flags = np.asarray(layout["flags"], np.bool_)
            self.shared_memory = "shm_path" in layout
            self.compressed_rows = layout.get("compressed_rows") is True
            sources.append(source)
            # Rows in messages: the other connections, each a stream of the same memory.
            for _ in range(0 if self.shared_memory else int(connections) - 1):
                more = self._open(connect(), False)
                if _layout_key(more) != _layout_key(layout):
                    raise ProtocolError(
                        f"SamplingStream: {endpoint} gave its connections different layouts"
                    )
                sources.append(self._source_of(self._socks[-1], more))
            self._sources = tuple(sources)
            self._source = sources[0]  # the first connection's: priorities go through it
            self.connections = len(sources)
            # With shared memory the server's slots are the ring: no feed, no copy; with a
            # device they are the host ring the device path copies from.
            self._feed_made = self.shared_memory and device is None
            self._feed = (
                None
                if self._feed_made
                else Feed(
                    self,
                    self._batch_size,
                    depth=depth,
                    threads=self.connections,
                    device=device,
                    device_slots=device_slots,
                )
            )
        except BaseException:
            # Streams the server opened (the first connection's, when another failed) hear
            # goodbye rather than wait for the idle timeout.
            _close_stream(sources, [], self._socks, self._ctx)
            raise
        self._last_batch = time.monotonic()  # when next last returned a batch (or the open)
        self._timeouts = 0  # TimeoutErrors since then
        self._gaps = 0  # ProtocolErrors since then (a batch missing in a connection's order)
        holder = [] if self._feed is None else self._feed._holder
        self._finalizer = weakref.finalize(
            self, _close_stream, self._sources, holder, self._socks, self._ctx
        )

    def _open(self, sock: zmq.Socket, shm: bool) -> dict:
        """Opens a stream on `sock` (granting the first credit) and returns the server's
        layout."""
        timeout = self._timeout
        no_answer = TimeoutError(
            f"SamplingStream: no answer from {self.endpoint} within "
            f"{timeout} s (is a server's stream worker running there?)"
        )
        # A DEALER has no pipe to send into while the server refuses its CURVE handshake, and
        # the send would then block for ever: bound it by the timeout too (as RequestClient's).
        sock.sndtimeo = int(timeout * 1000)
        try:
            sock.send_multipart(
                codec.encode(
                    Msg.STREAM,
                    {
                        "op": "open",
                        "batch_size": self._batch_size,
                        "credit": self.credit,
                        "shared_memory": shm,
                        "shm_ring": _core.STREAM_RING_VERSION,
                        "compressed_rows": True,  # this learner decodes LZ4 states
                        **({} if self._ahead is None else {"ahead": self._ahead}),
                    },
                ),
                copy=False,
            )
        except zmq.Again:
            raise no_answer from None
        finally:
            sock.sndtimeo = -1
        if not sock.poll(int(timeout * 1000)):
            raise no_answer
        frames = sock.recv_multipart()
        try:
            msg = codec.decode(frames, max_bytes=self._max_bytes, expect=(Msg.STREAM, Msg.ERROR))
        except ProtocolError as e:
            raise ProtocolError(f"SamplingStream: bad reply from {self.endpoint}: {e}") from None
        if msg.type == Msg.ERROR:
            raise_for_error(msg, "SamplingStream")
        v = msg.values
        if v.get("op") != "layout" or v.get("batch_size") != self._batch_size:
            raise ProtocolError(f"SamplingStream: unexpected reply from {self.endpoint}")
        return v

    def _source_of(self, sock: zmq.Socket, layout: dict):
        """The native end of the stream `sock` opened with `layout` (RuntimeError where its
        shared-memory file cannot be mapped)."""
        templates = [
            np.zeros(tuple(int(d) for d in shape), np.dtype(dtype))
            for _, dtype, shape in layout["schema"]
        ]
        chunk = max(1, self.credit // 2)
        return _core.StreamSource(
            sock.underlying,
            templates,
            self._batch_size,
            int(layout["frame_stack"]),
            int(layout["multi_step"]),
            [bool(f) for f in layout["flags"]],
            int(self._timeout * 1000),
            int(PING_S * 1000),
            chunk,
            codec.encode(Msg.STREAM, {"op": "credit", "credit": chunk}),
            codec.encode(Msg.STREAM, {"op": "credit", "credit": 0}),
            int(self._max_bytes),
            str(layout.get("shm_path", "")),
            int(layout.get("shm_slots", 0)),
            int(layout.get("shm_slot_bytes", 0)),
            layout.get("compressed_rows") is True,
        )

    # ---- the learner's side

    def __iter__(self) -> "SamplingStream":
        return self

    def __next__(self) -> Batch:
        """The next batch (see the module docstring); blocks until one is there.

        A learner may simply call again after a TimeoutError (a partition, a server busy for
        a while): the stream goes on where it stopped once batches come again, and says so in
        one log line (how long it went without, and that nothing was lost: each connection
        checks that its batches follow on, and a gap raises ProtocolError).

        Raises:
          TimeoutError: none came within ``timeout``. RuntimeError: the server refused (its
          reason), the stream is closed, or (shared memory) the learner holds every slot.
        """
        try:
            batch = self._next()
        except TimeoutError:
            self._timeouts += 1
            raise
        except ProtocolError:
            self._gaps += 1  # a batch missing in a connection's order, among others
            raise
        if self._timeouts:
            log.warning(
                "SamplingStream %s: batches again after %.1f s without one (%d timeout(s) of "
                "%g s); %s",
                self.endpoint,
                time.monotonic() - self._last_batch,
                self._timeouts,
                self._timeout,
                f"{self._gaps} gap(s) in the stream's order (ProtocolError raised)"
                if self._gaps
                else "lost none, the stream went on in order",
            )
            self._timeouts = 0
        self._gaps = 0
        self._last_batch = time.monotonic()
        return batch

    def _next(self) -> Batch:
        if self._feed is not None:
            return next(self._feed)
        if not self._finalizer.alive:
            raise RuntimeError("the stream is closed")
        try:
            try:
                parts = self._source.take()
            except RuntimeError as e:
                if not hasattr(e, "held"):
                    raise
                gc.collect()  # a batch in a reference cycle still holds its slot
                parts = self._source.take()
        except RuntimeError as e:
            if hasattr(e, "timeout"):  # a silent server
                raise TimeoutError(str(e)) from None
            raise
        batch = Batch(tuple(parts[0:7]), tuple(parts[7:14]), *parts[14:18])
        batch.num_sampleable, batch.total_weight = int(parts[18][0]), float(parts[19][0])
        return batch

    def take(self) -> Batch:
        """Same as ``next(stream)``."""
        return next(self)

    def release(self, after=None) -> None:
        """With ``device``: gives the last batch's device slot back once ``after`` is ready
        (:meth:`memoire.feed.Feed.release`); a no-op otherwise."""
        if self._feed is not None:
            self._feed.release(after)

    def update_priorities(self, ids, weights) -> None:
        """Sets sampling weights of the server's entries by id (``batch.id``), over the
        stream's connection; the server applies them in order with the stream's messages and
        skips stale ids. Invalid weights are refused here (ValueError), before sending."""
        ids = np.ascontiguousarray(ids, np.int64).reshape(-1)
        weights = np.ascontiguousarray(weights, np.float32).reshape(-1)
        if ids.shape != weights.shape:
            raise ValueError(f"update_priorities: {ids.size} ids but {weights.size} weights")
        if not np.all(np.isfinite(weights)) or np.any(weights < 0):
            raise ValueError("update_priorities: weights must be finite and >= 0")
        if self._finalizer is not None and not self._finalizer.alive:
            raise RuntimeError("update_priorities: the stream is closed")
        self._source.post(
            codec.encode(Msg.STREAM, {"op": "priorities", "ids": ids, "weights": weights})
        )

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def received(self) -> int:
        """Batches received from the server so far (over every connection)."""
        return sum(source.received for source in self._sources)

    def close(self) -> None:
        """Stops receiving, tells the server, closes the socket. Batches already handed out
        stay valid; a later ``next`` raises RuntimeError. Idempotent."""
        if self._feed is not None:
            self._feed.close()
        self._finalizer()

    def __enter__(self) -> "SamplingStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
