"""The JAX ``ReplayBuffer``'s constructor defaults from gin: assigned to
``dopamine.jax.replay_memory.replay_buffer.ReplayBuffer``, memoire's class is what Dopamine's
agents build, with ``batch_size`` and ``max_capacity`` left to the gin bindings of Dopamine's
``ReplayBuffer``; this module takes them (and the other two, when left at their defaults).
"""

from __future__ import annotations

from typing import Optional, Tuple

from dopamine.jax.replay_memory import replay_buffer as dopamine_replay_buffer

from memoire.dopamine_compat import _dropin

# Dopamine's class, kept before anyone assigns memoire's to its module attribute.
_DOPAMINE_REPLAY_BUFFER = dopamine_replay_buffer.ReplayBuffer

# The constructor's own defaults: an argument left at its default takes the gin binding.
_DEFAULTS = dict(batch_size=None, max_capacity=None, checkpoint_duration=4, compress=True)


def resolve(
    batch_size: Optional[int], max_capacity: Optional[int], checkpoint_duration: int, compress
) -> Tuple[int, int, int, bool]:
    """(batch_size, max_capacity, checkpoint_duration, compress): each argument given, or
    else the gin binding of Dopamine's ``ReplayBuffer``, or else the default.

    Raises:
      TypeError: batch_size or max_capacity neither given nor bound.
    """
    given = dict(
        batch_size=batch_size,
        max_capacity=max_capacity,
        checkpoint_duration=checkpoint_duration,
        compress=compress,
    )
    bindings = _dropin.dopamine_gin_bindings(_DOPAMINE_REPLAY_BUFFER)
    for name, default in _DEFAULTS.items():
        if _dropin.same_value(given[name], default) and name in bindings:
            given[name] = bindings[name]
    for name in ("batch_size", "max_capacity"):
        if given[name] is None:
            raise TypeError(
                f"ReplayBuffer: missing argument {name!r} (pass it, or bind "
                f"ReplayBuffer.{name} in gin)"
            )
    return (
        given["batch_size"],
        given["max_capacity"],
        given["checkpoint_duration"],
        given["compress"],
    )
