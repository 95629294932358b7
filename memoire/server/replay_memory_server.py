"""ReplayMemoryServer: the server object itself, composed of the services of this package
(see the package docstring, :mod:`memoire.server`)."""

from __future__ import annotations

import atexit
import dataclasses
import os
import weakref
from typing import Any, Optional

import numpy as np
import zmq

from memoire import _core, codec, ingest_limits
from memoire.codec import Message
from memoire.memory import Batch, ReplayMemory
from memoire.protocol import (
    SETTINGS,
    WIRE_VERSION,
    Msg,
    describe_schema,
)
from memoire.rate_limiter import DEFAULT_TIMEOUT, RateLimiter, check_capacity
from memoire.server.cache_service import CacheBatch, CacheService
from memoire.server.central_service import (
    DEFAULT_MAX_COUNTER_CLIENTS,
    CentralService,
    ClientCounters,
    PeerStreams,
    default_stream_budgets,
)
from memoire.server.checkpoints import MemoryCheckpoints, check_period
from memoire.server.rpc_host import DEFAULT_MAX_BATCH, DEFAULT_REPLY_CACHE_BYTES, RpcHost
from memoire.server.sampling_service import SamplingService, check_native, check_threads
from memoire.server.workers import (
    DEFAULT_MAX_MESSAGE_BYTES,
    BindError,
    Logfile,
    Publisher,
    Stats,
    Workers,
    WouldBlock,
    decode,
    rep_answer,
)
from memoire.transport import LOOPBACK, PEER_TIMEOUT_S, CurveKeys, native_libzmq

__all__ = ["ReplayMemoryServer"]


class _MemoryService:
    """The server's memory as a remote object (hosted as ``"memory"``)."""

    def __init__(self, server: "ReplayMemoryServer"):
        self._server = server

    def sample(self, batch_size: int, timeout: Optional[float] = None) -> dict:
        n = self._server.check_batch(batch_size, "sample")
        b = self._server._central.try_sample(n)
        if b is None:  # the rate limiter holds it back: the reply waits, the worker does not
            limiter = self._server.rate_limiter
            raise WouldBlock(
                "memory.sample: rate limiter",
                DEFAULT_TIMEOUT if timeout is None else float(timeout),
                lambda seconds: limiter.wait_can_sample(n, seconds),
                limiter.describe,
                limiter.record_sample_wait,
            )
        rem = self._server.rem
        return {
            "prev": tuple(b.prev),
            "next": tuple(b.next),
            "weight": b.weight,
            "prob": b.prob,
            "done": b.done,
            "id": b.id,
            "num_sampleable": int(rem.num_sampleable),
            "total_weight": float(rem.total_weight),
        }

    def get_batch(self, batch_size: int) -> dict:
        b = self._server.get_batch(self._server.check_batch(batch_size, "get_batch"))
        return {
            f.name: (
                tuple(getattr(b, f.name)) if f.name in ("prev", "next") else getattr(b, f.name)
            )
            for f in dataclasses.fields(b)
        }

    def update_priorities(self, ids, weights) -> int:
        try:
            return int(self._server.update_priorities(ids, weights))
        except ValueError as e:  # NaN, infinite or negative weights, or mismatched lengths
            self._server._stats.reject("bad_priorities", f"update_priorities: {e}")
            raise

    def stats(self) -> dict:
        return self._server.stats()

    def checkpoint(self) -> str:
        return os.path.basename(self._server.checkpoint())


def _ingest_limit(name: str, kind: type, doc: str) -> property:
    """A property that reads and sets one limit of the server's chunk ingest."""

    def get(self):
        return getattr(self._central.ingest, name)

    def set(self, value):
        setattr(self._central.ingest, name, kind(value))

    return property(get, set, doc=doc)


class ReplayMemoryServer:
    """The server of a distributed replay memory (see the module docstring).

    Args:
      state_buf, action_buf, reward_buf, prob_buf, value_buf, qvest_buf, info_buf: buffer
        templates as for :class:`memoire.ReplayMemory`; clients build their memories from them.
      max_step: entries the server's memory holds (central mode); also the default
        ``max_step`` of clients' local memories.
      pub_endpoint: endpoint bound for PUB/SUB (``tcp://*:port`` binds `bind_host`; port ``*``
        lets the OS choose, read it back from :attr:`pub_endpoint`); None for no PUB socket.
      n_caches: caches kept (the newest) for :meth:`get_batch`.
      bind_host: the interface a ``*`` host binds: loopback unless you opt out (``"0.0.0.0"``).
      keys: :class:`memoire.transport.CurveKeys` to authenticate and encrypt every socket the
        server binds; peers without an authorized key get nothing in and nothing out.
      max_message_bytes: the largest message accepted.
      seed: seeds the server's generators (memory sampling and cache draws).
      open_episode_timeout: seconds after which an unfinished episode with no new chunk is
        dropped (an actor alive, keepalives and all, but stuck mid-episode).
      max_open_episodes: unfinished episodes held at once (one per actor); a new one beyond it
        drops the least recently fed (central mode).
      max_episode_bytes: bytes one unfinished episode may hold (its chunks' frames plus
        4 KiB each); beyond it the episode is dropped (``stream_bytes``). None:
        ``min(max_step * row_bytes, 256 MiB) + 32 MiB`` (row_bytes: one entry as sent).
      max_open_bytes: bytes all unfinished episodes may hold; beyond it the largest are
        dropped (``open_bytes``). None: ``max(64 MiB, min(max_step * row_bytes, 4 GiB))``.
      reply_cache_bytes: bytes of remote-call replies kept for retries (oldest go first; a
        larger reply is not kept).
      max_batch: rows one remote ``sample``/``get_batch`` call may ask for (larger asks are
        refused, ``batch_too_large``; hosted buffers get the same bound via
        :meth:`check_batch`).
      max_counter_clients: distinct client uuids whose counters are kept; counters from
        further clients are refused (``counter_clients``).
      allow_nonfinite: store NaN/infinite rewards, probs and values from actors (default:
        their episodes are dropped, ``nonfinite``); sets :attr:`rem`'s ``allow_nonfinite``.
      checkpoint_dir: a folder for checkpoints of :attr:`rem` (created if missing). The newest
        one that loads is loaded here (its entries, settings and generator state; `seed` then
        only seeds a fresh memory); :meth:`checkpoint` writes one (also remotely:
        ``RemoteMemory(rep).checkpoint()``). See :mod:`memoire.server.checkpoints`.
      checkpoint_every: seconds between periodic checkpoints (needs `checkpoint_dir`; None:
        only on request).
      rate_limiter: a limiter of :mod:`memoire.rate_limiter` (``SampleToInsertRatio``,
        ``MinSize``) for central mode, fresh (nothing counted yet): the PULL worker stops
        pulling while it blocks inserts (actors are held back by ZeroMQ's high-water marks,
        nothing is dropped; caches and logs on that socket wait too); :meth:`sample` and
        remote ``memory.sample`` wait while it blocks samples (a remote caller's reply is
        deferred; the server serves other peers meanwhile). Its counters are in
        :meth:`stats` (``rate_limiter``). ValueError when its
        ``min_size_to_sample`` exceeds `max_step`.
      peer_timeout: seconds of listening after which an actor not heard from (no chunk, no
        keepalive: killed, frozen, its machine lost) has its open episode dropped, and only
        its (``rejected["peer_lost"]``; ``peer_connects``/``peer_disconnects`` in
        :meth:`stats`). Actors send a keepalive every
        :data:`memoire.transport.KEEPALIVE_S` seconds they have nothing to send. No socket
        runs ZeroMQ heartbeats (see :class:`memoire.transport.Heartbeat`).
      compress_states: store :attr:`rem`'s states LZ4-compressed (ReplayMemory's
        ``compress_states``: less memory per transition on compressible frames such as
        Atari screens, slower sampling; every batch, stream, cache and checkpoint is bit for
        bit what an uncompressed memory gives).

    Every limit refuses what exceeds it, counts it in :meth:`stats` (``rejected``) and logs
    it; the server keeps serving the other peers (docs/LIMITS.md).

    Settings (``priority_exponent``, ``frame_stack``, ``cache_size``, ...) are those of
    :attr:`rem`; set them before clients connect (the handshake sends them).
    """

    def __init__(
        self,
        state_buf,
        action_buf,
        reward_buf,
        prob_buf,
        value_buf,
        qvest_buf,
        info_buf,
        max_step,
        pub_endpoint="tcp://127.0.0.1:*",
        n_caches=16,
        *,
        bind_host: str = LOOPBACK,
        keys: Optional[CurveKeys] = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        seed: Optional[int] = None,
        open_episode_timeout: float = 600.0,
        max_open_episodes: int = 4096,
        max_episode_bytes: Optional[int] = None,
        max_open_bytes: Optional[int] = None,
        reply_cache_bytes: int = DEFAULT_REPLY_CACHE_BYTES,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_counter_clients: int = DEFAULT_MAX_COUNTER_CLIENTS,
        allow_nonfinite: bool = False,
        checkpoint_dir: Optional[str] = None,
        checkpoint_every: Optional[float] = None,
        rate_limiter: Optional[RateLimiter] = None,
        peer_timeout: float = PEER_TIMEOUT_S,
        compress_states: bool = False,
        **older_names,
    ):
        # The ingest's budgets under their older names (max_streams, stream_timeout,
        # max_stream_bytes) still work; anything else is an unknown argument.
        unknown = set(older_names) - set(ingest_limits.OLDER_NAMES)
        if unknown:
            raise TypeError(
                f"ReplayMemoryServer: unexpected keyword argument {sorted(unknown)[0]!r}"
            )
        given = dict(
            open_episode_timeout=open_episode_timeout,
            max_open_episodes=max_open_episodes,
            max_episode_bytes=max_episode_bytes,
        )
        for old, new in ingest_limits.OLDER_NAMES.items():
            if old in older_names:
                given[new] = older_names[old]
        open_episode_timeout = given["open_episode_timeout"]
        max_open_episodes = given["max_open_episodes"]
        max_episode_bytes = given["max_episode_bytes"]
        if int(n_caches) < 1:
            raise ValueError(f"n_caches: expected >= 1, got {n_caches}")
        check_capacity(rate_limiter, int(max_step), "the server's memory (max_step)")
        self._stats = Stats()
        self._rpc = RpcHost(self._stats, reply_cache_bytes, max_batch)
        self._counters = ClientCounters(self._stats, max_counter_clients)
        self._rem = ReplayMemory(
            state_buf,
            action_buf,
            reward_buf,
            prob_buf,
            value_buf,
            qvest_buf,
            info_buf,
            int(max_step),
            compress_states=compress_states,
        )
        ring_seed = int(np.random.default_rng(seed).integers(1 << 63))
        if seed is not None:
            self._rem.seed(int(seed))
        self._checkpoints = self._open_checkpoints(checkpoint_dir, checkpoint_every)
        self._rem.allow_nonfinite = bool(allow_nonfinite)
        self._schema = describe_schema(
            (state_buf, action_buf, reward_buf, prob_buf, value_buf, qvest_buf, info_buf)
        )
        self._workers = Workers(
            self._stats,
            keys=keys,
            bind_host=bind_host,
            max_message_bytes=max_message_bytes,
        )
        self._caches = CacheService(
            self._schema,
            self._rem,
            n_caches,
            ring_seed,
            self._workers.max_message_bytes,
            self._stats,
            self._workers.closing,
        )
        # Episode chunks are checked, assembled per actor and committed into self._rem natively
        # (the only writer of that memory's episodes).
        stream_bytes, open_bytes = default_stream_budgets(self._schema, int(max_step))
        ingest = _core.ChunkIngest(
            self._rem,
            self._workers.max_message_bytes,
            int(max_open_episodes),
            float(open_episode_timeout),
            int(stream_bytes if max_episode_bytes is None else max_episode_bytes),
            int(open_bytes if max_open_bytes is None else max_open_bytes),
            float(peer_timeout),
        )
        self._central = CentralService(
            ingest, self._rem, self._stats, self._workers.closing, rate_limiter
        )
        self._sampling = SamplingService(self, self._schema, self._stats, self._workers)
        self._logfile = Logfile()
        self._rep = rep_answer(
            self._stats,
            {
                Msg.HELLO: self._hello,
                Msg.COUNTER: self._counters.handle,
                Msg.CALL: self._rpc.handle_call,
            },
            self._workers.max_message_bytes,
        )
        self.host(
            "memory",
            _MemoryService(self),
            methods=("sample", "get_batch", "update_priorities", "stats", "checkpoint"),
            serialize=False,
        )
        self._pub: Optional[Publisher] = None
        self.pub_endpoint: Optional[str] = None
        if pub_endpoint is not None:
            try:
                self._pub = Publisher(self._workers, pub_endpoint)
            except BindError:  # nothing runs yet: the context goes with it
                self._workers.terminate()
                raise
            self.pub_endpoint = self._pub.endpoint
            self.endpoints["pub"].append(self.pub_endpoint)
        if checkpoint_every is not None:
            self._checkpoints.every(checkpoint_every)
        _OPEN.add(self)

    # ------------------------------------------------------------------ properties (seed)

    rem = property(
        lambda self: self._rem,
        doc="The server's ReplayMemory (central mode data; its settings are sent to clients).",
    )
    logfile = property(lambda self: self._logfile.path, doc="Path of the logfile, or None.")
    endpoints = property(
        lambda self: self._workers.endpoints,
        doc="Endpoints bound or connected, by socket ('pub', 'rep', 'pull', "
        "'rep_proxy_front', ...).",
    )
    n_caches = property(lambda self: self._caches.n_caches, doc="Caches kept for get_batch.")
    reply_cache_bytes = property(
        lambda self: self._rpc.reply_cache_bytes,
        doc="Bytes of remote-call replies kept for retries.",
    )
    max_batch = property(
        lambda self: self._rpc.max_batch, doc="Rows one remote sample/get_batch call may ask for."
    )
    max_counter_clients = property(
        lambda self: self._counters.max_clients,
        doc="Distinct client uuids whose counters are kept.",
    )
    bind_host = property(
        lambda self: self._workers.bind_host, doc="The interface a '*' host binds."
    )
    max_message_bytes = property(
        lambda self: self._workers.max_message_bytes, doc="The largest message accepted."
    )
    open_episode_timeout = _ingest_limit(
        "open_episode_timeout",
        float,
        "Seconds after which an unfinished episode of a silent actor is dropped (> 0).",
    )
    peer_timeout = _ingest_limit(
        "peer_timeout",
        float,
        "Seconds of listening after which an actor not heard from loses its open episode (> 0).",
    )
    max_episode_bytes = _ingest_limit(
        "max_episode_bytes", int, "Bytes one unfinished episode may hold (>= 1)."
    )
    max_open_bytes = _ingest_limit(
        "max_open_bytes", int, "Bytes all unfinished episodes may hold together (>= 1)."
    )
    max_open_episodes = _ingest_limit(
        "max_open_episodes", int, "Unfinished episodes held at once (>= 1)."
    )
    # The older spellings of the three (see memoire.ingest_limits).
    stream_timeout = open_episode_timeout
    max_stream_bytes = max_episode_bytes
    max_streams = max_open_episodes

    @property
    def total_episodes(self) -> int:
        """Episodes reported by clients' update_counter (each client's count is cumulative,
        so a retried update is counted once)."""
        return self._counters.totals()[0]

    @property
    def total_steps(self) -> int:
        """Steps reported by clients' update_counter."""
        return self._counters.totals()[1]

    @property
    def total_caches(self) -> int:
        """Caches received and accepted."""
        return self._stats.get("caches")

    @property
    def rows_in(self) -> int:
        """Entries stored in the server's memory from clients' episodes (central mode)."""
        return self._central.rows_in

    def wait_rows_in(self, count: int, timeout: float) -> bool:
        """Waits until :attr:`rows_in` reaches `count` or `timeout` seconds pass (or the server
        closes). Returns whether it was reached."""
        return self._central.wait_rows_in(count, timeout)

    def open_episodes(self) -> list:
        """Episodes actors are streaming in (central mode), not stored yet: ``[(actor uuid,
        episode number, rows received so far)]``, unordered. An actor that dies or goes silent
        for ``peer_timeout`` seconds loses its open episode (counted as ``peer_lost``)."""
        return self._central.ingest.open_streams()

    def take_stored_episodes(self) -> tuple:
        """The episodes stored from actors (central mode) since the last call, oldest first:
        ``([(actor uuid, episode number, rows, info)], dropped)``; ``info`` is the episode's
        ``(return, length, terminated)`` when its actor sent them, else None. At most 4,096 are
        kept between calls; ``dropped`` counts the older ones lost to that bound."""
        return self._central.ingest.take_committed()

    def stats(self) -> dict:
        """A snapshot of the counters: caches, chunks, episodes and steps ingested (central),
        batches and rows sampled, logs, calls, ``rejected`` by reason, sizes (``open_streams``
        and ``open_stream_bytes`` held for unfinished episodes, ``reply_cache_bytes``,
        ``counter_clients``, ``stored_state_bytes``: what the memory's states take, compressed
        or raw; ``stream_samplers_waiting``: sampling streams' sampler threads waiting for
        their learner now); ``peer_connects``/``peer_disconnects`` (PULL connections, ever);
        with a rate limiter, ``rate_limiter`` (its counters: ``inserts``, ``samples``, calls
        ``*_blocked`` and seconds ``*_blocked_s`` spent blocked, ``*_timeouts``, waiting now)
        and ``deferred`` (remote samples parked, ever)."""
        central = self._central.counters()
        episodes, steps = self._counters.totals()
        self._sampling.sync_stats()  # the native stream samplers' counts
        with self._stats.lock:
            s = dict(self._stats.counts)
            rejected = dict(self._stats.rejected)
        for reason, n in central.pop("rejected").items():
            rejected[reason] = rejected.get(reason, 0) + n
        s["rejected"] = rejected
        s["rejected_total"] = sum(rejected.values())
        s["total_episodes"] = episodes
        s["total_steps"] = steps
        s["caches_held"] = self._caches.held
        s["reply_cache_bytes"] = self._rpc.reply_bytes
        s["counter_clients"] = self._counters.clients
        s["sampling_streams"] = self._sampling.open_streams
        s["stream_samplers_waiting"] = self._sampling.samplers_waiting
        s["stored_state_bytes"] = self._rem.stored_state_bytes
        s.update(central)
        return s

    def settings(self) -> dict:
        """The settings sent to clients in the handshake."""
        out = {}
        for name in SETTINGS:
            v = getattr(self._rem, name)
            out[name] = np.asarray(v) if isinstance(v, np.ndarray) else v
        out["cache_flags"] = np.asarray(self._rem.cache_flags, np.bool_)
        return out

    # ------------------------------------------------------------------ logfile and pub

    def set_logfile(self, logfile_path: str, mode: str = "a") -> None:
        """Writes actors' log lines to `logfile_path` (opened with `mode`, e.g. 'w' or 'a'), one
        line per message: ``'%s,%08x,%s\\n' % (timestamp, uuid, message)``, timestamp in ISO
        8601 local time; newlines in a message are escaped as ``\\n``. Buffered; flushed by
        :meth:`flush_logfile` and :meth:`close`."""
        self._logfile.open(logfile_path, mode)

    def flush_logfile(self) -> None:
        self._logfile.flush()

    def pub_bytes(self, topic, message) -> None:
        """Publishes `message` (bytes-like or a numpy array, any size) under `topic` (str or
        bytes) to every client subscribed with ``sub_bytes(topic)``. Clients that subscribe
        later miss it (PUB/SUB does not store)."""
        if self._workers.closing.is_set():
            raise RuntimeError("pub_bytes: the server is closed")
        if self._pub is None:
            raise RuntimeError("pub_bytes: this server has no PUB socket (pub_endpoint=None)")
        self._pub.publish(topic, message)

    # ------------------------------------------------------------------ hosting (RPC)

    def host(self, name: str, obj: Any, methods, serialize: bool = True) -> None:
        """Makes `obj`'s `methods` callable by :class:`memoire.remote.RemoteObject` through the
        REP workers: see :meth:`memoire.server.rpc_host.RpcHost.host`."""
        self._rpc.host(name, obj, methods, serialize)

    def check_batch(self, batch_size, what: str = "batch_size") -> int:
        """`batch_size` as an int when a remote call may ask for it (1..:attr:`max_batch`):
        see :meth:`memoire.server.rpc_host.RpcHost.check_batch`."""
        return self._rpc.check_batch(batch_size, what)

    def check_finite(self, what: str, **arrays) -> None:
        """Refuses NaN or infinite values a peer sent to a hosted object: see
        :meth:`memoire.server.rpc_host.RpcHost.check_finite`."""
        self._rpc.check_finite(what, **arrays)

    @property
    def allow_nonfinite(self) -> bool:
        """Whether NaN/infinite values from peers are stored (:attr:`rem`'s setting)."""
        return bool(self._rem.allow_nonfinite)

    # ------------------------------------------------------------------ handlers

    def _hello(self, msg: Message) -> list:
        reply = codec.encode(
            Msg.HELLO_REPLY,
            {
                "schema": [(n, d, np.asarray(s, np.int64)) for n, d, s in self._schema],
                "max_step": int(self._rem.max_step),
                "n_caches": self.n_caches,
                "settings": self.settings(),
                "max_message_bytes": self.max_message_bytes,
                "peer_timeout": float(self.peer_timeout),
                "modes": ("cache", "central"),
            },
        )
        self._stats.count("handshakes")
        return reply

    def _handle_pull(self, sock: zmq.Socket, frames: list) -> None:
        if frames and _core.peek_header(frames[0]) == (WIRE_VERSION, Msg.CACHE):
            self._caches.insert(frames)
            return
        if self._central.take(frames):  # episode chunks: checked and stored natively
            return
        msg = decode(
            self._stats, frames, (Msg.CACHE, Msg.CHUNK, Msg.LOG), self.max_message_bytes
        )  # a log (or a bad message)
        if msg is not None:
            text, uuid = msg.values.get("message"), msg.values.get("uuid")
            if not isinstance(text, str) or not isinstance(uuid, (int, np.integer)):
                self._stats.reject("malformed", "log: expected uuid and message")
                return
            self._logfile.write(int(uuid), text)
            self._stats.count("logs")

    # ------------------------------------------------------------------ cache mode

    def get_batch(
        self, batch_size: int, timeout: float = 0.0, out: Optional[CacheBatch] = None
    ) -> CacheBatch:
        """A batch of ``batch_size`` transitions from the held caches (cache mode).

        Without ``reuse_cache`` (the default) rows are drawn without replacement: each cache
        row is used once, oldest caches first, in a random order within a cache. With
        ``reuse_cache`` rows are drawn uniformly with replacement from all held caches.

        Args:
          batch_size: rows, >= 1.
          timeout: seconds to wait for enough unused rows (0: fail at once); the wait
            releases the GIL and ends as soon as the rows are there.
          out: a batch an earlier call returned, to fill in place (no allocation; the same
            arrays come back); ignored when its size or layout no longer fits.

        A batch that is exactly one whole unused cache (``batch_size == cache_size``, no
        reuse, no fitting `out`) is lent, not copied: its ``prev``/``next``, ``weight``,
        ``prob``, ``done`` and ``id`` are read-only views of the received message (a
        stratified draw of the actor's memory, as the actor made it). Any other batch is
        gathered into fresh (or `out`'s) writeable arrays.

        Returns:
          :class:`CacheBatch`: ``prev``/``next`` tuples of 7 arrays
          ``dtype[batch, frame_stack, *shape]`` (None where ``cache_flags`` disable a field),
          ``weight``, ``prob``, ``done`` (True where ``next`` ends a terminated episode), and
          the importance-sampling normaliser per row (``num_sampleable``, ``total_weight``).

        Raises:
          RuntimeError: too few cache rows (the message says how many there are).
          ValueError: ``batch_size < 1``.
        """
        return self._caches.get_batch(batch_size, timeout, out)

    # ---- central mode

    def sample(self, batch_size: int, timeout: Optional[float] = None) -> Batch:
        """A batch from the server's memory (central mode): see
        :meth:`memoire.ReplayMemory.get_batch`. ``batch.id`` feeds :meth:`update_priorities`.
        With a :attr:`rate_limiter`, first waits up to `timeout` seconds (None:
        :data:`memoire.rate_limiter.DEFAULT_TIMEOUT`; the GIL is released) until it allows
        ``batch_size`` samples.

        Raises:
          RuntimeError: nothing is sampleable yet.
          TimeoutError: the rate limiter blocked for `timeout` (the message gives its state).
        """
        return self._central.sample(batch_size, timeout)

    rate_limiter = property(
        lambda self: self._central.limiter, doc="The rate limiter (central mode), or None."
    )

    def update_priorities(self, ids, weights) -> int:
        """Sets the sampling weights of entries by id (central mode); stale ids are skipped.
        Returns how many were updated."""
        return self._central.update_priorities(ids, weights)

    # ------------------------------------------------------------------ worker loops

    def rep_worker_main(self, endpoint: str, mode: str = "Bind") -> None:
        """Serves REP requests until :meth:`close`: handshakes (``sync_sizes``), counter
        updates, remote calls. Several workers may serve one endpoint through
        :meth:`rep_proxy_main` (``'Conn'`` to its back endpoint). A request that must wait
        (a sample the rate limiter holds back) is parked and answered later, so one worker
        keeps serving every peer (a ROUTER socket that speaks REP's envelope)."""
        sock = self._workers.open(zmq.ROUTER, endpoint, mode, "rep")
        self._workers.deferring_loop(sock, self._rep, "rep worker")

    def pull_worker_main(self, endpoint: str, mode: str = "Bind") -> None:
        """Receives caches, episode chunks and log lines until :meth:`close`. With pyzmq's
        libzmq attached, caches and chunks go from libzmq into the cache ring and the chunk
        ingest without the GIL (the service of the kind last seen holds the socket)."""
        sock = self._workers.open(zmq.PULL, endpoint, mode, "pull")
        peers = PeerStreams(sock, self._stats)

        def idle():
            self._central.reap()
            peers.poll()

        try:
            if native_libzmq():
                self._workers.native_loop(
                    sock,
                    {
                        Msg.CACHE: self._caches.receive,
                        Msg.CHUNK: self._central.receive,
                        Msg.KEEPALIVE: self._central.receive,
                    },
                    self._handle_pull,
                    "pull worker",
                    idle=idle,
                )
            else:
                self._workers.loop([sock], self._handle_pull, "pull worker", idle=idle)
        finally:
            peers.close()

    def stream_worker_main(
        self, endpoint: str, mode: str = "Bind", threads: Optional[int] = None
    ) -> None:
        """Serves sampling streams (:class:`memoire.stream.SamplingStream`, central mode) on a
        ROUTER socket until :meth:`close`: see :mod:`memoire.server.sampling_service`."""
        self._sampling.worker_main(endpoint, mode, threads)

    def start_stream(
        self,
        endpoint: str = "tcp://127.0.0.1:*",
        timeout: float = 10.0,
        threads: Optional[int] = None,
    ) -> str:
        """Runs :meth:`stream_worker_main` in a daemon thread, bound to `endpoint` (``tcp://``
        or, on one host, ``ipc://``), and returns the endpoint bound (the port filled in).
        `threads`: native sampler threads per stream served there (None: 1 below 4 cores,
        else 2; docs/STREAM.md says what stays equal: everything).

        Raises:
          ValueError: `threads` is not an int in [1, 64].
          RuntimeError: memoire's native message path is off (the stream needs it).
          BindError: its socket could not bind (a ZMQError naming the endpoint).
          TimeoutError: it did not bind within `timeout` seconds (its error is logged).
        """
        if threads is not None:
            threads = check_threads(threads)  # ValueError here, not in the worker
        check_native()

        def stream_worker_main(ep: str, mode: str) -> None:
            self.stream_worker_main(ep, mode, threads)

        return self._workers.start_threads([(stream_worker_main, endpoint, "stream")], timeout)[
            "stream"
        ]

    def rep_proxy_main(self, front_ep: str, back_ep: str) -> None:
        """Forwards requests from clients (bound at `front_ep`) to REP workers that connect to
        `back_ep` (bound), and their replies back, until :meth:`close`."""
        self._workers.rep_proxy_main(front_ep, back_ep)

    def pull_proxy_main(self, front_ep: str, back_ep: str) -> None:
        """Forwards pushed messages from clients (bound at `front_ep`) to PULL workers that
        connect to `back_ep` (bound), until :meth:`close`."""
        self._workers.pull_proxy_main(front_ep, back_ep)

    def pub_proxy_main(self, front_ep: str, back_ep: str) -> None:
        """Relays a publisher (connects to `front_ep`, e.g. this server's PUB endpoint on
        another machine) to subscribers that connect to `back_ep` (bound), until
        :meth:`close`."""
        self._workers.pub_proxy_main(front_ep, back_ep)

    def start(
        self,
        rep_endpoint: str = "tcp://127.0.0.1:*",
        pull_endpoint: str = "tcp://127.0.0.1:*",
        timeout: float = 10.0,
    ) -> dict:
        """Runs one REP and one PULL worker in daemon threads (bound to the endpoints) and
        returns ``{"pub": ..., "rep": ..., "pull": ...}`` with the ports filled in.

        Raises:
          BindError: a socket could not bind (a ZMQError naming the endpoint).
          TimeoutError: a worker did not bind within `timeout` seconds (its error is logged).
        """
        got = self._workers.start_threads(
            [
                (self.rep_worker_main, rep_endpoint, "rep"),
                (self.pull_worker_main, pull_endpoint, "pull"),
            ],
            timeout,
        )
        return {"pub": self.pub_endpoint, **got}

    # ------------------------------------------------------------------ checkpoints

    def _open_checkpoints(self, folder, every) -> Optional[MemoryCheckpoints]:
        """The checkpoint folder's manager (None without a folder), having loaded the newest
        checkpoint there into :attr:`rem`; checks `every` (the period starts at the end of
        the constructor)."""
        check_period(folder, every)
        if folder is None:
            return None
        checkpoints = MemoryCheckpoints(self._rem, folder)
        checkpoints.load_newest()
        if self._rem.episode_open:  # saved in the middle of an episode's commit: it goes
            self._rem.new_episode()  # (its actor's stream is lost with the crash anyway)
        return checkpoints

    @property
    def checkpoint_dir(self) -> Optional[str]:
        """The checkpoint folder (absolute), or None."""
        return None if self._checkpoints is None else self._checkpoints.folder

    def checkpoint(self) -> str:
        """Writes a checkpoint of :attr:`rem` into the checkpoint folder now (atomically; the
        oldest beyond the newest 3 are removed) and returns its path. Episodes still being
        streamed by actors are not in it (they enter :attr:`rem` when their last chunk
        arrives). Adds and samples wait while it is written.

        Raises:
          RuntimeError: the server has no checkpoint folder. OSError: the write failed.
        """
        if self._checkpoints is None:
            raise RuntimeError(
                "checkpoint: this server has no checkpoint folder "
                "(checkpoint_dir, memoire serve --checkpoint_dir)"
            )
        return self._checkpoints.save()

    # ------------------------------------------------------------------ lifetime

    def close(self, timeout: float = 5.0) -> None:
        """Stops every worker and proxy loop (each notices within ~0.1 s), flushes and closes
        the logfile, and closes the sockets, and ends periodic checkpoints (it writes none:
        call :meth:`checkpoint` for a last one). Idempotent."""
        if self._checkpoints is not None:
            self._checkpoints.stop(timeout)
        if not self._workers.close(timeout, before_join=self._wake_waits):
            return
        if self._pub is not None:
            self._pub.close()
        self._logfile.close()
        self._workers.terminate()

    def _wake_waits(self) -> None:
        self._caches.close()
        if self.rate_limiter is not None:
            self.rate_limiter.cancel()  # samples waiting on it fail at once

    def __enter__(self) -> "ReplayMemoryServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ReplayMemoryServer(pub={self.pub_endpoint}, rep={self.endpoints.get('rep')}, "
            f"pull={self.endpoints.get('pull')}, caches={self.total_caches})"
        )


# Servers not closed by their program are closed when the interpreter exits (atexit runs before
# CPython ends daemon threads): their loops and native samplers stop and their shared-memory
# files go, instead of threads cut off mid-wait while the process tears down.
_OPEN: "weakref.WeakSet[ReplayMemoryServer]" = weakref.WeakSet()


@atexit.register
def _close_open_servers() -> None:
    for server in list(_OPEN):
        server.close()
