"""The server's sampling streams: a learner in its own process pulls batches of the server's
memory with several in flight, each distinct stored row sent once (central mode).

The learner's end is :class:`memoire.stream.SamplingStream`; the batch, its draw and its wire
layout are ``cpp/core/stream_batch.h``. One ROUTER socket serves every stream (a learner holds
a DEALER). Learners send STREAM messages (codec dicts, ``"op"`` says which):

- ``{"op": "open", "batch_size": n, "credit": c, "shared_memory": bool, "shm_ring": 2,
  "ahead": a, "compressed_rows": bool}``: opens (or reopens) the peer's stream with ``c``
  batches granted (``ahead`` optional, shared memory only: see below; ``compressed_rows``
  optional: the learner decodes LZ4 states); the reply is a STREAM
  ``{"op": "layout", "schema", "frame_stack", "multi_step", "flags", "batch_size",
  "max_credit"}`` (the layout is fixed from then on), with ``"compressed_rows": True`` when
  the rows travel in messages, the memory compresses its states and the learner asked: the
  states then travel as the memory's LZ4 blocks (``cpp/core/stream_batch.h``).
  With ``shared_memory`` (a learner on
  this host that speaks the server's ring version, ``_core.STREAM_RING_VERSION``) the server
  makes a file in /dev/shm holding the stream's ring (``cpp/core/stream_ring.h``) and ``c``
  slots, and adds ``"shm_path", "shm_slots", "shm_slot_bytes"``: it then samples each batch
  straight into a free slot in the learner's final layout (``get_batch``'s draw and arrays,
  ``BatchLayout`` in ``cpp/core/batch_layout.h``) and publishes its ``seq`` and ``slot`` in the
  ring; the learner gives each slot back through the ring once it has dropped its batch. No
  message per batch. The samplers keep at most ``ahead`` batches (1..c; by default the
  stream's threads + 1) drawn and not yet taken by the learner (the ring's notice tail), so
  that the learner reads a batch soon after it was written, from cache; the other slots are
  for batches the learner holds.
  Where that fails (no /dev/shm, over ``max_shm_bytes``, another ring version) the reply has
  no shm entries and the rows travel in the messages.
- ``{"op": "credit", "credit": k}``: ``k`` more batches may be sent (``k = 0`` is a ping: a
  peer the server does not know, e.g. after a restart, gets an ERROR saying so). A
  shared-memory stream sends pings only (its slots go back through the ring).
- ``{"op": "priorities", "ids": int64[m], "weights": float32[m]}``: the server's
  :meth:`update_priorities`, in order with the stream's other messages.
- ``{"op": "close"}``: drops the stream.

The server sends one STREAM_BATCH per credit, as its samplers draw them, or
an ERROR of kind ``SampleError`` for a draw that failed (it spends the credit; with shared
memory the ring's notice says so and the slot holds the reason; that peer's draws pause 50 ms),
and an ERROR for any request it refuses (no credit spent). So the batches in flight to a
learner never exceed its credit.

Limits (each refusal is counted in the server's ``rejected`` and answered with an ERROR; the
worker keeps serving): credit outstanding per stream at most ``max_credit``
(``stream_credit``); at most ``max_streams`` open streams (``stream_peers``); batch size as
remote calls (``batch_too_large``); malformed or wrong-version messages (``malformed``,
``version``); bad requests (``stream_request``); a peer with no open stream
(``stream_unknown``); bad priorities (``bad_priorities``). A stream silent for
``idle_timeout`` seconds is dropped (``stream_idle``). A shared-memory learner whose ring
gives back a slot it does not hold is dropped (``stream_credit``).

Threads: each worker loop (:meth:`SamplingService.worker_main`, one per endpoint) owns its
socket and its streams' table; it waits on the socket in C++ with the GIL released
(``_core.StreamHub.poll``). Every stream is sampled by ``threads`` native threads of its own,
with no Python per batch: a shared-memory stream's (``cpp/core/stream_sampler.h``: slots, the
rate limiter, the draw, the notice's order) trade notices and slots with the learner through
the ring, with no socket; a rows stream's (``cpp/core/stream_rows_sampler.h``: credit, the rate
limiter, the draw in order) hand their finished batches to the hub, which sends them from the
worker's thread while it polls (the socket has one user).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Dict, List, Optional

import numpy as np
import zmq

from memoire import _core, codec
from memoire.protocol import Msg
from memoire.server.workers import POLL_MS, Stats, Workers, decode, error_reply, log
from memoire.transport import native_libzmq

DEFAULT_MAX_CREDIT = 64
DEFAULT_MAX_STREAMS = 64
DEFAULT_IDLE_TIMEOUT = 600.0
DEFAULT_MAX_SHM_BYTES = 1 << 30  # one stream's shared-memory slots; larger ones use the wire
ERROR_PAUSE_S = 0.05  # after a failed draw (e.g. nothing sampleable yet), that stream waits
LIMITED_PAUSE_S = 0.002  # while the server's rate limiter holds samples back, a stream waits
SEND_TIMEOUT_MS = 1000
RECV_PER_STEP = 64


def default_stream_threads() -> int:
    """Sampler threads per stream by default: 1 below 4 cores, where one
    thread's copy (split with the memory's helper) already keeps the cores busy and a second
    only competes with the learner (2 cores: 1.03x of in-process ``get_batch`` with 1 thread,
    0.74x with 2; docs/STREAM.md); 2 from 4 cores, so that two batches are copied at once
    (16 cores: 1.4x with 2, 0.84x with 1). More threads help where more cores are free
    (`threads=`)."""
    return 2 if (os.cpu_count() or 1) >= 4 else 1


@dataclasses.dataclass
class _Stream:
    last_seen: float
    # _core.StreamShm: the ring and slots of a learner on this host; None: rows in messages.
    # Either way the stream's sampler threads are the worker's StreamHub's, which counts
    # credit, order and slots.
    shm: object = None


class SamplingService:
    """The sampling streams of one server (see the module docstring).

    Args:
      server: the :class:`memoire.server.ReplayMemoryServer` (its memory, ``check_batch``,
        ``update_priorities``).
      schema: the memory's fields as :func:`memoire.protocol.describe_schema` gives them.
      stats, workers: the server's counters and socket plumbing.
      max_credit: batches one stream may have granted and unsent at once.
      max_streams: open streams at once.
      idle_timeout: seconds after which a silent stream is dropped.
      max_shm_bytes: the largest shared-memory region one stream gets.
      threads: native sampler threads per stream (None:
        :func:`default_stream_threads`).
    """

    def __init__(
        self,
        server,
        schema,
        stats: Stats,
        workers: Workers,
        *,
        max_credit: int = DEFAULT_MAX_CREDIT,
        max_streams: int = DEFAULT_MAX_STREAMS,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        max_shm_bytes: int = DEFAULT_MAX_SHM_BYTES,
        threads: Optional[int] = None,
    ):
        self._server = server
        self._schema = schema
        self._stats = stats
        self._workers = workers
        self.max_credit = int(max_credit)
        self.max_streams = int(max_streams)
        self.idle_timeout = float(idle_timeout)
        self.max_shm_bytes = int(max_shm_bytes)
        self.threads = default_stream_threads() if threads is None else check_threads(threads)
        # The streams of each worker loop, by peer identity (identities are per socket).
        self._tables: List[Dict[bytes, _Stream]] = []
        self._hubs: List[object] = []  # each worker loop's _core.StreamHub

    @property
    def open_streams(self) -> int:
        return sum(len(t) for t in list(self._tables))

    @property
    def samplers_waiting(self) -> int:
        """Sampler threads waiting for their learner now, over every stream."""
        return sum(hub.samplers_waiting for hub in list(self._hubs))

    def worker_main(self, endpoint: str, mode: str = "Bind", threads: Optional[int] = None) -> None:
        """Serves sampling streams on a ROUTER socket until the server closes (each call its
        own socket and streams: several endpoints may run side by side, e.g. tcp and ipc).
        `threads`: sampler threads per stream here (None: :attr:`threads`)."""
        threads = self.threads if threads is None else check_threads(threads)
        check_native()
        sock = self._workers.open(zmq.ROUTER, endpoint, mode, "stream")
        hub = _core.StreamHub(sock.underlying)
        streams: Dict[bytes, _Stream] = {}
        self._tables.append(streams)
        self._hubs.append(hub)
        next_reap = [0.0]
        try:
            self._workers.serve([sock], lambda: self._step(sock, hub, streams, next_reap, threads))
        finally:
            hub.clear()
            self.sync_stats()
            self._tables.remove(streams)
            self._hubs.remove(hub)

    def sync_stats(self) -> None:
        """Adds the native samplers' counts (batches, rows, draw errors, limited) to the
        server's stats."""
        for hub in list(self._hubs):
            counts = {k: v for k, v in hub.take_counts().items() if v}
            if counts:
                with self._stats.lock:
                    for k, v in counts.items():
                        self._stats.counts[k] += v

    # ---- the loop

    def _step(
        self, sock, hub, streams: Dict[bytes, _Stream], next_reap: list, threads: int
    ) -> None:
        # The streams' batches need nothing here: their native samplers draw them; a rows
        # stream's go out in hub.poll, a shared-memory stream's through its ring.
        for k in range(RECV_PER_STEP):
            try:
                frames = hub.poll(0 if k else POLL_MS)
            except RuntimeError as e:  # a socket error: say so, do not spin on it
                self._stats.reject("internal", f"stream worker: {e}")
                time.sleep(POLL_MS / 1000)
                return
            if frames is None:
                break
            self._workers.guarded(
                lambda so, fr: self._handle(so, hub, streams, fr, threads),
                "stream worker",
                sock,
                frames,
            )
        for ident, why in hub.refusals():  # a learner that gave back a slot it did not hold
            self._drop(hub, streams, ident)
            self._refuse(sock, ident, "stream_credit", "ValueError", f"{why}: stream dropped")
        now = time.monotonic()
        if now >= next_reap[0]:
            next_reap[0] = now + 1.0
            self.sync_stats()
            for ident, s in list(streams.items()):
                idle = now - s.last_seen
                if s.shm is not None:
                    idle = min(idle, hub.idle_seconds(ident))
                if idle > self.idle_timeout:
                    self._drop(hub, streams, ident)
                    self._stats.reject("stream_idle", f"stream silent for {self.idle_timeout} s")

    def _drop(self, hub, streams: Dict[bytes, _Stream], ident: bytes) -> None:
        """Forgets the peer's stream (its samplers stop; shared memory goes with the last
        mapping, batches not yet sent are dropped)."""
        if streams.pop(ident, None) is not None:
            hub.remove(ident)

    # ---- requests

    def _reply(self, sock: zmq.Socket, ident: bytes, frames: list) -> None:
        sock.send_multipart([ident, *frames], copy=False)

    def _refuse(self, sock, ident: bytes, reason: str, kind: str, detail: str) -> None:
        self._stats.reject(reason, detail)
        self._reply(sock, ident, error_reply(kind, detail))

    def _handle(self, sock, hub, streams: Dict[bytes, _Stream], frames: list, threads: int) -> None:
        if len(frames) < 2:
            self._stats.reject("malformed", "stream: a message without a body")
            return
        ident = bytes(frames[0])
        msg = decode(self._stats, frames[1:], (Msg.STREAM,), self._workers.max_message_bytes)
        if msg is None:  # counted by decode
            self._reply(
                sock,
                ident,
                error_reply(
                    "ProtocolError",
                    "stream: malformed message or another wire version (expected "
                    f"a version {codec.WIRE_VERSION} STREAM message)",
                ),
            )
            return
        v = msg.values
        op = v.get("op")
        stream = streams.get(ident)
        if stream is not None:
            stream.last_seen = time.monotonic()
        if op == "open":
            self._open(sock, hub, streams, ident, v, threads)
        elif op in ("credit", "priorities", "close") and stream is None:
            self._refuse(
                sock,
                ident,
                "stream_unknown",
                "RuntimeError",
                "stream: no open stream for this peer (the server restarted or dropped "
                "it): open a new SamplingStream",
            )
        elif op == "credit":
            k = v.get("credit")
            if stream.shm is not None:
                self._shm_credit(sock, ident, k, v.get("slots"))
                return
            outstanding = hub.outstanding(ident)
            if not _is_int(k) or k < 0 or outstanding + int(k) > self.max_credit:
                self._refuse(
                    sock,
                    ident,
                    "stream_credit",
                    "ValueError",
                    f"stream: credit must be an int >= 0 keeping the outstanding credit "
                    f"<= {self.max_credit} (outstanding {outstanding}), got {k!r}",
                )
                return
            hub.grant(ident, int(k))
        elif op == "priorities":
            self._priorities(sock, ident, v)
        elif op == "close":
            self._drop(hub, streams, ident)
        else:
            self._refuse(
                sock,
                ident,
                "stream_request",
                "ValueError",
                f"stream: op must be 'open', 'credit', 'priorities' or 'close', got {op!r}",
            )

    def _shm_credit(self, sock, ident: bytes, k, slots) -> None:
        """A shared-memory stream's credit message: a ping (k = 0) is fine; its slots go back
        through the ring, so anything else is refused (and changes nothing)."""
        if _is_int(k) and k == 0 and slots is None:
            return
        self._refuse(
            sock,
            ident,
            "stream_credit",
            "ValueError",
            f"stream: a shared-memory stream gives its slots back through its ring; its only "
            f"credit message is a ping (credit 0), got {k!r} and {slots!r}",
        )

    def _open(
        self, sock, hub, streams: Dict[bytes, _Stream], ident: bytes, v: dict, threads: int
    ) -> None:
        n, credit = v.get("batch_size"), v.get("credit")
        if not _is_int(n):
            self._refuse(
                sock,
                ident,
                "stream_request",
                "ValueError",
                f"stream: batch_size must be an int, got {n!r}",
            )
            return
        try:
            n = self._server.check_batch(n, "stream")
        except ValueError as e:  # too large is counted by check_batch
            self._reply(sock, ident, error_reply("ValueError", str(e)))
            return
        if not _is_int(credit) or not 1 <= credit <= self.max_credit:
            self._refuse(
                sock,
                ident,
                "stream_credit",
                "ValueError",
                f"stream: credit must be an int in [1, max_credit={self.max_credit}], "
                f"got {credit!r}",
            )
            return
        ahead = v.get("ahead")
        if ahead is not None and (not _is_int(ahead) or not 1 <= ahead <= credit):
            self._refuse(
                sock,
                ident,
                "stream_request",
                "ValueError",
                f"stream: ahead must be an int in [1, credit={credit}], got {ahead!r}",
            )
            return
        if ident not in streams and self.open_streams >= self.max_streams:
            self._refuse(
                sock,
                ident,
                "stream_peers",
                "RuntimeError",
                f"stream: this server serves at most {self.max_streams} streams",
            )
            return
        rem = self._server.rem
        fs, ms = int(rem.frame_stack), int(rem.multi_step)
        flags = np.asarray(rem.cache_flags, np.bool_)
        nf = len(flags) // 2
        send = [bool(flags[f] or flags[nf + f]) for f in range(nf)]
        stream = _Stream(time.monotonic())
        self._drop(hub, streams, ident)  # a reopened stream's samplers and slots go first
        layout = {
            "op": "layout",
            "schema": [(f, d, np.asarray(s, np.int64)) for f, d, s in self._schema],
            "frame_stack": fs,
            "multi_step": ms,
            "flags": flags,
            "batch_size": n,
            "max_credit": self.max_credit,
        }
        if v.get("shared_memory") is True and v.get("shm_ring") == _core.STREAM_RING_VERSION:
            ahead = min(int(credit), threads + 1) if ahead is None else int(ahead)
            self._make_shm(hub, ident, stream, n, int(credit), rem, layout, threads, ahead)
        if stream.shm is None:
            # A memory that compresses its states sends them as stored, to a learner that
            # decodes them: a tenth of an Atari screen's bytes on the wire, no decoding here.
            compressed = v.get("compressed_rows") is True and bool(rem.compress_states)
            if compressed:
                layout["compressed_rows"] = True
            hub.add_rows(
                ident,
                rem,
                n,
                fs + min(ms, fs),
                send,
                compressed,
                int(credit),
                threads,
                self._server.rate_limiter,
                int(ERROR_PAUSE_S * 1000),
                int(LIMITED_PAUSE_S * 1000),
                SEND_TIMEOUT_MS,
            )
        streams[ident] = stream
        self._stats.count("streams_opened")
        self._reply(sock, ident, codec.encode(Msg.STREAM, layout))

    def _make_shm(
        self,
        hub,
        ident: bytes,
        stream: _Stream,
        batch_size: int,
        credit: int,
        rem,
        layout: dict,
        threads: int,
        ahead: int,
    ) -> None:
        """Gives `stream` its slots in shared memory (one per credit, each a whole batch in
        the learner's layout), sampled by `threads` threads keeping `ahead` batches ready, and
        says where in `layout`; on failure the stream uses the wire."""
        slot_bytes = _core.StreamShm.slot_bytes_for(rem, batch_size)
        if slot_bytes * credit > self.max_shm_bytes:
            self._stats.count("stream_shm_too_large")
            return
        try:
            shm = _core.StreamShm(rem, batch_size, credit)
        except (RuntimeError, ValueError) as e:  # no /dev/shm, no room: the wire will do
            log.info("stream: no shared memory (%s); batches go over the socket", e)
            self._stats.count("stream_shm_failed")
            return
        # Its samplers start now: the learner finds their notices in the ring once mapped.
        hub.add(
            ident,
            rem,
            shm,
            threads,
            ahead,
            self._server.rate_limiter,
            int(ERROR_PAUSE_S * 1000),
            int(LIMITED_PAUSE_S * 1000),
        )
        stream.shm = shm
        layout.update(shm_path=shm.path, shm_slots=credit, shm_slot_bytes=shm.slot_bytes)

    def _priorities(self, sock, ident: bytes, v: dict) -> None:
        ids, weights = v.get("ids"), v.get("weights")
        if not (
            isinstance(ids, np.ndarray)
            and isinstance(weights, np.ndarray)
            and ids.dtype == np.int64
            and weights.dtype == np.float32
            and ids.ndim == 1
            and ids.shape == weights.shape
        ):
            self._refuse(
                sock,
                ident,
                "bad_priorities",
                "ValueError",
                "stream: priorities need ids int64[m] and weights float32[m]",
            )
            return
        try:
            self._server.update_priorities(ids, weights)
        except ValueError as e:  # NaN, infinite or negative weights
            self._refuse(sock, ident, "bad_priorities", "ValueError", f"stream: {e}")
            return
        self._stats.count("stream_priority_updates")


def check_native() -> None:
    """RuntimeError unless memoire's native message path is on (the stream's socket is read
    and written in C++)."""
    if not native_libzmq():
        raise RuntimeError(
            "sampling streams need memoire's native message path (pyzmq's libzmq, see "
            "memoire.transport.native_libzmq; MEMOIRE_NATIVE_ZMQ=0 turns it off)"
        )


def check_threads(threads) -> int:
    """`threads` as sampler threads per stream (an int in [1, 64]), else ValueError."""
    if not _is_int(threads) or not 1 <= threads <= 64:
        raise ValueError(f"stream threads: expected an int in [1, 64], got {threads!r}")
    return int(threads)


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
