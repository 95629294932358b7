"""What a feed draws from: the buffers it takes, the layout of their batches in the native host
ring, which parts of a batch travel to a device, and the batch objects built from the parts.

Kinds: ``"jax"`` (memoire's JAX ``ReplayBuffer``), ``"tf"`` (the TF face's
``OutOfGraph(Prioritized)ReplayBuffer``), ``"memory"`` (``memoire.ReplayMemory``) and
``"stream"`` (a ``memoire.stream.SamplingStream`` over the socket).
"""

from __future__ import annotations

import sys
from typing import List, NamedTuple, Optional

import numpy as np

from memoire import _core
from memoire.memory import Batch

# A ReplayMemory batch's parts: prev[7], next[7], weight, prob, done, id; a stream's add
# num_sampleable int64[1] and total_weight float64[1] (the normaliser of the draw).
_MEMORY_PARTS = 18


def kind_of(buffer) -> str:
    """The kind of ``buffer``; TypeError for anything a feed cannot draw from."""
    if isinstance(buffer, _core.ReplayMemory):
        return "memory"
    stream = sys.modules.get("memoire.stream")
    if stream is not None and isinstance(buffer, stream.SamplingStream):
        return "stream"
    jrb = sys.modules.get("memoire.dopamine_compat.jax_replay_buffer")
    if jrb is not None and isinstance(buffer, jrb.ReplayBuffer):
        return "jax"
    crb = sys.modules.get("memoire.dopamine_compat.circular_replay_buffer")
    if crb is not None and isinstance(buffer, crb.OutOfGraphReplayBuffer):
        if not buffer._fast_sampling:
            raise TypeError(
                f"buffer: {type(buffer).__name__} draws its own indices "
                "(sample_index_batch is overridden); the feed cannot draw for it"
            )
        return "tf"
    raise TypeError(
        "buffer: expected memoire.ReplayMemory, or memoire's JAX ReplayBuffer or "
        "OutOfGraphReplayBuffer (memoire.dopamine_compat), got "
        f"{type(buffer).__name__}"
    )


def native_source(kind: str, buffer):
    """The native object the ring draws from: the JAX face's store (None before its first
    add), the TF face's circular buffer, the memory, or the stream's sources (one per
    connection)."""
    if kind == "jax":
        return buffer._store
    if kind == "tf":
        return buffer._core
    if kind == "stream":
        return buffer._sources
    return buffer


def frames_granule(batch_size: int) -> int:
    """Distinct frames travel in multiples of this (zero-padded), so that the device's gather
    compiles for a few shapes: 8 frames, or a quarter of the batch when that is more."""
    return max(8, batch_size // 4)


def host_templates(kind: str, buffer, n: int, stack_on_device: bool) -> tuple:
    """(templates, frames granule) of the native ring for batches of ``n``: one array per part
    (its dtype and shape); a ReplayMemory's or stream's ring sizes itself from its layout."""
    if kind == "jax" and stack_on_device:
        granule = frames_granule(n)
        action = buffer._empty_batch(1)[1]
        frames = _core.Feed.distinct_frames_capacity(n, buffer._stack_size, granule)
        return [
            np.empty(n, np.int32),
            np.empty(n, np.float64),
            np.empty((frames, *buffer._obs_shape), buffer._obs_dtype),
            np.empty((n, 2, buffer._stack_size), np.int32),
            np.empty(2, np.int32),
            np.empty((n, *action.shape[1:]), action.dtype),
            np.empty(n, np.float64),
            np.empty(n, np.bool_),
            np.empty(n, np.bool_),
        ], granule
    if kind == "jax":
        return [np.empty(n, np.int32), np.empty(n, np.float64), *buffer._empty_batch(n)], 0
    if kind == "tf":
        return list(buffer._create_batch_arrays(n)), 0
    return [], 0


class DeviceLayout(NamedTuple):
    """Which parts travel to the device (metadata stays on the host: keys, probabilities, a
    memory's ids, the TF face's indices), and ``trim``: (part, count part, count index), a
    part of which only the first ``count`` rows travel (distinct frames up to the padded
    count)."""

    to_device: List[bool]
    trim: Optional[List[int]] = None


def device_layout(kind: str, parts: int, stack_on_device: bool) -> DeviceLayout:
    if kind == "jax":
        to_device = [False, False] + [True] * (parts - 2)
        if stack_on_device:  # counts stay on the host; frames travel up to counts[1]
            to_device[4] = False
            return DeviceLayout(to_device, [2, 4, 1])
        return DeviceLayout(to_device)
    if kind == "tf":
        to_device = [True] * parts
        to_device[7] = False  # indices: for set_priority on the host
        return DeviceLayout(to_device)
    # A memory's 17 arrays travel, its id stays (update_weights); a stream's normaliser too.
    return DeviceLayout([True] * (_MEMORY_PARTS - 1) + [False] * (parts - _MEMORY_PARTS + 1))


def slot_share(kind: str, stack_on_device: bool):
    """views -> what every batch lent from a device slot shares (built once per import of the
    slot): a memory's or stream's stacks (prev, next), the JAX face's ``ReplayElement`` (None
    with ``stack_on_device``: its stacks are assembled per batch), nothing for the TF face."""
    if kind in ("memory", "stream"):
        return lambda views: (tuple(views[0:7]), tuple(views[7:14]))
    if kind == "jax" and not stack_on_device:
        return lambda views: jax_element(views[2:])
    return lambda views: None


def memory_batch(kind: str, parts: tuple, prev: tuple, next_: tuple, id_):
    """A ReplayMemory or stream ``Batch``: ``prev``/``next_`` (its stacks, parts 0-13), the rest
    from ``parts``, ``id_`` for its id."""
    batch = Batch(prev, next_, parts[14], parts[15], parts[16], id_)
    if kind == "stream":  # as RemoteMemory.sample: the normaliser of the draw
        batch.num_sampleable, batch.total_weight = int(parts[18][0]), float(parts[19][0])
    return batch


def jax_metadata(buffer, keys, probabilities):
    """``sample(with_sample_metadata=True)``'s metadata for the JAX face."""
    from dopamine.jax.replay_memory import samplers

    if buffer._prioritized:
        return samplers.PrioritizedSampleMetadata(keys=keys, probabilities=probabilities)
    return samplers.SampleMetadata(keys=keys)


def jax_element(parts):
    """Dopamine's ``ReplayElement`` of parts (state, action, reward, next_state, is_terminal,
    episode_end): the type the JAX face returns (the library does not import the face)."""
    from dopamine.jax.replay_memory import elements

    return elements.ReplayElement(*parts)
