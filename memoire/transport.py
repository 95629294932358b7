"""Socket helpers for memoire's server and client: endpoints and modes, loopback by default,
CURVE keys, and a request channel with timeouts and bounded retries (ZeroMQ's "lazy pirate").

A ZeroMQ socket belongs to one thread: every helper here creates a socket for the calling
thread, and the classes that hold one (:class:`RequestChannel`) guard it with a lock so that a
second thread waits instead of corrupting it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import time
from typing import Any, List, Optional, Sequence

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from memoire import _core, codec

log = logging.getLogger("memoire.transport")
DEFAULT_TIMEOUT = 5.0  # seconds a request waits for its reply
DEFAULT_RETRIES = 3  # resends after the first attempt
LOOPBACK = "127.0.0.1"


def is_bind(mode: str) -> bool:
    """True for ``'Bind'``, False for ``'Conn'`` (the seed's modes; case-insensitive, and
    ``'connect'`` also accepted). Raises ValueError for anything else."""
    m = str(mode).lower()
    if m == "bind":
        return True
    if m in ("conn", "connect"):
        return False
    raise ValueError(f"mode: expected 'Bind' or 'Conn', got {mode!r}")


_TCP = re.compile(r"^tcp://(\*|\[[^\]]*\]|[^:/]*):(\*|\d+)$")


def bind_address(endpoint: str, bind_host: str = LOOPBACK) -> str:
    """The address to bind for `endpoint`: a ``tcp://*:port`` wildcard host becomes `bind_host`
    (loopback unless the caller opts out), so a server is unreachable from other machines by
    default. Port ``*`` or ``0`` lets the OS choose. Other transports pass unchanged.

    Raises:
      ValueError: a tcp endpoint that is not ``tcp://host:port``.
    """
    if not endpoint.startswith("tcp://"):
        return endpoint
    m = _TCP.match(endpoint)
    if not m:
        raise ValueError(f"endpoint: expected tcp://host:port, got {endpoint!r}")
    host, port = m.group(1), m.group(2)
    if host == "*":
        host = bind_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
    if port == "0":
        port = "*"
    return f"tcp://{host}:{port}"


def last_endpoint(sock: zmq.Socket) -> str:
    """The endpoint a socket last bound, with the OS-chosen port filled in."""
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode()


@dataclasses.dataclass
class CurveKeys:
    """CURVE authentication and encryption settings (keys in ZeroMQ certificate files, as
    written by :func:`generate_keys` or ``zmq.auth.create_certificates``).

    Server side: ``secret_file`` (the server's keypair) and ``authorized_dir`` (a folder of
    the public certificates of clients allowed in; None lets any client that knows the
    server's public key in, still encrypted).
    Client side: ``secret_file`` (the client's keypair) and ``server_public_file``.
    """

    secret_file: str
    server_public_file: Optional[str] = None
    authorized_dir: Optional[str] = None

    def _own(self):
        public, secret = zmq.auth.load_certificate(self.secret_file)
        if secret is None:
            raise ValueError(
                f"CURVE: {self.secret_file} holds no secret key (expected a .key_secret file)"
            )
        return public, secret

    def apply_server(self, sock: zmq.Socket) -> None:
        public, secret = self._own()
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True

    def apply_client(self, sock: zmq.Socket) -> None:
        if not self.server_public_file:
            raise ValueError("CURVE: a client needs server_public_file")
        public, secret = self._own()
        server_public, _ = zmq.auth.load_certificate(self.server_public_file)
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_serverkey = server_public


def generate_keys(folder: str, name: str):
    """Writes ``name.key`` (public) and ``name.key_secret`` into `folder`; returns both paths."""
    os.makedirs(folder, exist_ok=True)
    return zmq.auth.create_certificates(folder, name)


class Authenticator:
    """ZeroMQ's ZAP handler for one context: only clients whose public key is in
    ``keys.authorized_dir`` get through CURVE sockets of that context."""

    def __init__(self, ctx: zmq.Context, keys: CurveKeys):
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        location = keys.authorized_dir if keys.authorized_dir else zmq.auth.CURVE_ALLOW_ANY
        self._auth.configure_curve(domain="*", location=location)

    def stop(self) -> None:
        self._auth.stop()


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """ZeroMQ heartbeats of a socket's connections (ZMTP PING/PONG, libzmq >= 4.2), seconds.

    - ``interval`` (ZMQ_HEARTBEAT_IVL): a PING goes out on each connection this often.
    - ``timeout`` (ZMQ_HEARTBEAT_TIMEOUT): a connection that sends nothing back (no PONG, no
      message) for this long after a PING is closed: a peer whose machine died or froze is
      noticed within ``interval + timeout`` seconds (a killed process at once: its kernel
      closes the connection).
    - ``ttl`` (ZMQ_HEARTBEAT_TTL): sent in each PING; the peer closes the connection when it
      hears nothing from this side for this long (so a client notices a dead server too).
      Rounded to tenths of a second by the protocol (at most 6553.5 s).

    A closed connection is reconnected by the connecting side as usual; the server counts
    and handles the close (``stats()``: ``peer_disconnects``, ``rejected["peer_lost"]``).
    """

    interval: float = 1.0
    timeout: float = 5.0
    ttl: float = 10.0

    def __post_init__(self):
        for name in ("interval", "timeout", "ttl"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v <= 6553.5):
                raise ValueError(f"heartbeat {name}: expected seconds in (0, 6553.5], got {v!r}")

    def apply(self, sock: zmq.Socket) -> None:
        sock.setsockopt(zmq.HEARTBEAT_IVL, int(self.interval * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(self.timeout * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TTL, int(self.ttl * 1000))


DEFAULT_HEARTBEAT = Heartbeat()  # every long-lived connection memoire opens (docs/LIMITS.md)


def open_socket(
    ctx: zmq.Context,
    kind: int,
    endpoint: str,
    mode: str,
    *,
    keys: Optional[CurveKeys] = None,
    server_side: bool = True,
    bind_host: str = LOOPBACK,
    hwm: Optional[int] = None,
    max_bytes: Optional[int] = None,
    heartbeat: Optional[Heartbeat] = DEFAULT_HEARTBEAT,
) -> zmq.Socket:
    """A new socket of `kind` bound to or connected to `endpoint`.

    Args:
      mode: ``'Bind'`` or ``'Conn'``.
      keys: CURVE keys; `server_side` says which half of the handshake this socket plays.
      bind_host: the interface a ``tcp://*:port`` endpoint binds (loopback by default).
      hwm: send and receive high-water marks (messages queued per peer).
      max_bytes: ZMQ_MAXMSGSIZE: a peer sending a larger frame is disconnected by libzmq.
      heartbeat: ZeroMQ heartbeats on its connections (:class:`Heartbeat`; None: none).
    """
    bind = is_bind(mode)
    sock = ctx.socket(kind)
    sock.linger = 0
    if heartbeat is not None:
        heartbeat.apply(sock)
    if hwm is not None:
        sock.sndhwm = hwm
        sock.rcvhwm = hwm
    if max_bytes is not None:
        sock.maxmsgsize = int(max_bytes)
    if keys is not None:
        (keys.apply_server if server_side else keys.apply_client)(sock)
    try:
        if bind:
            sock.bind(bind_address(endpoint, bind_host))
        else:
            sock.connect(endpoint)
    except Exception:
        sock.close(0)
        raise
    return sock


class ConnectionWatch:
    """The connections of one socket, seen through ZeroMQ's socket monitor: how many are open,
    and when each closed (a peer that closed its socket, a killed process, or one that stopped
    answering heartbeats: see :class:`Heartbeat`). ZeroMQ does not say which peer a message
    came from, so this counts connections, not peers by name.

    Owned by the socket's thread: call :meth:`poll` from it (non-blocking) and :meth:`close`
    before the socket is closed.
    """

    def __init__(self, sock: zmq.Socket):
        self._sock = sock
        self._mon = sock.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
        )
        self.open = 0
        self.opened = 0  # connections ever made
        self.closed = 0  # connections ever closed
        self.last_closed: Optional[float] = None  # time.monotonic() of the latest close

    def poll(self) -> List[float]:
        """Reads the events queued so far; returns the ``time.monotonic()`` at which each
        connection closed since the last call (when this call saw it)."""
        from zmq.utils.monitor import recv_monitor_message

        closed = []
        while True:
            try:
                event = recv_monitor_message(self._mon, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return closed
            except zmq.ZMQError:  # the monitor is gone (closing)
                return closed
            if event in (zmq.EVENT_ACCEPTED, zmq.EVENT_CONNECTED):
                self.open += 1
                self.opened += 1
            elif event == zmq.EVENT_DISCONNECTED:
                self.open = max(0, self.open - 1)
                self.closed += 1
                self.last_closed = time.monotonic()
                closed.append(self.last_closed)

    def close(self) -> None:
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._mon.close(0)


class RequestChannel:
    """A REQ socket with a timeout per attempt and a bounded number of resends.

    When no reply comes in `timeout` seconds the socket is closed and a fresh one reconnects
    and resends (a REQ socket cannot send twice), up to `retries` times; then TimeoutError.
    So a client survives a server restart: its next request reaches the new server. Requests
    must therefore be idempotent (memoire's are: counters are cumulative, calls are reads or
    replace state). Thread-safe: one request at a time.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        *,
        keys: Optional[CurveKeys] = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        max_bytes: int = codec.DEFAULT_MAX_BYTES,
    ):
        if timeout <= 0:
            raise ValueError(f"timeout: expected seconds > 0, got {timeout}")
        if retries < 0:
            raise ValueError(f"retries: expected >= 0, got {retries}")
        self.endpoint = endpoint
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.max_bytes = max_bytes
        self._ctx = ctx
        self._keys = keys
        self._lock = threading.Lock()
        self._sock: Optional[zmq.Socket] = None

    def _open(self) -> zmq.Socket:
        return open_socket(
            self._ctx, zmq.REQ, self.endpoint, "Conn", keys=self._keys, server_side=False
        )

    def request(
        self, frames: Sequence[Any], timeout: Optional[float] = None, retries: Optional[int] = None
    ) -> List[zmq.Frame]:
        """Sends `frames` and returns the reply frames.

        Raises:
          TimeoutError: no reply after ``1 + retries`` attempts of `timeout` seconds each.
        """
        timeout = self.timeout if timeout is None else float(timeout)
        attempts = 1 + (self.retries if retries is None else int(retries))
        with self._lock:
            for _ in range(attempts):
                if self._sock is None:
                    self._sock = self._open()
                # A REQ socket has no pipe to send into while a peer refuses its CURVE
                # handshake, and a send would then block for ever: bound it too.
                self._sock.sndtimeo = int(timeout * 1000)
                try:
                    self._sock.send_multipart(frames, copy=False)
                    if self._sock.poll(int(timeout * 1000), zmq.POLLIN):
                        return self._sock.recv_multipart(copy=False)
                except zmq.Again:
                    pass
                self._sock.close(0)  # lazy pirate: drop the stuck socket, reconnect, resend
                self._sock = None
        raise TimeoutError(
            f"no reply from {self.endpoint} after {attempts} attempt(s) of {timeout:g} s"
        )

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close(0)
                self._sock = None


def log_dropped(logger: logging.Logger, what: str, reason: str, count: int, detail: str) -> None:
    """Logs the ``count``-th ``what`` (e.g. "a chunk") dropped for ``reason``: the first ten,
    then every thousandth, so a peer's flood of bad messages does not flood the log."""
    if count <= 10 or count % 1000 == 0:
        logger.warning("dropped %s (%s, %d so far): %s", what, reason, count, detail)


def publication_frames(topic: bytes, data) -> list:
    """The frames a server publishes for ``pub_bytes(topic, data)``: the topic (ZeroMQ's
    subscription prefix), then a PUB message repeating it (so prefix matches of other topics
    can be told apart) with the data."""
    return [topic] + codec.encode(codec.Msg.PUB, {"topic": topic, "data": data})


def publication(frames: Sequence[Any], max_bytes: int = codec.DEFAULT_MAX_BYTES):
    """``(topic, data)`` (bytes) of frames made by :func:`publication_frames`, or None for
    anything else: a subscriber ignores what is not a memoire publication, never dies of it."""
    if len(frames) < 2:
        return None
    try:
        msg = codec.decode(frames[1:], max_bytes=max_bytes, expect=(codec.Msg.PUB,))
    except codec.ProtocolError:
        return None
    topic, data = msg.values.get("topic"), msg.values.get("data")
    first = frames[0].bytes if hasattr(frames[0], "bytes") else bytes(frames[0])
    if not isinstance(topic, bytes) or topic != first or not isinstance(data, bytes):
        return None
    return topic, data


_native: Optional[bool] = None
_native_lock = threading.Lock()  # one thread finds it; the others wait for its answer


def native_libzmq() -> bool:
    """Whether memoire's native message paths (a server receiving caches, a client sending
    them: C++ loops without the GIL) can use the libzmq that pyzmq loaded. Found once per
    process in its memory map; ``MEMOIRE_NATIVE_ZMQ=0`` turns the native paths off (the pure
    pyzmq paths do the same work, slower)."""
    global _native
    with _native_lock:  # threads started together must not see a half-made answer
        if _native is None:
            native = False
            if os.environ.get("MEMOIRE_NATIVE_ZMQ", "1") != "0":
                path = _loaded_libzmq()
                why = (
                    "pyzmq's libzmq is not a shared library here"
                    if path is None
                    else _core.attach_libzmq(path)
                )
                native = why is None
                if why is not None:
                    log.info("native message paths off: %s", why)
            _native = native
        return _native


def _loaded_libzmq() -> Optional[str]:
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:  # not Linux
        return None
    for line in lines:
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if os.path.basename(path).startswith("libzmq") and ".so" in path:
            return path
    return None
