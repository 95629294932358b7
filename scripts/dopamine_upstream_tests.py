#!/usr/bin/env python
"""Runs Dopamine's own tests against memoire's buffers and reports which pass.

Dopamine's wheel ships no tests, so this takes a Dopamine source tree (a clone of
github.com/google/dopamine; the tests have not changed since dopamine-rl 4.1.2). Two suites:

- ``replay``: ``tests/dopamine/tf/replay_memory/{circular,prioritized}_replay_buffer_test.py``
  with memoire's ``OutOfGraphReplayBuffer``, ``WrappedReplayBuffer``,
  ``OutOfGraphPrioritizedReplayBuffer`` and ``WrappedPrioritizedReplayBuffer`` assigned into
  Dopamine's modules (TF1 graph mode, as the files' ``__main__`` sets);
- ``agents``: ``tests/dopamine/jax/agents/{dqn,rainbow,full_rainbow,quantile,
  implicit_quantile}/*_test.py`` with memoire's JAX ``ReplayBuffer`` assigned to
  ``dopamine.jax.replay_memory.replay_buffer.ReplayBuffer`` (what the agents build).

The test files are copied into a temporary folder (their fixed ``/tmp/dopamine_tests`` folder
renamed into it, so runs do not collide) and run by pytest, one interpreter per suite. The
report lists every test that did not pass; those in KNOWN (below: tests that read private
attributes memoire does not have, or load checkpoints that memoire's load refuses on purpose)
are expected. Exit status: 0 when every other test passed. (tf.test.TestCase's own ``test_session`` helper,
which pytest collects and skips as "Not a test", is not counted.)

Usage: scripts/dopamine_upstream_tests.py DOPAMINE_SRC [--suite replay|agents|all] [-k EXPR]
The agents suite is heavy (JAX compiles every agent: several minutes on 2 cores).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SUITES = {
    "replay": [
        "tests/dopamine/tf/replay_memory/circular_replay_buffer_test.py",
        "tests/dopamine/tf/replay_memory/prioritized_replay_buffer_test.py",
    ],
    "agents": [
        "tests/dopamine/jax/agents/dqn/dqn_agent_test.py",
        "tests/dopamine/jax/agents/rainbow/rainbow_agent_test.py",
        "tests/dopamine/jax/agents/full_rainbow/full_rainbow_agent_test.py",
        "tests/dopamine/jax/agents/quantile/quantile_agent_test.py",
        "tests/dopamine/jax/agents/implicit_quantile/implicit_quantile_agent_test.py",
    ],
}

# Tests expected not to pass with memoire's classes, and why.
KNOWN = {
    "OutOfGraphReplayBufferTest::testCheckAddTypes": (
        "calls the private _check_add_types (memoire checks add's arguments in C++)"
    ),
    "OutOfGraphReplayBufferTest::testLoad": (
        "loads files that do not fit the buffer (a float64[10] observation column for a "
        "uint8[5, 84, 84] one, add_count 7 with a 10-long invalid_range): memoire's load "
        "refuses what its buffer would not write"
    ),
    "WrappedReplayBufferTest::testWrapperLoad": "as testLoad, through the wrapper",
}

# Written into the temporary folder: what each suite's interpreter sets up before the tests.
CONFTEST = {
    "replay": """
import tensorflow as tf
from absl import flags

flags.FLAGS.mark_as_parsed()
tf.compat.v1.disable_v2_behavior()  # what the test files' __main__ does

from dopamine.tf.replay_memory import circular_replay_buffer as dcrb
from dopamine.tf.replay_memory import prioritized_replay_buffer as dprb
from memoire.dopamine_compat import circular_replay_buffer as mcrb
from memoire.dopamine_compat import prioritized_replay_buffer as mprb

# memoire's wrappers subclass Dopamine's: build them before Dopamine's names are replaced.
swaps = {
    (dcrb, "OutOfGraphReplayBuffer"): mcrb.OutOfGraphReplayBuffer,
    (dcrb, "WrappedReplayBuffer"): mcrb.WrappedReplayBuffer,
    (dprb, "OutOfGraphPrioritizedReplayBuffer"): mprb.OutOfGraphPrioritizedReplayBuffer,
    (dprb, "WrappedPrioritizedReplayBuffer"): mprb.WrappedPrioritizedReplayBuffer,
}
for (module, name), cls in swaps.items():
    setattr(module, name, cls)
print("memoire's classes in Dopamine's modules:", sorted(n for _, n in swaps))
""",
    "agents": """
import sys
import unittest.mock

from absl import flags

# dopamine.utils.test_utils imports the `mock` backport (not a Dopamine dependency); the
# standard library's unittest.mock is the same API.
sys.modules.setdefault("mock", unittest.mock)

flags.FLAGS.mark_as_parsed()

from dopamine.jax.replay_memory import replay_buffer
from memoire.dopamine_compat import jax_replay_buffer

replay_buffer.ReplayBuffer = jax_replay_buffer.ReplayBuffer
print("memoire's ReplayBuffer in dopamine.jax.replay_memory.replay_buffer")
""",
}

_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR) (\S+\.py::\S+)")


def run_suite(suite, src, work, extra):
    """Runs one suite in its own interpreter; returns {test id: outcome}."""
    folder = os.path.join(work, suite)
    os.makedirs(folder)
    with open(os.path.join(folder, "conftest.py"), "w") as f:
        f.write(CONFTEST[suite])
    files = []
    for rel in SUITES[suite]:
        with open(os.path.join(src, rel)) as f:
            text = f.read().replace("/tmp/dopamine_tests", os.path.join(folder, "tmp"))
        target = os.path.join(folder, os.path.basename(rel))
        with open(target, "w") as f:
            f.write(text)
        files.append(os.path.basename(rel))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "pytest", "-rA", "-q", "-p", "no:cacheprovider", *extra]
    proc = subprocess.run(
        command + files, cwd=folder, env=env, capture_output=True, text=True, check=False
    )
    outcomes = {}
    for line in proc.stdout.splitlines():
        m = _OUTCOME.match(line)
        if m:
            outcomes[m.group(2)] = m.group(1)
    if not outcomes:
        sys.stderr.write(proc.stdout[-5000:] + proc.stderr[-5000:])
        raise SystemExit(f"{suite}: pytest reported no test (exit status {proc.returncode})")
    return outcomes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dopamine_src", help="a Dopamine source tree (holding tests/dopamine/)")
    parser.add_argument("--suite", choices=["replay", "agents", "all"], default="replay")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (a subset)")
    args = parser.parse_args(argv)
    extra = ["-k", args.keyword] if args.keyword else []
    suites = ["replay", "agents"] if args.suite == "all" else [args.suite]
    work = tempfile.mkdtemp(prefix="memoire-dopamine-tests-")
    unexpected = 0
    try:
        for suite in suites:
            outcomes = run_suite(suite, args.dopamine_src, work, extra)
            passed = sorted(t for t, o in outcomes.items() if o == "PASSED")
            print(f"[{suite}] {len(passed)} of {len(outcomes)} passed")
            for test, outcome in sorted(outcomes.items()):
                if outcome == "PASSED":
                    continue
                reason = next((r for k, r in KNOWN.items() if test.endswith(k)), None)
                if reason is None:
                    unexpected += 1
                    print(f"  {outcome} {test}  (unexpected)")
                else:
                    print(f"  {outcome} {test}  (known: {reason})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
