"""The TF face's ``OutOfGraph(Prioritized)ReplayBuffer`` as a source of a
:class:`memoire.feed.Feed`: the :class:`memoire.feed.BatchSource` its ``__feed_source__()``
hands out (the feed knows the face only through it).

A batch's parts are ``sample_transition_batch()``'s tuple (``get_transition_elements()``'s
order), drawn by the buffer's own native sampler.
"""

from __future__ import annotations

from memoire.feed import DeviceLayout

_INDICES = 7  # the part the host keeps: the indices, for set_priority


class CircularFeedSource:
    """A :class:`memoire.feed.BatchSource` over ``buffer``.

    Raises:
      TypeError: ``buffer``'s class overrides ``sample_index_batch`` (the feed cannot draw its
        indices).
    """

    name = "tf"
    stacks_on_device = False
    has_metadata = False

    def __init__(self, buffer):
        if not buffer._fast_sampling:
            raise TypeError(
                f"buffer: {type(buffer).__name__} draws its own indices "
                "(sample_index_batch is overridden); the feed cannot draw for it"
            )
        self._buffer = buffer
        self.batch_size = buffer._batch_size

    def native(self):
        return self._buffer._core

    def templates(self, n: int, stack_on_device: bool):
        return list(self._buffer._create_batch_arrays(n)), 0

    def device_layout(self, parts: int, stack_on_device: bool) -> DeviceLayout:
        to_device = [True] * parts
        to_device[_INDICES] = False
        return DeviceLayout(to_device)

    def element(self, *arrays):
        raise TypeError("the TF face has no stack_on_device layout")

    @staticmethod
    def slot_share(views):
        return None

    def batch(self, parts, *, size: int, lent: bool, shared, element, with_metadata: bool):
        self._buffer._sample_count += size
        if lent:  # the indices are the batch's own (the slot is refilled)
            return (
                tuple(parts[:_INDICES]) + (parts[_INDICES].copy(),) + tuple(parts[_INDICES + 1 :])
            )
        return parts

    def sample_error(self, error: Exception, n: int):
        return self._buffer._dopamine_sample_error(error, n)
