"""ReplayMemoryClient: an actor's end of a distributed memoire (the memoire API).

The client asks the server for the schema and settings (the handshake, :meth:`sync_sizes`)
and builds its local :class:`memoire.ReplayMemory` from them (:attr:`rem`; in central mode
only when first asked for, as streaming does not use it). Then, in

- **cache mode** (default): the actor fills ``client.rem`` (``new_episode``, ``add_entry``,
  ``close_episode``), calls :meth:`push_cache` periodically to send a prioritized cache and
  :meth:`update_counter` after each episode;
- **central mode** (``mode="central"``): the actor calls the client's own
  :meth:`new_episode` / :meth:`add_entry` / :meth:`close_episode`, which stream the episode to
  the server in chunks of ``chunk_size`` entries; the server stores it when it is closed. The
  client then holds at most a few chunks (staged, or being sent), whatever the server's size.
  That protocol is :class:`memoire.episode_pusher.EpisodePusher`, over the one chunk sender
  (:class:`memoire.experience.ChunkStream`).

Requests (handshake, counters) time out and are resent on a fresh socket a bounded number of
times, so a client outlives a server restart; pushes and subscriptions reconnect by themselves.

Thread safety: use a client from one thread at a time; :meth:`sub_bytes` may run in another
thread than the rest (each socket has its own lock).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Deque, Dict, Optional

import numpy as np
import zmq

from memoire import codec
from memoire.codec import ProtocolError
from memoire.episode_pusher import EpisodePusher
from memoire.memory import ReplayMemory
from memoire.protocol import (
    CACHE_NEXT,
    CACHE_PREV,
    CACHE_ROW_COLUMNS,
    CACHE_SCALARS,
    FIELDS,
    SETTINGS,
    Msg,
    cache_layout,
    cache_spec,
)
from memoire.remote import request
from memoire.transport import (
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    KEEPALIVE_S,
    PEER_TIMEOUT_S,
    CurveKeys,
    RequestChannel,
    native_libzmq,
    open_socket,
    publication,
)

log = logging.getLogger(__name__)

_SNDMORE = int(zmq.SNDMORE)


class _CountingMemory(ReplayMemory):
    """The client's local memory: counts closed episodes and their entries for update_counter."""

    def close_episode(
        self,
        episodic_weight_multiplier=1.0,
        do_update_value=True,
        do_update_weight=True,
        terminal=True,
    ):
        n = self.open_length
        super().close_episode(
            episodic_weight_multiplier, do_update_value, do_update_weight, terminal
        )
        self._closed_episodes += 1
        self._closed_steps += n


def cache_message(rem: ReplayMemory, uuid: int) -> list:
    """The frames of a CACHE message: ``rem.cache_size`` transitions sampled from `rem` (with
    replacement, by priority weight) with its normaliser. Raises RuntimeError when nothing is
    sampleable."""
    prev, nxt, *rows = rem._sample(int(rem.cache_size))  # rows: weight, prob, done, id
    values: Dict[str, Any] = {}
    for k, f in enumerate(FIELDS):
        if prev[k] is not None:
            values[CACHE_PREV + f] = prev[k]
        if nxt[k] is not None:
            values[CACHE_NEXT + f] = nxt[k]
    values.update({name: x for (name, _), x in zip(CACHE_ROW_COLUMNS, rows)})
    scalars = (uuid, rem.num_sampleable, rem.total_weight)
    values.update(
        {
            name: np.array(x, dtype)  # 0-d arrays: the native encoder
            for (name, dtype), x in zip(CACHE_SCALARS, scalars)
        }
    )
    return codec.encode(Msg.CACHE, values)


class ReplayMemoryClient:
    """The client of a :class:`memoire.ReplayMemoryServer`.

    Args:
      sub_endpoint: the server's PUB endpoint (None: no subscriptions).
      req_endpoint: the server's REP endpoint (or a REP proxy's front).
      push_endpoint: the server's PULL endpoint (or a PULL proxy's front).
      input_uuid: this actor's id (e.g. its IP address as an integer); 0 for a random one.
      mode: ``"cache"`` or ``"central"`` (see the module docstring).
      max_step: the local memory's size; None takes the server's. (Central mode builds that
        memory only when :attr:`rem` is first read.)
      timeout: seconds a request or a push waits; retries: resends of a request.
      keys: :class:`memoire.transport.CurveKeys` (client side) for a CURVE server.
      chunk_size: entries per episode chunk (central mode).
      seed: seeds the local memory's generator.
      keepalive: seconds (central mode; None: none): while an episode is open and nothing
        was pushed for this long, a thread sends a KEEPALIVE with this client's uuid, so the
        server, which drops the open episode of an actor it has not heard from for its
        ``peer_timeout``, keeps this one's (:class:`memoire.experience.Keepalive`).

    Raises:
      TimeoutError: the server did not answer the handshake.
      ProtocolError: the server speaks another wire version (the message says which).
    """

    def __init__(
        self,
        sub_endpoint: Optional[str],
        req_endpoint: str,
        push_endpoint: str,
        input_uuid: int = 0,
        *,
        mode: str = "cache",
        max_step: Optional[int] = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        keys: Optional[CurveKeys] = None,
        chunk_size: int = 256,
        seed: Optional[int] = None,
        keepalive: Optional[float] = KEEPALIVE_S,
    ):
        if mode not in ("cache", "central"):
            raise ValueError(f"mode: expected 'cache' or 'central', got {mode!r}")
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size: expected >= 1, got {chunk_size}")
        self.mode = mode
        self.chunk_size = int(chunk_size)
        self.timeout = float(timeout)
        self._seed = seed
        self.uuid = int(input_uuid) or int.from_bytes(np.random.default_rng().bytes(4), "little")
        self._ctx = zmq.Context()
        self._keys = keys
        self._req = RequestChannel(
            self._ctx, req_endpoint, keys=keys, timeout=timeout, retries=retries
        )
        self._push_lock = threading.Lock()
        self._push = open_socket(
            self._ctx, zmq.PUSH, push_endpoint, "Conn", keys=keys, server_side=False, hwm=64
        )
        self._push.sndtimeo = int(self.timeout * 1000)
        self._keepalive_s = keepalive
        self._pusher: Optional[EpisodePusher] = None  # central mode's, built by sync_sizes
        self._sub_lock = threading.Lock()
        self._sub = None
        if sub_endpoint is not None:
            self._sub = open_socket(
                self._ctx, zmq.SUB, sub_endpoint, "Conn", keys=keys, server_side=False
            )
        self._topics: Dict[bytes, Deque[bytes]] = {}
        self._rem: Optional[_CountingMemory] = None
        self._rem_spec = None  # (templates, max_step, settings) for building the local memory
        self._counts = [0, 0]  # closed episodes and steps of memories replaced by sync_sizes
        self._schema = None
        self._header_layout = None
        self._header = b""
        self._max_step = max_step
        self.sync_sizes(max_step)

    # ------------------------------------------------------------------ handshake

    @property
    def rem(self) -> ReplayMemory:
        """The local ReplayMemory (built from the server's schema and settings; in central
        mode, when first read)."""
        if self._rem is None:
            self._rem = self._build_rem()
        return self._rem

    def _build_rem(self) -> _CountingMemory:
        templates, max_step, settings = self._rem_spec
        rem = _CountingMemory(*templates, max_step)
        rem._closed_episodes = 0
        rem._closed_steps = 0
        for name in SETTINGS:
            if name in settings:
                setattr(rem, name, settings[name])
        if self._seed is not None:
            rem.seed(int(self._seed))
        rem.uuid = self.uuid & 0xFFFFFFFFFFFFFFFF
        return rem

    def sync_sizes(self, max_step: Optional[int] = None) -> None:
        """Asks the server for its schema and settings and rebuilds the local memory with them
        (entries stored locally are dropped; counters are kept; central mode builds it when
        :attr:`rem` is next read).

        Args:
          max_step: the local memory's size; None keeps the last one given (or the server's).

        Raises:
          TimeoutError, ProtocolError: as the constructor.
        """
        msg = request(self._req, Msg.HELLO, {"uuid": self.uuid}, (Msg.HELLO_REPLY,), "handshake")
        v = msg.values
        try:
            schema = [(str(n), np.dtype(d), tuple(int(x) for x in s)) for n, d, s in v["schema"]]
            settings = v["settings"]
            server_max_step = int(v["max_step"])
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"handshake: malformed reply ({type(e).__name__}: {e})") from None
        if [n for n, _, _ in schema] != list(FIELDS):
            raise ProtocolError(
                f"handshake: expected fields {FIELDS}, got {[n for n, _, _ in schema]}"
            )
        if max_step is not None:
            self._max_step = int(max_step)
        templates = [np.zeros(shape, dtype) for _, dtype, shape in schema]
        if self._rem is not None:
            self._counts[0] += self._rem._closed_episodes
            self._counts[1] += self._rem._closed_steps
        self._rem_spec = (templates, self._max_step or server_max_step, settings)
        # A central-mode actor streams chunks and never fills a local memory: building one as
        # large as the server's would reserve its whole address range for nothing.
        self._rem = None if self.mode == "central" else self._build_rem()
        self._schema = schema
        self._header_layout = None  # the schema may differ (a restarted server)
        if self.mode == "central" and (self._pusher is None or self._pusher.schema != schema):
            first = 0
            if self._pusher is not None:  # its chunks may still be read: go on counting
                self._pusher.close()
                first = self._pusher.stream.episode + 1
            self._pusher = EpisodePusher(
                schema,
                self.uuid,
                self._send_locked,
                self._try_send,
                self._push_lock,
                self.chunk_size,
                self.timeout,
                self._keepalive_s,
                first_episode=first,
            )
        self.max_message_bytes = int(v.get("max_message_bytes", codec.DEFAULT_MAX_BYTES))
        # A push that waits this long says so once it goes (an older server does not say).
        self._stall_s = float(v.get("peer_timeout", PEER_TIMEOUT_S))

    # ------------------------------------------------------------------ counters and logs

    def _totals(self):
        e, s = self._counts
        if self._rem is not None:
            e, s = e + self._rem._closed_episodes, s + self._rem._closed_steps
        if self._pusher is not None:
            e, s = e + self._pusher.episodes_closed, s + self._pusher.rows_closed
        return e, s

    def update_counter(self) -> dict:
        """Reports this actor's episode and step counts to the server (call after each
        finished episode). The counts sent are cumulative, so a retried update is not counted
        twice. Returns the server's totals ``{"total_episodes", "total_steps"}``.

        Raises:
          TimeoutError: the server did not answer.
        """
        episodes, steps = self._totals()
        msg = request(
            self._req,
            Msg.COUNTER,
            {"uuid": self.uuid, "episodes": int(episodes), "steps": int(steps)},
            (Msg.COUNTER_REPLY,),
            "update_counter",
        )
        return dict(msg.values)

    def _send(self, frames) -> bool:
        """Sends one multipart message (copy=False); False when the server could not take it
        within the timeout. (send_multipart's per-frame checks and enum flag arithmetic cost
        more than the sends of a small chunk; ZeroMQ refuses only a message's first frame.)"""
        with self._push_lock:
            return self._send_locked(frames)

    def _send_locked(self, frames) -> bool:
        """:meth:`_send` with ``_push_lock`` held by the caller."""
        send = self._push.send
        start = time.monotonic()
        try:
            for f in frames[:-1]:
                send(f, _SNDMORE, copy=False)
            send(frames[-1], 0, copy=False)
        except zmq.Again:
            return False
        self._say_stall(time.monotonic() - start)
        return True

    def _say_stall(self, waited: float) -> None:
        """One line when a push went after waiting at least the server's peer_timeout (its
        queue full: the server not reading, or unreachable): what this actor lost (nothing:
        its queue waited) and what the server may have dropped."""
        if waited < self._stall_s:
            return
        log.warning(
            "ReplayMemoryClient %08x: the server took nothing for %.1f s (its peer_timeout is "
            "%g s) and takes messages again; nothing dropped here (the push queue waited)%s",
            self.uuid & 0xFFFFFFFF,
            waited,
            self._stall_s,
            "; an episode the server was receiving when it stopped taking them is lost if it "
            "went on listening meanwhile (a partition, not its rate limiter), and it says so"
            if self.mode == "central"
            else "",
        )

    def _try_send(self, frames) -> bool:
        """Sends a keepalive if the queue has room now (the caller holds _push_lock)."""
        try:
            self._push.send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def write_log(self, log_message: str) -> int:
        """Sends a line to the server's logfile. Returns 0, or -1 when the server could not
        take it within the timeout."""
        return (
            0
            if self._send(codec.encode(Msg.LOG, {"uuid": self.uuid, "message": str(log_message)}))
            else -1
        )

    # ------------------------------------------------------------------ cache mode

    def push_cache(self) -> int:
        """Samples a cache of ``cache_size`` transitions from the local memory (with
        replacement, by priority weight) and pushes it to the server.

        Returns:
          0 when sent; -1 when nothing is sampleable locally or the server could not take it
          within the timeout.
        """
        rem = self.rem
        try:
            if native_libzmq():  # sampled into one block and sent from C++, GIL released
                with self._push_lock:
                    sent = rem._push_cache(
                        self._push.underlying,
                        self._cache_header(),
                        int(rem.cache_size),
                        self.uuid,
                        int(self.timeout * 1000),
                    )
                return 0 if sent else -1
            frames = cache_message(rem, self.uuid)
        except RuntimeError:  # nothing sampleable
            return -1
        return 0 if self._send(frames) else -1

    def _cache_header(self) -> bytes:
        """The header of this memory's cache messages (made again when the settings change)."""
        layout = cache_layout(self.rem)
        if layout != self._header_layout:
            self._header = cache_spec(self._schema, layout).header(Msg.CACHE)
            self._header_layout = layout
        return self._header

    # ------------------------------------------------------------------ central mode

    def _episodes(self, what: str) -> EpisodePusher:
        """The central-mode pusher; RuntimeError in cache mode."""
        if self._pusher is None:
            raise RuntimeError(
                f"{what}: the client is in cache mode (use client.rem.{what}, or "
                "construct the client with mode='central')"
            )
        return self._pusher

    def new_episode(self) -> None:
        """Opens an episode (central mode). An episode still open is abandoned: the server
        drops what it received of it."""
        self._episodes("new_episode").new_episode()

    def add_entry(self, s, a, r, p, v, i=None, init_w: float = 1.0) -> None:
        """Appends one entry (central mode); rows are checked against the schema and sent in
        chunks of ``chunk_size``.

        Raises:
          RuntimeError: no open episode. ValueError: a row of the wrong shape.
          TimeoutError: the server could not take a chunk (the episode is abandoned).
        """
        self._episodes("add_entry").add_entry(s, a, r, p, v, i, init_w)

    def add_entries(self, s, a, r, p, v, i, init_w) -> None:
        """Appends n entries at once (central mode): arrays with a leading axis of n."""
        self._episodes("add_entries").add_entries(s, a, r, p, v, i, init_w)

    def close_episode(
        self,
        episodic_weight_multiplier: float = 1.0,
        do_update_value: bool = True,
        do_update_weight: bool = True,
        terminal: bool = True,
    ) -> None:
        """Closes the episode (central mode): sends the last chunk; the server then stores the
        episode and computes its returns and priorities with its settings.

        Raises:
          RuntimeError: no open episode, or it has no entries.
          TimeoutError: the server could not take the chunk (the episode is abandoned).
        """
        self._episodes("close_episode").close_episode(
            episodic_weight_multiplier, do_update_value, do_update_weight, terminal
        )

    # ------------------------------------------------------------------ pub/sub

    def sub_bytes(self, topic, timeout: Optional[float] = None) -> bytes:
        """The next message published under exactly `topic` (str or bytes).

        The first call for a topic subscribes to it; messages published before that are not
        seen. Messages of other subscribed topics that arrive meanwhile are kept (the newest
        16 per topic) for their own calls.

        Args:
          timeout: seconds to wait; None blocks until a message comes (as in the seed).

        Raises:
          TimeoutError: nothing came within `timeout`.
          RuntimeError: the client has no SUB socket.
        """
        if self._sub is None:
            raise RuntimeError("sub_bytes: the client was built without sub_endpoint")
        t = topic.encode() if isinstance(topic, str) else bytes(topic)
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        with self._sub_lock:
            if t not in self._topics:
                self._sub.setsockopt(zmq.SUBSCRIBE, t)
                self._topics[t] = collections.deque(maxlen=16)
            while True:
                if self._topics[t]:
                    return self._topics[t].popleft()
                left = (
                    100 if deadline is None else int(max(0.0, deadline - time.monotonic()) * 1000)
                )
                if not self._sub.poll(min(left, 100)):
                    if deadline is not None and time.monotonic() >= deadline:
                        raise TimeoutError(
                            f"sub_bytes: nothing under {topic!r} within {timeout:g} s"
                        )
                    continue
                got = publication(self._sub.recv_multipart(copy=False), self.max_message_bytes)
                if got is not None and got[0] in self._topics:  # not prefix matches of others
                    self._topics[got[0]].append(got[1])

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Closes the sockets. Pushes not sent yet (the last chunks of an episode just closed,
        or chunks queued while the server restarts and the socket reconnects) get up to
        ``timeout`` seconds to leave; what a server that stays away never takes is dropped."""
        if self._pusher is not None:
            self._pusher.close()
        self._req.close()
        with self._push_lock:
            self._push.close(int(self.timeout * 1000))
        with self._sub_lock:
            if self._sub is not None:
                self._sub.close(0)
        self._ctx.term()

    def __enter__(self) -> "ReplayMemoryClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
