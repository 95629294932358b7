"""The sampling distributions of the JAX face (Dopamine's ``replay_memory/samplers.py``).

Each subclasses Dopamine's class of the same name, so agents' ``isinstance`` checks pass, and
keeps Dopamine's numpy ``Generator`` (same seed, same draws, checkpointed); the keys, the key
maps and the sum tree are the buffer's C++ store's. Keys come and go with the buffer's adds
and evictions, never through the distribution.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from dopamine.jax.replay_memory import samplers as dopamine_samplers

from memoire.dopamine_compat.jax_replay_buffer.store_handle import StoreHandle
from memoire.dopamine_compat.jax_replay_buffer.sum_tree import SumTreeView, tree_leaves

SampleMetadata = dopamine_samplers.SampleMetadata
PrioritizedSampleMetadata = dopamine_samplers.PrioritizedSampleMetadata


class UniformSamplingDistribution(dopamine_samplers.UniformSamplingDistribution):
    """Dopamine's uniform sampling distribution over memoire's store.

    Passes ``isinstance(x, dopamine...samplers.UniformSamplingDistribution)``. Keys are added
    and removed by the buffer; ``sample`` draws dense indices with the owned numpy Generator
    (as Dopamine does) and maps them to keys in C++.

    Args:
      seed: what ``numpy.random.default_rng`` takes (an int, a SeedSequence, a Generator or None).
    """

    # No store until a buffer attaches its own (an instance pickled before handles existed
    # finds this one too); nobody sets a store on it.
    _handle = StoreHandle()

    def __init__(self, seed) -> None:  # pylint: disable=super-init-not-called
        self._rng = np.random.default_rng(seed)
        self._handle = StoreHandle()  # the buffer's, once one composes this (attach)

    def attach(self, handle: StoreHandle) -> None:
        """Draws from the store of ``handle`` (the composing buffer's) from now on."""
        self._handle = handle

    def _store(self):
        return self._handle.store

    @property
    def size(self) -> int:
        store = self._store()
        return 0 if store is None else store.size

    def add(self, key, **kwargs) -> None:
        raise TypeError("keys of memoire's buffer are added by ReplayBuffer.add")

    def remove(self, key) -> None:
        raise TypeError("keys of memoire's buffer are removed by ReplayBuffer.add (eviction)")

    def update(self, keys, *args, **kwargs) -> None:
        """A no-op, as in Dopamine."""

    def sample(self, size: int) -> SampleMetadata:
        n = self.size
        if n == 0:
            raise ValueError("No keys to sample from.")
        if size <= 0:
            raise ValueError("Sample size must be positive.")
        indices = self._rng.integers(n, size=size)
        return SampleMetadata(keys=self._store().keys_at(indices))

    def clear(self) -> None:
        self._handle.clear()

    def to_state_dict(self) -> dict[str, Any]:
        store = self._store()
        keys = [] if store is None else store.export_sampler()[0].tolist()
        return {
            "key_by_index": keys,
            "index_by_key": {k: i for i, k in enumerate(keys)},
            "rng_state": self._rng.bit_generator.state,
        }

    def from_state_dict(self, state_dict: dict[str, Any]) -> None:
        # The key maps are restored by ReplayBuffer.from_state_dict (with the elements).
        self._rng.bit_generator.state = state_dict["rng_state"]


class PrioritizedSamplingDistribution(dopamine_samplers.PrioritizedSamplingDistribution):
    """Dopamine's prioritized sampling distribution over memoire's store.

    Passes ``isinstance(x, dopamine...samplers.PrioritizedSamplingDistribution)``; ``_sum_tree``
    is a view whose ``max_recorded_priority`` is what Dopamine's agents read. Leaf values are
    ``priority ** priority_exponent`` (0 stays 0), kept in a C++ tree with Dopamine's layout and
    arithmetic; ``sample`` draws targets with the owned numpy Generator (as Dopamine does).

    Args:
      seed: what ``numpy.random.default_rng`` takes.
      priority_exponent: float, the exponent applied to priorities on add and update.
      max_capacity: int, leaves of the tree (Dopamine's sampler capacity).
    """

    def __init__(self, seed, *, priority_exponent: float = 1.0, max_capacity: int) -> None:  # pylint: disable=super-init-not-called
        self._rng = np.random.default_rng(seed)
        self._priority_exponent = priority_exponent
        self._max_capacity = int(max_capacity)
        self._sum_tree = SumTreeView(self)
        self._handle = StoreHandle()

    _handle = UniformSamplingDistribution._handle
    attach = UniformSamplingDistribution.attach
    _store = UniformSamplingDistribution._store
    size = UniformSamplingDistribution.size
    add = UniformSamplingDistribution.add
    remove = UniformSamplingDistribution.remove
    clear = UniformSamplingDistribution.clear

    @property
    def max_recorded_priority(self):
        return self._sum_tree.max_recorded_priority

    def record_added(self, values: np.ndarray) -> None:
        """The buffer stored elements of leaf ``values``: ``max_recorded_priority`` follows, as
        Dopamine's ``add`` updates it (max of it and ``values``, keeping the winner's type)."""
        if values.size:
            top = values.max()
            if top > self._sum_tree.max_recorded_priority:
                self._sum_tree.max_recorded_priority = top

    def leaf_value(self, priority) -> float:
        """The leaf value of a new element's priority (None counts as 0), as Dopamine's add."""
        if priority is None:
            priority = 0.0
        if not priority >= 0.0:
            raise ValueError(f"priority: expected a value >= 0, got {priority}")
        return float(self.leaf_values(priority))

    def leaf_values(self, priorities):
        """Dopamine's leaf values of ``priorities`` (>= 0; an array, or one value): each raised
        to ``priority_exponent``, 0 kept 0 (as ``0 ** 0`` would not be). The one place of that
        rule; its dtype follows ``priorities`` (what ``max_recorded_priority`` keeps)."""
        return np.where(priorities == 0.0, 0.0, priorities**self._priority_exponent)

    def update(self, keys, *, priorities) -> None:
        """Sets the priorities of stored ``keys``.

        Args:
          keys: ``int[n]`` keys (or one key).
          priorities: ``float[n]`` priorities >= 0 (or one, for one key); raised to
            ``priority_exponent``.

        Raises:
          KeyError: a key is not stored. ValueError: lengths differ, or a value is negative/NaN.
        """
        if not isinstance(keys, np.ndarray):
            keys = np.asarray([keys], dtype=np.int32)
        raw = np.asarray(priorities, dtype=np.float64)
        if np.isnan(raw).any() or (raw < 0).any():
            raise ValueError(f"priorities: expected values >= 0, got {raw.tolist()}")
        values = np.asarray(self.leaf_values(priorities))
        flat = values.reshape(-1).astype(np.float64, copy=False)
        if flat.size == 1 and keys.size != 1:
            raise ValueError(f"priorities: expected {keys.size} values (one per key), got 1")
        if np.isnan(flat).any() or (flat < 0).any():
            raise ValueError(f"priorities: expected values >= 0, got {flat.tolist()}")
        store = self._store()
        if store is None:
            raise KeyError(int(np.asarray(keys).reshape(-1)[0]) if keys.size else None)
        store.update(np.asarray(keys, dtype=np.int64).reshape(-1), flat)  # KeyError(key)
        self.record_added(values.reshape(-1))

    def sample(self, size: int) -> PrioritizedSampleMetadata:
        store = self._store()
        root = 0.0 if store is None else store.tree_root
        if root == 0.0:
            keys = UniformSamplingDistribution.sample(self, size).keys
            return PrioritizedSampleMetadata(
                keys=keys, probabilities=np.full_like(keys, 1.0 / self.size, dtype=np.float64)
            )
        targets = self._rng.uniform(0.0, root, size=size)
        keys, probabilities = store.query(targets)
        return PrioritizedSampleMetadata(keys=keys, probabilities=probabilities)

    def to_state_dict(self) -> dict[str, Any]:
        state = UniformSamplingDistribution.to_state_dict(self)
        store = self._store()
        nodes = (
            np.zeros(2 * tree_leaves(self._max_capacity, self._max_capacity) - 1)
            if store is None
            else store.export_sampler()[1]
        )
        return {"sum_tree": {"nodes": nodes}, **state}

    from_state_dict = UniformSamplingDistribution.from_state_dict


def as_memoire_distribution(dist):
    """``dist`` if it is memoire's; memoire's counterpart of Dopamine's uniform or prioritized
    distribution sharing its numpy Generator (and its max_recorded_priority); TypeError for
    any other (Dopamine's sequential one included)."""
    if isinstance(dist, (UniformSamplingDistribution, PrioritizedSamplingDistribution)):
        return dist
    if isinstance(dist, dopamine_samplers.PrioritizedSamplingDistribution):
        ours = PrioritizedSamplingDistribution(
            dist._rng, priority_exponent=dist._priority_exponent, max_capacity=dist._max_capacity
        )
        ours._sum_tree.max_recorded_priority = dist._sum_tree.max_recorded_priority
        return ours
    if isinstance(dist, dopamine_samplers.UniformSamplingDistribution) and not isinstance(
        dist, dopamine_samplers.SequentialSamplingDistribution
    ):
        return UniformSamplingDistribution(dist._rng)
    raise TypeError(
        "sampling_distribution: expected a Uniform- or PrioritizedSamplingDistribution "
        f"(memoire's or Dopamine's), got {type(dist).__name__}"
    )
