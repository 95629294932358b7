"""A drop-in for Dopamine's JAX replay buffer (``dopamine.jax.replay_memory``), on memoire's core.

:class:`ReplayBuffer` has the constructor, methods and results of Dopamine 4.1.2's
``dopamine.jax.replay_memory.replay_buffer.ReplayBuffer``; for the same stream of
``TransitionElement`` adds and the same seed it stores the same keys, returns the same
``ReplayElement`` batches (same fields, dtypes, shapes and values), the same sampled keys and
probabilities, and the same priorities and ``max_recorded_priority``. What differs is inside:

- Dopamine stores every element as two stacked (and snappy-compressed) observations. memoire's
  C++ ``TransitionStore`` keeps each frame once in a ring and assembles stacks at sample time,
  in C++, with the GIL released. ``compress`` only chooses the checkpoint format.
- Accumulation, eviction, the sampler's key maps and the sum tree run in C++ with Dopamine's
  arithmetic (see ``cpp/core/transition_store.h``). Random draws still come from the numpy
  ``Generator`` that Dopamine's sampler would own (same seed, same stream, checkpointed).

Each role is in the module of Dopamine's ``dopamine/jax/replay_memory/`` that holds it, and
what Dopamine's ``replay_buffer.py`` does besides in modules of its own:

=====================  ==========================================================================
module                 what
=====================  ==========================================================================
``elements``           ``ReplayElement``, ``TransitionElement`` (Dopamine's own types)
``accumulator``        :class:`TransitionAccumulator`: the settings of the n-step, frame-stacking
                       accumulation (which runs in the C++ store)
``samplers``           :class:`UniformSamplingDistribution`, :class:`PrioritizedSamplingDistribution`
``sum_tree``           the view of the C++ sum tree that agents read at ``_sum_tree``
``replay_buffer``      :class:`ReplayBuffer`, composing them over the C++ store
``store_handle``       the store the buffer shares with its sampler and accumulator
``state_dict``         the state dict: Dopamine's layout written, read and checked
``gin_defaults``       constructor arguments left to the gin bindings of Dopamine's buffer
``chunk_ingest``       the native ingest of episodes streamed by actors
``feed_source``        what a ``memoire.feed.Feed`` draws from (its ``BatchSource``)
``orbax_managers``     one orbax manager per checkpoint folder; save and load
``checkpointers``      the orbax handler of its checkpoints, which decodes files strictly
=====================  ==========================================================================

Import every name from this package (``memoire.dopamine_compat.jax_replay_buffer``): that is
the public path, and its classes carry it as their ``__module__``, as they did when the face
was one module (run records name the buffer's class by it, and pickles find the classes there).

Dopamine behaviours kept on purpose (an agent would see them):

- ``TransitionAccumulator`` quirks: with update horizon ``n`` an element whose n-step window ends
  at a terminal step leaves that step's reward out (with ``n == 1`` the last reward of an episode
  is never stored); an element's ``episode_end`` equals its ``is_terminal``; a truncated episode
  (``episode_end`` without ``is_terminal``) yields no shorter-horizon tail elements.
- With ``stack_size > 1`` a terminal step yields the same transition ``stack_size - 1`` extra
  times, each with one more zeroed frame (google/dopamine#228). Pass
  ``TransitionAccumulator(..., fix_terminal_duplicates=True)`` (or the agent argument of the same
  name) to yield each terminal transition once, with its full stack.
- ``max_recorded_priority`` starts at 1.0, survives ``clear()`` and is not checkpointed.
- Keys and sampled keys are ``int32`` arrays; rewards are ``float64``; flags are ``bool``.

Deliberate differences (Dopamine fails where memoire does not):

- A prioritized buffer whose ``max_capacity`` is a power of two gets one more tree level:
  Dopamine raises ``IndexError`` at its first eviction there.
- ``update(key, priorities=p)`` with a single key works (Dopamine's assertion rejects it).
- Bad input raises ``ValueError`` / ``KeyError`` / ``TypeError`` before anything changes
  (Dopamine asserts, or fails half way).
- Observations of the first add fix the observation shape and dtype, and actions fix the action
  dtype and shape; later adds are cast to them (numpy's ``same_kind``) or rejected.

Thread-safety: the C++ store is thread-safe; the Python object is thread-compatible (guard
concurrent ``add``/``sample``/``update`` from several threads with your own lock).
"""

from memoire.dopamine_compat.jax_replay_buffer.accumulator import TransitionAccumulator
from memoire.dopamine_compat.jax_replay_buffer.checkpointers import ReplayCheckpointArgs
from memoire.dopamine_compat.jax_replay_buffer.elements import (
    ELEMENT_FIELDS,
    ReplayElement,
    TransitionElement,
)
from memoire.dopamine_compat.jax_replay_buffer.replay_buffer import ReplayBuffer
from memoire.dopamine_compat.jax_replay_buffer.samplers import (
    PrioritizedSampleMetadata,
    PrioritizedSamplingDistribution,
    SampleMetadata,
    UniformSamplingDistribution,
)

_ELEMENT_FIELDS = ELEMENT_FIELDS  # the single module's name for it, which tests still read

__all__ = [
    "ReplayBuffer",
    "TransitionAccumulator",
    "UniformSamplingDistribution",
    "PrioritizedSamplingDistribution",
    "ReplayElement",
    "TransitionElement",
    "SampleMetadata",
    "PrioritizedSampleMetadata",
    "ReplayCheckpointArgs",
    "ELEMENT_FIELDS",
]

# memoire's classes by their public path (see the module docstring); Dopamine's keep theirs.
for _cls in (
    ReplayBuffer,
    TransitionAccumulator,
    UniformSamplingDistribution,
    PrioritizedSamplingDistribution,
):
    _cls.__module__ = __name__
del _cls
