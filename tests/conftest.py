"""Suite-wide setup: the helpers' folder on sys.path, one marker per kind of test (by
folder), and one JAX compilation cache for every process the tests start.

The suite starts some hundred training processes (learners, actors, sweeps) that compile the same
few Dopamine networks; XLA's compile of an Atari network costs a third of such a process's CPU
(full Rainbow: 38 s of CPU without the cache, 24 s with it). JAX's persistent cache, in a folder
of this run's (removed at its end), lets each network compile once. A size limit turns on JAX's
file lock around every read and write, so the two pytest-xdist workers and their children share
the folder safely. What the tests check is memoire's, not XLA's: a cached executable is the one
XLA compiled for the same program.

It also loads tests/helpers/_environ_guard.py: a test fails when a worker thread of the tests lists
os.environ, which races with pytest's own changes to it.
"""

import importlib.util
import os
import shutil
import sys
import tempfile

# The suite's own processes apply upstream_compat's steps (what Dopamine needs on the current
# stack) before a test module imports Dopamine or TensorFlow, as a user's script must;
# tests/unit/memoire/dopamine_compat/test_upstream_compat.py checks the steps themselves in fresh interpreters.
import pytest

import memoire.dopamine_compat  # noqa: F401

pytest_plugins = ["_environ_guard"]

_CACHE_VARIABLES = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    "JAX_COMPILATION_CACHE_MAX_SIZE": str(4 << 30),  # bytes; any limit turns the lock on
}


def pytest_configure(config):
    # The controller (or a run without xdist) makes the folder before any worker starts; the
    # workers and every subprocess inherit the variables. A folder the user named is left alone,
    # and without filelock (which JAX's lock needs) the runs compile as before.
    if hasattr(config, "workerinput") or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    if importlib.util.find_spec("filelock") is None:
        return
    folder = tempfile.mkdtemp(prefix="memoire-tests-jax-cache-")
    config._memoire_jax_cache = folder
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
    for name, value in _CACHE_VARIABLES.items():
        os.environ.setdefault(name, value)


def pytest_unconfigure(config):
    folder = getattr(config, "_memoire_jax_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


# The helpers (tests/helpers/) are plain modules imported by name (`from _waiting import
# wait_until`): their folder goes first on sys.path for every test module, and (sys.path being
# inherited by multiprocessing's spawn) for the processes those start.
HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers")
if HELPERS not in sys.path:
    sys.path.insert(0, HELPERS)

# One marker per kind of test, from its folder (docs/ARCHITECTURE.md, "Tests"); registered in
# pyproject.toml. A test outside the kinds' folders is refused, so that every test has a kind.
KINDS = ("unit", "differential", "hostile", "system")


def pytest_collection_modifyitems(config, items):
    tests = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        parts = os.path.relpath(str(item.path), tests).split(os.sep)
        if len(parts) < 2 or parts[0] not in KINDS:
            raise pytest.UsageError(
                f"{item.path}: a test lives in one of tests/{{{','.join(KINDS)}}}/ "
                "(docs/ARCHITECTURE.md, 'Tests')"
            )
        item.add_marker(parts[0])
