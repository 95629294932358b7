"""ReplayMemoryServer: the learner's end of a distributed memoire (seed 001).

Actors (:class:`memoire.ReplayMemoryClient`) on many machines feed one server over ZeroMQ.
Two topologies share one server:

- **cache mode** (the seed's): actors keep local memories, sample caches of ``cache_size``
  transitions by priority and push them; the server keeps the newest ``n_caches`` caches and
  :meth:`ReplayMemoryServer.get_batch` builds batches from them.
- **central mode**: actors stream episodes (in chunks) and the server's own memory
  (:attr:`ReplayMemoryServer.rem`) holds them; the learner samples there with :meth:`sample`
  and updates priorities with :meth:`update_priorities`, locally or remotely through the
  hosted ``"memory"`` object (:class:`memoire.remote.RemoteMemory`).

Sockets (endpoints as in ZeroMQ, modes ``'Bind'`` or ``'Conn'``):

- PUB (bound at construction): :meth:`pub_bytes` to every client's :meth:`sub_bytes`.
- REP (:meth:`rep_worker_main`): handshakes (schema and settings), counters, remote calls.
- PULL (:meth:`pull_worker_main`): caches, episode chunks, log lines.

Worker main loops block the calling thread (without holding the GIL) until :meth:`close`;
run each in its own ``threading.Thread``, or let :meth:`start` do it. Every message is checked
by the codec (:mod:`memoire.codec`); a malformed, truncated, oversized or wrong-version message
is counted in :meth:`stats` (``rejected``), logged on the ``memoire.server`` logger and
dropped; REP requests get an error reply. A worker never dies from what a peer sends.

Thread safety: all public methods may be called from any thread. ``pub_bytes`` serialises on a
lock (the PUB socket is created by the constructor's thread and then only used under it).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import logging
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import zmq

from memoire import _core, codec
from memoire.codec import Msg, ProtocolError
from memoire.memory import FIELDS, Batch, ReplayMemory
from memoire.transport import (LOOPBACK, Authenticator, CurveKeys, is_bind, last_endpoint,
                               native_libzmq, open_socket, publication_frames)

log = logging.getLogger("memoire.server")

POLL_MS = 100  # worker loops check for close() this often
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
# Bounds on what peers can make a server hold (docs/LIMITS.md).
DEFAULT_REPLY_CACHE_BYTES = 64 << 20
DEFAULT_MAX_BATCH = 16384
DEFAULT_MAX_COUNTER_CLIENTS = 65536
COUNTER_MAX = 2 ** 53 - 1  # largest count a client may report (exact in a float64)
_INT64_MAX = 2 ** 63 - 1  # totals saturate here (the wire's integers are int64)
# Flags of a chunk message.
CHUNK_LAST, CHUNK_TERMINAL, CHUNK_UPDATE_VALUE, CHUNK_UPDATE_WEIGHT = 1, 2, 4, 8
_COMMITTED = 2  # _core.ChunkIngest.ingest's outcome for a chunk that closed its episode
SETTINGS = ("priority_exponent", "priority_epsilon", "mix_lambda", "frame_stack", "multi_step",
            "cache_size", "max_episode", "reuse_cache", "discount_factor", "reward_coeff",
            "cache_flags")


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


def default_stream_budgets(schema: Sequence[tuple], max_step: int) -> Tuple[int, int]:
    """``(max_stream_bytes, max_open_bytes)`` defaults for a memory of `max_step` entries of
    `schema` (see :class:`ReplayMemoryServer`): one stream may hold a full-length episode as
    sent (at most 256 MiB of it) plus 32 MiB of chunk overhead (8192 chunks); all streams
    together as much as the memory itself, at least 64 MiB and at most 4 GiB."""
    row = 4  # init_w
    for name, dtype, shape in schema:
        if name != "q":  # computed by the server, not sent
            row += np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
    episode = row * int(max_step)
    return min(episode, 256 << 20) + (32 << 20), max(64 << 20, min(episode, 4 << 30))


def describe_schema(templates: Sequence[Any]) -> List[tuple]:
    """[(field, dtype name, shape)] of the seven buffer templates (s, a, r, p, v, q, i)."""
    out = []
    for f, t in zip(FIELDS, templates):
        t = np.asarray(t)
        out.append((f, t.dtype.name, tuple(int(d) for d in t.shape)))
    return out


def cache_layout(rem: ReplayMemory) -> tuple:
    """``(cache_size, frame_stack, cache_flags)`` of a memory: what the layout of its cache
    messages depends on, besides the schema (comparable, to notice a change)."""
    return (int(rem.cache_size), int(rem.frame_stack),
            tuple(np.asarray(rem.cache_flags, np.bool_).tolist()))


def cache_spec(schema: Sequence[tuple], layout: tuple) -> codec.Spec:
    """The codec spec of a cache message for a schema and a :func:`cache_layout`."""
    cs, fs, flags = layout
    arrays = {}
    for k, (name, dtype, shape) in enumerate(schema):
        if flags[k]:
            arrays[f"prev/{name}"] = (dtype, (cs, fs) + tuple(shape))
        if flags[len(FIELDS) + k]:
            arrays[f"next/{name}"] = (dtype, (cs, fs) + tuple(shape))
    arrays.update({"weight": (np.float32, (cs,)), "prob": (np.float64, (cs,)),
                   "done": (np.bool_, (cs,)), "id": (np.int64, (cs,)), "uuid": (np.uint64, ()),
                   "num_sampleable": (np.int64, ()), "total_weight": (np.float64, ())})
    return codec.Spec(arrays)




class _Hosted:
    def __init__(self, obj: Any, methods: Iterable[str], serialize: bool):
        self.obj = obj
        self.methods = frozenset(methods)
        self.lock = threading.Lock() if serialize else None


class _MemoryService:
    """The server's memory as a remote object (hosted as ``"memory"``)."""

    def __init__(self, server: "ReplayMemoryServer"):
        self._server = server

    def sample(self, batch_size: int) -> dict:
        b = self._server.sample(self._server.check_batch(batch_size, "sample"))
        rem = self._server.rem
        return {"prev": tuple(b.prev), "next": tuple(b.next), "weight": b.weight, "prob": b.prob,
                "done": b.done, "id": b.id, "num_sampleable": int(rem.num_sampleable),
                "total_weight": float(rem.total_weight)}

    def get_batch(self, batch_size: int) -> dict:
        b = self._server.get_batch(self._server.check_batch(batch_size, "get_batch"))
        return {f.name: (tuple(getattr(b, f.name)) if f.name in ("prev", "next")
                         else getattr(b, f.name)) for f in dataclasses.fields(b)}

    def update_priorities(self, ids, weights) -> int:
        try:
            return int(self._server.update_priorities(ids, weights))
        except ValueError as e:  # NaN, infinite or negative weights, or mismatched lengths
            self._server._reject("bad_priorities", f"update_priorities: {e}")
            raise

    def stats(self) -> dict:
        return self._server.stats()


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
      stream_timeout: seconds after which an unfinished episode of a silent actor is dropped.
      max_streams: unfinished episodes held at once (one per actor); a new one beyond it drops
        the least recently fed (central mode).
      max_stream_bytes: bytes one unfinished episode may hold (its chunks' frames plus
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

    Every limit refuses what exceeds it, counts it in :meth:`stats` (``rejected``) and logs
    it; the server keeps serving the other peers (docs/LIMITS.md).

    Settings (``priority_exponent``, ``frame_stack``, ``cache_size``, ...) are those of
    :attr:`rem`; set them before clients connect (the handshake sends them).
    """

    def __init__(self, state_buf, action_buf, reward_buf, prob_buf, value_buf, qvest_buf,
                 info_buf, max_step, pub_endpoint="tcp://127.0.0.1:*", n_caches=16, *,
                 bind_host: str = LOOPBACK, keys: Optional[CurveKeys] = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, seed: Optional[int] = None,
                 stream_timeout: float = 600.0, max_streams: int = 4096,
                 max_stream_bytes: Optional[int] = None, max_open_bytes: Optional[int] = None,
                 reply_cache_bytes: int = DEFAULT_REPLY_CACHE_BYTES,
                 max_batch: int = DEFAULT_MAX_BATCH,
                 max_counter_clients: int = DEFAULT_MAX_COUNTER_CLIENTS,
                 allow_nonfinite: bool = False):
        if int(n_caches) < 1:
            raise ValueError(f"n_caches: expected >= 1, got {n_caches}")
        for name, value, least in (("reply_cache_bytes", reply_cache_bytes, 0),
                                   ("max_batch", max_batch, 1),
                                   ("max_counter_clients", max_counter_clients, 1)):
            if int(value) < least:
                raise ValueError(f"{name}: expected >= {least}, got {value}")
        self._rem = ReplayMemory(state_buf, action_buf, reward_buf, prob_buf, value_buf,
                                 qvest_buf, info_buf, int(max_step))
        self._rng = np.random.default_rng(seed)
        if seed is not None:
            self._rem.seed(int(seed))
        self._rem.allow_nonfinite = bool(allow_nonfinite)
        self.n_caches = int(n_caches)
        self.reply_cache_bytes = int(reply_cache_bytes)
        self.max_batch = int(max_batch)
        self.max_counter_clients = int(max_counter_clients)
        self.bind_host = bind_host
        self.max_message_bytes = int(max_message_bytes)
        self._schema = describe_schema(
            (state_buf, action_buf, reward_buf, prob_buf, value_buf, qvest_buf, info_buf))
        self._keys = keys
        self._ctx = zmq.Context()
        self._auth = Authenticator(self._ctx, keys) if keys is not None else None
        self._closing = threading.Event()
        self._lock = threading.Lock()  # counters, caches, streams, hosted objects
        self._log_lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._active = 0  # worker loops running
        self._threads: List[threading.Thread] = []
        self.endpoints: Dict[str, List[str]] = collections.defaultdict(list)
        # Counters (seed) and statistics.
        self._per_client: Dict[int, Tuple[int, int]] = {}
        self._total_episodes = 0
        self._total_steps = 0
        self._stats = collections.Counter()
        self._rejected = collections.Counter()
        # Cache ring (made for the current settings when first needed).
        self._ring: Optional[_core.CacheRing] = None
        self._ring_layout = None
        # Central mode: episode chunks are checked, assembled per actor and committed into
        # self._rem natively (the only writer of that memory's episodes).
        stream_bytes, open_bytes = default_stream_budgets(self._schema, int(max_step))
        self._chunks = _core.ChunkIngest(
            self._rem, self.max_message_bytes, int(max_streams), float(stream_timeout),
            int(stream_bytes if max_stream_bytes is None else max_stream_bytes),
            int(open_bytes if max_open_bytes is None else max_open_bytes))
        self._hosted: Dict[str, _Hosted] = {}
        # caller -> (seq, reply frames, bytes); the oldest go first past reply_cache_bytes.
        self._replies: "collections.OrderedDict[int, tuple]" = collections.OrderedDict()
        self._reply_bytes = 0
        self._logfile = None
        self._logfile_path: Optional[str] = None
        self.host("memory", _MemoryService(self),
                  methods=("sample", "get_batch", "update_priorities", "stats"), serialize=False)
        self._pub_lock = threading.Lock()
        self._pub = None
        self.pub_endpoint: Optional[str] = None
        if pub_endpoint is not None:
            self._pub = open_socket(self._ctx, zmq.PUB, pub_endpoint, "Bind", keys=keys,
                                    bind_host=bind_host)
            self.pub_endpoint = last_endpoint(self._pub)
            self.endpoints["pub"].append(self.pub_endpoint)

    # ------------------------------------------------------------------ properties (seed)

    rem = property(lambda self: self._rem, doc="The server's ReplayMemory (central mode data; "
                                               "its settings are sent to clients).")
    logfile = property(lambda self: self._logfile_path, doc="Path of the logfile, or None.")

    @property
    def stream_timeout(self) -> float:
        """Seconds after which an unfinished episode of a silent actor is dropped (> 0)."""
        return self._chunks.stream_timeout

    @stream_timeout.setter
    def stream_timeout(self, seconds: float) -> None:
        self._chunks.stream_timeout = float(seconds)

    @property
    def max_stream_bytes(self) -> int:
        """Bytes one unfinished episode may hold (>= 1)."""
        return self._chunks.max_stream_bytes

    @max_stream_bytes.setter
    def max_stream_bytes(self, n: int) -> None:
        self._chunks.max_stream_bytes = int(n)

    @property
    def max_open_bytes(self) -> int:
        """Bytes all unfinished episodes may hold together (>= 1)."""
        return self._chunks.max_open_bytes

    @max_open_bytes.setter
    def max_open_bytes(self, n: int) -> None:
        self._chunks.max_open_bytes = int(n)

    @property
    def max_streams(self) -> int:
        """Unfinished episodes held at once (>= 1)."""
        return self._chunks.max_streams

    @max_streams.setter
    def max_streams(self, n: int) -> None:
        self._chunks.max_streams = int(n)

    @property
    def total_episodes(self) -> int:
        """Episodes reported by clients' update_counter (each client's count is cumulative,
        so a retried update is counted once)."""
        with self._lock:
            return self._total_episodes

    @property
    def total_steps(self) -> int:
        """Steps reported by clients' update_counter."""
        with self._lock:
            return self._total_steps

    @property
    def total_caches(self) -> int:
        """Caches received and accepted."""
        with self._lock:
            return self._stats["caches"]

    @property
    def rows_in(self) -> int:
        """Entries stored in the server's memory from clients' episodes (central mode)."""
        with self._lock:
            return self._stats["steps_in"]

    def wait_rows_in(self, count: int, timeout: float) -> bool:
        """Waits until :attr:`rows_in` reaches `count` or `timeout` seconds pass (or the server
        closes). Returns whether it was reached."""
        deadline = time.monotonic() + float(timeout)
        with self._cond:
            while self._stats["steps_in"] < count and not self._closing.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._stats["steps_in"] >= count

    def stats(self) -> dict:
        """A snapshot of the counters: caches, chunks, episodes and steps ingested (central),
        batches and rows sampled, logs, calls, ``rejected`` by reason, sizes (``open_streams``
        and ``open_stream_bytes`` held for unfinished episodes, ``reply_cache_bytes``,
        ``counter_clients``)."""
        central = self._chunks.counters()
        with self._lock:
            s = dict(self._stats)
            rejected = self._rejected + collections.Counter(central["rejected"])
            s["rejected"] = dict(rejected)
            s["rejected_total"] = sum(rejected.values())
            s["total_episodes"] = self._total_episodes
            s["total_steps"] = self._total_steps
            s["caches_held"] = self._ring.held if self._ring is not None else 0
            s["reply_cache_bytes"] = self._reply_bytes
            s["counter_clients"] = len(self._per_client)
        if central["chunks"]:
            s["chunks"] = central["chunks"]
        s["open_streams"] = central["open_streams"]
        s["open_stream_bytes"] = central["open_bytes"]
        s["memory_size"] = int(self._rem.size)
        s["memory_episodes"] = int(self._rem.num_episode())
        return s

    def settings(self) -> dict:
        """The settings sent to clients in the handshake."""
        out = {}
        for name in SETTINGS:
            v = getattr(self._rem, name)
            out[name] = np.asarray(v) if isinstance(v, np.ndarray) else v
        out["cache_flags"] = np.asarray(self._rem.cache_flags, np.bool_)
        return out

    # ------------------------------------------------------------------ logfile

    def set_logfile(self, logfile_path: str, mode: str = "a") -> None:
        """Writes actors' log lines to `logfile_path` (opened with `mode`, e.g. 'w' or 'a'), one
        line per message: ``'%s,%08x,%s\\n' % (timestamp, uuid, message)``, timestamp in ISO
        8601 local time; newlines in a message are escaped as ``\\n``. Buffered; flushed by
        :meth:`flush_logfile` and :meth:`close`."""
        if mode not in ("w", "a", "x"):
            raise ValueError(f"mode: expected 'w', 'a' or 'x', got {mode!r}")
        f = open(logfile_path, mode, buffering=1 << 16, encoding="utf-8")
        with self._log_lock:
            if self._logfile is not None:
                self._logfile.close()
            self._logfile = f
            self._logfile_path = logfile_path

    def flush_logfile(self) -> None:
        with self._log_lock:
            if self._logfile is not None:
                self._logfile.flush()

    def _write_log(self, uuid: int, message: str) -> None:
        line = "%s,%08x,%s\n" % (datetime.datetime.now().isoformat(), uuid,
                                 message.replace("\\", "\\\\").replace("\n", "\\n"))
        with self._log_lock:
            if self._logfile is not None:
                self._logfile.write(line)

    # ------------------------------------------------------------------ pub

    def pub_bytes(self, topic, message) -> None:
        """Publishes `message` (bytes-like or a numpy array, any size) under `topic` (str or
        bytes) to every client subscribed with ``sub_bytes(topic)``. Clients that subscribe
        later miss it (PUB/SUB does not store)."""
        if self._closing.is_set():
            raise RuntimeError("pub_bytes: the server is closed")
        if self._pub is None:
            raise RuntimeError("pub_bytes: this server has no PUB socket (pub_endpoint=None)")
        t = topic.encode() if isinstance(topic, str) else bytes(topic)
        data = message if isinstance(message, (bytes, np.ndarray)) else memoryview(message)
        if isinstance(data, np.ndarray):
            data = memoryview(np.ascontiguousarray(data)).cast("B")
        frames = publication_frames(t, data)
        with self._pub_lock:
            if self._pub is None:
                raise RuntimeError("pub_bytes: the server is closed")
            self._pub.send_multipart(frames, copy=False)

    # ------------------------------------------------------------------ hosting (RPC)

    def host(self, name: str, obj: Any, methods: Sequence[str], serialize: bool = True) -> None:
        """Makes `obj`'s `methods` callable by :class:`memoire.remote.RemoteObject` through the
        REP workers. Arguments and results must be codec values (numpy arrays, scalars, str,
        bytes, None, and lists/tuples/dicts of them). With `serialize`, calls to this object
        run one at a time; otherwise concurrently from several REP workers.

        Raises:
          ValueError: a method that `obj` lacks or that is private.
        """
        for m in methods:
            if m.startswith("_") or not callable(getattr(obj, m, None)):
                raise ValueError(f"host: {type(obj).__name__}.{m} is not a public method")
        with self._lock:
            self._hosted[str(name)] = _Hosted(obj, methods, serialize)

    def _call(self, v: dict) -> list:
        """Runs one remote call. The last reply to each caller is kept, so a call retried after
        a lost reply (same caller and seq) is answered again without running twice."""
        caller, seq = v.get("caller"), v.get("seq")
        keyed = isinstance(caller, int) and isinstance(seq, int)
        if keyed:
            with self._lock:
                cached = self._replies.get(caller)
                if cached is not None and cached[0] == seq:
                    self._replies.move_to_end(caller)
                    return cached[1]
        reply = self._run_call(v)
        if keyed:
            size = sum(memoryview(f).nbytes for f in reply)
            with self._lock:
                old = self._replies.pop(caller, None)
                if old is not None:
                    self._reply_bytes -= old[2]
                if size <= self.reply_cache_bytes:  # a larger reply is not kept: a retry reruns
                    self._replies[caller] = (seq, reply, size)
                    self._reply_bytes += size
                while self._replies and (self._reply_bytes > self.reply_cache_bytes
                                         or len(self._replies) > 1024):
                    self._reply_bytes -= self._replies.popitem(last=False)[1][2]
        return reply

    def check_batch(self, batch_size, what: str = "batch_size") -> int:
        """`batch_size` as an int when a remote call may ask for it (1..:attr:`max_batch`).

        Raises:
          ValueError: outside those bounds (counted in :meth:`stats` as ``batch_too_large``
            when too large).
        """
        n = int(batch_size)
        if n > self.max_batch:
            self._reject("batch_too_large", f"{what}({n}): more than max_batch={self.max_batch}")
            raise ValueError(f"{what}: batch_size {n} is more than this server's max_batch "
                             f"({self.max_batch}); ask for smaller batches")
        if n < 1:
            raise ValueError(f"{what}: expected batch_size >= 1, got {n}")
        return n

    def check_finite(self, what: str, **arrays) -> None:
        """Refuses NaN or infinite values a peer sent to a hosted object (docs/LIMITS.md).

        Args:
          what: the call, for the message (``"add_batch"``).
          arrays: name=values (array-likes; None is skipped). Float arrays are scanned with one
            vectorized ``np.isfinite`` each; other dtypes cannot hold non-finite values.

        Raises:
          ValueError: one of `arrays` holds a NaN or an infinity (the first one is named);
            counted in :meth:`stats` as ``nonfinite``.
        """
        for name, values in arrays.items():
            if values is None:
                continue
            a = np.asarray(values)
            if a.dtype.kind in "fc" and not np.isfinite(a).all():
                self._reject("nonfinite", f"{what}: {name} holds a NaN or an infinity")
                raise ValueError(f"{what}: {name} holds a NaN or an infinity; this server "
                                 "refuses non-finite values from peers (see docs/LIMITS.md)")

    def _run_call(self, v: dict) -> list:
        name, method = v.get("object"), v.get("method")
        args, kwargs = v.get("args", ()), v.get("kwargs", {})
        with self._lock:
            hosted = self._hosted.get(name) if isinstance(name, str) else None
        if hosted is None:
            return _error("KeyError", f"no hosted object {name!r}")
        if method not in hosted.methods:
            return _error("AttributeError",
                          f"{name!r} has no remote method {method!r} (allowed: "
                          f"{', '.join(sorted(hosted.methods))})")
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
            return _error("TypeError", "call: expected args as a tuple and kwargs as a dict")
        try:
            fn = getattr(hosted.obj, method)
            if hosted.lock is not None:
                with hosted.lock:
                    result = fn(*args, **kwargs)
            else:
                result = fn(*args, **kwargs)
            reply = codec.encode(Msg.CALL_REPLY, {"result": result})
        except Exception as e:  # noqa: BLE001 - the caller gets the error; the worker lives on
            return _error(type(e).__name__, str(e))
        self._count("calls")
        return reply

    # ------------------------------------------------------------------ worker loops

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def _count_batch(self, rows: int) -> None:
        with self._lock:
            self._stats["batches"] += 1
            self._stats["rows_sampled"] += rows

    def _reject(self, reason: str, detail: str) -> None:
        with self._lock:
            self._rejected[reason] += 1
            n = self._rejected[reason]
        if n <= 10 or n % 1000 == 0:  # a flood of bad messages must not flood the log
            log.warning("dropped a message (%s, %d so far): %s", reason, n, detail)

    def _loop(self, socks: Sequence[zmq.Socket], handle: Callable[[zmq.Socket, list], None],
              name: str, idle: Optional[Callable[[], None]] = None) -> None:
        """Polls `socks` until close(); every handler error is counted and survived. `idle`
        runs after a poll that found nothing."""
        poller = zmq.Poller()
        for s in socks:
            poller.register(s, zmq.POLLIN)

        def step():
            ready = poller.poll(POLL_MS)
            for sock, _ in ready:
                frames = sock.recv_multipart(copy=False)
                self._guarded(handle, name, sock, frames)
            if not ready and idle is not None:
                idle()
        self._serve(socks, step)

    def _native_pull_loop(self, sock: zmq.Socket) -> None:
        """The PULL worker's loop in C++: caches go from libzmq into the ring, episode chunks
        into the central ingest, without the GIL; other messages come back here. One of the
        two receives the socket at a time: the one for the kind of message last seen."""
        address = sock.underlying
        central = False

        def step():
            nonlocal central
            self._chunks.reap()  # stale streams go even when no chunk comes (rate-limited)
            try:
                if central:
                    episodes, rows, rejected, frames = self._chunks.receive(address, POLL_MS)
                    self._chunks_taken(episodes, rows, rejected)
                else:
                    with self._lock:
                        ring = self._ring_for_settings()
                    held, frames = ring.receive(address, POLL_MS)
                    if held:
                        self._count("caches", held)
            except RuntimeError as e:  # a socket error: say so, do not spin on it
                self._reject("internal", f"pull worker: {e}")
                time.sleep(POLL_MS / 1000)
                return
            if frames is not None:
                kind = _core.peek_header(frames[0]) if frames else None
                if kind in ((codec.WIRE_VERSION, Msg.CHUNK), (codec.WIRE_VERSION, Msg.CACHE)):
                    central = kind[1] == Msg.CHUNK
                self._guarded(self._handle_pull, "pull worker", sock, frames)
        self._serve([sock], step)

    def _guarded(self, handle, name, sock, frames) -> None:
        try:
            handle(sock, frames)
        except Exception as e:  # noqa: BLE001 - a worker never dies from input
            self._reject("internal", f"{name}: {type(e).__name__}: {e}")
            log.exception("%s: unexpected error", name)

    def _serve(self, socks: Sequence[zmq.Socket], step: Callable[[], None]) -> None:
        """Runs `step` until close(), then closes `socks`."""
        with self._lock:
            self._active += 1
        try:
            while not self._closing.is_set():
                step()
        finally:
            for s in socks:
                s.close(0)
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def _bind_or_connect(self, kind: int, endpoint: str, mode: str, label: str,
                         server_side: bool = True) -> zmq.Socket:
        if self._closing.is_set():
            raise RuntimeError(f"{label}: the server is closed")
        sock = open_socket(self._ctx, kind, endpoint, mode,
                           keys=self._keys if (is_bind(mode) and server_side) else None,
                           bind_host=self.bind_host, max_bytes=self.max_message_bytes)
        with self._cond:
            self.endpoints[label].append(last_endpoint(sock) if is_bind(mode) else endpoint)
            self._cond.notify_all()
        return sock

    def rep_worker_main(self, endpoint: str, mode: str = "Bind") -> None:
        """Serves REP requests until :meth:`close`: handshakes (``sync_sizes``), counter
        updates, remote calls. Several workers may serve one endpoint through
        :meth:`rep_proxy_main` (``'Conn'`` to its back endpoint)."""
        sock = self._bind_or_connect(zmq.REP, endpoint, mode, "rep")
        self._loop([sock], self._handle_rep, "rep worker")

    def pull_worker_main(self, endpoint: str, mode: str = "Bind") -> None:
        """Receives caches, episode chunks and log lines until :meth:`close`."""
        sock = self._bind_or_connect(zmq.PULL, endpoint, mode, "pull")
        if native_libzmq():
            self._native_pull_loop(sock)
        else:
            self._loop([sock], self._handle_pull, "pull worker", idle=self._chunks.reap)

    def _proxy(self, front_kind, front_ep, front_mode, back_kind, back_ep, label) -> None:
        front = self._bind_or_connect(front_kind, front_ep, front_mode, f"{label}_front",
                                      server_side=True)
        back = self._bind_or_connect(back_kind, back_ep, "Bind", f"{label}_back")

        def forward(sock, frames):
            (back if sock is front else front).send_multipart(frames, copy=False)
        self._loop([front, back], forward, f"{label} proxy")

    def rep_proxy_main(self, front_ep: str, back_ep: str) -> None:
        """Forwards requests from clients (bound at `front_ep`) to REP workers that connect to
        `back_ep` (bound), and their replies back, until :meth:`close`."""
        self._proxy(zmq.ROUTER, front_ep, "Bind", zmq.DEALER, back_ep, "rep_proxy")

    def pull_proxy_main(self, front_ep: str, back_ep: str) -> None:
        """Forwards pushed messages from clients (bound at `front_ep`) to PULL workers that
        connect to `back_ep` (bound), until :meth:`close`."""
        self._proxy(zmq.PULL, front_ep, "Bind", zmq.PUSH, back_ep, "pull_proxy")

    def pub_proxy_main(self, front_ep: str, back_ep: str) -> None:
        """Relays a publisher (connects to `front_ep`, e.g. this server's PUB endpoint on
        another machine) to subscribers that connect to `back_ep` (bound), until
        :meth:`close`."""
        self._proxy(zmq.XSUB, front_ep, "Conn", zmq.XPUB, back_ep, "pub_proxy")

    def start(self, rep_endpoint: str = "tcp://127.0.0.1:*",
              pull_endpoint: str = "tcp://127.0.0.1:*", timeout: float = 10.0) -> dict:
        """Runs one REP and one PULL worker in daemon threads (bound to the endpoints) and
        returns ``{"pub": ..., "rep": ..., "pull": ...}`` with the ports filled in.

        Raises:
          TimeoutError: a worker did not bind within `timeout` seconds (its error is logged).
        """
        with self._lock:
            n_rep, n_pull = len(self.endpoints["rep"]), len(self.endpoints["pull"])
        for target, ep in ((self.rep_worker_main, rep_endpoint),
                           (self.pull_worker_main, pull_endpoint)):
            t = threading.Thread(target=_logged(target), args=(ep, "Bind"), daemon=True,
                                 name=f"memoire-{target.__name__}")
            t.start()
            self._threads.append(t)
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.endpoints["rep"]) <= n_rep or len(self.endpoints["pull"]) <= n_pull:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("start: the workers did not bind in time (see the log)")
                self._cond.wait(left)
            return {"pub": self.pub_endpoint, "rep": self.endpoints["rep"][n_rep],
                    "pull": self.endpoints["pull"][n_pull]}

    # ------------------------------------------------------------------ handlers

    def _decode(self, frames, expect, spec=None) -> Optional[codec.Message]:
        try:
            return codec.decode(frames, max_bytes=self.max_message_bytes, spec=spec, expect=expect)
        except ProtocolError as e:
            version = codec.peek_version(frames[0]) if frames else None
            reason = "version" if version not in (None, codec.WIRE_VERSION) else "malformed"
            self._reject(reason, str(e))
            return None

    def _handle_rep(self, sock: zmq.Socket, frames: list) -> None:
        try:
            msg = self._decode(frames, (Msg.HELLO, Msg.COUNTER, Msg.CALL))
            if msg is None:
                version = codec.peek_version(frames[0]) if frames else None
                if version not in (None, codec.WIRE_VERSION):
                    reply = _error("ProtocolError", f"wire version mismatch: the server speaks "
                                   f"version {codec.WIRE_VERSION}, the request came in version "
                                   f"{version}; upgrade memoire on one side")
                else:
                    reply = _error("ProtocolError", "malformed request (see the server log)")
            elif msg.type == Msg.HELLO:
                reply = codec.encode(Msg.HELLO_REPLY, self._handshake())
                self._count("handshakes")
            elif msg.type == Msg.COUNTER:
                reply = self._counter(msg)
            else:
                reply = self._call(msg.values)
        except Exception as e:  # noqa: BLE001 - REP must answer every request
            self._reject("internal", f"rep: {type(e).__name__}: {e}")
            reply = _error("RuntimeError", f"server error: {type(e).__name__}: {e}")
        sock.send_multipart(reply, copy=False)

    def _handshake(self) -> dict:
        return {"schema": [(n, d, np.asarray(s, np.int64)) for n, d, s in self._schema],
                "max_step": int(self._rem.max_step), "n_caches": self.n_caches,
                "settings": self.settings(), "max_message_bytes": self.max_message_bytes,
                "modes": ("cache", "central")}

    def _counter(self, msg: codec.Message) -> list:
        v = msg.values
        try:
            uuid, episodes, steps = int(v["uuid"]), int(v["episodes"]), int(v["steps"])
        except (KeyError, TypeError, ValueError):
            self._reject("malformed", "counter: expected uuid, episodes and steps")
            return _error("ProtocolError", "counter: expected uuid, episodes and steps")
        if not (0 <= episodes <= COUNTER_MAX and 0 <= steps <= COUNTER_MAX):
            self._reject("counter_range", f"counter from {uuid:08x}: "
                         f"episodes={episodes}, steps={steps} outside [0, 2**53-1]")
            return _error("ValueError", f"counter: episodes and steps must be in [0, "
                          f"{COUNTER_MAX}], got episodes={episodes}, steps={steps}")
        with self._lock:
            full = (uuid not in self._per_client
                    and len(self._per_client) >= self.max_counter_clients)
            if not full:
                prev_e, prev_s = self._per_client.get(uuid, (0, 0))
                # Totals saturate instead of outgrowing the wire's int64.
                self._total_episodes = min(_INT64_MAX,
                                           self._total_episodes + max(0, episodes - prev_e))
                self._total_steps = min(_INT64_MAX, self._total_steps + max(0, steps - prev_s))
                self._per_client[uuid] = (max(prev_e, episodes), max(prev_s, steps))
            totals = {"total_episodes": self._total_episodes, "total_steps": self._total_steps}
        if full:
            self._reject("counter_clients", f"counter from a new client {uuid:08x}: "
                         f"max_counter_clients={self.max_counter_clients} already counted")
            return _error("RuntimeError", f"counter: this server counts at most "
                          f"{self.max_counter_clients} clients (max_counter_clients)")
        return codec.encode(Msg.COUNTER_REPLY, totals)

    def _handle_pull(self, sock: zmq.Socket, frames: list) -> None:
        if frames and _core.peek_header(frames[0]) == (codec.WIRE_VERSION, Msg.CACHE):
            self._ingest_cache(frames)
            return
        got = self._chunks.ingest(frames)  # episode chunks: checked and stored natively
        if got is not None:
            self._chunk_done(*got)
            return
        msg = self._decode(frames, (Msg.CACHE, Msg.CHUNK, Msg.LOG))  # a log (or a bad message)
        if msg is not None:
            text, uuid = msg.values.get("message"), msg.values.get("uuid")
            if not isinstance(text, str) or not isinstance(uuid, (int, np.integer)):
                self._reject("malformed", "log: expected uuid and message")
                return
            self._write_log(int(uuid), text)
            self._count("logs")

    # ---- cache mode

    def _ring_for_settings(self) -> "_core.CacheRing":
        """The cache ring, laid out for the current settings (called under the lock); a
        settings change drops the held caches (they no longer match the batches asked for)."""
        layout = cache_layout(self._rem)
        if layout != self._ring_layout:
            spec = cache_spec(self._schema, layout)
            columns = [(name, np.dtype(dt), list(shape[1:]))
                       for name, (dt, shape) in spec.arrays.items() if len(shape)]
            if self._ring is None:
                self._ring = _core.CacheRing(columns, layout[0], self.n_caches,
                                             int(self._rng.integers(1 << 63)),
                                             self.max_message_bytes)
            else:
                self._ring.relayout(columns, layout[0])
            self._ring_layout = layout
        self._ring.allow_nonfinite = bool(self._rem.allow_nonfinite)
        return self._ring

    def _ingest_cache(self, frames: list) -> None:
        """Holds a received cache (no copy: the ring keeps the frames), checked natively."""
        with self._lock:
            ring = self._ring_for_settings()
        try:
            ring.insert(frames)
        except ValueError as e:  # ProtocolError: malformed; else a non-finite value
            self._reject("malformed" if isinstance(e, ProtocolError) else "nonfinite",
                         f"cache: {e}")
            return
        self._count("caches")

    def get_batch(self, batch_size: int, timeout: float = 0.0,
                  out: Optional[CacheBatch] = None) -> CacheBatch:
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
        n = int(batch_size)
        if n < 1:
            raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
        with self._lock:
            ring = self._ring_for_settings()
        try:
            got = ring.get_batch(n, bool(self._rem.reuse_cache), float(timeout), _as_outputs(out))
        except RuntimeError as e:
            if self._closing.is_set():
                raise RuntimeError("get_batch: the server is closed") from None
            raise RuntimeError(
                f"get_batch: {e} (reuse_cache={bool(self._rem.reuse_cache)}); wait for "
                "clients to push_cache() or lower batch_size") from None
        self._count_batch(n)
        prev = tuple(got.get(f"prev/{f}") for f in FIELDS)
        nxt = tuple(got.get(f"next/{f}") for f in FIELDS)
        return CacheBatch(prev, nxt, got["weight"], got["prob"], got["done"], got["id"],
                          got["uuid"], got["num_sampleable"], got["total_weight"])

    # ---- central mode

    def _chunk_done(self, outcome: int, rows: int, reason: Optional[str], count: int,
                    detail: Optional[str]) -> None:
        """Accounts for one chunk _core.ChunkIngest.ingest took."""
        if outcome == _COMMITTED:
            self._chunks_taken(1 if rows else 0, rows, ())
        elif reason is not None:
            self._chunks_taken(0, 0, ((reason, count, detail),))

    def _chunks_taken(self, episodes: int, rows: int, rejected) -> None:
        """Stored episodes wake wait_rows_in; rejections (counted natively, by reason) are
        logged, sparsely under a flood."""
        if episodes:
            with self._cond:
                self._stats["episodes_in"] += episodes
                self._stats["steps_in"] += rows
                self._cond.notify_all()
        for reason, count, detail in rejected:
            if count <= 10 or count % 1000 == 0:
                log.warning("dropped a chunk (%s, %d so far): %s", reason, count, detail)

    def sample(self, batch_size: int) -> Batch:
        """A batch from the server's memory (central mode): see
        :meth:`memoire.ReplayMemory.get_batch`. ``batch.id`` feeds :meth:`update_priorities`.

        Raises:
          RuntimeError: nothing is sampleable yet.
        """
        b = self._rem.get_batch(int(batch_size))
        self._count_batch(len(b))
        return b

    def update_priorities(self, ids, weights) -> int:
        """Sets the sampling weights of entries by id (central mode); stale ids are skipped.
        Returns how many were updated."""
        return int(self._rem.update_weights(np.asarray(ids, np.int64),
                                            np.asarray(weights, np.float32)))

    # ------------------------------------------------------------------ lifetime

    def close(self, timeout: float = 5.0) -> None:
        """Stops every worker and proxy loop (each notices within ~0.1 s), flushes and closes
        the logfile, and closes the sockets. Idempotent."""
        if self._closing.is_set() and self._ctx.closed:
            return
        self._closing.set()
        with self._lock:
            if self._ring is not None:
                self._ring.close()
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._active > 0 and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._pub_lock:
            if self._pub is not None:
                self._pub.close(0)
                self._pub = None
        with self._log_lock:
            if self._logfile is not None:
                self._logfile.close()
                self._logfile = None
        if self._auth is not None:
            self._auth.stop()
        if self._active == 0:
            self._ctx.term()

    def __enter__(self) -> "ReplayMemoryServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ReplayMemoryServer(pub={self.pub_endpoint}, rep={self.endpoints.get('rep')}, "
                f"pull={self.endpoints.get('pull')}, caches={self.total_caches})")


def _as_outputs(batch: Optional[CacheBatch]) -> Optional[dict]:
    """The arrays of `batch` by cache entry name (to be filled in place), or None."""
    if batch is None:
        return None
    arrays = {"weight": batch.weight, "prob": batch.prob, "done": batch.done, "id": batch.id,
              "uuid": batch.uuid, "num_sampleable": batch.num_sampleable,
              "total_weight": batch.total_weight}
    for k, f in enumerate(FIELDS):
        arrays[f"prev/{f}"] = batch.prev[k]
        arrays[f"next/{f}"] = batch.next[k]
    return arrays


def _error(kind: str, reason: str) -> list:
    return codec.encode(Msg.ERROR, {"error": kind, "reason": reason})


def _logged(fn):
    def run(*args):
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a failed bind is reported by start()'s timeout
            log.exception("%s failed", fn.__name__)
    return run
