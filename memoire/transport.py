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


def beyond_loopback(where: str) -> bool:
    """Whether binding `where` (a host, or an endpoint such as ``tcp://0.0.0.0:5555``) may be
    reached from other machines: True for every TCP host but loopback (``127.x.x.x``,
    ``localhost``, ``::1``), wildcards (``*``, ``0.0.0.0``, ``::``) and names included; False for
    loopback and for ``ipc://`` and ``inproc://`` endpoints (this machine only). The one place
    memoire decides whether what it binds needs CURVE keys."""
    where = str(where)
    if where.startswith(("ipc://", "inproc://")):
        return False
    if where.startswith("tcp://"):
        where = where[len("tcp://") :].rsplit(":", 1)[0]
    host = where.strip("[]").lower()
    return not (host.startswith("127.") or host in ("localhost", "::1"))


def clear_text_warning(who: str, bound: Sequence[str], advice: str = "") -> Optional[str]:
    """The one warning of sockets bound beyond loopback without CURVE keys (``memoire serve``
    without ``--curve_secret``, a learner under ``--insecure``); None when none of ``bound``
    is beyond loopback (:func:`beyond_loopback`).

    Args:
      who: what bound them, the line's first words (e.g. ``memoire serve``, ``--insecure``).
      bound: the addresses bound (endpoints or hosts), in the order to name them.
      advice: what to do about it (e.g. which flag adds keys), or ''.
    """
    beyond = [str(where) for where in bound if beyond_loopback(where)]
    if not beyond:
        return None
    return (
        f"{who}: bound beyond loopback ({', '.join(beyond)}) without CURVE keys: what travels "
        "is in clear and anyone who reaches these ports can connect"
        + (f"; {advice}" if advice else "")
    )


@dataclasses.dataclass
class CurveKeys:
    """CURVE authentication and encryption settings: keys in ZeroMQ certificate files (as
    written by :func:`generate_keys` or ``zmq.auth.create_certificates``), or in memory (Z85
    bytes, as :func:`run_keys` makes them: never on disk).

    Server side: ``secret_file`` (the server's keypair) and ``authorized_dir`` (a folder of
    the public certificates of clients allowed in; None lets any client that knows the
    server's public key in, still encrypted).
    Client side: ``secret_file`` (the client's keypair) and ``server_public_file``.
    In memory: ``public``/``secret`` (this side's keypair), ``server_public`` (client side)
    and ``authorized`` (server side: the public keys of the clients allowed in).
    """

    secret_file: Optional[str] = None
    server_public_file: Optional[str] = None
    authorized_dir: Optional[str] = None
    public: Optional[bytes] = None
    secret: Optional[bytes] = None
    server_public: Optional[bytes] = None
    authorized: Optional[tuple] = None

    def __repr__(self) -> str:  # never print a secret key (logs, Ray's error messages)
        return f"CurveKeys(secret_file={self.secret_file!r}, public={self.public!r}, ...)"

    def _own(self):
        if self.secret is not None:
            return self.public, self.secret
        if not self.secret_file:
            raise ValueError("CURVE: expected a secret_file or an in-memory keypair")
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
        if self.server_public is not None:
            server_public = self.server_public
        elif self.server_public_file:
            server_public, _ = zmq.auth.load_certificate(self.server_public_file)
        else:
            raise ValueError("CURVE: a client needs server_public_file")
        public, secret = self._own()
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_serverkey = server_public


def generate_keys(folder: str, name: str):
    """Writes ``name.key`` (public) and ``name.key_secret`` into `folder`; returns both paths."""
    os.makedirs(folder, exist_ok=True)
    return zmq.auth.create_certificates(folder, name)


def run_keys() -> tuple:
    """Fresh CURVE keys for one run, in memory: ``(server side, client side)``
    :class:`CurveKeys`. The server lets in only the client keypair made here, which every
    client of the run shares; whoever holds the client side can connect."""
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    server = CurveKeys(public=server_public, secret=server_secret, authorized=(client_public,))
    client = CurveKeys(public=client_public, secret=client_secret, server_public=server_public)
    return server, client


class _AuthorizedKeys:
    """ZeroMQ's ZAP credentials provider for public keys held in memory."""

    def __init__(self, keys):
        self._keys = frozenset(bytes(k) for k in keys)

    def callback(self, domain: str, key: bytes) -> bool:
        return bytes(key) in self._keys


class Authenticator:
    """ZeroMQ's ZAP handler for one context: only clients whose public key is in
    ``keys.authorized_dir`` (or ``keys.authorized``, in memory) get through CURVE sockets of
    that context."""

    def __init__(self, ctx: zmq.Context, keys: CurveKeys):
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        if keys.authorized is not None:
            provider = _AuthorizedKeys(keys.authorized)
            self._auth.configure_curve_callback(domain="*", credentials_provider=provider)
            return
        location = keys.authorized_dir if keys.authorized_dir else zmq.auth.CURVE_ALLOW_ANY
        self._auth.configure_curve(domain="*", location=location)

    def stop(self) -> None:
        self._auth.stop()


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """ZeroMQ heartbeats of a socket's connections (ZMTP PING/PONG, libzmq >= 4.2), seconds.

    memoire sets them on NO socket by default, and a socket whose input can stop must never
    have them: the libzmq that pyzmq's wheels bundle (4.3.5) aborts the whole process
    (``Assertion failed: !_io_error (src/stream_engine_base.cpp:310)``) when a socket running
    heartbeat timers, whose input is stopped by a full receive queue, loses its peer
    (zeromq/libzmq#3937, #4767; reproduced by tests/unit/memoire/test_transport_liveness.py). That is every receiver
    of experience, parameters, stream credits or notices, and, under a hostile peer's flood,
    even a REQ or REP. memoire measures liveness itself instead: actors send a KEEPALIVE on
    their data channel when idle (:class:`memoire.experience.Keepalive`) and the receiving
    ingest drops the open episode of an actor it has not heard from for ``peer_timeout``
    seconds (``_core.ChunkIngest``); request channels time out and resend
    (:class:`RequestChannel`), which notices a dead server without heartbeats.

    Kept for callers that opt in on a socket that only sends (a PUSH or PUB never stops its
    input on data):

    - ``interval`` (ZMQ_HEARTBEAT_IVL): a PING goes out on each connection this often.
    - ``timeout`` (ZMQ_HEARTBEAT_TIMEOUT): a connection that sends nothing back for this long
      after a PING is closed.
    - ``ttl`` (ZMQ_HEARTBEAT_TTL): sent in each PING; the peer closes the connection when it
      hears nothing from this side for this long. Rounded to tenths of a second (at most
      6553.5 s).
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


# Liveness measured by memoire (docs/LIMITS.md, "Liveness"): an actor with nothing to send for
# KEEPALIVE_S seconds sends a KEEPALIVE; a receiver drops the open episode of an actor it has
# not heard from for PEER_TIMEOUT_S seconds of listening.
KEEPALIVE_S = 1.0
PEER_TIMEOUT_S = 10.0

# Messages a receiving socket queues per connection (ZMQ_RCVHWM; libzmq's default is 1000).
# With ZMQ_MAXMSGSIZE this bounds the bytes waiting in a receiver's libzmq queues: at most
# (RECEIVE_HWM + 1) x max message bytes per connection (the +1: the message its engine decoded
# and holds while the queue is full). A receiver that stops reading (a rate limiter holding
# inserts back) then stops reading its TCP connections, and what its peers send waits in their
# own processes: their sends block or time out. 16, not fewer: small chunks (a CartPole chunk is
# a few KB) need the queue to keep a receiver fed; at 4, central-mode ingest of float32[4]
# chunks fell to 0.62-0.76 of raw pyzmq (benchmarks/RESULTS.md, 2026-11-27), at 16 0.94-0.97.
RECEIVE_HWM = 16
_RECEIVERS = (zmq.PULL, zmq.SUB, zmq.ROUTER, zmq.DEALER, zmq.REP, zmq.REQ, zmq.PAIR)


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
    rcvhwm: int = RECEIVE_HWM,
    heartbeat: Optional[Heartbeat] = None,
) -> zmq.Socket:
    """A new socket of `kind` bound to or connected to `endpoint`.

    Args:
      mode: ``'Bind'`` or ``'Conn'``.
      keys: CURVE keys; `server_side` says which half of the handshake this socket plays.
      bind_host: the interface a ``tcp://*:port`` endpoint binds (loopback by default).
      hwm: the send high-water mark (messages queued per peer before a send blocks or drops).
      max_bytes: ZMQ_MAXMSGSIZE: a peer sending a larger frame is disconnected by libzmq.
      rcvhwm: the receive high-water mark of a socket that receives data (PULL, SUB, ROUTER,
        DEALER, REP, REQ, PAIR): messages queued per connection (:data:`RECEIVE_HWM`).
      heartbeat: ZeroMQ heartbeats (:class:`Heartbeat`). Refused on a receiving socket: they
        can abort the process (see :class:`Heartbeat`).

    Raises:
      ValueError: heartbeats asked for a receiving socket; an rcvhwm below 1.
    """
    bind = is_bind(mode)
    if heartbeat is not None and kind in _RECEIVERS:
        raise ValueError(
            "heartbeat: refused on a receiving socket (libzmq 4.3.5 aborts the process when "
            "such a socket with a full queue loses its peer: zeromq/libzmq#3937)"
        )
    if int(rcvhwm) < 1:
        raise ValueError(f"rcvhwm: expected >= 1 messages, got {rcvhwm}")
    sock = ctx.socket(kind)
    sock.linger = 0
    if heartbeat is not None:
        heartbeat.apply(sock)
    if hwm is not None:
        sock.sndhwm = hwm
    if kind in _RECEIVERS:
        sock.rcvhwm = int(rcvhwm)
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


# A CURVE socket's monitor events for a peer it refused: a plain (NULL) or otherwise
# mismatched handshake, a client key the authenticator did not let in.
_REFUSED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class ConnectionWatch:
    """The connections of one socket, seen through ZeroMQ's socket monitor: how many are open,
    and when each closed (a peer that closed its socket, or a killed process: its kernel closes
    them). ZeroMQ does not say which peer a message came from, so this counts connections, not
    peers by name (a frozen peer's connection stays open: the chunk ingest's liveness notices
    it by its actor's silence). :attr:`refused` counts handshakes a CURVE socket refused.

    Owned by the socket's thread: call :meth:`poll` from it (non-blocking) and :meth:`close`
    before the socket is closed.
    """

    def __init__(self, sock: zmq.Socket):
        self._sock = sock
        self._mon = sock.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | _REFUSED
        )
        self.refused = 0  # handshakes that failed: a peer without the CURVE keys, or not ZMTP
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
            elif event & _REFUSED:
                self.refused += 1
                if self.refused <= 10 or self.refused % 1000 == 0:  # a flood: not every one
                    log.warning(
                        "refused a connection whose handshake failed: no or wrong CURVE "
                        "keys, or not a ZeroMQ peer (%d so far)",
                        self.refused,
                    )
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
        self.resends = 0  # attempts that got no reply in time, so far (each one reconnects)

    def _open(self) -> zmq.Socket:
        # No ZeroMQ heartbeats (see Heartbeat): a hostile server can fill a REQ's receive
        # queue, and the timeout per attempt already notices a dead or frozen server.
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
                self.resends += 1
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
