"""What the JAX ``ReplayBuffer``, its sampling distribution and its accumulator share: the
buffer's native ``TransitionStore``, through a :class:`StoreHandle`, instead of pointers to
each other.
"""

from __future__ import annotations


class StoreHandle:
    """The buffer's C++ ``TransitionStore``, None until its first add fixes the layouts (or a
    load builds one). The buffer sets :attr:`store`; the sampling distribution (its keys and
    tree) and the accumulator (its open trajectory) read it. One thread at a time, as the
    buffer."""

    __slots__ = ("store",)

    def __init__(self) -> None:
        self.store = None

    def clear(self) -> None:
        """Forgets every element and the open trajectory (add_count restarts at 0)."""
        if self.store is not None:
            self.store.clear()

    def clear_trajectory(self) -> None:
        """Drops the open trajectory; the elements stay."""
        if self.store is not None:
            self.store.clear_trajectory()
