"""The socket and worker plumbing every memoire server shares: counters, worker loops, proxies,
the PUB socket and the logfile. No message is interpreted here except to route it.

Threads and ownership:

- :class:`Stats` is shared by a server and its services; its lock guards only its counters
  (and its condition wakes waiters on them).
- :class:`Workers` owns the ZeroMQ context, the authenticator and every socket a worker or
  proxy loop opens. Each loop runs in the thread that called it (``start_threads`` makes
  daemon threads) until :meth:`Workers.close`; a loop closes its own sockets when it ends.
  Every handler error is counted (``rejected["internal"]``) and survived.
- :class:`Publisher` owns the PUB socket, created by the constructor's thread and then used
  only under its lock.
- :class:`Logfile` owns the logfile, written under its lock.
"""

from __future__ import annotations

import collections
import datetime
import logging
import os
import stat
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import zmq

from memoire import _core, codec
from memoire.codec import ProtocolError
from memoire.protocol import Msg
from memoire.transport import (
    LOOPBACK,
    Authenticator,
    CurveKeys,
    is_bind,
    last_endpoint,
    log_dropped,
    open_socket,
    publication_frames,
)

log = logging.getLogger("memoire.server")

POLL_MS = 100  # loops check for close() this often
MAX_DEFERRED = 1024  # requests a deferring loop parks at most
DEFERRED_WAIT_S = 0.002  # a deferring loop with parked requests looks at its socket this often
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30


class BindError(zmq.ZMQError):
    """A server's socket could not bind its endpoint (in use, or not this machine's address).

    Attributes:
      label: which socket ('pub', 'rep', 'pull', 'stream').
      endpoint: the endpoint it was to bind, as given.
      reason: libzmq's reason (e.g. "Address already in use").
    """

    def __init__(self, label: str, endpoint: str, error: zmq.ZMQError):
        self.label, self.endpoint = label, endpoint
        self.reason = str(error.strerror).split(" (addr=")[0]
        super().__init__(error.errno, f"the {label} endpoint {endpoint}: {self.reason}")


def bind_socket(label: str, endpoint: str, open_: Callable[[], zmq.Socket]) -> zmq.Socket:
    """``open_()`` (a socket bound to `endpoint`), its ZMQError raised as :class:`BindError`."""
    try:
        return open_()
    except BindError:
        raise
    except zmq.ZMQError as e:
        raise BindError(label, endpoint, e) from None


class Stats:
    """Counters of a server: ``counts`` by name and ``rejected`` by reason. Thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)  # notified when counts that waiters read grow
        self.counts = collections.Counter()
        self.rejected = collections.Counter()

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def get(self, key: str) -> int:
        with self.lock:
            return self.counts[key]

    def reject(self, reason: str, detail: str) -> None:
        """Counts a dropped message and logs it, sparsely under a flood."""
        with self.lock:
            self.rejected[reason] += 1
            n = self.rejected[reason]
        log_dropped(log, "a message", reason, n, detail)


def error_reply(kind: str, reason: str, **extra) -> list:
    """The frames of an ERROR reply (:func:`memoire.remote.raise_for_error` raises it), with
    any `extra` entries (a sampling stream's failed draw names its slot)."""
    return codec.encode(Msg.ERROR, {"error": kind, "reason": reason, **extra})


def decode(stats: Stats, frames, expect, max_bytes: int) -> Optional[codec.Message]:
    """The message, or None when it is malformed or of another wire version (counted)."""
    try:
        return codec.decode(frames, max_bytes=max_bytes, expect=expect)
    except ProtocolError as e:
        version = codec.peek_version(frames[0]) if frames else None
        stats.reject(
            "version" if version not in (None, codec.WIRE_VERSION) else "malformed", str(e)
        )
        return None


class WouldBlock(Exception):
    """Raised by a request handler that cannot answer yet (a sample the rate limiter holds
    back). :meth:`Workers.deferring_loop` parks the request and runs it again once
    ``wait(seconds)`` (which blocks up to `seconds`, without the GIL, and returns whether a
    retry may succeed) says so, and answers TimeoutError(`what` + ``describe()``) after
    `timeout` seconds; ``record(waited_seconds, timed_out)`` is told how it ended."""

    def __init__(
        self,
        what: str,
        timeout: float,
        wait: Callable[[float], bool],
        describe: Callable[[], str],
        record: Callable[[float, bool], None] = lambda waited, timed_out: None,
    ):
        super().__init__(what)
        self.what, self.timeout, self.wait = what, float(timeout), wait
        self.describe, self.record = describe, record


def rep_handler(
    stats: Stats, handlers: Mapping[int, Callable[[codec.Message], list]], max_bytes: int
) -> Callable[[zmq.Socket, list], None]:
    """A REP loop's handler: decodes a request, runs the handler of its type (message ->
    reply frames) and sends the reply (see :func:`rep_answer`)."""
    answer = rep_answer(stats, handlers, max_bytes)

    def handle(sock: zmq.Socket, frames: list) -> None:
        sock.send_multipart(answer(frames), copy=False)

    return handle


def rep_answer(
    stats: Stats, handlers: Mapping[int, Callable[[codec.Message], list]], max_bytes: int
) -> Callable[[list], list]:
    """``answer(request frames) -> reply frames``: decodes a request and runs the handler of
    its type (message -> reply frames). Every request gets a reply: an undecodable one an
    ERROR naming the version mismatch or the malformation, a failing handler an ERROR too. A
    handler's :class:`WouldBlock` goes through (for :meth:`Workers.deferring_loop`)."""
    expect = tuple(handlers)

    def answer(frames: list) -> list:
        try:
            msg = decode(stats, frames, expect, max_bytes)
            if msg is None:
                version = codec.peek_version(frames[0]) if frames else None
                if version not in (None, codec.WIRE_VERSION):
                    reply = error_reply(
                        "ProtocolError",
                        f"wire version mismatch: the server "
                        f"speaks version {codec.WIRE_VERSION}, the request "
                        f"came in version {version}; upgrade memoire on one "
                        "side",
                    )
                else:
                    reply = error_reply("ProtocolError", "malformed request (see the server log)")
            else:
                reply = handlers[msg.type](msg)
        except WouldBlock:
            raise
        except Exception as e:  # noqa: BLE001 - REP must answer every request
            stats.reject("internal", f"rep: {type(e).__name__}: {e}")
            reply = error_reply("RuntimeError", f"server error: {type(e).__name__}: {e}")
        return reply

    return answer


class Workers:
    """Sockets and loops of one server (see the module docstring).

    Args:
      stats: the server's counters.
      keys: CURVE keys for every socket bound on the server side (None: plain).
      bind_host: the interface a ``*`` host binds.
      max_message_bytes: the largest message a socket accepts.
    """

    def __init__(
        self,
        stats: Stats,
        *,
        keys: Optional[CurveKeys] = None,
        bind_host: str = LOOPBACK,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ):
        self.stats = stats
        self.keys = keys
        self.bind_host = bind_host
        self.max_message_bytes = int(max_message_bytes)
        self.ctx = zmq.Context()
        self._auth = Authenticator(self.ctx, keys) if keys is not None else None
        self.closing = threading.Event()
        self._active = 0  # loops running; guarded by stats.lock
        self._threads: List[threading.Thread] = []
        self.endpoints: Dict[str, List[str]] = collections.defaultdict(list)  # under stats.lock
        # The ipc:// socket files this server bound, (path, inode): libzmq removes the file of a
        # closed socket only for a wildcard endpoint, so terminate() removes the others.
        self._ipc_files: List[Tuple[str, int]] = []  # under stats.lock

    # ---- sockets and loops

    def open(
        self, kind: int, endpoint: str, mode: str, label: str, server_side: bool = True
    ) -> zmq.Socket:
        """A socket bound or connected (``mode`` ``'Bind'``/``'Conn'``) and recorded in
        :attr:`endpoints` under `label` (with the OS-chosen port when bound)."""
        if self.closing.is_set():
            raise RuntimeError(f"{label}: the server is closed")

        def open_():
            return open_socket(
                self.ctx,
                kind,
                endpoint,
                mode,
                keys=self.keys if (is_bind(mode) and server_side) else None,
                bind_host=self.bind_host,
                max_bytes=self.max_message_bytes,
            )

        sock = bind_socket(label, endpoint, open_) if is_bind(mode) else open_()
        if is_bind(mode):
            self.note_bound(last_endpoint(sock))
        with self.stats.cond:
            self.endpoints[label].append(last_endpoint(sock) if is_bind(mode) else endpoint)
            self.stats.cond.notify_all()
        return sock

    def note_bound(self, endpoint: str) -> None:
        """Records `endpoint`, bound by this server, for :meth:`terminate` if it is ``ipc://``."""
        if not endpoint.startswith("ipc://"):
            return
        path = endpoint[len("ipc://") :]
        try:
            inode = os.stat(path).st_ino
        except OSError:  # an abstract socket (ipc://@name) has no file
            return
        with self.stats.lock:
            self._ipc_files.append((path, inode))

    def loop(
        self,
        socks: Sequence[zmq.Socket],
        handle: Callable[[zmq.Socket, list], None],
        name: str,
        idle: Optional[Callable[[], None]] = None,
    ) -> None:
        """Polls `socks` until close(); `handle(sock, frames)` runs per message. `idle` runs
        after a poll that found nothing, and at least every POLL_MS under steady traffic."""
        poller = zmq.Poller()
        for s in socks:
            poller.register(s, zmq.POLLIN)
        last_idle = time.monotonic()

        def step():
            nonlocal last_idle
            ready = poller.poll(POLL_MS)
            for sock, _ in ready:
                frames = sock.recv_multipart(copy=False)
                self.guarded(handle, name, sock, frames)
            if idle is not None and (not ready or time.monotonic() - last_idle >= POLL_MS / 1000):
                last_idle = time.monotonic()
                idle()

        self.serve(socks, step)

    def native_loop(
        self,
        sock: zmq.Socket,
        receivers: Mapping[int, Callable[[int, int], Optional[list]]],
        handle: Callable[[zmq.Socket, list], None],
        name: str,
        idle: Optional[Callable[[], None]] = None,
    ) -> None:
        """A PULL loop whose messages are received in C++ (GIL released): `receivers` maps a
        message type to ``receive(socket address, timeout_ms)``, which takes messages of its
        type and returns the frames of the first other one (or None). The receiver of the type
        last seen holds the socket; other messages go to `handle`. `idle` runs every step."""
        address = sock.underlying
        kinds = list(receivers)
        current = kinds[0]

        def step():
            nonlocal current
            if idle is not None:
                idle()
            try:
                frames = receivers[current](address, POLL_MS)
            except RuntimeError as e:  # a socket error: say so, do not spin on it
                self.stats.reject("internal", f"{name}: {e}")
                time.sleep(POLL_MS / 1000)
                return
            if frames is not None:
                kind = _core.peek_header(frames[0]) if frames else None
                if kind is not None and kind[0] == codec.WIRE_VERSION and kind[1] in receivers:
                    current = kind[1]
                self.guarded(handle, name, sock, frames)

        self.serve([sock], step)

    def deferring_loop(
        self,
        sock: zmq.Socket,
        answer: Callable[[list], list],
        name: str,
        max_pending: int = MAX_DEFERRED,
    ) -> None:
        """Serves requests on a ROUTER `sock` (REQ peers, or a proxy's DEALER) until close():
        ``answer(request frames) -> reply frames`` as a REP loop would, except that a request
        whose handler raises :class:`WouldBlock` is parked, not waited on: this loop goes on
        serving other peers and answers the parked request (oldest first) once it can, or
        with TimeoutError when its time runs out. At most `max_pending` requests are parked;
        beyond that a request that would block is answered TimeoutError at once.
        """
        pending: "collections.deque[list]" = collections.deque()  # [envelope, body, t0, wb]

        def unpark(entry: list) -> None:  # by identity: frames have no useful ==
            for i, e in enumerate(pending):
                if e is entry:
                    del pending[i]
                    return

        def run(envelope: list, body: list, parked: Optional[list]) -> None:
            try:
                reply = answer(body)
            except WouldBlock as wb:
                now = time.monotonic()
                if parked is not None:
                    parked[3] = wb  # its first deadline stands
                    return
                if len(pending) < max_pending:
                    pending.append([envelope, body, now, wb])
                    self.stats.count("deferred")
                    return
                reply = error_reply(
                    "TimeoutError",
                    f"{wb.what}: {max_pending} requests are already waiting ({wb.describe()})",
                )
                wb.record(0.0, True)
            else:
                if parked is not None:
                    parked[3].record(time.monotonic() - parked[2], False)
                    unpark(parked)
            sock.send_multipart(envelope + list(reply), copy=False)

        def receive() -> None:
            for _ in range(64):  # what is queued, then back to the parked ones
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    return
                cut = next((i for i, f in enumerate(frames) if len(f) == 0), None)
                if cut is None:  # no REQ envelope: nothing to answer to
                    self.stats.reject("malformed", f"{name}: a request without an envelope")
                    continue
                self.guarded(
                    lambda s, f, c=cut: run(f[: c + 1], f[c + 1 :], None), name, sock, frames
                )

        def retry() -> None:
            now = time.monotonic()
            for entry in list(pending):
                envelope, _, t0, wb = entry
                if now - t0 >= wb.timeout:
                    unpark(entry)
                    wb.record(now - t0, True)
                    sock.send_multipart(
                        envelope
                        + error_reply(
                            "TimeoutError",
                            f"{wb.what}: blocked for {wb.timeout:g} s ({wb.describe()})",
                        ),
                        copy=False,
                    )
            if pending and pending[0][3].wait(0):
                for entry in list(pending):
                    self.guarded(lambda s, f, e=entry: run(e[0], e[1], e), name, sock, [])
                    if any(e is entry for e in pending):  # still blocked: keep the order
                        break

        def step() -> None:
            if not pending:
                if sock.poll(POLL_MS, zmq.POLLIN):
                    receive()
                return
            if not sock.poll(0, zmq.POLLIN):
                pending[0][3].wait(DEFERRED_WAIT_S)  # wakes when the oldest may go
            receive()
            retry()

        self.serve([sock], step)

    def guarded(self, handle, name, sock, frames) -> None:
        try:
            handle(sock, frames)
        except Exception as e:  # noqa: BLE001 - a worker never dies from input
            self.stats.reject("internal", f"{name}: {type(e).__name__}: {e}")
            log.exception("%s: unexpected error", name)

    def serve(self, socks: Sequence[zmq.Socket], step: Callable[[], None]) -> None:
        """Runs `step` until close(), then closes `socks`."""
        with self.stats.lock:
            self._active += 1
        try:
            while not self.closing.is_set():
                step()
        finally:
            for s in socks:
                s.close(0)
            with self.stats.cond:
                self._active -= 1
                self.stats.cond.notify_all()

    # ---- proxies

    def proxy(self, front_kind, front_ep, front_mode, back_kind, back_ep, label) -> None:
        """Forwards messages both ways between a front socket and a bound back socket."""
        front = self.open(front_kind, front_ep, front_mode, f"{label}_front")
        back = self.open(back_kind, back_ep, "Bind", f"{label}_back")

        def forward(sock, frames):
            (back if sock is front else front).send_multipart(frames, copy=False)

        self.loop([front, back], forward, f"{label} proxy")

    def rep_proxy_main(self, front_ep: str, back_ep: str) -> None:
        """Forwards requests from clients (bound at `front_ep`) to REP workers that connect to
        `back_ep` (bound), and their replies back, until :meth:`close`."""
        self.proxy(zmq.ROUTER, front_ep, "Bind", zmq.DEALER, back_ep, "rep_proxy")

    def pull_proxy_main(self, front_ep: str, back_ep: str) -> None:
        """Forwards pushed messages from clients (bound at `front_ep`) to PULL workers that
        connect to `back_ep` (bound), until :meth:`close`."""
        self.proxy(zmq.PULL, front_ep, "Bind", zmq.PUSH, back_ep, "pull_proxy")

    def pub_proxy_main(self, front_ep: str, back_ep: str) -> None:
        """Relays a publisher (connects to `front_ep`, e.g. a server's PUB endpoint on another
        machine) to subscribers that connect to `back_ep` (bound), until :meth:`close`."""
        self.proxy(zmq.XSUB, front_ep, "Conn", zmq.XPUB, back_ep, "pub_proxy")

    # ---- threads

    def start_threads(self, targets: Sequence[tuple], timeout: float) -> Dict[str, str]:
        """Runs each ``(main, endpoint, label)`` of `targets` as ``main(endpoint, "Bind")`` in
        a daemon thread and returns ``{label: endpoint bound}`` once each has bound.

        Raises:
          BindError: a loop's socket could not bind (at once, not after `timeout`).
          TimeoutError: a loop did not bind within `timeout` seconds (its error is logged).
        """
        with self.stats.lock:
            before = {label: len(self.endpoints[label]) for _, _, label in targets}
        failed: Dict[str, BaseException] = {}  # label -> what stopped its loop before it bound

        def run(main, label):
            def loop(*args):
                try:
                    main(*args)
                except BindError as e:  # start_threads raises it (the caller's to report)
                    with self.stats.cond:
                        failed[label] = e
                        self.stats.cond.notify_all()
                except Exception:  # noqa: BLE001 - after binding: the loop's own failure
                    log.exception("%s failed", main.__name__)

            return loop

        for main, endpoint, label in targets:
            t = threading.Thread(
                target=run(main, label),
                args=(endpoint, "Bind"),
                daemon=True,
                name=f"memoire-{main.__name__}",
            )
            t.start()
            self._threads.append(t)
        deadline = time.monotonic() + timeout
        with self.stats.cond:
            while any(len(self.endpoints[label]) <= n for label, n in before.items()):
                if failed:
                    raise next(iter(failed.values()))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("start: the workers did not bind in time (see the log)")
                self.stats.cond.wait(left)
            return {label: self.endpoints[label][n] for label, n in before.items()}

    def close(self, timeout: float = 5.0, before_join: Callable[[], None] = lambda: None) -> bool:
        """Stops every loop (each notices within ~0.1 s) and waits up to `timeout` seconds for
        them; `before_join` runs once the loops are told to stop (to wake waits of their
        own). Returns False when already closed (idempotent)."""
        if self.closing.is_set() and self.ctx.closed:
            return False
        self.closing.set()
        before_join()
        deadline = time.monotonic() + timeout
        with self.stats.cond:
            while self._active > 0 and time.monotonic() < deadline:
                self.stats.cond.wait(max(0.0, deadline - time.monotonic()))
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return True

    def terminate(self) -> None:
        """Stops the authenticator and ends the context (once the loops are gone)."""
        if self._auth is not None:
            self._auth.stop()
        if self._active == 0:
            self.ctx.term()
            with self.stats.lock:
                files, self._ipc_files = self._ipc_files, []
            for path, inode in files:
                # Only the file this server bound: another socket bound there since has
                # replaced it (another inode) and keeps its file.
                try:
                    st = os.stat(path)
                    if st.st_ino == inode and stat.S_ISSOCK(st.st_mode):
                        os.unlink(path)
                except OSError:
                    pass


class Publisher:
    """A PUB socket bound at construction (see :meth:`publish`)."""

    def __init__(self, workers: Workers, endpoint: str):
        self._lock = threading.Lock()
        self._closing = workers.closing
        self._sock = bind_socket(
            "pub",
            endpoint,
            lambda: open_socket(
                workers.ctx,
                zmq.PUB,
                endpoint,
                "Bind",
                keys=workers.keys,
                bind_host=workers.bind_host,
            ),
        )
        self.endpoint = last_endpoint(self._sock)
        workers.note_bound(self.endpoint)

    def publish(self, topic, message) -> None:
        """Publishes `message` (bytes-like or a numpy array, any size) under `topic` (str or
        bytes) to every client subscribed with ``sub_bytes(topic)``."""
        if self._closing.is_set():
            raise RuntimeError("pub_bytes: the server is closed")
        t = topic.encode() if isinstance(topic, str) else bytes(topic)
        data = message if isinstance(message, (bytes, np.ndarray)) else memoryview(message)
        if isinstance(data, np.ndarray):
            data = memoryview(np.ascontiguousarray(data)).cast("B")
        frames = publication_frames(t, data)
        with self._lock:
            if self._sock is None:
                raise RuntimeError("pub_bytes: the server is closed")
            self._sock.send_multipart(frames, copy=False)

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close(0)
                self._sock = None


class Logfile:
    """Actors' log lines, written to a file (see :meth:`open`); nothing until opened."""

    def __init__(self):
        self._lock = threading.Lock()
        self._file = None
        self.path: Optional[str] = None

    def open(self, path: str, mode: str = "a") -> None:
        """Writes log lines to `path` (opened with `mode`: 'w', 'a' or 'x'), one line per
        message: ``'%s,%08x,%s\\n' % (timestamp, uuid, message)``, timestamp in ISO 8601 local
        time; newlines in a message are escaped as ``\\n``. Buffered; flushed by
        :meth:`flush` and :meth:`close`."""
        if mode not in ("w", "a", "x"):
            raise ValueError(f"mode: expected 'w', 'a' or 'x', got {mode!r}")
        f = open(path, mode, buffering=1 << 16, encoding="utf-8")
        with self._lock:
            if self._file is not None:
                self._file.close()
            self._file = f
            self.path = path

    def write(self, uuid: int, message: str) -> None:
        line = "%s,%08x,%s\n" % (
            datetime.datetime.now().isoformat(),
            uuid,
            message.replace("\\", "\\\\").replace("\n", "\\n"),
        )
        with self._lock:
            if self._file is not None:
                self._file.write(line)

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
