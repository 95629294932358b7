"""Builds Dopamine TF replay wrappers the way Dopamine's agents do, under one drop-in idiom
each; prints one JSON line per idiom. Used by test_dropin_vs_dopamine.py in a subprocess (graph
mode must not leak into other tests)."""

import json
import sys

import gin
import numpy as np
import tensorflow as tf
from dopamine.tf.replay_memory import circular_replay_buffer as dcrb
from dopamine.tf.replay_memory import prioritized_replay_buffer as dprb

import memoire.dopamine_compat.gin_registry
from memoire.dopamine_compat import circular_replay_buffer as mcrb
from memoire.dopamine_compat import prioritized_replay_buffer as mprb

ORIGINAL = {
    (dcrb, "WrappedReplayBuffer"): dcrb.WrappedReplayBuffer,
    (dcrb, "OutOfGraphReplayBuffer"): dcrb.OutOfGraphReplayBuffer,
    (dprb, "WrappedPrioritizedReplayBuffer"): dprb.WrappedPrioritizedReplayBuffer,
    (dprb, "OutOfGraphPrioritizedReplayBuffer"): dprb.OutOfGraphPrioritizedReplayBuffer,
}

# What Dopamine's agents pass (dqn_agent / rainbow_agent _build_replay_buffer); capacity and
# batch size come from gin.
AGENT_ARGS = dict(
    observation_shape=(4, 1),
    stack_size=2,
    use_staging=False,
    update_horizon=3,
    gamma=0.9,
    observation_dtype=np.float64,
)

IDIOMS = {
    # README: Dopamine's wrapper, memoire's memory bound by gin with no arguments.
    "gin_dopamine_wrapper": (
        "uniform",
        {},
        """
        WrappedReplayBuffer.wrapped_memory = @MemoireOutOfGraphReplayBuffer()
        WrappedReplayBuffer.replay_capacity = 1000
        WrappedReplayBuffer.batch_size = 8""",
    ),
    "gin_dopamine_prioritized_wrapper": (
        "prioritized",
        {},
        """
        WrappedPrioritizedReplayBuffer.wrapped_memory = @MemoireOutOfGraphPrioritizedReplayBuffer()
        WrappedPrioritizedReplayBuffer.replay_capacity = 1000
        WrappedPrioritizedReplayBuffer.batch_size = 8""",
    ),
    # A memory bound in part: its own bindings win, the wrapper fills the rest.
    "gin_partial_memory": (
        "uniform",
        {},
        """
        WrappedReplayBuffer.wrapped_memory = @MemoireOutOfGraphReplayBuffer()
        WrappedReplayBuffer.replay_capacity = 5000
        WrappedReplayBuffer.batch_size = 8
        MemoireOutOfGraphReplayBuffer.replay_capacity = 1000""",
    ),
    # memoire's wrappers under Dopamine's names (module assignment), Dopamine's gin files.
    "assign_wrapper": (
        "uniform",
        {(dcrb, "WrappedReplayBuffer"): "WrappedReplayBuffer"},
        """
        WrappedReplayBuffer.replay_capacity = 1000
        WrappedReplayBuffer.batch_size = 8""",
    ),
    "assign_prioritized_wrapper": (
        "prioritized",
        {(dprb, "WrappedPrioritizedReplayBuffer"): "WrappedPrioritizedReplayBuffer"},
        """
        WrappedPrioritizedReplayBuffer.replay_capacity = 1000
        WrappedPrioritizedReplayBuffer.batch_size = 8""",
    ),
    # memoire's out-of-graph buffers under Dopamine's names: Dopamine's wrappers build them.
    "assign_buffer": (
        "uniform",
        {(dcrb, "OutOfGraphReplayBuffer"): "OutOfGraphReplayBuffer"},
        """
        WrappedReplayBuffer.replay_capacity = 1000
        WrappedReplayBuffer.batch_size = 8""",
    ),
    "assign_prioritized_buffer": (
        "prioritized",
        {(dprb, "OutOfGraphPrioritizedReplayBuffer"): "OutOfGraphPrioritizedReplayBuffer"},
        """
        WrappedPrioritizedReplayBuffer.replay_capacity = 1000
        WrappedPrioritizedReplayBuffer.batch_size = 8""",
    ),
    # memoire's gin names, the memory bound as a class alone.
    "gin_memoire_wrapper_class": (
        "memoire_uniform",
        {},
        """
        MemoireWrappedReplayBuffer.wrapped_memory = @MemoireOutOfGraphReplayBuffer
        MemoireWrappedReplayBuffer.replay_capacity = 1000
        MemoireWrappedReplayBuffer.batch_size = 8""",
    ),
    "gin_memoire_prioritized_wrapper": (
        "memoire_prioritized",
        {},
        """
        MemoireWrappedPrioritizedReplayBuffer.replay_capacity = 1000
        MemoireWrappedPrioritizedReplayBuffer.batch_size = 8""",
    ),
}


def memoire_class(name):
    return getattr(mcrb, name, None) or getattr(mprb, name)


def build(kind):
    if kind == "uniform":
        return dcrb.WrappedReplayBuffer(**AGENT_ARGS)
    if kind == "prioritized":
        return dprb.WrappedPrioritizedReplayBuffer(**AGENT_ARGS)
    if kind == "memoire_uniform":
        return memoire.dopamine_compat.gin_registry.MemoireWrappedReplayBuffer(**AGENT_ARGS)
    return memoire.dopamine_compat.gin_registry.MemoireWrappedPrioritizedReplayBuffer(**AGENT_ARGS)


def run(name):
    kind, assign, config = IDIOMS[name]
    gin.clear_config()
    for (module, attr), cls in ORIGINAL.items():
        setattr(module, attr, cls)
    for (module, attr), ours in assign.items():
        setattr(module, attr, memoire_class(ours))
    gin.parse_config(config)
    with tf.Graph().as_default():
        wrapper = build(kind)
        memory = wrapper.memory
        for i in range(30):
            args = [np.full((4, 1), i, np.float64), i % 2, float(i), i % 7 == 6]
            if "prioritized" in kind:
                args.append(1.0)
            wrapper.add(*args)
        with tf.compat.v1.Session() as sess:
            batch = sess.run(wrapper.transition)
    return {
        "idiom": name,
        "wrapper": type(wrapper).__module__ + "." + type(wrapper).__name__,
        "memory": type(memory).__module__ + "." + type(memory).__name__,
        "capacity": memory._replay_capacity,
        "batch_size": memory._batch_size,  # pylint: disable=protected-access
        "update_horizon": memory._update_horizon,
        "gamma": memory._gamma,  # pylint: disable=protected-access
        "stack_size": memory._stack_size,  # pylint: disable=protected-access
        "observation_shape": list(memory._observation_shape),  # pylint: disable=protected-access
        "observation_dtype": np.dtype(memory._observation_dtype).name,  # pylint: disable=protected-access
        "add_count": int(memory.add_count),
        "batch_shapes": {k: list(np.shape(v)) for k, v in batch.items()},
        "has_tf_set_priority": hasattr(wrapper, "tf_set_priority"),
    }


def main(names):
    tf.compat.v1.disable_v2_behavior()
    for name in names:
        print("RESULT " + json.dumps(run(name)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(IDIOMS))
