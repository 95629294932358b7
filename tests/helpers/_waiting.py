"""Waiting on a condition in tests: one helper, with a deadline and a message naming what never
happened. A test never sleeps to stand in for a state; it waits for the state itself."""

from __future__ import annotations

import os
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], what: str, timeout: float = 30.0, *, fail: bool = True
) -> T:
    """Polls ``predicate`` (every 10 ms, then less often) until it returns something true, and
    returns that. After ``timeout`` seconds raises AssertionError: "waited N s for WHAT"; with
    ``fail=False`` returns the last (false) value instead, for a caller that asserts with a
    message of its own, or that checks something does not happen within ``timeout``."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            if not fail:
                return value
            raise AssertionError(f"waited {timeout:g} s for {what}; it never happened")
        time.sleep(pause)
        pause = min(pause * 1.5, 0.2)


def memoire_threads(prefix: str = "memoire-") -> int:
    """How many of this process's threads memoire started (named ``memoire-...``: the feed's
    samplers, device copy threads, stream samplers, helpers). A joined thread can stay listed
    in /proc for a moment after ``pthread_join`` returns (the kernel removes it after waking
    the joiner), so a test waits for the count rather than reading it once."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += f.read().startswith(prefix)
        except FileNotFoundError:  # gone since the listing
            pass
    return count
