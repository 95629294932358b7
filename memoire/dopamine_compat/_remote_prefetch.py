"""Sample requests kept in flight ahead of a learner, for a remote Dopamine buffer's proxy.

:class:`RemotePrefetcher` runs one background thread with its own connection to the hosted
buffer (so the learner's own calls, such as ``set_priority``, never queue behind a sample) that
asks for default-size batches while fewer than ``depth`` are requested and not yet taken. The
thread waits on the socket (pyzmq releases the GIL there); the batch is decoded by the codec.

Staleness, as :mod:`memoire.feed`: a batch is drawn on the server when its request arrives,
and at most ``depth`` requests are out at once, so after any call of the learner returns (a
priority update, a flush of its adds) at most ``depth`` batches taken later were drawn before
it; every later one sees it.

Errors the server raises for a request (an empty buffer, a timeout) are handed to the
``take`` that receives that batch, with the same exception type the synchronous call raises;
requests go on after an error (each still holds a slot, so a failing server sees at most
``depth`` outstanding requests). ``close`` stops the thread within one request's timeout.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable


class RemotePrefetcher:
    """Keeps up to ``depth`` calls of ``fetch()`` done ahead of ``take()``.

    Args:
      connect: returns a new connection (a :class:`memoire.remote.RemoteObject`) for the thread;
        it is closed when the prefetcher closes.
      fetch: ``fetch(connection)`` returns one batch (or raises).
      depth: int >= 1, batches requested ahead.
    """

    def __init__(self, connect: Callable[[], Any], fetch: Callable[[Any], Any], depth: int):
        self._depth = int(depth)
        self._fetch = fetch
        self._connection = connect()
        self._cond = threading.Condition()
        self._ready: collections.deque = collections.deque()  # (ok, batch or exception)
        self._outstanding = 0  # requested and not yet taken
        self._closed = False
        self.taken = 0
        self._thread = threading.Thread(target=self._run, name="memoire-remote-prefetch")
        self._thread.daemon = True  # a learner that forgets close() must still exit
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._closed and self._outstanding >= self._depth:
                        self._cond.wait()
                    if self._closed:
                        return
                    self._outstanding += 1
                try:
                    item = (True, self._fetch(self._connection))
                except Exception as e:  # noqa: BLE001  handed to the learner's take()
                    item = (False, e.with_traceback(None))
                with self._cond:
                    self._ready.append(item)
                    self._cond.notify_all()
        finally:
            self._connection.close()

    def take(self) -> Any:
        """The next batch; blocks until it arrives. Raises what the request raised, or
        RuntimeError after close."""
        with self._cond:
            while not self._ready and not self._closed:
                self._cond.wait()
            if self._closed:
                raise RuntimeError("the remote prefetcher is closed")
            ok, item = self._ready.popleft()
            self._outstanding -= 1
            self._cond.notify_all()
        self.taken += 1
        if not ok:
            raise item
        return item

    @property
    def depth(self) -> int:
        return self._depth

    def close(self, timeout: float = 60.0) -> None:
        """Stops the thread (a request in flight completes or times out first) and closes its
        connection; waits at most ``timeout`` seconds. Idempotent."""
        with self._cond:
            self._closed = True
            self._ready.clear()
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
