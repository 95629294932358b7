"""Dopamine's own TF agents (DQN, Rainbow) train on CartPole with memoire's buffers via gin."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("dopamine.tf.agents.dqn.dqn_agent")
pytest.importorskip("gym")

pytestmark = [pytest.mark.dopamine, pytest.mark.slow]
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run_agent(gin_file, steps):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "tests", "helpers", "_tf_agent_run.py"),
            os.path.join(ROOT, "configs", gin_file),
            str(steps),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_dqn_trains_on_memoire_buffer_via_gin():
    r = run_agent("dqn_cartpole_tf.gin", 700)
    assert r[
        "memory_class"
    ] == "memoire.dopamine_compat.circular_replay_buffer.OutOfGraphReplayBuffer" or r[
        "memory_class"
    ].endswith("MemoireOutOfGraphReplayBuffer")
    assert r["wrapper_class"] == "dopamine.tf.replay_memory.circular_replay_buffer"
    assert r["add_count"] >= 700
    assert r["training_steps"] >= 700
    assert r["batch_shapes"]["state"] == [128, 4, 1, 1]
    assert r["batch_shapes"]["indices"] == [128]
    # The memory was bound with no arguments: it took the agent's and the wrapper's.
    assert (r["update_horizon"], r["replay_capacity"]) == (1, 50000)
    assert r["batch_indices_valid"]
    assert r["reloaded"] and r["reloaded_add_count"] == r["add_count"]


def test_rainbow_trains_on_memoire_prioritized_buffer_via_gin():
    r = run_agent("rainbow_cartpole_tf.gin", 700)
    assert "OutOfGraphPrioritizedReplayBuffer" in r["memory_class"]
    assert r["memory_class"].startswith("memoire.") or "Memoire" in r["memory_class"]
    assert r["batch_shapes"]["sampling_probabilities"] == [128]
    assert (r["update_horizon"], r["replay_capacity"]) == (3, 50000)  # the agent's and wrapper's
    assert r["batch_indices_valid"]
    # The agent set priorities through tf_set_priority: they are no longer all equal.
    assert r["distinct_priorities"] > 10
    assert r["reloaded"] and r["reloaded_add_count"] == r["add_count"]
