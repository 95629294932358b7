"""Independent training runs of one parametrized test, started two at a time.

A training subprocess (TensorFlow/JAX imports, XLA compiles, a short run) keeps one core busy;
run one after the other, they leave the second core of a 2-core CI machine idle. A
module-scoped fixture makes a :class:`TwoAtATime` for the parameter values the session selected
(``-k`` or a test id runs only those); each test then waits for its own run and checks it in
its own thread, so every case still passes or fails on its own.
"""

from concurrent.futures import ThreadPoolExecutor


class TwoAtATime:
    """``work(value)`` for each ``param`` value of the selected items of test ``test_name``
    (in this fixture's module), two at a time, in the session's order.

    Args:
      request: the module-scoped fixture's ``request``.
      test_name: str, the test function's name.
      param: str, the parametrize argument's name.
      work: callable(value) -> result; it runs in a worker thread (no pytest fixtures there,
        no matplotlib); what it raises is raised by :meth:`result`.
    """

    def __init__(self, request, test_name, param, work):
        values = [
            item.callspec.params[param]
            for item in request.session.items
            if getattr(item, "originalname", None) == test_name
            and getattr(item, "module", None) is request.module
        ]
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=test_name)
        self._futures = {v: self._pool.submit(work, v) for v in dict.fromkeys(values)}

    def result(self, value):
        """What ``work(value)`` returned (waiting for it), or what it raised."""
        return self._futures[value].result()

    def close(self):
        """Starts no more runs and waits for the ones running."""
        self._pool.shutdown(wait=True, cancel_futures=True)
