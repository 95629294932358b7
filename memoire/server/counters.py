"""The live counters of a replay memory server, per interval: the figures (as TensorBoard
scalars, tag -> number) and the one line ``memoire serve`` logs, both from
:meth:`~memoire.server.ReplayMemoryServer.stats`; :class:`ServerCounters` takes them interval
after interval and writes the figures to TensorBoard event files (``memoire serve
--tensorboard``, :mod:`memoire.tensorboard`)."""

from __future__ import annotations

import time
from typing import Optional

from memoire.tensorboard import SummaryWriter


def counter_scalars(now: dict, before: dict, seconds: float, cache_size: int, memory=None) -> dict:
    """The figures of one interval, as TensorBoard scalars (tag -> number).

    Args:
      now, before: :meth:`ReplayMemoryServer.stats` at the end and start of the interval.
      seconds: the interval's length.
      cache_size: rows per cache (a cache received counts as that many inserts).
      memory: the server's ReplayMemory, for its priority weights (None: left out).

    ``replay/``: ``size`` (entries in the memory), ``episodes`` (episodes in the memory),
    ``inserts`` and ``samples`` (cumulative rows),
    ``inserts_per_s``, ``samples_per_s``, ``batches_per_s``, ``priority_total`` (the sum of
    the sampling weights) and ``priority_mean`` (per sampleable entry; the memory keeps the sum,
    not each weight, so no wider spread is read without a scan). ``server/``: ``caches_held``,
    ``episodes`` (reported by clients' ``update_counter``), ``open_streams``, ``open_stream_bytes``, ``rejected`` and
    ``rejected/<reason>``.
    """
    dt = max(seconds, 1e-9)

    def inserted(s):
        return s.get("steps_in", 0) + cache_size * s.get("caches", 0)

    out = {
        "replay/size": now.get("memory_size", 0),
        "replay/inserts": inserted(now),
        "replay/samples": now.get("rows_sampled", 0),
        "replay/inserts_per_s": (inserted(now) - inserted(before)) / dt,
        "replay/samples_per_s": (now.get("rows_sampled", 0) - before.get("rows_sampled", 0)) / dt,
        "replay/batches_per_s": (now.get("batches", 0) - before.get("batches", 0)) / dt,
        "replay/episodes": now.get("memory_episodes", 0),
        "server/caches_held": now.get("caches_held", 0),
        "server/episodes": now.get("total_episodes", 0),
        "server/open_streams": now.get("open_streams", 0),
        "server/open_stream_bytes": now.get("open_stream_bytes", 0),
        "server/rejected": now.get("rejected_total", 0),
    }
    for reason, n in sorted(now.get("rejected", {}).items()):
        out[f"server/rejected/{reason}"] = n
    if memory is not None:
        total, sampleable = float(memory.total_weight), int(memory.num_sampleable)
        out["replay/priority_total"] = total
        out["replay/priority_mean"] = total / sampleable if sampleable else 0.0
    return out


def live_line(stats: dict, figures: dict) -> str:
    """The live counter line ``memoire serve`` logs each interval, from
    :meth:`ReplayMemoryServer.stats` and :func:`counter_scalars`'s ``figures``: rates, what the
    server's memory stores (entries and episodes: what actors streamed in, central mode),
    caches held, episodes reported by ``update_counter`` (actors keeping memories of their
    own) and messages rejected."""
    return (
        f"inserts/s {figures['replay/inserts_per_s']:10.1f}  "
        f"samples/s {figures['replay/samples_per_s']:10.1f}  "
        f"stored {stats.get('memory_size', 0)} entries in "
        f"{stats.get('memory_episodes', 0)} episodes  "
        f"caches {stats.get('caches_held', 0)}  "
        f"episodes reported {stats.get('total_episodes', 0)}  "
        f"rejected {stats.get('rejected_total', 0)}"
    )


class ServerCounters:
    """The counters of one running server, interval after interval: each :meth:`take` reads
    its stats, turns the interval since the previous take into figures
    (:func:`counter_scalars`), writes them as TensorBoard scalars when ``tensorboard`` names a
    folder (step: the take's number, from 1) and returns the live line (:func:`live_line`).

    Not thread-safe: one thread takes (``memoire serve``'s loop).

    Raises (constructor):
      ValueError: ``tensorboard`` cannot be made or written (nothing is written then).
    """

    def __init__(self, server, tensorboard: Optional[str] = None):
        self._server = server
        self._cache_size = int(server.rem.cache_size)
        self._last, self._t_last = server.stats(), time.monotonic()
        self._takes = 0
        self._writer = None
        if tensorboard is not None:
            self._writer = SummaryWriter(tensorboard)

    def take(self) -> str:
        """Reads the server's stats now; returns the interval's live line."""
        now, stats = time.monotonic(), self._server.stats()
        figures = counter_scalars(
            stats, self._last, now - self._t_last, self._cache_size, self._server.rem
        )
        self._takes += 1
        if self._writer is not None:
            self._writer.scalars(self._takes, figures)
        self._last, self._t_last = stats, now
        return live_line(stats, figures)

    def close(self) -> None:
        """Closes the event file (if any); idempotent."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
