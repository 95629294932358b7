"""Independent single-process runs of a test module's tests, started two at a time.

A training subprocess (TensorFlow/JAX imports, XLA compiles, a short run) keeps one core busy;
run one after the other, they leave the second core of a 2-core CI machine idle. A
module-scoped fixture makes a :class:`TwoAtATime` from the module's jobs, one per test (by the
test's name, parameters included); it starts the jobs of the tests the session selected (``-k``
or a test id runs only those), in the session's order, two at a time. Each test then waits for
its own job and checks the result in its own thread, so every test still passes or fails on its
own, with its own message.

A job reads the environment through ``_subprocess_env.environ()`` (``subprocess_env``,
``root_env``), which gives it the copy its pool took here, in the main thread: pytest changes
``os.environ`` there around every test phase, and a copy made in a worker races with it.
"""

import os
from concurrent.futures import ThreadPoolExecutor

from _subprocess_env import adopt_environ, environ


class TwoAtATime:
    """Runs ``jobs[name]()`` for each selected test ``name`` of the fixture's module.

    Args:
      request: the module-scoped fixture's ``request``.
      jobs: {test name (``request.node.name``, e.g. ``test_x[a]``): callable() -> result}; each
        runs in a worker thread (no pytest fixtures there, no matplotlib, and the environment
        from ``_subprocess_env.environ()``, never ``os.environ``); what it raises is raised by
        :meth:`result`.
    """

    def __init__(self, request, jobs):
        names = [
            item.name
            for item in request.session.items
            if getattr(item, "module", None) is request.module and item.name in jobs
        ]
        # Under pytest-xdist (make test) the other workers' modules take cores too: on 2 cores
        # with 2 workers the jobs run one at a time.
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        at_once = max(1, min(2, (os.cpu_count() or 2) // workers))
        self._pool = ThreadPoolExecutor(
            max_workers=at_once,
            thread_name_prefix="two_at_a_time",
            initializer=adopt_environ,
            initargs=(environ(),),
        )
        self._futures = {name: self._pool.submit(jobs[name]) for name in dict.fromkeys(names)}

    def result(self, name):
        """What test ``name``'s job returned (waiting for it), or what it raised."""
        return self._futures[name].result()

    def close(self):
        """Starts no more jobs and waits for the ones running."""
        self._pool.shutdown(wait=True, cancel_futures=True)
