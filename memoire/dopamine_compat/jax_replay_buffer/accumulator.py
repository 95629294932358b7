"""The transition accumulator of the JAX face (Dopamine's ``replay_memory/accumulator.py``).

Dopamine's ``TransitionAccumulator`` turns an agent's steps into n-step, frame-stacked elements
in Python. memoire's does it in the buffer's C++ store (``cpp/core/transition_store.h``), with
Dopamine's arithmetic and quirks (see :mod:`memoire.dopamine_compat.jax_replay_buffer`): the
accumulator here only carries the settings, and Dopamine's own is accepted in its place.
"""

from __future__ import annotations

from dopamine.jax.replay_memory import accumulator as dopamine_accumulator

from memoire.dopamine_compat.jax_replay_buffer.store_handle import StoreHandle


class TransitionAccumulator:
    """Settings of Dopamine's ``TransitionAccumulator`` for memoire's buffer.

    The accumulation itself runs in the buffer's C++ store; this object only carries the
    settings (Dopamine's own ``TransitionAccumulator`` is accepted by :class:`ReplayBuffer` too).

    Args:
      stack_size: int >= 1, frames per state (stacked on a new last axis).
      update_horizon: int >= 1, the n of n-step returns.
      gamma: float, the discount.
      fix_terminal_duplicates: bool, False (Dopamine's behaviour, google/dopamine#228) or True
        (each terminal transition once, with its full stack).

    Raises:
      ValueError: a non-positive stack size or horizon.
    """

    _handle = StoreHandle()  # no store until a buffer attaches its own (older pickles too)

    def __init__(
        self,
        stack_size: int,
        update_horizon: int,
        gamma: float,
        *,
        fix_terminal_duplicates: bool = False,
    ):
        if int(stack_size) < 1:
            raise ValueError(f"stack_size: expected >= 1, got {stack_size}")
        if int(update_horizon) < 1:
            raise ValueError(f"update_horizon: expected >= 1, got {update_horizon}")
        self._stack_size = int(stack_size)
        self._update_horizon = int(update_horizon)
        self._gamma = float(gamma)
        self.fix_terminal_duplicates = bool(fix_terminal_duplicates)
        self._handle = StoreHandle()  # the buffer's, once one composes this (attach)

    def attach(self, handle: StoreHandle) -> None:
        """Works on the store of ``handle`` (the composing buffer's) from now on."""
        self._handle = handle

    def clear(self) -> None:
        """Drops the partial trajectory (the buffer's elements stay)."""
        self._handle.clear_trajectory()


def accumulator_settings(acc) -> tuple[int, int, float, bool]:
    """``(stack_size, update_horizon, gamma, fix_terminal_duplicates)`` of memoire's or
    Dopamine's accumulator; TypeError for anything else."""
    if isinstance(acc, (TransitionAccumulator, dopamine_accumulator.TransitionAccumulator)):
        return (
            int(acc._stack_size),
            int(acc._update_horizon),
            float(acc._gamma),
            bool(getattr(acc, "fix_terminal_duplicates", False)),
        )
    raise TypeError(
        "transition_accumulator: expected a TransitionAccumulator (memoire's or "
        f"dopamine.jax.replay_memory.accumulator's), got {type(acc).__name__}"
    )
