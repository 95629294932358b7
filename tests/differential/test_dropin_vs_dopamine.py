"""Every way of dropping memoire's buffers into Dopamine works: gin bindings (Dopamine's names
and memoire's, the memory bound with no arguments or as a class), ``wrapped_memory``, and
assigning memoire's classes into Dopamine's modules (all four TF classes and the JAX buffer);
Dopamine's public attributes are settable."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _subprocess_env import subprocess_env

pytest.importorskip("dopamine.tf.replay_memory.circular_replay_buffer")
gin = pytest.importorskip("gin")

from memoire.dopamine_compat import circular_replay_buffer as mcrb  # pylint: disable=g-import-not-at-top
from memoire.dopamine_compat import prioritized_replay_buffer as mprb  # pylint: disable=g-import-not-at-top

pytestmark = pytest.mark.dopamine
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MEMOIRE_UNIFORM = "memoire.dopamine_compat.circular_replay_buffer.OutOfGraphReplayBuffer"
MEMOIRE_PRIORITIZED = (
    "memoire.dopamine_compat.prioritized_replay_buffer.OutOfGraphPrioritizedReplayBuffer"
)


@pytest.fixture(scope="module")
def idioms():
    """{idiom: result} from tests/helpers/_dropin_run.py (TF graph mode, so in a subprocess)."""
    env = subprocess_env(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "helpers", "_dropin_run.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    results = [
        json.loads(line[len("RESULT ") :])
        for line in out.stdout.splitlines()
        if line.startswith("RESULT ")
    ]
    assert out.returncode == 0, out.stderr[-3000:]
    return {r["idiom"]: r for r in results}


@pytest.mark.parametrize(
    "idiom, wrapper, memory",
    [
        # The README's two lines: Dopamine's wrapper, memoire's memory with no arguments.
        (
            "gin_dopamine_wrapper",
            "dopamine.tf.replay_memory.circular_replay_buffer.WrappedReplayBuffer",
            MEMOIRE_UNIFORM,
        ),
        (
            "gin_dopamine_prioritized_wrapper",
            "dopamine.tf.replay_memory.prioritized_replay_buffer.WrappedPrioritizedReplayBuffer",
            MEMOIRE_PRIORITIZED,
        ),
        (
            "gin_partial_memory",
            "dopamine.tf.replay_memory.circular_replay_buffer.WrappedReplayBuffer",
            MEMOIRE_UNIFORM,
        ),
        (
            "assign_wrapper",
            "memoire.dopamine_compat.circular_replay_buffer.WrappedReplayBuffer",
            MEMOIRE_UNIFORM,
        ),
        (
            "assign_prioritized_wrapper",
            "memoire.dopamine_compat.prioritized_replay_buffer.WrappedPrioritizedReplayBuffer",
            MEMOIRE_PRIORITIZED,
        ),
        (
            "assign_buffer",
            "dopamine.tf.replay_memory.circular_replay_buffer.WrappedReplayBuffer",
            MEMOIRE_UNIFORM,
        ),
        (
            "assign_prioritized_buffer",
            "dopamine.tf.replay_memory.prioritized_replay_buffer.WrappedPrioritizedReplayBuffer",
            MEMOIRE_PRIORITIZED,
        ),
        (
            "gin_memoire_wrapper_class",
            "memoire.dopamine_compat.circular_replay_buffer.WrappedReplayBuffer",
            MEMOIRE_UNIFORM,
        ),
        (
            "gin_memoire_prioritized_wrapper",
            "memoire.dopamine_compat.prioritized_replay_buffer.WrappedPrioritizedReplayBuffer",
            MEMOIRE_PRIORITIZED,
        ),
    ],
)
def test_idiom_builds_memoire_memory_with_the_agents_settings(idioms, idiom, wrapper, memory):
    r = idioms[idiom]
    assert (r["wrapper"], r["memory"]) == (wrapper, memory)
    # The agent's arguments (shape, dtype, stack, horizon, discount) and gin's capacity and batch
    # size reached the memory; adds went through the wrapper; the sampling tensors run.
    assert r["observation_shape"] == [4, 1] and r["observation_dtype"] == "float64"
    assert (r["stack_size"], r["update_horizon"], r["gamma"]) == (2, 3, 0.9)
    assert (r["capacity"], r["batch_size"]) == (1000, 8)
    assert r["add_count"] == 35  # 30 adds + one padding slot for each of the 5 episodes
    assert r["batch_shapes"]["state"] == [8, 4, 1, 2]
    prioritized = memory == MEMOIRE_PRIORITIZED
    assert ("sampling_probabilities" in r["batch_shapes"]) == prioritized
    assert r["has_tf_set_priority"] == prioritized


def test_unbound_buffer_outside_a_wrapper_raises_naming_the_arguments():
    buf = mcrb.OutOfGraphReplayBuffer()
    with pytest.raises(
        AttributeError, match="observation_shape, stack_size, replay_capacity, batch_size"
    ):
        _ = buf.add_count
    partial = mprb.OutOfGraphPrioritizedReplayBuffer(stack_size=2, batch_size=4)
    with pytest.raises(AttributeError, match="observation_shape, replay_capacity"):
        partial.is_empty()


def test_served_buffer_without_its_shape_fails_when_built():
    from memoire.dopamine_compat import buffer_server  # pylint: disable=g-import-not-at-top

    with pytest.raises(AttributeError, match="observation_shape, replay_capacity, batch_size"):
        buffer_server.build_buffer("circular", stack_size=1)


def test_failed_bind_leaves_the_buffer_unbound():
    buf = mcrb.OutOfGraphReplayBuffer(replay_capacity=3)
    args = dict(observation_shape=(3,), stack_size=2, batch_size=2, update_horizon=2)
    with pytest.raises(ValueError, match="not enough capacity"):
        mcrb.bind_memory(buf, args)
    mcrb.bind_memory(buf, dict(args, update_horizon=1))  # capacity 3 covers stack 2 + horizon 1
    assert buf._replay_capacity == 3 and buf.add_count == 0  # pylint: disable=protected-access


def test_bind_memory_keeps_the_memorys_own_settings():
    buf = mcrb.OutOfGraphReplayBuffer(replay_capacity=50, gamma=0.5)
    mcrb.bind_memory(
        buf,
        dict(
            observation_shape=(3,),
            stack_size=1,
            replay_capacity=999,
            batch_size=2,
            update_horizon=2,
            gamma=0.99,
        ),
    )
    assert (buf._replay_capacity, buf._gamma, buf._update_horizon) == (50, 0.5, 2)  # pylint: disable=protected-access
    assert buf._observation_shape == (3,) and buf.add_count == 0  # pylint: disable=protected-access
    buf.add(np.ones(3, np.uint8), 0, 1.0, False)
    assert buf.add_count == 1


@pytest.mark.parametrize(
    "cls", [mcrb.OutOfGraphReplayBuffer, mprb.OutOfGraphPrioritizedReplayBuffer]
)
def test_invalid_range_is_settable_until_the_next_add(cls):
    buf = cls((2,), 2, 20, 4)
    assert buf.invalid_range.shape == (2,)
    buf.invalid_range = np.array([7, 8, 9])
    np.testing.assert_array_equal(buf.invalid_range, [7, 8, 9])
    args = (np.zeros(2, np.uint8), 0, 0.0, False) + ((1.0,) if cls._PRIORITIZED else ())  # pylint: disable=protected-access
    buf.add(*args)
    # As Dopamine: the next add writes the cursor's range over the assigned value.
    np.testing.assert_array_equal(buf.invalid_range, mcrb.invalid_range(2, 20, 2, 1))


def test_documented_attributes_are_settable():
    buf = mprb.OutOfGraphPrioritizedReplayBuffer((2,), 1, 20, 4)
    buf.add(np.zeros(2, np.uint8), 0, 0.0, False, 1.0)
    buf.add_count = np.array(5)
    assert buf.add_count == 5
    buf.episode_end_indices = {3}
    assert buf.episode_end_indices == {3}
    buf.sum_tree.max_recorded_priority = 4.0
    assert buf.sum_tree.max_recorded_priority == 4.0


def test_jax_buffer_assigned_into_dopamine_takes_dopamines_gin_bindings():
    pytest.importorskip("dopamine.jax.replay_memory.replay_buffer")
    from dopamine.jax.replay_memory import accumulator, elements, replay_buffer, samplers  # pylint: disable=g-import-not-at-top

    from memoire.dopamine_compat import jax_replay_buffer  # pylint: disable=g-import-not-at-top

    original = replay_buffer.ReplayBuffer
    gin.clear_config()
    try:
        gin.parse_config("ReplayBuffer.max_capacity = 500\nReplayBuffer.batch_size = 8")
        replay_buffer.ReplayBuffer = jax_replay_buffer.ReplayBuffer
        # What Dopamine's JaxDQNAgent._build_replay_buffer does.
        buf = replay_buffer.ReplayBuffer(
            transition_accumulator=accumulator.TransitionAccumulator(
                stack_size=1, update_horizon=1, gamma=0.9
            ),
            sampling_distribution=samplers.UniformSamplingDistribution(seed=0),
        )
        assert isinstance(buf, jax_replay_buffer.ReplayBuffer)
        assert (buf._max_capacity, buf._batch_size) == (500, 8)  # pylint: disable=protected-access
        for i in range(20):
            buf.add(
                elements.TransitionElement(np.full((4,), i, np.float32), i % 2, 1.0, False, False)
            )
        assert buf.sample().state.shape == (8, 4, 1)
    finally:
        replay_buffer.ReplayBuffer = original
        gin.clear_config()
    with pytest.raises(TypeError, match="max_capacity"):
        jax_replay_buffer.ReplayBuffer(
            accumulator.TransitionAccumulator(1, 1, 0.9),
            samplers.UniformSamplingDistribution(seed=0),
            batch_size=2,
        )
