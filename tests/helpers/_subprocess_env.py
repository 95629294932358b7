"""The environment for Python subprocesses that tests start: they import the memoire under test.

That is the package this interpreter imported (the installed one under `make test`, the source
tree under `PYTHONPATH=. pytest` after scripts/dev_build.sh), never the source tree by accident:
a checkout's memoire/ holds no built extension unless scripts/dev_build.sh put one there.
"""

import os
import subprocess
import sys
import textwrap
import threading

import memoire

# The folder of the tests' helpers, for a child's PYTHONPATH (`subprocess_env(HELPERS)`).
HELPERS = os.path.dirname(os.path.abspath(__file__))

# The folder holding the memoire package this process runs.
MEMOIRE_PATH = os.path.dirname(os.path.dirname(os.path.abspath(memoire.__file__)))


# The environment a worker thread of tests/helpers/_two_at_a_time.py sees (set by its pool's initializer).
_worker = threading.local()

# pytest sets and removes this one around each phase of every test; it names the test of the
# moment in pytest's own process, nothing a child should inherit.
_PYTEST_OWN = "PYTEST_CURRENT_TEST"


def environ() -> dict:
    """A copy of the environment, safe in any thread the tests start.

    pytest's main thread sets and removes PYTEST_CURRENT_TEST in ``os.environ`` around each phase
    of every test. Copying ``os.environ`` lists its keys and then reads each value, so a copy made
    in another thread can meet a key removed in between (``KeyError: 'PYTEST_CURRENT_TEST'``,
    once CI's only failure). A worker thread therefore gets the copy its pool took in the main
    thread (:func:`adopt_environ`); only the thread that runs the tests reads ``os.environ``
    itself, and tests/conftest.py fails a test whose worker thread lists it directly.
    """
    taken = getattr(_worker, "environ", None)
    env = dict(os.environ) if taken is None else dict(taken)
    env.pop(_PYTEST_OWN, None)
    return env


def adopt_environ(taken: dict) -> None:
    """Makes ``taken`` (an :func:`environ` copy made in the main thread) the environment that
    :func:`environ` gives in the calling thread: a pool's initializer."""
    _worker.environ = dict(taken)


def subprocess_env(*paths: str, **variables: str) -> dict:
    """os.environ plus `variables`, with PYTHONPATH = MEMOIRE_PATH, then `paths`, then the
    current PYTHONPATH, and PYTHONSAFEPATH=1: a child never puts its working directory (or a
    script's folder) first on sys.path, so it never imports a checkout by accident."""
    inherited = environ()
    env = dict(inherited, PYTHONSAFEPATH="1", **variables)
    # Importing the test modules (TensorFlow among them) sets TF_CPP_MIN_LOG_LEVEL=1 in pytest's
    # own process; a child inheriting it would take it for the user's choice and show
    # TensorFlow's C++ errors (memoire's commands keep them out by default: memoire.cli).
    if "TF_CPP_MIN_LOG_LEVEL" not in variables:
        env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [MEMOIRE_PATH, *paths] + [p for p in [inherited.get("PYTHONPATH")] if p]
    )
    return env


def run_script(script: str, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `script` (dedented) with ``python -c`` in `cwd` (not the checkout, whose memoire/
    holds no extension in CI), importing the memoire under test and the tests' helpers."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(os.path.dirname(os.path.abspath(__file__))),
        cwd=str(cwd),
    )


def assert_clean_exit(proc: subprocess.CompletedProcess) -> None:
    """The script ran to its end (its last line "OK") and its interpreter exited with 0: no
    abort (``terminate called``) and no thread that died of an error."""
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("OK"), proc.stdout[-2000:]
    assert "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


def dopamine_runner_module() -> list:
    """The ``python -m`` arguments that start Dopamine's own runner as the README says: through
    ``memoire.dopamine_compat.upstream_compat`` where its steps are needed (the current stack;
    Dopamine's runner imports Dopamine before any gin file can name memoire), else as is."""
    from memoire.dopamine_compat import upstream_compat

    through = ["memoire.dopamine_compat.upstream_compat"]
    return (through if any(upstream_compat.needed().values()) else []) + [
        "dopamine.discrete_domains.train"
    ]
