"""Central mode's sending end of :class:`memoire.ReplayMemoryClient`: an actor's episodes
streamed to the server's memory as chunks (over :class:`memoire.experience.ChunkStream`).

The seed's entry calls (``new_episode``, ``add_entry``, ``close_episode``) on the client go to
an :class:`EpisodePusher`; the server's chunk ingest stores each episode when it is closed and
computes its returns and priorities with the server's settings. The pusher holds at most a few
chunks (staged, or being sent by ZeroMQ), whatever the server's size.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, Sequence

import numpy as np

from memoire.experience import ChunkStream
from memoire.protocol import CHUNK_INIT_W, CHUNK_UPDATE_VALUE, CHUNK_UPDATE_WEIGHT, QVEST


class EpisodePusher:
    """Streams one actor's episodes to a central-mode server.

    Args:
      schema: the server's ``[(name, dtype, shape)]`` (the handshake's); every field but the
        q-vector ``q`` is a chunk column, with the entries' initial weights (``init_w``).
      uuid: the actor's id (uint64).
      send: sends one message's frames with ``copy=False`` (the caller holds `lock`); False
        when the server could not take it within `timeout`.
      try_send: sends frames without blocking (for keepalives; `lock` held).
      lock: guards the push socket.
      chunk_size: entries per chunk (>= 1).
      timeout: seconds a chunk may wait for the server.
      keepalive: seconds (None: none) of silence mid-episode before a KEEPALIVE goes.
      first_episode: the first episode's number (a pusher rebuilt after a new handshake goes on
        counting).

    Not thread-safe: one actor thread owns it.
    """

    def __init__(
        self,
        schema: Sequence[tuple],
        uuid: int,
        send: Callable[[list], bool],
        try_send: Callable[[list], bool],
        lock: threading.Lock,
        chunk_size: int,
        timeout: float,
        keepalive: Optional[float],
        first_episode: int = 0,
    ):
        self.schema = list(schema)
        self._fields = [(name, dtype, shape) for name, dtype, shape in self.schema if name != QVEST]
        self._no_ids = {
            name: np.zeros(shape, dtype) for name, dtype, shape in self._fields if name == "i"
        }
        row_spec = self._fields + [(CHUNK_INIT_W[0], np.dtype(CHUNK_INIT_W[1]), ())]
        self._row_names = tuple(name for name, _, _ in row_spec)
        self.timeout = float(timeout)
        self.stream = ChunkStream(
            row_spec,
            send,
            chunk_rows=chunk_size,
            uuid=uuid,
            keepalive=keepalive,
            try_send=try_send,
            lock=lock,
            zero_copy=True,
            hold_full=True,
            timeout=timeout,
            first_episode=first_episode,
        )
        self._open = False
        self.episodes_closed = 0
        self.rows_closed = 0

    def _lost(self) -> TimeoutError:
        self._open = False
        return TimeoutError(
            f"push: the server took no chunk within {self.timeout:g} s; "
            "the open episode was abandoned"
        )

    def new_episode(self) -> None:
        """Opens an episode. An episode still open is abandoned: the server drops what it
        received of it."""
        self.stream.abandon()
        self._open = True

    def add_entry(self, s, a, r, p, v, i=None, init_w: float = 1.0) -> None:
        """Appends one entry; rows are checked against the schema and sent in chunks.

        Raises:
          RuntimeError: no open episode. ValueError: a row of the wrong shape.
          TimeoutError: the server could not take a chunk (the episode is abandoned).
        """
        if not self._open:
            raise RuntimeError("add_entry: no open episode (call new_episode() first)")
        row = {"s": s, "a": a, "r": r, "p": p, "v": v, "i": i, CHUNK_INIT_W[0]: init_w}
        if i is None:
            row.update(self._no_ids)
        if not self.stream.add({name: row[name] for name in self._row_names}):
            raise self._lost()

    def add_entries(self, s, a, r, p, v, i, init_w) -> None:
        """Appends n entries at once: arrays with a leading axis of n (``init_w``: float[n]).

        Raises: as :meth:`add_entry`.
        """
        if not self._open:
            raise RuntimeError("add_entries: no open episode (call new_episode() first)")
        rows = {"s": s, "a": a, "r": r, "p": p, "v": v, "i": i}
        columns = {name: rows[name] for name, _, _ in self._fields}
        columns[CHUNK_INIT_W[0]] = np.asarray(init_w, CHUNK_INIT_W[1]).reshape(-1)
        if not self.stream.add_rows(columns):
            raise self._lost()

    def close_episode(
        self,
        episodic_weight_multiplier: float = 1.0,
        do_update_value: bool = True,
        do_update_weight: bool = True,
        terminal: bool = True,
    ) -> None:
        """Closes the episode: sends its last chunk; the server then stores the episode and
        computes its returns and priorities with its settings.

        Raises:
          RuntimeError: no open episode, or it has no entries.
          TimeoutError: the server could not take the chunk (the episode is abandoned).
        """
        if not self._open:
            raise RuntimeError("close_episode: no open episode")
        rows = self.stream.open_rows
        if rows == 0:
            raise RuntimeError("close_episode: the open episode has no entries")
        flags = (CHUNK_UPDATE_VALUE if do_update_value else 0) | (
            CHUNK_UPDATE_WEIGHT if do_update_weight else 0
        )
        if not self.stream.end_episode(
            terminal, multiplier=episodic_weight_multiplier, flags=flags
        ):
            raise self._lost()
        self._open = False
        self.episodes_closed += 1
        self.rows_closed += rows

    def close(self) -> None:
        """Stops the keepalive (before the socket closes)."""
        self.stream.close()
