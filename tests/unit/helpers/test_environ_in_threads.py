"""The tests' worker threads read the environment without racing pytest (tests/helpers/_environ_guard.py,
tests/helpers/_subprocess_env.environ)."""

import os
import threading

import _environ_guard
from _subprocess_env import environ, subprocess_env
from _two_at_a_time import TwoAtATime


def test_a_worker_listing_os_environ_is_found():
    t = threading.Thread(target=lambda: dict(os.environ), name="lists-environ")
    t.start()
    t.join()
    found = _environ_guard.take_found()
    assert [name for name, _ in found] == ["lists-environ"]
    assert "test_environ_in_threads.py" in found[0][1]


def test_the_test_thread_lists_os_environ_freely():
    dict(os.environ)
    assert _environ_guard.take_found() == []


def test_environ_leaves_out_pytests_own_variable():
    assert "PYTEST_CURRENT_TEST" in os.environ  # pytest's, during the test
    assert "PYTEST_CURRENT_TEST" not in environ()
    assert environ()["PATH"] == os.environ["PATH"]


def test_two_at_a_time_jobs_get_the_main_threads_environment(request, monkeypatch):
    monkeypatch.setenv("MEMOIRE_TEST_TAKEN", "before")
    name = request.node.name

    def job():
        # The main thread changes os.environ while the job runs: the job keeps the copy its
        # pool took, and never lists os.environ itself.
        return environ()["MEMOIRE_TEST_TAKEN"], subprocess_env()["MEMOIRE_TEST_TAKEN"]

    runs = TwoAtATime(request, {name: job})
    try:
        monkeypatch.setenv("MEMOIRE_TEST_TAKEN", "after")
        assert runs.result(name) == ("before", "before")
    finally:
        runs.close()
    assert _environ_guard.take_found() == []
