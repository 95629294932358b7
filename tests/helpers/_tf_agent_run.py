"""Runs a Dopamine TF agent built from a gin file for a few hundred CartPole steps; prints JSON.

Used by test_dopamine_tf_agents.py in a subprocess (the TF agents switch the process to graph
mode, which must not leak into other tests).
"""

import json
import os
import sys
import tempfile

# isort: off
import memoire.dopamine_compat  # noqa: F401  before TensorFlow, as the README says (upstream_compat)

import gin
import numpy as np
import tensorflow as tf

# isort: on


def main(gin_file, steps):
    from dopamine.discrete_domains import run_experiment  # pylint: disable=g-import-not-at-top

    tf.compat.v1.disable_v2_behavior()
    gin.add_config_file_search_path(os.path.dirname(os.path.abspath(gin_file)))  # includes
    gin.parse_config_files_and_bindings([gin_file], ["Runner.max_steps_per_episode = 200"])
    from dopamine.discrete_domains import gym_lib  # pylint: disable=g-import-not-at-top

    env = gym_lib.create_gym_environment()
    sess = tf.compat.v1.Session("", config=tf.compat.v1.ConfigProto(allow_soft_placement=True))
    agent = run_experiment.create_agent(sess, env)
    sess.run(tf.compat.v1.global_variables_initializer())
    weights = sess.run(tf.compat.v1.trainable_variables())
    obs = env.reset()
    action = agent.begin_episode(obs)
    episodes, length = 0, 0
    for _ in range(steps):
        obs, reward, terminal, _ = env.step(action)
        length += 1
        if terminal or length >= 200:
            agent.end_episode(reward)
            episodes += 1
            length = 0
            obs = env.reset()
            action = agent.begin_episode(obs)
        else:
            action = agent.step(reward, obs)
    memory = agent._replay.memory  # pylint: disable=protected-access
    result = {
        "memory_class": type(memory).__module__ + "." + type(memory).__name__,
        "wrapper_class": type(agent._replay).__module__,  # pylint: disable=protected-access
        "add_count": int(memory.add_count),
        "update_horizon": int(memory._update_horizon),  # pylint: disable=protected-access
        "replay_capacity": int(memory._replay_capacity),  # pylint: disable=protected-access
        "training_steps": int(agent.training_steps),
        "episodes": episodes,
    }
    batch = sess.run(agent._replay.transition)  # pylint: disable=protected-access
    result["weights_changed"] = bool(
        any(
            not np.array_equal(a, b)
            for a, b in zip(weights, sess.run(tf.compat.v1.trainable_variables()))
        )
    )
    feed = getattr(memory, "__dict__", {}).get("_feed")  # memoire's prefetching feed, if on
    if feed is not None:
        result["feed"] = {"depth": feed.depth, "threads": feed.threads}
        result["feed_taken"] = int(feed.taken)
        result["sample_count"] = int(memory.sample_count)
    result["batch_shapes"] = {k: list(np.shape(v)) for k, v in batch.items()}
    result["batch_indices_valid"] = bool(
        all(memory.is_valid_transition(int(i)) for i in batch["indices"])
    )
    if hasattr(memory, "sum_tree"):
        result["max_recorded_priority"] = float(memory.sum_tree.max_recorded_priority)
        pri = memory.get_priority(np.arange(min(int(memory.add_count), 50000), dtype=np.int32))
        result["distinct_priorities"] = int(len(np.unique(pri)))
    with tempfile.TemporaryDirectory() as d:
        agent.bundle_and_checkpoint(d, 0)
        result["reloaded"] = bool(agent.unbundle(d, 0, agent.bundle_and_checkpoint(d, 0)))
        result["reloaded_add_count"] = int(memory.add_count)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
