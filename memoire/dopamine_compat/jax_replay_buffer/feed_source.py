"""The JAX ``ReplayBuffer`` as a source of a :class:`memoire.feed.Feed`: the
:class:`memoire.feed.BatchSource` its ``__feed_source__()`` hands out (the feed knows the face
only through it).

A batch's parts in the feed's ring: keys int32[B], probabilities float64[B], then the
``ReplayElement``'s six arrays (state, action, reward, next_state, is_terminal, episode_end;
see ``ReplayBuffer.sample``), or with ``stack_on_device`` the feed's distinct-frames layout.
"""

from __future__ import annotations

import numpy as np
from dopamine.jax.replay_memory import samplers as dopamine_samplers

from memoire import _core
from memoire.dopamine_compat.jax_replay_buffer.elements import ReplayElement
from memoire.feed import DeviceLayout, frames_granule


class JaxFeedSource:
    """A :class:`memoire.feed.BatchSource` over ``buffer`` (its store, layouts and counts)."""

    name = "jax"
    stacks_on_device = True
    has_metadata = True

    def __init__(self, buffer):
        self._buffer = buffer
        self.batch_size = buffer.batch_size

    def native(self):
        return self._buffer._store  # None before the first add: the feed raises as sample()

    def templates(self, n: int, stack_on_device: bool):
        b = self._buffer
        keys = np.empty(n, np.int32)
        probabilities = np.empty(n, np.float64)
        if not stack_on_device:
            return [keys, probabilities, *b._empty_batch(n)], 0
        granule = frames_granule(n)
        frames = _core.Feed.distinct_frames_capacity(n, b._stack_size, granule)
        return [
            keys,
            probabilities,
            np.empty((frames, *b._obs_shape), b._obs_dtype),
            np.empty((n, 2, b._stack_size), np.int32),
            np.empty(2, np.int32),
            np.empty((n, *b._action_shape), b._action_dtype),
            np.empty(n, np.float64),
            np.empty(n, np.bool_),
            np.empty(n, np.bool_),
        ], granule

    def device_layout(self, parts: int, stack_on_device: bool) -> DeviceLayout:
        to_device = [False, False] + [True] * (parts - 2)  # keys, probabilities: the host's
        if stack_on_device:  # counts stay on the host; frames travel up to counts[1]
            to_device[4] = False
            return DeviceLayout(to_device, [2, 4, 1])
        return DeviceLayout(to_device)

    def element(self, *arrays):
        return ReplayElement(*arrays)

    @staticmethod
    def slot_share(views):
        return ReplayElement(*views[2:])

    def batch(self, parts, *, size: int, lent: bool, shared, element, with_metadata: bool):
        self._buffer._sample_count += size
        if element is None:
            element = shared if shared is not None else ReplayElement(*parts[2:])
        if not with_metadata:
            return element
        keys, probabilities = parts[0], parts[1]
        if lent:  # the slot's arrays are refilled: the metadata is the batch's own
            keys, probabilities = keys.copy(), probabilities.copy()
        if self._buffer.prioritized:
            metadata = dopamine_samplers.PrioritizedSampleMetadata(
                keys=keys, probabilities=probabilities
            )
        else:
            metadata = dopamine_samplers.SampleMetadata(keys=keys)
        return element, metadata

    def sample_error(self, error: Exception, n: int):
        return None
