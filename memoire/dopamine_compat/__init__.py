"""Drop-ins for Google Dopamine's replay buffers (dopamine-rl 4.1.2), on memoire's core.

TF-era buffers (the reference is ``dopamine.tf.replay_memory``):

- :class:`OutOfGraphReplayBuffer`, :class:`OutOfGraphPrioritizedReplayBuffer`: no TensorFlow
  needed; same constructor, methods, outputs, errors and checkpoint files as Dopamine's.
- ``WrappedReplayBuffer``, ``WrappedPrioritizedReplayBuffer``: Dopamine's in-graph wrappers
  (TensorFlow) defaulting to memoire's buffers; imported on first access.

Importing this package applies :mod:`memoire.dopamine_compat.upstream_compat` (what Dopamine
needs on today's stack, only where needed): import it before Dopamine or TensorFlow.

Gin: ``import memoire.dopamine_compat.gin_registry`` (see that module for names and the binding
that plugs memoire into Dopamine's own agents).

    >>> import numpy as np
    >>> from memoire.dopamine_compat import OutOfGraphReplayBuffer
    >>> buf = OutOfGraphReplayBuffer((84, 84), 4, replay_capacity=1000, batch_size=32)
"""

from memoire.dopamine_compat import upstream_compat

# Before anything here imports Dopamine, TensorFlow or JAX: what Dopamine 4.1.2 needs on today's
# stack (TF_USE_LEGACY_KERAS, a JAX attribute tfp reads), only where a version check says so.
upstream_compat.apply()

from memoire.dopamine_compat.circular_replay_buffer import OutOfGraphReplayBuffer, ReplayElement  # noqa: E402
from memoire.dopamine_compat.prioritized_replay_buffer import (  # noqa: E402
    OutOfGraphPrioritizedReplayBuffer,
)

__all__ = [
    "OutOfGraphReplayBuffer",
    "OutOfGraphPrioritizedReplayBuffer",
    "ReplayElement",
    "WrappedReplayBuffer",
    "WrappedPrioritizedReplayBuffer",
]


def __getattr__(name):  # the TF wrappers import TensorFlow, so only on first access
    if name == "WrappedReplayBuffer":
        from memoire.dopamine_compat import circular_replay_buffer  # pylint: disable=g-import-not-at-top

        return circular_replay_buffer.WrappedReplayBuffer
    if name == "WrappedPrioritizedReplayBuffer":
        from memoire.dopamine_compat import prioritized_replay_buffer  # pylint: disable=g-import-not-at-top

        return prioritized_replay_buffer.WrappedPrioritizedReplayBuffer
    if name == "ReplayBuffer":  # the JAX buffer, from its own module
        from memoire.dopamine_compat import jax_replay_buffer  # pylint: disable=g-import-not-at-top

        return jax_replay_buffer.ReplayBuffer
    raise AttributeError("module {!r} has no attribute {!r}".format(__name__, name))
