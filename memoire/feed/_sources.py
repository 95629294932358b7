"""What a feed draws from: the sources it takes, the layout of their batches in the native host
ring, which parts of a batch travel to a device, and the batch objects built from the parts.

Kinds: ``"memory"`` (``memoire.ReplayMemory``), ``"stream"`` (a ``memoire.stream.SamplingStream``
over the socket, whose class sets ``__feed_stream__ = True``) and ``"source"``: a buffer whose ``__feed_source__()`` hands out a
:class:`BatchSource` (each Dopamine face implements one in its own package). The feed knows
those faces only through that protocol.
"""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Protocol, Sequence, Tuple

import numpy as np

from memoire import _core
from memoire.memory import Batch

# A ReplayMemory batch's parts: prev[7], next[7], weight, prob, done, id; a stream's add
# num_sampleable int64[1] and total_weight float64[1] (the normaliser of the draw).
_MEMORY_PARTS = 18


class DeviceLayout(NamedTuple):
    """Which parts travel to the device (metadata stays on the host: keys, probabilities, a
    memory's ids, the TF face's indices), and ``trim``: (part, count part, count index), a
    part of which only the first ``count`` rows travel (distinct frames up to the padded
    count)."""

    to_device: List[bool]
    trim: Optional[List[int]] = None


class BatchSource(Protocol):
    """A source of batches for a :class:`memoire.feed.Feed` besides memoire's own: what a
    buffer's ``__feed_source__()`` returns.

    A batch is drawn natively into a ring slot as ``parts``, one array per template of
    :meth:`templates`; :meth:`batch` turns them into what the buffer's ``sample`` returns.
    With ``stack_on_device`` (where :attr:`stacks_on_device`) the parts are the distinct-frames
    layout: keys int32[B], probabilities float64[B], frames dtype[F, *obs] (F a multiple of
    :func:`frames_granule`), index int32[B, 2, stack], counts int32[2], then action, reward,
    is_terminal and episode_end of the batch; the feed assembles the stacks.
    """

    name: str  # what messages call it
    batch_size: int  # the buffer's own batch size (the feed's default)
    stacks_on_device: bool  # whether it has the distinct-frames layout above
    has_metadata: bool  # whether with_sample_metadata pairs each batch with its metadata

    def native(self) -> Any:
        """The native object the ring draws from (a new one rebuilds the rings), or None while
        nothing is stored (the feed then raises as ``sample()`` does)."""

    def templates(self, n: int, stack_on_device: bool) -> Tuple[List[np.ndarray], int]:
        """(templates, frames granule) of the ring's parts for batches of ``n`` (granule 0:
        no distinct frames)."""

    def device_layout(self, parts: int, stack_on_device: bool) -> DeviceLayout:
        """Which of the ``parts`` parts travel to a device."""

    def element(self, *arrays: Any) -> Any:
        """The batch element of the arrays state, action, reward, next_state, is_terminal and
        episode_end (with ``stack_on_device``; the JAX face's ``ReplayElement``)."""

    def slot_share(self, views: Sequence[Any]) -> Any:
        """What every batch lent from a device slot shares, built once per import of the
        slot's arrays ``views`` (None: nothing). A staticmethod: the feed's native rings keep
        it, and must not keep the buffer (the feed would never be collected)."""

    def batch(
        self,
        parts: Sequence[Any],
        *,
        size: int,
        lent: bool,
        shared: Any,
        element: Any,
        with_metadata: bool,
    ) -> Any:
        """The batch of ``parts``, ``size`` transitions counted as sampled. ``lent``: the arrays of a device slot
        (metadata is copied out of them); ``shared``: :meth:`slot_share`'s for that slot;
        ``element``: the stacks the feed assembled with ``stack_on_device``, else None."""

    def sample_error(self, error: Exception, n: int) -> Optional[Exception]:
        """The exception the buffer's own ``sample`` of ``n`` raises where a draw raised
        ``error`` (None: the feed's own mapping)."""


def kind_of(buffer) -> Tuple[str, Optional[BatchSource]]:
    """(kind, the buffer's BatchSource or None); TypeError for anything a feed cannot draw
    from (a source may raise its own TypeError: a buffer it cannot draw for)."""
    if isinstance(buffer, _core.ReplayMemory):
        return "memory", None
    make = getattr(type(buffer), "__feed_source__", None)
    if make is not None:
        return "source", make(buffer)
    if getattr(type(buffer), "__feed_stream__", False):
        # memoire.stream.SamplingStream says so itself: it imports the feed, so the feed
        # cannot import it (nor look it up) without a cycle.
        return "stream", None
    raise TypeError(
        "buffer: expected memoire.ReplayMemory, a SamplingStream or a buffer with a "
        "__feed_source__ (memoire's JAX ReplayBuffer, OutOfGraphReplayBuffer), got "
        f"{type(buffer).__name__}"
    )


def native_source(kind: str, buffer, source: Optional[BatchSource]):
    """The native object the ring draws from: a BatchSource's (None before anything is
    stored), the memory, or the stream's sources (one per connection)."""
    if kind == "source":
        return source.native()
    if kind == "stream":
        return buffer._sources
    return buffer


def frames_granule(batch_size: int) -> int:
    """Distinct frames travel in multiples of this (zero-padded), so that the device's gather
    compiles for a few shapes: 8 frames, or a quarter of the batch when that is more."""
    return max(8, batch_size // 4)


def host_templates(kind: str, source: Optional[BatchSource], n: int, stack_on_device: bool):
    """(templates, frames granule) of the native ring for batches of ``n``: one array per part
    (its dtype and shape); a ReplayMemory's or stream's ring sizes itself from its layout."""
    if kind == "source":
        return source.templates(n, stack_on_device)
    return [], 0


def device_layout(
    kind: str, source: Optional[BatchSource], parts: int, stack_on_device: bool
) -> DeviceLayout:
    """Which parts of ``parts`` travel to a device."""
    if kind == "source":
        return source.device_layout(parts, stack_on_device)
    # A memory's 17 arrays travel, its id stays (update_weights); a stream's normaliser too.
    return DeviceLayout([True] * (_MEMORY_PARTS - 1) + [False] * (parts - _MEMORY_PARTS + 1))


def slot_share(kind: str, source: Optional[BatchSource], stack_on_device: bool):
    """views -> what every batch lent from a device slot shares (built once per import of the
    slot): a memory's or stream's stacks (prev, next), a source's ``slot_share`` (nothing with
    ``stack_on_device``: those stacks are assembled per batch)."""
    if kind in ("memory", "stream"):
        return lambda views: (tuple(views[0:7]), tuple(views[7:14]))
    if kind == "source" and not stack_on_device:
        return source.slot_share
    return lambda views: None


def memory_batch(kind: str, parts: tuple, prev: tuple, next_: tuple, id_):
    """A ReplayMemory or stream ``Batch``: ``prev``/``next_`` (its stacks, parts 0-13), the rest
    from ``parts``, ``id_`` for its id."""
    batch = Batch(prev, next_, parts[14], parts[15], parts[16], id_)
    if kind == "stream":  # as RemoteMemory.sample: the normaliser of the draw
        batch.num_sampleable, batch.total_weight = int(parts[18][0]), float(parts[19][0])
    return batch
