"""Experience streamed by actors into the JAX ``ReplayBuffer``: the native chunk ingest over
its store (the receiving end of :mod:`memoire.experience`), and the priority of what it
stores. ``ReplayBuffer.chunk_ingest`` and ``set_ingest_priority`` call these.
"""

from __future__ import annotations

import numpy as np

from memoire import _core, ingest_limits


def ingest_into(buffer, observation, action, **limits) -> "_core.ChunkIngest":
    """A ``memoire._core.ChunkIngest`` storing whole episodes into ``buffer`` (see
    ``ReplayBuffer.chunk_ingest``); ``observation`` and ``action`` fix the layouts as a first
    add would."""
    if buffer._store is None:
        buffer._build_store(np.asarray(observation), np.asarray(action))
    return _core.ChunkIngest(
        buffer._store,
        observation_dtype=buffer._obs_dtype,
        observation_shape=list(buffer._obs_shape),
        action_dtype=buffer._action_dtype,
        action_shape=list(buffer._action_shape),
        **ingest_limits.current_names(limits),
    )


def set_priority(distribution, ingest: "_core.ChunkIngest", priority: float) -> None:
    """Gives what ``ingest`` stores from now on the leaf value of ``priority`` under the
    prioritized ``distribution``, recorded as an add records it.

    Raises:
      ValueError: a negative or non-finite priority.
    """
    leaf = distribution.leaf_value(priority)
    if not np.isfinite(leaf):
        raise ValueError(f"priority: expected a finite value >= 0, got {priority}")
    ingest.priority = leaf
    distribution.record_added(np.array([leaf]))
