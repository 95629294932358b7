"""Remote calls: objects hosted for :class:`memoire.remote.RemoteObject`, with no memory.

- :class:`RpcHost` runs CALL messages against hosted objects and keeps the last reply to each
  caller, so a call retried after a lost reply runs once. It also offers the bounds a hosted
  object applies to what peers send (:meth:`RpcHost.check_batch`,
  :meth:`RpcHost.check_finite`). A :class:`memoire.ReplayMemoryServer` has one.
- :class:`RpcServer` is a standalone host: REP workers (and proxies) around an
  :class:`RpcHost`, for objects that need no replay memory (a Dopamine buffer server).

Threads and ownership: an RpcHost is called from every REP worker thread at once. Its lock
guards the hosted table and the reply cache only; a hosted method runs outside it (under the
object's own lock when hosted with ``serialize``). The host owns neither the objects nor any
socket.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Dict, Iterable, Optional, Sequence

import numpy as np
import zmq

from memoire import codec
from memoire.protocol import Msg
from memoire.server.workers import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Publisher,
    Stats,
    Workers,
    WouldBlock,
    error_reply,
    rep_handler,
)
from memoire.transport import LOOPBACK, CurveKeys

# Bounds on what peers can make a host hold (docs/LIMITS.md).
DEFAULT_REPLY_CACHE_BYTES = 64 << 20
DEFAULT_MAX_BATCH = 16384
_MAX_CALLERS = 1024  # replies kept at most (one per caller), whatever their size


class _Hosted:
    def __init__(self, obj: Any, methods: Iterable[str], serialize: bool):
        self.obj = obj
        self.methods = frozenset(methods)
        # Re-entrant: a hosted method may take it again (a buffer server's checkpoint call
        # runs under it and saves under it, as its periodic saves do).
        self.lock = threading.RLock() if serialize else None


class RpcHost:
    """Hosted objects and the reply cache (see the module docstring).

    Args:
      stats: counters to report into (``calls``; ``rejected``: ``batch_too_large``,
        ``nonfinite``).
      reply_cache_bytes: bytes of replies kept for retries (oldest go first; a larger reply is
        not kept), >= 0.
      max_batch: rows one remote call may ask for (:meth:`check_batch`), >= 1.
    """

    def __init__(
        self,
        stats: Stats,
        reply_cache_bytes: int = DEFAULT_REPLY_CACHE_BYTES,
        max_batch: int = DEFAULT_MAX_BATCH,
    ):
        for name, value, least in (
            ("reply_cache_bytes", reply_cache_bytes, 0),
            ("max_batch", max_batch, 1),
        ):
            if int(value) < least:
                raise ValueError(f"{name}: expected >= {least}, got {value}")
        self.stats = stats
        self.reply_cache_bytes = int(reply_cache_bytes)
        self.max_batch = int(max_batch)
        self._lock = threading.Lock()
        self._hosted: Dict[str, _Hosted] = {}
        # caller -> (seq, reply frames, bytes); the oldest go first past reply_cache_bytes.
        self._replies: "collections.OrderedDict[int, tuple]" = collections.OrderedDict()
        self._reply_bytes = 0

    @property
    def reply_bytes(self) -> int:
        """Bytes of replies held for retries."""
        with self._lock:
            return self._reply_bytes

    def host(self, name: str, obj: Any, methods: Sequence[str], serialize: bool = True) -> None:
        """Makes `obj`'s `methods` callable by :class:`memoire.remote.RemoteObject`. Arguments
        and results must be codec values (numpy arrays, scalars, str, bytes, None, and
        lists/tuples/dicts of them). With `serialize`, calls to this object run one at a time;
        otherwise concurrently from several REP workers.

        Raises:
          ValueError: a method that `obj` lacks or that is private.
        """
        for m in methods:
            if m.startswith("_") or not callable(getattr(obj, m, None)):
                raise ValueError(f"host: {type(obj).__name__}.{m} is not a public method")
        with self._lock:
            self._hosted[str(name)] = _Hosted(obj, methods, serialize)

    def lock(self, name: str):
        """The lock that calls to the object hosted as `name` run under (a re-entrant lock;
        None when it was hosted without ``serialize``): hold it to act on the object between
        calls, as a server's periodic checkpoint does.

        Raises:
          KeyError: nothing is hosted as `name`.
        """
        with self._lock:
            return self._hosted[str(name)].lock

    def handle_call(self, msg: codec.Message) -> list:
        """The reply frames to a CALL message. The last reply to each caller is kept, so a call
        retried after a lost reply (same caller and seq) is answered again without running
        twice."""
        v = msg.values
        caller, seq = v.get("caller"), v.get("seq")
        keyed = isinstance(caller, int) and isinstance(seq, int)
        if keyed:
            with self._lock:
                cached = self._replies.get(caller)
                if cached is not None and cached[0] == seq:
                    self._replies.move_to_end(caller)
                    return cached[1]
        reply = self._run(v)
        if keyed:
            size = sum(memoryview(f).nbytes for f in reply)
            with self._lock:
                old = self._replies.pop(caller, None)
                if old is not None:
                    self._reply_bytes -= old[2]
                if size <= self.reply_cache_bytes:  # a larger reply is not kept: a retry reruns
                    self._replies[caller] = (seq, reply, size)
                    self._reply_bytes += size
                while self._replies and (
                    self._reply_bytes > self.reply_cache_bytes or len(self._replies) > _MAX_CALLERS
                ):
                    self._reply_bytes -= self._replies.popitem(last=False)[1][2]
        return reply

    def _run(self, v: dict) -> list:
        name, method = v.get("object"), v.get("method")
        args, kwargs = v.get("args", ()), v.get("kwargs", {})
        with self._lock:
            hosted = self._hosted.get(name) if isinstance(name, str) else None
        if hosted is None:
            return error_reply("KeyError", f"no hosted object {name!r}")
        if method not in hosted.methods:
            return error_reply(
                "AttributeError",
                f"{name!r} has no remote method {method!r} (allowed: "
                f"{', '.join(sorted(hosted.methods))})",
            )
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
            return error_reply("TypeError", "call: expected args as a tuple and kwargs as a dict")
        try:
            fn = getattr(hosted.obj, method)
            if hosted.lock is not None:
                with hosted.lock:
                    result = fn(*args, **kwargs)
            else:
                result = fn(*args, **kwargs)
            reply = codec.encode(Msg.CALL_REPLY, {"result": result})
        except WouldBlock:  # answered later by the deferring loop
            raise
        except Exception as e:  # noqa: BLE001 - the caller gets the error; the worker lives on
            return error_reply(type(e).__name__, str(e))
        self.stats.count("calls")
        return reply

    def check_batch(self, batch_size, what: str = "batch_size") -> int:
        """`batch_size` as an int when a remote call may ask for it (1..:attr:`max_batch`).

        Raises:
          ValueError: outside those bounds (counted as ``batch_too_large`` when too large).
        """
        n = int(batch_size)
        if n > self.max_batch:
            self.stats.reject(
                "batch_too_large", f"{what}({n}): more than max_batch={self.max_batch}"
            )
            raise ValueError(
                f"{what}: batch_size {n} is more than this server's max_batch "
                f"({self.max_batch}); ask for smaller batches"
            )
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
            counted as ``nonfinite``.
        """
        for name, values in arrays.items():
            if values is None:
                continue
            a = np.asarray(values)
            if a.dtype.kind in "fc" and not np.isfinite(a).all():
                self.stats.reject("nonfinite", f"{what}: {name} holds a NaN or an infinity")
                raise ValueError(
                    f"{what}: {name} holds a NaN or an infinity; this server "
                    "refuses non-finite values from peers (see docs/LIMITS.md)"
                )


class RpcServer:
    """A standalone remote-call server: hosts objects (:meth:`host`) for
    :class:`memoire.remote.RemoteObject` over REP, with no replay memory.

    Args:
      bind_host: the interface a ``*`` host binds: loopback unless you opt out.
      keys: :class:`memoire.transport.CurveKeys` to authenticate and encrypt what it binds.
      max_message_bytes: the largest request accepted.
      reply_cache_bytes, max_batch: as :class:`RpcHost`.
      allow_nonfinite: what hosted objects should do with NaN/infinite values from peers
        (read by :func:`memoire.dopamine_compat.buffer_server.serve_buffer`).
      pub_endpoint: an endpoint to bind a PUB socket at (port ``*``: chosen by the OS, read
        back from :attr:`pub_endpoint`) for :meth:`pub_bytes`; None (default) for none.

    Serve with :meth:`start` (a REP worker in a daemon thread), or run :meth:`rep_worker_main`
    (and the proxies) in threads of your own. Thread-safe; :meth:`close` stops every loop.
    The server hosts itself as ``"server"``: peers may read its :meth:`stats`.
    """

    def __init__(
        self,
        *,
        bind_host: str = LOOPBACK,
        keys: Optional[CurveKeys] = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        reply_cache_bytes: int = DEFAULT_REPLY_CACHE_BYTES,
        max_batch: int = DEFAULT_MAX_BATCH,
        allow_nonfinite: bool = False,
        pub_endpoint: Optional[str] = None,
    ):
        self._stats = Stats()
        self.rpc = RpcHost(self._stats, reply_cache_bytes, max_batch)
        self.allow_nonfinite = bool(allow_nonfinite)
        self._workers = Workers(
            self._stats, keys=keys, bind_host=bind_host, max_message_bytes=max_message_bytes
        )
        self._handle = rep_handler(
            self._stats, {Msg.CALL: self.rpc.handle_call}, self._workers.max_message_bytes
        )
        self.host = self.rpc.host
        self.check_batch = self.rpc.check_batch
        self.check_finite = self.rpc.check_finite
        self.rep_proxy_main = self._workers.rep_proxy_main
        self.host("server", self, methods=("stats",), serialize=False)
        self._pub = Publisher(self._workers, pub_endpoint) if pub_endpoint is not None else None
        self.pub_endpoint = None if self._pub is None else self._pub.endpoint
        # The hosted object's checkpoint folder (memoire.server.checkpoints.Checkpoints), set
        # by whoever gives it one (start_buffer_server); close() ends its periodic saves.
        self.checkpoints = None

    def pub_bytes(self, topic, message) -> None:
        """Publishes `message` under `topic` to subscribers of :attr:`pub_endpoint` (as
        :meth:`memoire.ReplayMemoryServer.pub_bytes`).

        Raises:
          RuntimeError: no PUB socket (``pub_endpoint=None``), or the server is closed.
        """
        if self._pub is None:
            raise RuntimeError("pub_bytes: this server has no PUB socket (pub_endpoint=None)")
        self._pub.publish(topic, message)

    max_batch = property(lambda self: self.rpc.max_batch, doc="Rows one call may ask for.")
    endpoints = property(
        lambda self: self._workers.endpoints,
        doc="Endpoints bound or connected, by socket kind ('rep', ...).",
    )

    def rep_worker_main(self, endpoint: str, mode: str = "Bind") -> None:
        """Serves remote calls on a REP socket until :meth:`close` (blocks)."""
        sock = self._workers.open(zmq.REP, endpoint, mode, "rep")
        self._workers.loop([sock], self._handle, "rep worker")

    def start(self, rep_endpoint: str = "tcp://127.0.0.1:*", timeout: float = 10.0) -> str:
        """Runs a REP worker in a daemon thread; returns its endpoint (port filled in).

        Raises:
          TimeoutError: it did not bind within `timeout` seconds (its error is logged).
        """
        return self._workers.start_threads([(self.rep_worker_main, rep_endpoint, "rep")], timeout)[
            "rep"
        ]

    def stats(self) -> dict:
        """Counters: ``calls``, ``rejected`` by reason, ``rejected_total``,
        ``reply_cache_bytes``."""
        with self._stats.lock:
            s = dict(self._stats.counts)
            s["rejected"] = dict(self._stats.rejected)
            s["rejected_total"] = sum(self._stats.rejected.values())
        s["reply_cache_bytes"] = self.rpc.reply_bytes
        return s

    def close(self, timeout: float = 5.0) -> None:
        """Stops every loop (periodic checkpoints included; it writes none) and closes the
        sockets. Idempotent."""
        if self.checkpoints is not None:
            self.checkpoints.stop(timeout)
        if self._workers.close(timeout):
            if self._pub is not None:
                self._pub.close()
            self._workers.terminate()

    def __enter__(self) -> "RpcServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RpcServer(rep={self.endpoints.get('rep')})"
