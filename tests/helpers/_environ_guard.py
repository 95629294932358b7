"""A pytest plugin (tests/conftest.py loads it): a test fails when a thread other than the one
running the tests lists ``os.environ`` from the tests' code.

pytest sets and removes PYTEST_CURRENT_TEST in ``os.environ`` around each phase of every test,
in the thread that runs them. Listing ``os.environ`` (``dict(os.environ)``, ``.copy()``,
``.items()``) reads its keys and then each value, so a worker thread doing it can meet a key
removed in between: ``KeyError: 'PYTEST_CURRENT_TEST'``, by chance, once in a long CI run. Worker
threads take the environment from ``_subprocess_env.environ()`` instead; this plugin makes the
pattern fail every time it is written, not once in a thousand runs.

Only listings made from the tests' own files count (a library's thread is its own business);
the listing itself still happens, and the test that is running when it is found fails at its
teardown, naming the thread and where it listed.
"""

import os
import threading
import traceback

import pytest

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
_list_environ = os._Environ.__iter__
_test_thread = None
_found = []  # (thread name, where it listed os.environ)


def _from_the_tests(stack) -> bool:
    return any(f.filename.startswith(_TESTS + os.sep) and f.filename != __file__ for f in stack)


def _guarded_iter(self):
    if self is os.environ and threading.current_thread() is not _test_thread:
        stack = traceback.extract_stack()[:-1]
        if _from_the_tests(stack):
            where = "".join(traceback.format_list(stack[-4:]))
            _found.append((threading.current_thread().name, where))
    return _list_environ(self)


def pytest_sessionstart(session):
    global _test_thread
    _test_thread = threading.current_thread()
    os._Environ.__iter__ = _guarded_iter


def pytest_sessionfinish(session, exitstatus):
    os._Environ.__iter__ = _list_environ


def take_found() -> list:
    """What was found since the last call (and forget it): [(thread name, where)]."""
    found = list(_found)
    del _found[: len(found)]
    return found


@pytest.fixture(autouse=True)
def _environ_listed_only_by_the_test_thread():
    yield
    found = take_found()
    if found:
        pytest.fail(
            "os.environ was listed outside the thread that runs the tests, where it races "
            "with pytest's PYTEST_CURRENT_TEST (use _subprocess_env.environ()):\n"
            + "\n".join(f"thread {name}:\n{where}" for name, where in found),
            pytrace=False,
        )
