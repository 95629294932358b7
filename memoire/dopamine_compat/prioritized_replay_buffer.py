"""Drop-in for ``dopamine.tf.replay_memory.prioritized_replay_buffer`` (dopamine-rl 4.1.2).

:class:`OutOfGraphPrioritizedReplayBuffer` adds Schaul et al.'s prioritized sampling to
:class:`~memoire.dopamine_compat.circular_replay_buffer.OutOfGraphReplayBuffer`: one priority
per slot in the native sum tree (double precision), stratified batch sampling with Dopamine's
redraw rule for invalid indices, ``set_priority``/``get_priority`` and the
``sampling_probabilities`` element (the raw priorities as float32, as Dopamine returns them).

Differences from Dopamine, all deliberate: set_priority checks every index and priority before
setting any (an index outside [0, capacity), a NaN or infinite priority, or lengths that differ
raise; Dopamine would corrupt its tree, accept NaN or silently truncate), and the tree's inner
sums are exact rather than accumulated deltas.
"""

import inspect

import numpy as np

from memoire.dopamine_compat import _dropin, circular_replay_buffer
from memoire.dopamine_compat.circular_replay_buffer import ReplayElement


def _leaf_index_error(error):
    """The IndexError numpy raises (its own text) where Dopamine reads its leaf array, for the
    core's IndexError ``error`` (details: index, bound = the padded leaf count)."""
    try:
        np.empty(error.bound)[error.index]  # pylint: disable=expression-not-assigned
    except IndexError as numpy_error:
        return numpy_error
    return error


class SumTreeView(object):
    """Dopamine's ``sum_tree`` attribute, backed by the buffer's native sum tree.

    Agents read ``max_recorded_priority`` (Rainbow stores new transitions at it). ``nodes`` is
    Dopamine's level-by-level layout, rebuilt on access (float64 arrays of 1, 2, ..., P nodes).
    """

    def __init__(self, core):
        self._core = core

    @property
    def max_recorded_priority(self):
        return self._core.max_recorded_priority

    @max_recorded_priority.setter
    def max_recorded_priority(self, value):
        self._core.max_recorded_priority = float(value)

    def _total_priority(self):
        return self._core.total_priority

    def get(self, node_index):
        """float: the priority of slot ``node_index``."""
        try:
            return float(self._core.get_priorities(np.array([node_index], np.int64))[0])
        except IndexError as e:
            raise _leaf_index_error(e) from None

    def set(self, node_index, value):
        """Sets slot ``node_index``'s priority (float >= 0; ValueError otherwise)."""
        if value < 0.0:
            raise ValueError("Sum tree values should be nonnegative. Got {}".format(value))
        self._core.set_priorities(np.array([node_index], np.int64), np.array([value], np.float64))

    def sample(self, query_value=None):
        """A slot drawn in proportion to priority (the buffer's own generator).

        Raises:
          ValueError: the tree is empty. NotImplementedError: ``query_value`` is given.
        """
        if query_value is not None:
            raise NotImplementedError("memoire's sum tree samples with its own generator only")
        return int(self._sample_tree(1, False)[0])

    def stratified_sample(self, batch_size):
        """list of ``batch_size`` slots, one per equal slice of the total priority.

        Raises:
          ValueError: the tree is empty (Dopamine's message).
        """
        return self._sample_tree(int(batch_size), True).tolist()

    def _sample_tree(self, n, stratified):
        try:
            return self._core.sample_tree(n, stratified)
        except RuntimeError:
            if self._core.total_priority == 0.0:
                raise ValueError("Cannot sample from an empty sum tree.") from None
            raise

    @property
    def nodes(self):
        leaves = self._core.get_priorities(np.arange(self._core.padded_leaves, dtype=np.int64))
        levels = [leaves]
        while len(levels[0]) > 1:
            levels.insert(0, levels[0][0::2] + levels[0][1::2])
        return levels


class OutOfGraphPrioritizedReplayBuffer(circular_replay_buffer.OutOfGraphReplayBuffer):
    """Dopamine's out-of-graph prioritized replay buffer on memoire's native core.

    add() takes a ``priority`` (positional after the extras, or keyword); padding slots get 0.
    """

    _PRIORITIZED = True

    def __init__(
        self,
        observation_shape=None,
        stack_size=None,
        replay_capacity=None,
        batch_size=None,
        update_horizon=1,
        gamma=0.99,
        max_sample_attempts=1000,
        extra_storage_types=None,
        observation_dtype=np.uint8,
        terminal_dtype=np.uint8,
        action_shape=(),
        action_dtype=np.int32,
        reward_shape=(),
        reward_dtype=np.float32,
        *,
        episode_end_breaks_stacks=False,
        fix_keep_every=False,
        seed=None,
        prefetch_depth=0,
        prefetch_threads=1,
    ):
        """Same arguments as Dopamine's class; see OutOfGraphReplayBuffer for memoire's options
        (and for unbound buffers, built without the first four arguments)."""
        if circular_replay_buffer._defer(self, OutOfGraphPrioritizedReplayBuffer, locals()):  # pylint: disable=protected-access
            return
        super().__init__(
            observation_shape=observation_shape,
            stack_size=stack_size,
            replay_capacity=replay_capacity,
            batch_size=batch_size,
            update_horizon=update_horizon,
            gamma=gamma,
            max_sample_attempts=max_sample_attempts,
            extra_storage_types=extra_storage_types,
            observation_dtype=observation_dtype,
            terminal_dtype=terminal_dtype,
            action_shape=action_shape,
            action_dtype=action_dtype,
            reward_shape=reward_shape,
            reward_dtype=reward_dtype,
            episode_end_breaks_stacks=episode_end_breaks_stacks,
            fix_keep_every=fix_keep_every,
            seed=seed,
            prefetch_depth=prefetch_depth,
            prefetch_threads=prefetch_threads,
        )
        self.sum_tree = SumTreeView(self._core)

    def get_add_args_signature(self):
        """The storage signature plus ReplayElement('priority', (), np.float32)."""
        return super().get_add_args_signature() + [ReplayElement("priority", (), np.float32)]

    def sample_index_batch(self, batch_size):
        """list of ``batch_size`` indices drawn by stratified prioritized sampling.

        An invalid draw is replaced by non-stratified draws, max_sample_attempts in all per batch,
        as Dopamine does (which may, like Dopamine, leave the last redraw invalid).

        Raises:
          ValueError: every priority is 0 ('Cannot sample from an empty sum tree.').
          RuntimeError: the attempts ran out (Dopamine's message).
        """
        try:
            return self._core.sample_indices(int(batch_size)).tolist()
        except RuntimeError as e:
            raise self._dopamine_sample_error(e, batch_size) from None

    sample_index_batch._memoire_native = True

    def set_priority(self, indices, priorities):
        """Sets the priorities of slots ``indices`` (int32[n]) to ``priorities`` (float[n]).

        Raises:
          AssertionError: indices are not int32 (as Dopamine).
          ValueError: a negative (Dopamine's message), NaN or infinite priority, or n differs.
          IndexError: an index outside [0, replay_capacity). Nothing is set on any error.
        """
        assert indices.dtype == np.int32, "Indices must be integers, given: {}".format(
            indices.dtype
        )
        priorities = np.asarray(priorities)
        negative = np.flatnonzero(priorities < 0.0)
        if negative.size:
            raise ValueError(
                "Sum tree values should be nonnegative. Got {}".format(
                    priorities.reshape(-1)[negative[0]]
                )
            )
        self._core.set_priorities(
            np.asarray(indices, np.int64).reshape(-1),
            np.asarray(priorities, np.float64).reshape(-1),
        )

    def get_priority(self, indices):
        """float32[n]: the priorities of slots ``indices`` (int32[n]); 0 for unused slots.

        Raises:
          AssertionError: indices is not an int32 array (as Dopamine).
          IndexError: an index outside numpy's range for Dopamine's leaf array.
        """
        assert indices.shape, "Indices must be an array."
        assert indices.dtype == np.int32, "Indices must be int32s, given: {}".format(indices.dtype)
        try:
            return self._core.get_priorities(indices.astype(np.int64)).astype(np.float32)
        except IndexError as e:
            raise _leaf_index_error(e) from None

    def stored_priorities(self):
        """float64[n]: the priorities of slots 0 .. n - 1, n = min(add_count, replay_capacity)
        (padding slots hold 0), in one native call."""
        n = min(self._core.add_count, self._replay_capacity)
        return self._core.get_priorities(np.arange(n, dtype=np.int64))

    def get_transition_elements(self, batch_size=None):
        """The parent's elements plus ReplayElement('sampling_probabilities', (batch_size,), float32)."""
        parent = super().get_transition_elements(batch_size)
        return parent + [ReplayElement("sampling_probabilities", (batch_size,), np.float32)]


def _make_wrapped_prioritized_replay_buffer():
    """Builds WrappedPrioritizedReplayBuffer on first use (it needs TensorFlow and Dopamine)."""
    from dopamine.tf.replay_memory import prioritized_replay_buffer as dopamine_prb  # pylint: disable=g-import-not-at-top

    dopamine_wrapper = dopamine_prb.WrappedPrioritizedReplayBuffer
    signature = inspect.signature(dopamine_wrapper.__init__)

    class WrappedPrioritizedReplayBuffer(dopamine_wrapper):
        """Dopamine's WrappedPrioritizedReplayBuffer over memoire's prioritized buffer.

        Adds to the wrapped tensors ``tf_set_priority(indices, priorities)`` and
        ``tf_get_priority(indices)`` (tf.numpy_function ops, as Dopamine). ``wrapped_memory``:
        None (memoire's OutOfGraphPrioritizedReplayBuffer), a buffer, or a buffer class; memoire's
        buffers given unbound or as a class take this wrapper's arguments (all of them: Dopamine
        forwards only observation_dtype of the dtypes and shapes to its default memory).

        Arguments not passed take the gin bindings of Dopamine's ``WrappedPrioritizedReplayBuffer``,
        then its defaults, so this class can be assigned to
        ``dopamine.tf.replay_memory.prioritized_replay_buffer.WrappedPrioritizedReplayBuffer``.
        Dopamine's own ``__init__`` is skipped (its parent's runs): it calls ``super()`` through the
        module attribute, which would then be this class, and recurse.
        """

        def __init__(self, *args, **kwargs):
            bound = signature.bind_partial(self, *args, **kwargs)
            for name, value in _dropin.dopamine_gin_bindings(dopamine_wrapper).items():
                bound.arguments.setdefault(name, value)
            bound.apply_defaults()
            bound.arguments["wrapped_memory"] = circular_replay_buffer._wrapped_memory_of(  # pylint: disable=protected-access
                bound.arguments["wrapped_memory"], OutOfGraphPrioritizedReplayBuffer
            )
            super(dopamine_wrapper, self).__init__(*bound.args[1:], **bound.kwargs)  # pylint: disable=bad-super-call

    WrappedPrioritizedReplayBuffer.__init__.__signature__ = signature
    WrappedPrioritizedReplayBuffer.__module__ = __name__
    return WrappedPrioritizedReplayBuffer


_LAZY = {"WrappedPrioritizedReplayBuffer": _make_wrapped_prioritized_replay_buffer}


def __getattr__(name):  # PEP 562: the TF wrapper is built on first access
    if name in _LAZY:
        value = _LAZY.pop(name)()
        globals()[name] = value
        return value
    raise AttributeError("module {!r} has no attribute {!r}".format(__name__, name))
