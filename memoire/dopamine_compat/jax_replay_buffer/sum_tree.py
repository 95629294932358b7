"""The sum tree of the JAX face, as Dopamine's agents read it (``replay_memory/sum_tree.py``).

The tree itself is C++ (``cpp/core/sum_tree.h``, inside the buffer's store). Agents reach into
``buffer._sampling_distribution._sum_tree.max_recorded_priority`` after an
``isinstance(..., samplers.PrioritizedSamplingDistribution)`` check, so the prioritized
sampling distribution (:mod:`.samplers`) holds a :class:`SumTreeView` there: its
``max_recorded_priority`` is the buffer's, and ``get(indices)`` reads the leaves at Dopamine's
sampler indices (as Dopamine's agent tests do). Prefer the public
``ReplayBuffer.max_recorded_priority`` and ``ReplayBuffer.priorities(keys)``.
"""

from __future__ import annotations

import numpy as np


class SumTreeView:
    """What Dopamine's agents and tests read at ``_sampling_distribution._sum_tree``:
    ``max_recorded_priority`` (read and write), ``root`` and ``get(index)`` over the buffer's
    C++ tree.

    Leaf ``i`` is Dopamine's: the leaf value (``priority ** priority_exponent``) of the key
    the sampler holds at index ``i`` (``to_state_dict()['sampling_distribution']
    ['key_by_index'][i]``), 0.0 for an index past the stored elements. Unlike Dopamine's
    ``SumTree.get`` (which reads inner nodes for negative indices), an index outside
    ``[0, leaves)`` raises IndexError.
    """

    def __init__(self, dist):  # the PrioritizedSamplingDistribution that holds this view
        self._dist = dist
        self.max_recorded_priority = 1.0

    @property
    def root(self) -> float:
        store = self._dist._store()
        return 0.0 if store is None else store.tree_root

    def get(self, index):
        """The leaf values at sampler indices ``index``: a float for an int, ``float64[n]``
        for an int array (numpy's fancy indexing of Dopamine's leaves)."""
        indices = np.asarray(index)
        if indices.dtype.kind not in "iu":
            raise IndexError(f"sum tree index: expected integers, got {indices.dtype}")
        flat = indices.astype(np.int64).reshape(-1)
        store = self._dist._store()
        leaves = tree_leaves(self._dist._max_capacity, self._dist._max_capacity)
        bad = flat[(flat < 0) | (flat >= leaves)]
        if bad.size:
            raise IndexError(f"sum tree index {int(bad[0])} is outside [0, {leaves})")
        values = np.zeros(flat.shape, np.float64)
        size = 0 if store is None else store.size
        live = flat < size
        if live.any():
            values[live] = store.priorities(store.keys_at(flat[live]))
        return float(values[0]) if indices.ndim == 0 else values.reshape(indices.shape)


def tree_leaves(tree_capacity: int, max_capacity: int) -> int:
    """Leaves of the C++ tree (Dopamine's layout): the power of two at least ``tree_capacity``,
    doubled until it exceeds ``max_capacity`` (one more level than Dopamine's when
    ``max_capacity`` is a power of two: see the package docstring)."""
    leaves = 1
    while leaves < tree_capacity:
        leaves *= 2
    while leaves < max_capacity + 1:
        leaves *= 2
    return leaves
