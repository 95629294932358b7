"""JAX-face buffers the feed tests draw from (tests/unit/memoire/feed/test_feed.py, tests/unit/memoire/feed/test_feed_device.py)."""

import numpy as np
import pytest

try:  # the Dopamine faces; a core-only install (the wheel check) has none
    from memoire.dopamine_compat import jax_replay_buffer as jrb
except ImportError:
    jrb = None


def dopamine(test):
    """Marks a test that needs the Dopamine faces (deselected in the core-only run)."""
    return pytest.mark.dopamine(pytest.mark.skipif(jrb is None, reason="needs dopamine-rl")(test))


def jax_buffer(
    n_elements=20,
    *,
    stack=1,
    prioritized=False,
    obs_shape=(4, 4),
    batch_size=32,
    capacity=1000,
    episode=None,
):
    """A JAX-face buffer holding n_elements transitions (keys 0..n_elements-1 while nothing is
    evicted) whose observation i is all ``i % 251`` (uint8 ``obs_shape``), action ``i % 3``,
    reward ``i``; with ``episode``, each episode ends after that many steps. Prioritized
    buffers add everything at priority 1."""
    acc = jrb.TransitionAccumulator(stack_size=stack, update_horizon=1, gamma=0.99)
    dist = (
        jrb.PrioritizedSamplingDistribution(seed=0, max_capacity=capacity)
        if prioritized
        else jrb.UniformSamplingDistribution(seed=0)
    )
    buf = jrb.ReplayBuffer(acc, dist, batch_size=batch_size, max_capacity=capacity)
    kw = {"priority": 1.0} if prioritized else {}
    # Without episode ends, the last step's transition appears with the next step's add.
    for i in range(n_elements + (episode is None)):
        ends = episode is not None and i % episode == episode - 1
        obs = np.full(obs_shape, i % 251, np.uint8)
        buf.add(jrb.TransitionElement(obs, i % 3, float(i), False, ends), **kw)
    return buf
