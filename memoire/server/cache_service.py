"""The cache service (cache mode, the memoire API's design): actors push prioritized caches; the server keeps
the newest ``n_caches`` in a native ring (:class:`memoire._core.CacheRing`, no copies) and
:meth:`CacheService.get_batch` draws batches from them.

Threads and ownership: the service owns its ring; the ring is rebuilt (under the service's
lock) when the settings it is laid out for change. Caches come in from the PULL worker thread
(:meth:`CacheService.insert`, or :meth:`CacheService.receive` in C++ with the GIL released);
:meth:`CacheService.get_batch` runs in learner threads, waiting without the GIL. The settings
(``cache_size``, ``frame_stack``, ``cache_flags``, ``reuse_cache``, ``allow_nonfinite``) are
read from a settings object the caller owns (the server's memory).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Optional, Sequence

import numpy as np

from memoire import _core
from memoire.codec import ProtocolError
from memoire.memory import Batch
from memoire.protocol import (
    CACHE_NEXT,
    CACHE_PREV,
    CACHE_ROW_COLUMNS,
    CACHE_SCALARS,
    FIELDS,
    cache_layout,
    cache_spec,
)
from memoire.server.workers import Stats


@dataclasses.dataclass
class CacheBatch(Batch):
    """A batch drawn from the server's caches (cache mode). Iterates as ``(prev, next, weight)``.

    Besides :class:`memoire.Batch`'s fields (``id`` is the entry id in its actor's memory):

    Attributes:
      uuid: ``uint64[batch]``, the actor each row came from.
      num_sampleable: ``int64[batch]``, entries sampleable in that actor's memory when the
        cache was drawn (the ``N`` of importance sampling).
      total_weight: ``float64[batch]``, that memory's total weight (``prob = weight / total``).
    """

    uuid: np.ndarray = None
    num_sampleable: np.ndarray = None
    total_weight: np.ndarray = None

    def importance_weights(self, beta: float, num_sampleable=None) -> np.ndarray:
        """``float32[batch]`` corrections ``(N * prob) ** -beta`` with each row's own ``N``
        (or the one given), scaled so the largest is 1."""
        n = self.num_sampleable if num_sampleable is None else num_sampleable
        w = (np.asarray(n, np.float64) * self.prob) ** (-float(beta))
        return (w / w.max()).astype(np.float32)


class CacheService:
    """The caches of a server (see the module docstring).

    Args:
      schema: [(field, dtype name, shape)] of the memories caches come from.
      settings: an object with the memory settings caches depend on (a
        :class:`memoire.ReplayMemory`: ``cache_size``, ``frame_stack``, ``cache_flags``,
        ``reuse_cache``, ``allow_nonfinite``), read at each use.
      n_caches: caches kept (the newest), >= 1.
      seed: seeds the ring's draws.
      max_message_bytes: the largest cache message accepted.
      stats: counters to report into (``caches``, ``batches``, ``rows_sampled``;
        ``rejected``: ``malformed``, ``nonfinite``).
      closing: set when the server closes (a failed wait then says so).
    """

    def __init__(
        self,
        schema: Sequence[tuple],
        settings: Any,
        n_caches: int,
        seed: int,
        max_message_bytes: int,
        stats: Stats,
        closing: threading.Event,
    ):
        if int(n_caches) < 1:
            raise ValueError(f"n_caches: expected >= 1, got {n_caches}")
        self.n_caches = int(n_caches)
        self._schema = list(schema)
        self._settings = settings
        self._seed = int(seed)
        self._max_bytes = int(max_message_bytes)
        self._stats = stats
        self._closing = closing
        self._lock = threading.Lock()
        self._ring: Optional[_core.CacheRing] = None  # made when first needed
        self._layout = None

    @property
    def held(self) -> int:
        """Caches held."""
        with self._lock:
            return self._ring.held if self._ring is not None else 0

    def ring(self) -> "_core.CacheRing":
        """The ring, laid out for the current settings; a settings change drops the held
        caches (they no longer match the batches asked for)."""
        with self._lock:
            layout = cache_layout(self._settings)
            if layout != self._layout:
                spec = cache_spec(self._schema, layout)
                columns = [
                    (name, np.dtype(dt), list(shape[1:]))
                    for name, (dt, shape) in spec.arrays.items()
                    if len(shape)
                ]
                if self._ring is None:
                    self._ring = _core.CacheRing(
                        columns, layout[0], self.n_caches, self._seed, self._max_bytes
                    )
                else:
                    self._ring.relayout(columns, layout[0])
                self._layout = layout
            self._ring.allow_nonfinite = bool(self._settings.allow_nonfinite)
            return self._ring

    def insert(self, frames: list) -> None:
        """Holds a received CACHE message (no copy: the ring keeps the frames), checked
        natively; a bad one is counted and dropped."""
        try:
            self.ring().insert(frames)
        except ValueError as e:  # ProtocolError: malformed; else a non-finite value
            self._stats.reject(
                "malformed" if isinstance(e, ProtocolError) else "nonfinite", f"cache: {e}"
            )
            return
        self._stats.count("caches")

    def receive(self, address: int, timeout_ms: int) -> Optional[list]:
        """Takes caches from a PULL socket (its ``underlying`` address) in C++ for up to
        `timeout_ms`; returns the frames of the first other message (or of a cache that does
        not fit the current layout), or None."""
        held, frames = self.ring().receive(address, timeout_ms)
        if held:
            self._stats.count("caches", held)
        return frames

    def get_batch(
        self, batch_size: int, timeout: float = 0.0, out: Optional[CacheBatch] = None
    ) -> CacheBatch:
        """A batch of ``batch_size`` transitions from the held caches: see
        :meth:`memoire.ReplayMemoryServer.get_batch`."""
        n = int(batch_size)
        if n < 1:
            raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
        reuse = bool(self._settings.reuse_cache)
        try:
            got = self.ring().get_batch(n, reuse, float(timeout), _as_outputs(out))
        except RuntimeError as e:
            if self._closing.is_set():
                raise RuntimeError("get_batch: the server is closed") from None
            raise RuntimeError(
                f"get_batch: {e} (reuse_cache={reuse}); wait for clients to push_cache() or "
                "lower batch_size"
            ) from None
        with self._stats.lock:
            self._stats.counts["batches"] += 1
            self._stats.counts["rows_sampled"] += n
        prev = tuple(got.get(CACHE_PREV + f) for f in FIELDS)
        nxt = tuple(got.get(CACHE_NEXT + f) for f in FIELDS)
        return CacheBatch(
            prev, nxt, **{name: got[name] for name, _ in CACHE_ROW_COLUMNS + CACHE_SCALARS}
        )

    def close(self) -> None:
        """Wakes every waiting get_batch (which then raises)."""
        with self._lock:
            if self._ring is not None:
                self._ring.close()


def _as_outputs(batch: Optional[CacheBatch]) -> Optional[dict]:
    """The arrays of `batch` by cache entry name (to be filled in place), or None."""
    if batch is None:
        return None
    arrays = {name: getattr(batch, name) for name, _ in CACHE_ROW_COLUMNS + CACHE_SCALARS}
    for k, f in enumerate(FIELDS):
        arrays[CACHE_PREV + f] = batch.prev[k]
        arrays[CACHE_NEXT + f] = batch.next[k]
    return arrays
