"""The central service (central mode): actors stream episodes in CHUNK messages into a chunk
ingest, which stores finished episodes into a memory the learner samples
(:meth:`CentralService.sample`) and reprioritizes (:meth:`CentralService.update_priorities`);
and the seed's client counters (:class:`ClientCounters`, COUNTER messages).

The chunk ingest is given, built over whatever store it fills (for a memory,
``_core.ChunkIngest(memory, ...)``); the service only needs its methods ``ingest(frames)``,
``receive(address, timeout_ms)``, ``reap()``, ``listen()``, ``counters()`` and its limits
``open_episode_timeout``, ``peer_timeout``, ``max_open_episodes``, ``max_episode_bytes``,
``max_open_bytes``.

Threads and ownership: the ingest is the only writer of the memory's episodes and is fed from
the PULL worker thread (:meth:`CentralService.take`, or :meth:`CentralService.receive` in C++
with the GIL released); sampling and priority updates come from learner threads or REP
workers. Neither the ingest nor the memory is owned: the caller builds them and keeps them.
:class:`ClientCounters` is called from REP workers; its lock guards its tables.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from memoire import _core, codec
from memoire.experience import log_returned
from memoire.memory import Batch
from memoire.protocol import INGEST_COMMITTED, QVEST, WIRE_VERSION, Msg
from memoire.rate_limiter import DEFAULT_TIMEOUT
from memoire.server.workers import POLL_MS, Stats, error_reply
from memoire.transport import ConnectionWatch, log_dropped

log = logging.getLogger("memoire.server")

DEFAULT_MAX_COUNTER_CLIENTS = 65536
COUNTER_MAX = 2**53 - 1  # largest count a client may report (exact in a float64)
_INT64_MAX = 2**63 - 1  # totals saturate here (the wire's integers are int64)
POLL_S = POLL_MS / 1000  # a blocked ingest checks for close() this often


def default_stream_budgets(schema: Sequence[tuple], max_step: int) -> Tuple[int, int]:
    """``(max_episode_bytes, max_open_bytes)`` defaults for a memory of `max_step` entries of
    `schema` (see :class:`memoire.ReplayMemoryServer`): one stream may hold a full-length
    episode as sent (at most 256 MiB of it) plus 32 MiB of chunk overhead (8192 chunks); all
    streams together as much as the memory itself, at least 64 MiB and at most 4 GiB."""
    row = 4  # init_w
    for name, dtype, shape in schema:
        if name != QVEST:  # computed by the server, not sent
            row += np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
    episode = row * int(max_step)
    return min(episode, 256 << 20) + (32 << 20), max(64 << 20, min(episode, 4 << 30))


class CentralService:
    """Episode chunks in, batches out (see the module docstring).

    Args:
      ingest: the chunk ingest (e.g. ``_core.ChunkIngest(memory, ...)``).
      memory: the store the ingest fills and the learner samples (a
        :class:`memoire.ReplayMemory`: ``get_batch``, ``update_weights``).
      stats: counters to report into (``episodes_in``, ``steps_in``, ``batches``,
        ``rows_sampled``); its condition wakes :meth:`wait_rows_in`.
      closing: set when the server closes (ends waits).
      limiter: a :mod:`memoire.rate_limiter` limiter (None: none). Inserts are counted here
        as episodes are stored; while it blocks inserts, chunks are not pulled from the
        socket (high-water marks then hold the actors back); :meth:`sample` waits for it.
    """

    def __init__(
        self, ingest: Any, memory: Any, stats: Stats, closing: threading.Event, limiter: Any = None
    ):
        self.ingest = ingest
        self.memory = memory
        self._stats = stats
        self._closing = closing
        self.limiter = limiter

    # ---- chunks in (PULL worker)

    def take(self, frames: list) -> bool:
        """Ingests one received message if it is a chunk (checked and stored natively);
        False when it is not one (the caller decodes it another way)."""
        if (
            self.limiter is not None
            and frames
            and _core.peek_header(frames[0]) == (WIRE_VERSION, Msg.CHUNK)
        ):
            self._await_insert()  # the loop pulls nothing more meanwhile
        got = self.ingest.ingest(frames)
        if got is None:
            return False
        outcome, rows, reason, count, detail = got
        if outcome == INGEST_COMMITTED:
            self._taken(1 if rows else 0, rows, ())
        elif reason is not None:
            self._taken(0, 0, ((reason, count, detail),))
        return True

    def receive(self, address: int, timeout_ms: int) -> Optional[list]:
        """Takes chunks from a PULL socket (its ``underlying`` address) in C++ for up to
        `timeout_ms`; returns the frames of the first other message, or None. While the
        limiter blocks inserts it waits (up to `timeout_ms`) without touching the socket."""
        if self.limiter is not None and not self.limiter.await_insert(
            timeout_ms / 1000, raise_on_timeout=False
        ):
            return None
        episodes, rows, rejected, frames = self.ingest.receive(address, timeout_ms)
        self._taken(episodes, rows, rejected)
        return frames

    def reap(self) -> None:
        """Drops open episodes with no chunk for open_episode_timeout (cheap: rate-limited by the ingest)
        and, while the limiter lets inserts in (the worker reads its socket), those of actors
        silent past peer_timeout of listening (``listen``). While it holds inserts back, the
        worker does not read, and a live actor's silence is not counted."""
        self.ingest.reap()
        if self.limiter is None or self.limiter.can_insert(1):
            self._taken(0, 0, self.ingest.listen())
        log_returned(log, self.ingest)

    def _taken(self, episodes: int, rows: int, rejected) -> None:
        """Stored episodes wake wait_rows_in; rejections (counted by the ingest, by reason)
        are logged, sparsely under a flood."""
        if episodes:
            if self.limiter is not None:
                self.limiter.inserted(rows)
            with self._stats.cond:
                self._stats.counts["episodes_in"] += episodes
                self._stats.counts["steps_in"] += rows
                self._stats.cond.notify_all()
        for reason, count, detail in rejected:
            log_dropped(log, "a chunk", reason, count, detail)

    @property
    def rows_in(self) -> int:
        """Entries stored from actors' episodes."""
        return self._stats.get("steps_in")

    def wait_rows_in(self, count: int, timeout: float) -> bool:
        """Waits until :attr:`rows_in` reaches `count` or `timeout` seconds pass (or the server
        closes). Returns whether it was reached."""
        deadline = time.monotonic() + float(timeout)
        with self._stats.cond:
            while self._stats.counts["steps_in"] < count and not self._closing.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._stats.cond.wait(left)
            return self._stats.counts["steps_in"] >= count

    def counters(self) -> Dict[str, Any]:
        """The ingest's counters merged for :meth:`memoire.ReplayMemoryServer.stats`:
        ``chunks`` (when any), ``open_streams``, ``open_stream_bytes``, ``rejected``,
        ``memory_size``, ``memory_episodes``."""
        c = self.ingest.counters()
        out = {
            "rejected": c["rejected"],
            "open_streams": c["open_streams"],
            "open_stream_bytes": c["open_bytes"],
            "memory_size": int(self.memory.size),
            "memory_episodes": int(self.memory.num_episode()),
        }
        if c["chunks"]:
            out["chunks"] = c["chunks"]
        if self.limiter is not None:
            out["rate_limiter"] = self.limiter.counters()
        return out

    # ---- batches out (learner)

    def _await_insert(self) -> None:
        """Waits until the limiter lets one more transition in (or the server closes)."""
        while not self.limiter.await_insert(POLL_S, raise_on_timeout=False):
            if self._closing.is_set():
                return

    def sample(self, batch_size: int, timeout: Optional[float] = None) -> Batch:
        """A batch from the memory: see :meth:`memoire.ReplayMemory.get_batch`. With a
        limiter, first waits up to `timeout` seconds (None:
        :data:`memoire.rate_limiter.DEFAULT_TIMEOUT`) until it allows ``batch_size`` samples.

        Raises:
          TimeoutError: the limiter blocked for `timeout` (the message gives its state).
        """
        if self.limiter is not None:
            self.limiter.await_sample(
                int(batch_size), DEFAULT_TIMEOUT if timeout is None else float(timeout)
            )
        return self._draw(batch_size)

    def try_sample(self, batch_size: int) -> Optional[Batch]:
        """A batch as :meth:`sample`, or None at once when the limiter blocks it."""
        if self.limiter is not None and not self.limiter.await_sample(
            int(batch_size), 0.0, raise_on_timeout=False
        ):
            return None
        return self._draw(batch_size)

    def _draw(self, batch_size: int) -> Batch:
        b = self.memory.get_batch(int(batch_size))
        with self._stats.lock:
            self._stats.counts["batches"] += 1
            self._stats.counts["rows_sampled"] += len(b)
        return b

    def update_priorities(self, ids, weights) -> int:
        """Sets sampling weights of entries by id; stale ids are skipped. Returns how many
        were updated."""
        return int(
            self.memory.update_weights(np.asarray(ids, np.int64), np.asarray(weights, np.float32))
        )


class PeerStreams:
    """The connections of the PULL socket, counted (``peer_connects``, ``peer_disconnects`` in
    `stats`) through ZeroMQ's socket monitor. Which actors are alive is not decided here: the
    chunk ingest tracks each actor by the uuid in its chunks and keepalives and drops exactly
    the open episode of one it has not heard from for ``peer_timeout`` seconds
    (``rejected["peer_lost"]``, see ``_core.ChunkIngest``): a connection does not say which
    actor it carried, and a frozen actor's connection never closes.

    Owned by the PULL worker's thread: :meth:`poll` from its loop, :meth:`close` when it ends.
    """

    def __init__(self, sock, stats: Stats):
        self._watch = ConnectionWatch(sock)
        self._stats = stats

    def poll(self) -> None:
        opened = self._watch.opened
        closed = self._watch.poll()
        if self._watch.opened != opened:
            self._stats.count("peer_connects", self._watch.opened - opened)
        if closed:
            self._stats.count("peer_disconnects", len(closed))

    def close(self) -> None:
        self._watch.close()


class ClientCounters:
    """The seed's counters: each client reports its cumulative episode and step counts
    (COUNTER); the server keeps totals (a retried report is counted once).

    Args:
      stats: where refusals are counted (``counter_range``, ``counter_clients``,
        ``malformed``).
      max_clients: distinct client uuids kept; reports from further clients are refused.
    """

    def __init__(self, stats: Stats, max_clients: int = DEFAULT_MAX_COUNTER_CLIENTS):
        if int(max_clients) < 1:
            raise ValueError(f"max_counter_clients: expected >= 1, got {max_clients}")
        self.max_clients = int(max_clients)
        self._stats = stats
        self._lock = threading.Lock()
        self._per_client: Dict[int, Tuple[int, int]] = {}
        self.total_episodes = 0  # read without the lock: an int is swapped whole
        self.total_steps = 0

    @property
    def clients(self) -> int:
        with self._lock:
            return len(self._per_client)

    def handle(self, msg: codec.Message) -> list:
        """The reply frames to a COUNTER message: the totals, or an ERROR."""
        v = msg.values
        try:
            uuid, episodes, steps = int(v["uuid"]), int(v["episodes"]), int(v["steps"])
        except (KeyError, TypeError, ValueError):
            self._stats.reject("malformed", "counter: expected uuid, episodes and steps")
            return error_reply("ProtocolError", "counter: expected uuid, episodes and steps")
        if not (0 <= episodes <= COUNTER_MAX and 0 <= steps <= COUNTER_MAX):
            self._stats.reject(
                "counter_range",
                f"counter from {uuid:08x}: episodes={episodes}, steps={steps} outside [0, 2**53-1]",
            )
            return error_reply(
                "ValueError",
                f"counter: episodes and steps must be in [0, "
                f"{COUNTER_MAX}], got episodes={episodes}, steps={steps}",
            )
        with self._lock:
            full = uuid not in self._per_client and len(self._per_client) >= self.max_clients
            if not full:
                prev_e, prev_s = self._per_client.get(uuid, (0, 0))
                # Totals saturate instead of outgrowing the wire's int64.
                self.total_episodes = min(
                    _INT64_MAX, self.total_episodes + max(0, episodes - prev_e)
                )
                self.total_steps = min(_INT64_MAX, self.total_steps + max(0, steps - prev_s))
                self._per_client[uuid] = (max(prev_e, episodes), max(prev_s, steps))
            totals = {"total_episodes": self.total_episodes, "total_steps": self.total_steps}
        if full:
            self._stats.reject(
                "counter_clients",
                f"counter from a new client {uuid:08x}: "
                f"max_counter_clients={self.max_clients} already counted",
            )
            return error_reply(
                "RuntimeError",
                f"counter: this server counts at most "
                f"{self.max_clients} clients (max_counter_clients)",
            )
        return codec.encode(Msg.COUNTER_REPLY, totals)

    def totals(self) -> Tuple[int, int]:
        """(total episodes, total steps), read together."""
        with self._lock:
            return self.total_episodes, self.total_steps
