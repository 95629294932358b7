"""Typed remote calls to objects hosted by a server (:class:`memoire.server.RpcServer`, which
needs no replay memory, or a :class:`memoire.ReplayMemoryServer`), over its REP endpoint,
encoded with memoire's codec (never pickle). The serving side is
:mod:`memoire.server.rpc_host`.

Server side::

    server = RpcServer(); endpoint = server.start()
    server.host("replay", buffer, methods=("add_batch", "sample_transition_batch",
                                           "set_priority", "get_priority", "add_count"))

Client side::

    replay = RemoteObject(rep_endpoint, "replay")
    replay.call("add_batch", observations, actions)   # or replay.add_batch(...)

Arguments and results are codec values: numpy arrays, bool/int/float, str, bytes, None, and
lists/tuples/dicts (str keys) of them. Exceptions raised by the hosted method come back as the
same built-in type (ValueError, IndexError, KeyError, TypeError, RuntimeError, AttributeError,
NotImplementedError, AssertionError, FileNotFoundError, PermissionError, memoire.ProtocolError,
memoire.CapacityError; a checkpoint's CheckpointError as memoire.ProtocolError, its base) or as
:class:`RemoteError`.

Each call carries a caller id and a sequence number; the server remembers its last reply to
each caller, so a call retried after a lost reply runs once (safe for non-idempotent methods
such as ``add_batch``). Thread-safe: calls from several threads run one at a time.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional, Sequence

import numpy as np
import zmq

from memoire import _core, codec
from memoire.codec import Msg, ProtocolError
from memoire.memory import Batch
from memoire.transport import DEFAULT_RETRIES, DEFAULT_TIMEOUT, CurveKeys, RequestChannel


class RemoteError(RuntimeError):
    """A hosted method raised an exception of a type that is not mapped back."""


_MAPPED = {
    e.__name__: e
    for e in (
        ValueError,
        IndexError,
        KeyError,
        TypeError,
        RuntimeError,
        AttributeError,
        NotImplementedError,
        TimeoutError,
        AssertionError,
        FileNotFoundError,
        PermissionError,
    )
}
_MAPPED["ProtocolError"] = ProtocolError
_MAPPED["CheckpointError"] = ProtocolError  # its base class (dopamine_compat.checkpoint's)
_MAPPED["CapacityError"] = _core.CapacityError


def raise_for_error(msg: codec.Message, where: str) -> None:
    """Raises the exception an ERROR reply describes."""
    kind = msg.values.get("error")
    reason = msg.values.get("reason")
    exc = _MAPPED.get(kind, RemoteError) if isinstance(kind, str) else RemoteError
    text = f"{where}: {reason}" if exc is not RemoteError else f"{where}: {kind}: {reason}"
    raise exc(text)


def request(
    channel: RequestChannel,
    msg_type: int,
    values: dict,
    expect: Sequence[int],
    where: str,
    writable: bool = False,
) -> codec.Message:
    """Sends one request and decodes its reply; ERROR replies raise.

    Raises:
      TimeoutError: no reply after the channel's retries.
      ProtocolError: a malformed reply or one of another wire version.
    """
    frames = channel.request(codec.encode(msg_type, values))
    try:
        msg = codec.decode(
            frames,
            max_bytes=channel.max_bytes,
            expect=tuple(expect) + (Msg.ERROR,),
            writable=writable,
        )
    except ProtocolError as e:
        raise ProtocolError(f"{where}: bad reply from {channel.endpoint}: {e}") from None
    if msg.type == Msg.ERROR:
        raise_for_error(msg, where)
    return msg


class RemoteObject:
    """A proxy of an object hosted under `name` by the server whose REP endpoint is `endpoint`.

    Args:
      endpoint: the server's REP endpoint (e.g. ``"tcp://127.0.0.1:5561"``).
      name: the hosted object's name.
      keys: :class:`memoire.transport.CurveKeys` (client side) when the server uses CURVE.
      timeout: seconds per attempt; retries: resends after a timeout.
    """

    def __init__(
        self,
        endpoint: str,
        name: str,
        *,
        keys: Optional[CurveKeys] = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        max_bytes: int = codec.DEFAULT_MAX_BYTES,
    ):
        self.name = name
        self._ctx = zmq.Context()
        self._channel = RequestChannel(
            self._ctx, endpoint, keys=keys, timeout=timeout, retries=retries, max_bytes=max_bytes
        )
        self._caller = int.from_bytes(np.random.default_rng().bytes(8), "little") >> 1
        self._seq = itertools.count(1)

    def call(self, method: str, *args, **kwargs) -> Any:
        """Calls `method` remotely and returns its result (arrays writable, owned by you).

        Raises:
          TimeoutError: the server did not answer. The hosted method's exception otherwise.
        """
        values = {
            "object": self.name,
            "method": method,
            "args": tuple(args),
            "kwargs": kwargs,
            "caller": self._caller,
            "seq": next(self._seq),
        }
        msg = request(
            self._channel,
            Msg.CALL,
            values,
            (Msg.CALL_REPLY,),
            f"{self.name}.{method}",
            writable=True,
        )
        return msg.values.get("result")

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self.call(method, *args, **kwargs)

    def close(self) -> None:
        self._channel.close()
        self._ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteMemory(RemoteObject):
    """The server's memory (hosted as ``"memory"``): a remote learner's view.

    ``sample`` draws from the central memory, ``get_batch`` from the caches,
    ``update_priorities`` sets weights by id (central mode), ``stats`` reads the counters.
    """

    def __init__(self, endpoint: str, **kwargs):
        super().__init__(endpoint, "memory", **kwargs)

    def sample(self, batch_size: int, timeout: Optional[float] = None) -> Batch:
        """:class:`memoire.Batch` from the central memory, plus ``num_sampleable`` and
        ``total_weight`` attributes (the importance-sampling normaliser).

        Args:
          timeout: seconds the server's rate limiter (if it has one) may hold the sample back
            before it answers TimeoutError (None: :data:`memoire.rate_limiter.DEFAULT_TIMEOUT`).
            Keep it below this object's request `timeout`, which bounds each attempt.
        """
        extra = {} if timeout is None else {"timeout": float(timeout)}
        d = self.call("sample", int(batch_size), **extra)
        b = Batch(d["prev"], d["next"], d["weight"], d["prob"], d["done"], d["id"])
        b.num_sampleable, b.total_weight = d["num_sampleable"], d["total_weight"]
        return b

    def get_batch(self, batch_size: int):
        """:class:`memoire.server.CacheBatch` from the server's caches."""
        from memoire.server import CacheBatch

        return CacheBatch(**self.call("get_batch", int(batch_size)))

    def update_priorities(self, ids, weights) -> int:
        return int(
            self.call(
                "update_priorities", np.asarray(ids, np.int64), np.asarray(weights, np.float32)
            )
        )

    def stats(self) -> dict:
        return self.call("stats")
