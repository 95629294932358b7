"""Drop-in for ``dopamine.tf.replay_memory.circular_replay_buffer`` (dopamine-rl 4.1.2).

:class:`OutOfGraphReplayBuffer` has Dopamine's constructor, public methods, attributes, returned
elements (names, dtypes, shapes, values), validity rules, errors and checkpoint files; storage
and sampling live in one native object (``memoire._core.CircularBuffer``), so add is one bound
call and a batch is assembled in C++ with the GIL released.

Differences from Dopamine, all deliberate:

- Sampling draws from a generator owned by the buffer (``seed=``), not numpy's global one;
  indices differ from Dopamine's for the same global seed, their distribution does not.
- A failed call changes nothing (Dopamine may have written padding before raising).
- ``episode_end_indices`` is computed on access; mutating the returned set has no effect
  (assign a new set instead). ``invalid_range`` is derived from ``add_count``; an assigned
  value reads back (and is saved) until the next add, as in Dopamine, but validity keeps
  following the cursor.
- Resident memory follows what is stored: the ring is reserved, not committed (a
  1,000,000-slot Atari buffer costs nothing until frames arrive), and save/load stream columns
  in 1 MiB slices (no second copy; the file's zero slices take no memory on load).
- Built without observation_shape, stack_size, replay_capacity or batch_size, a buffer is
  unbound and takes them from the WrappedReplayBuffer holding it (see ``__init__``).
- Extra storage elements may not reuse a transition element's name.
- Checkpoints are written atomically per iteration and loaded without unpickling arbitrary
  objects; see :mod:`memoire.dopamine_compat.checkpoint`.
- Two Dopamine defects are kept by default and fixed on request: ``episode_end_breaks_stacks``
  (google/dopamine#213: a frame stack may reach across an episode that ended by truncation)
  and ``fix_keep_every`` (``save`` writes only one file when ``keep_every`` spares an iteration).
- ``prefetch_depth > 0`` (gin: ``MemoireOutOfGraphReplayBuffer.prefetch_depth = 4``) makes
  default-size sampling take batches that native threads drew ahead (:mod:`memoire.feed`, see
  ``sample_transition_batch``): the learner's thread no longer samples. Off by default.

Thread-safety: add, sampling and priority calls may run concurrently (the native object
locks); save/load and the ``_store`` views must not run concurrently with add.
"""

import collections
import inspect
import math
import operator
import secrets
import threading

import numpy as np

from memoire import _core, ingest_limits
from memoire.dopamine_compat import _dropin
from memoire.dopamine_compat import checkpoint as _checkpoint
from memoire.dopamine_compat._ring import (
    STORE_FILENAME_PREFIX,  # noqa: F401 (Dopamine's module has this name)
    invalid_range,
)

# Dopamine's record type: equal (as a tuple) to Dopamine's own ReplayElement.
ReplayElement = collections.namedtuple("shape_type", ["name", "shape", "type"])

_TRANSITION_NAMES = frozenset(
    [
        "observation",
        "state",
        "action",
        "reward",
        "next_state",
        "next_action",
        "next_reward",
        "terminal",
        "indices",
        "priority",
        "sampling_probabilities",
    ]
)


def _np_dtype(t):
    """numpy dtype of ``t``: a numpy type, a dtype, a name, or a TensorFlow DType (gin constants
    such as gym_lib.CARTPOLE_OBSERVATION_DTYPE are TF DTypes)."""
    return np.dtype(getattr(t, "as_numpy_dtype", t))


def modulo_range(start, length, modulo):
    """Yields (start + i) % modulo for i < length (Dopamine's helper)."""
    for i in range(length):
        yield (start + i) % modulo


class OutOfGraphReplayBuffer(object):
    """Dopamine's out-of-graph circular replay buffer on memoire's native core.

    Stores observation, action, reward, terminal (and extras) in a ring of ``replay_capacity``
    slots and builds frame stacks, n-step discounted returns and next states at sample time.

    Attributes:
      add_count: int64 0-d array, slots written so far (padding slots included).
      invalid_range: the indices next to the cursor that cannot be sampled: float64[stack_size]
        zeros before the first add, then int64[stack_size + update_horizon].
      episode_end_indices: set of int, the slots where an episode ended (terminal or truncated).
    """

    _PRIORITIZED = False

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
        checkpoint_duration=4,
        keep_every=None,
        *,
        episode_end_breaks_stacks=False,
        fix_keep_every=False,
        seed=None,
        prefetch_depth=0,
        prefetch_threads=1,
    ):
        """Initializes the buffer (Dopamine's arguments, then memoire's keyword-only options).

        Args:
          observation_shape: tuple of ints, one observation (e.g. ``(84, 84)``).
          stack_size: int, frames per state; states are ``observation_dtype[*obs_shape, stack]``.
          replay_capacity: int, slots kept (padding slots included).
          batch_size: int, default batch size.
          update_horizon: int, n of the n-step return.
          gamma: float, discount; the n-step weights are float32(gamma ** k).
          max_sample_attempts: int, invalid draws allowed per batch.
          extra_storage_types: list of ReplayElement(name, shape, type) stored per step and returned.
          observation_dtype, terminal_dtype, action_dtype, reward_dtype: numpy dtypes
            (reward_dtype float16 is not supported).
          action_shape, reward_shape: tuples of ints, () for scalars.
          checkpoint_duration: int, iterations a checkpoint is kept for.
          keep_every: int or None, keep checkpoints whose iteration is a multiple of this.
          episode_end_breaks_stacks: bool, fix google/dopamine#213: a transition whose frame stack
            holds an episode end (not only a terminal) before its last frame is invalid.
            False (Dopamine's behaviour) by default.
          fix_keep_every: bool, when ``keep_every`` spares an iteration, write its whole checkpoint
            (Dopamine writes only the first file). False by default.
          seed: int or None, seeds this buffer's sampling generator (None: from the OS).
          prefetch_depth: int >= 0. 0 (default): every sample is drawn on the caller's thread,
            in the order of Dopamine's draws. N > 0: ``sample_transition_batch()`` at the default batch size
            takes the next of N batches drawn ahead by native threads (a
            :class:`memoire.feed.Feed`, started on first use): same distribution, another
            order, and batches (and priorities) up to N batches stale (docs/FEED.md).
          prefetch_threads: int in [1, max(1, prefetch_depth)], the feed's sampler threads.

        Unbound buffers. Without observation_shape, stack_size, replay_capacity or batch_size
        (as gin's ``WrappedReplayBuffer.wrapped_memory = @MemoireOutOfGraphReplayBuffer()`` builds
        it) the buffer is unbound: on first use it takes the missing arguments, and those left at
        their defaults, from the WrappedReplayBuffer (Dopamine's or memoire's) that holds it; see
        :mod:`memoire.dopamine_compat._dropin`. Using it outside a wrapper raises AttributeError.

        Raises:
          AssertionError: observation_shape is not a tuple (as Dopamine).
          ValueError: replay_capacity < update_horizon + stack_size (Dopamine's message), or an
            unsupported dtype / reserved extra name.
        """
        if _defer(self, OutOfGraphReplayBuffer, locals()):
            return
        assert isinstance(observation_shape, tuple)
        _check_prefetch(prefetch_depth, prefetch_threads)
        if replay_capacity < update_horizon + stack_size:
            raise ValueError("There is not enough capacity to cover update_horizon and stack_size.")
        self._action_shape = action_shape
        self._action_dtype = action_dtype
        self._reward_shape = reward_shape
        self._reward_dtype = reward_dtype
        self._observation_shape = observation_shape
        self._stack_size = stack_size
        self._state_shape = self._observation_shape + (self._stack_size,)
        self._replay_capacity = replay_capacity
        self._batch_size = batch_size
        self._update_horizon = update_horizon
        self._gamma = gamma
        self._observation_dtype = observation_dtype
        self._terminal_dtype = terminal_dtype
        self._max_sample_attempts = max_sample_attempts
        self._extra_storage_types = list(extra_storage_types) if extra_storage_types else []
        for element in self._extra_storage_types:
            if element.name in _TRANSITION_NAMES:
                raise ValueError(
                    "extra_storage_types: name {!r} is reserved for a transition element; "
                    "choose another name".format(element.name)
                )
        self._cumulative_discount_vector = np.array(
            [math.pow(self._gamma, n) for n in range(update_horizon)], dtype=np.float32
        )
        self._checkpoint_duration = checkpoint_duration
        self._keep_every = keep_every
        self._fix_keep_every = bool(fix_keep_every)
        self._episode_end_breaks_stacks = bool(episode_end_breaks_stacks)
        self._core = self._make_core(secrets.randbits(64) if seed is None else seed)
        # Views of the native storage, under Dopamine's names (read them; do not resize them).
        self._store = {
            e.name: self._core.column(i) for i, e in enumerate(self.get_storage_signature())
        }
        self._batch_arrays_spec = {}
        self._sample_count = 0
        # Sampling and gathering run in one native call unless a subclass draws its own indices.
        self._fast_sampling = getattr(type(self).sample_index_batch, "_memoire_native", False)
        if prefetch_depth and not self._fast_sampling:
            raise ValueError(
                "prefetch_depth: {} overrides sample_index_batch, so the feed cannot draw for it; "
                "leave prefetch_depth at 0".format(type(self).__name__)
            )
        self._prefetch_depth = int(prefetch_depth)
        self._prefetch_threads = int(prefetch_threads)
        self._feed_lock = threading.Lock()  # a feed has one consumer at a time

    def __getattr__(self, name):
        # Only reached for attributes not found: an unbound buffer binds itself, then retries.
        unbound = self.__dict__.get("_unbound")
        if unbound is None or name.startswith("__"):
            raise AttributeError(
                "{!r} object has no attribute {!r}".format(type(self).__name__, name)
            )
        _bind(self, _dropin.enclosing_wrapper_args(self))
        return getattr(self, name)

    def _make_core(self, seed):
        """A new, empty native buffer with this buffer's fields and settings (its storage is
        reserved, not committed: pages are taken as slots are written)."""
        fields = [
            (e.name, _np_dtype(e.type), tuple(int(d) for d in e.shape))
            for e in self.get_storage_signature()
        ]
        return _core.CircularBuffer(
            fields,
            capacity=int(self._replay_capacity),
            stack_size=int(self._stack_size),
            update_horizon=int(self._update_horizon),
            gamma=float(self._gamma),
            max_sample_attempts=int(self._max_sample_attempts),
            prioritized=self._PRIORITIZED,
            episode_end_breaks_stacks=self._episode_end_breaks_stacks,
            seed=int(seed) & (2**64 - 1),
        )

    # ---- state mirrored from the native object -------------------------------------------------

    @property
    def add_count(self):
        return np.array(self._core.add_count)

    @add_count.setter
    def add_count(self, value):
        self._core.add_count = int(value)
        self.stop_prefetch()  # batches drawn ahead may hold slots the new count invalidates

    @property
    def invalid_range(self):
        assigned = self.__dict__.get("_assigned_invalid_range")
        count = self._core.add_count
        if assigned is not None and assigned[0] == count:
            return assigned[1]
        if count == 0:
            return np.zeros((self._stack_size))
        return invalid_range(
            count % self._replay_capacity,
            self._replay_capacity,
            self._stack_size,
            self._update_horizon,
        )

    @invalid_range.setter
    def invalid_range(self, value):
        # Dopamine keeps a plain attribute that the next add overwrites; so here: the assigned
        # array is what reads back (and what save writes) until add_count changes. Validity keeps
        # following the cursor, as Dopamine's does after any add.
        self._assigned_invalid_range = (self._core.add_count, np.asarray(value))

    @property
    def episode_end_indices(self):
        return set(self._core.episode_ends())

    @episode_end_indices.setter
    def episode_end_indices(self, value):
        self._core.set_episode_ends(sorted(int(i) for i in value))

    @property
    def _episode_end_indices(self):
        return self.episode_end_indices

    @property
    def _next_experience_is_episode_start(self):
        return self._core.next_is_episode_start

    @_next_experience_is_episode_start.setter
    def _next_experience_is_episode_start(self, value):
        self._core.next_is_episode_start = bool(value)

    @property
    def next_experience_is_episode_start(self):
        """bool: whether the next add starts an episode (and so first writes stack_size - 1
        zero padding slots). Read-only; :meth:`end_episode` sets it."""
        return self._core.next_is_episode_start

    @property
    def replay_capacity(self):
        """int, slots kept (padding slots included): the constructor's ``replay_capacity``."""
        return self._replay_capacity

    @property
    def prefetch_depth(self):
        """int, batches the prefetching feed draws ahead (0: sampling on the caller's thread)."""
        return self._prefetch_depth

    def end_episode(self):
        """Ends the episode in progress as a truncation: the last slot written becomes an
        episode end (Dopamine's mark: no n-step return or stack validity crosses it) unless it
        is one already, and the next add starts a new episode (padding first). A no-op on an
        empty buffer except for the latter. A server calls it on the buffer it restored from a
        checkpoint, whose actor's episode did not survive."""
        count = self._core.add_count
        last = (count - 1) % self._replay_capacity
        if count and last not in self._core.episode_ends():
            self.episode_end_indices = self.episode_end_indices | {last}
        self._core.next_is_episode_start = True

    def stored_priorities(self):
        """None: a uniform buffer has no priorities (the prioritized buffer returns its
        slots'). One name for what a tracker reads on every memoire face, local or remote."""
        return None

    def seed(self, seed):
        """Reseeds this buffer's sampling generator (and drops batches the feed drew ahead, so
        a single-threaded feed's draws after seed(s) are a function of s and the contents)."""
        self.stop_prefetch()
        self._core.seed(int(seed) & (2**64 - 1))

    def arguments(self):
        """dict: the constructor arguments that fix this buffer's layout and sampling, by name
        (``observation_shape``, ``stack_size``, ``replay_capacity``, ``batch_size``,
        ``update_horizon``, ``gamma``, ``max_sample_attempts``, ``extra_storage_types``, the
        dtypes and shapes, ``episode_end_breaks_stacks``): what builds an equal, empty buffer."""
        return dict(
            observation_shape=tuple(self._observation_shape),
            stack_size=self._stack_size,
            replay_capacity=self._replay_capacity,
            batch_size=self._batch_size,
            update_horizon=self._update_horizon,
            gamma=self._gamma,
            max_sample_attempts=self._max_sample_attempts,
            extra_storage_types=list(self._extra_storage_types),
            observation_dtype=self._observation_dtype,
            terminal_dtype=self._terminal_dtype,
            action_shape=tuple(self._action_shape),
            action_dtype=self._action_dtype,
            reward_shape=tuple(self._reward_shape),
            reward_dtype=self._reward_dtype,
            episode_end_breaks_stacks=self._episode_end_breaks_stacks,
        )

    # ---- signatures ----------------------------------------------------------------------------

    def get_add_args_signature(self):
        """list of ReplayElement: the arguments add() expects, in order."""
        return self.get_storage_signature()

    def get_storage_signature(self):
        """list of ReplayElement: what is stored per slot."""
        storage_elements = [
            ReplayElement("observation", self._observation_shape, self._observation_dtype),
            ReplayElement("action", self._action_shape, self._action_dtype),
            ReplayElement("reward", self._reward_shape, self._reward_dtype),
            ReplayElement("terminal", (), self._terminal_dtype),
        ]
        for extra_replay_element in self._extra_storage_types:
            storage_elements.append(extra_replay_element)
        return storage_elements

    def get_transition_elements(self, batch_size=None):
        """list of ReplayElement: what sample_transition_batch returns, in order.

        state/next_state ``observation_dtype[batch, *obs_shape, stack]``; action/next_action,
        reward/next_reward ``[batch, *shape]``; terminal ``terminal_dtype[batch]``;
        indices ``int32[batch]``; then the extras ``[batch, *shape]``.
        """
        batch_size = self._batch_size if batch_size is None else batch_size
        transition_elements = [
            ReplayElement("state", (batch_size,) + self._state_shape, self._observation_dtype),
            ReplayElement("action", (batch_size,) + self._action_shape, self._action_dtype),
            ReplayElement("reward", (batch_size,) + self._reward_shape, self._reward_dtype),
            ReplayElement("next_state", (batch_size,) + self._state_shape, self._observation_dtype),
            ReplayElement("next_action", (batch_size,) + self._action_shape, self._action_dtype),
            ReplayElement("next_reward", (batch_size,) + self._reward_shape, self._reward_dtype),
            ReplayElement("terminal", (batch_size,), self._terminal_dtype),
            ReplayElement("indices", (batch_size,), np.int32),
        ]
        for element in self._extra_storage_types:
            transition_elements.append(
                ReplayElement(element.name, (batch_size,) + tuple(element.shape), element.type)
            )
        return transition_elements

    # ---- adding --------------------------------------------------------------------------------

    def add(self, observation, action, reward, terminal, *args, priority=None, episode_end=False):
        """Adds one transition (Dopamine's add).

        The episode's first add writes stack_size - 1 zero padding slots first. ``terminal`` or
        ``episode_end`` (a truncation) ends the episode.

        Args:
          observation: observation_dtype[*observation_shape].
          action, reward: scalars or arrays of action_shape / reward_shape.
          terminal: truthy when the transition is terminal.
          *args: the extras, in extra_storage_types order.
          priority: float >= 0, required by the prioritized buffer; here, as in Dopamine, it
            counts as one argument too many (ValueError).
          episode_end: truthy when the episode ends here without a terminal state.

        Raises:
          ValueError: wrong argument count or shape (Dopamine's messages), or a value numpy cannot
            store; nothing is added then.
        """
        try:
            self._core.add(observation, action, reward, terminal, args, priority, episode_end)
        except ValueError as e:
            raise self._dopamine_add_error(
                e, [observation, action, reward, terminal, *args], priority
            ) from None

    def _dopamine_add_error(self, error, values, priority):
        """The ValueError Dopamine's add raises where the core raised ``error`` (its details say
        which check failed); ``error`` itself for memoire's own checks (casts, NaN priorities)."""
        if hasattr(error, "received"):  # _check_add_types: the argument count
            return ValueError(
                "Add expects {} elements, received {}".format(error.expected, error.received)
            )
        if self._PRIORITIZED and priority is None and values:
            priority = values.pop()  # given positionally, after the extras
        if hasattr(error, "field"):  # _check_add_types: the shape of one argument
            signature = self.get_add_args_signature()
            value = values[error.field] if error.field < len(values) else priority
            if isinstance(value, np.ndarray):
                shape = value.shape
            elif isinstance(value, (tuple, list)):
                shape = np.array(value).shape
            else:
                shape = tuple()
            return ValueError(
                "arg has shape {}, expected {}".format(shape, tuple(signature[error.field].shape))
            )
        if self._PRIORITIZED and priority is not None and priority < 0.0:  # the SumTree's check
            return ValueError("Sum tree values should be nonnegative. Got {}".format(priority))
        return error

    def chunk_ingest(self, allow_nonfinite=False, **limits):
        """A native ingest that stores whole episodes, streamed by actors as chunk messages
        (:mod:`memoire.experience`), into this buffer: each episode goes in as ``add_batch`` would
        take it, its last row ending the episode; a prioritized buffer gives new rows the largest
        recorded priority (Dopamine's add without a priority).

        Args:
          allow_nonfinite: store NaN or infinite rewards (refused, and the episode dropped, by
            default: they come from peers).
          limits: the ingest's budgets (``max_message_bytes``, ``max_open_episodes``,
            ``open_episode_timeout`` seconds, ``max_episode_bytes``, ``max_open_bytes``; the
            older ``max_streams``, ``stream_timeout``, ``max_stream_bytes`` work too).

        Returns:
          ``memoire._core.ChunkIngest`` whose ``row_spec`` is this buffer's columns (observation,
          action, reward, terminal, extras). Nothing else may add while it stores.
        """
        limits = ingest_limits.current_names(limits)
        return _core.ChunkIngest(self._core, allow_nonfinite=allow_nonfinite, **limits)

    def add_batch(
        self, observations, actions, rewards, terminals, *args, priorities=None, episode_ends=None
    ):
        """memoire's bulk add: the same as K add() calls, in one native call.

        Args:
          observations: ``observation_dtype[K, *observation_shape]`` (same-kind casts allowed).
          actions, rewards: ``[K, *shape]``; terminals: ``[K]``; *args: extras ``[K, *shape]``.
          priorities: float64[K] (prioritized buffer only, required there).
          episode_ends: bool[K] or None; an episode ends where terminal or episode_end is nonzero.

        Raises:
          ValueError: a shape or dtype mismatch; nothing is added then.
        """
        terminals_in = np.asarray(terminals)
        ends = terminals_in != 0
        if episode_ends is not None:
            ends = ends | (np.asarray(episode_ends) != 0)
        columns = [observations, actions, rewards, terminals_in] + list(args)
        self._core.add_batch(columns, np.ascontiguousarray(ends, dtype=np.uint8), priorities)

    # ---- state queries -------------------------------------------------------------------------

    def is_empty(self):
        """Is the Replay Buffer empty?"""
        return np.bool_(self._core.add_count == 0)

    def is_full(self):
        """Is the Replay Buffer full?"""
        return np.bool_(self._core.add_count >= self._replay_capacity)

    def cursor(self):
        """Index to the location where the next transition will be written."""
        return np.int64(self._core.add_count % self._replay_capacity)

    def get_range(self, array, start_index, end_index):
        """array[start_index:end_index] with wrap-around (Dopamine's helper and asserts)."""
        assert end_index > start_index, "end_index must be larger than start_index"
        assert end_index >= 0
        assert start_index < self._replay_capacity
        if not self.is_full():
            assert end_index <= self.cursor(), "Index {} has not been added.".format(start_index)
        if start_index % self._replay_capacity < end_index % self._replay_capacity:
            return array[start_index:end_index, ...]
        indices = [
            (start_index + i) % self._replay_capacity for i in range(end_index - start_index)
        ]
        return array[indices, ...]

    def get_observation_stack(self, index):
        """observation_dtype[*observation_shape, stack]: the frames ending at ``index``."""
        return self._get_element_stack(index, "observation")

    def _get_element_stack(self, index, element_name):
        state = self.get_range(self._store[element_name], index - self._stack_size + 1, index + 1)
        return np.moveaxis(state, 0, -1)

    def get_terminal_stack(self, index):
        """terminal_dtype[stack]: the terminal flags of the frames ending at ``index``."""
        return self.get_range(self._store["terminal"], index - self._stack_size + 1, index + 1)

    def is_valid_transition(self, index):
        """Dopamine's is_valid_transition: can ``index`` be sampled now? Returns bool."""
        if index < 0 or index >= self._replay_capacity:
            return False
        return self._core.is_valid(operator.index(index))

    def is_valid_transitions(self, indices):
        """memoire's vectorised is_valid_transition: bool[n] for int[n] ``indices``."""
        return self._core.is_valid_many(np.asarray(indices, dtype=np.int64))

    # ---- sampling ------------------------------------------------------------------------------

    def sample_index_batch(self, batch_size):
        """list of ``batch_size`` valid indices, drawn uniformly by rejection (Dopamine's rules).

        Raises:
          RuntimeError: fewer than stack_size + update_horizon transitions, or more than
            max_sample_attempts invalid draws (Dopamine's messages).
        """
        try:
            return self._core.sample_indices(int(batch_size)).tolist()
        except RuntimeError as e:
            raise self._dopamine_sample_error(e, batch_size) from None

    sample_index_batch._memoire_native = True

    def _dopamine_sample_error(self, error, batch_size):
        """The exception Dopamine's sampling raises where the core raised ``error`` (its type and
        details say which check failed); ``error`` itself when Dopamine has no counterpart."""
        if isinstance(error, KeyError):  # get_range: a slot not yet written (the key: its start)
            return AssertionError("Index {} has not been added.".format(error.key))
        if isinstance(error, IndexError):  # get_range's bare assertions on the ring's bounds
            return AssertionError()
        if isinstance(error, RuntimeError):
            if hasattr(error, "sampled"):
                return RuntimeError(
                    "Max sample attempts: Tried {} times but only sampled {} valid indices. Batch size "
                    "is {}".format(self._max_sample_attempts, error.sampled, batch_size)
                )
            if hasattr(error, "needed"):
                return RuntimeError(
                    "Cannot sample a batch with fewer than stack size ({}) + update_horizon ({}) "
                    "transitions.".format(self._stack_size, self._update_horizon)
                )
            if self._PRIORITIZED and self._core.total_priority == 0.0:
                return ValueError("Cannot sample from an empty sum tree.")
        if isinstance(error, ValueError) and hasattr(error, "length"):
            # Vector rewards numpy does not broadcast against the discounts: numpy's own error, from
            # the expression Dopamine evaluates (discounts[:length] * rewards, summed into a row).
            try:
                reward_dtype = _np_dtype(self._reward_dtype)
                row = np.empty(self._reward_shape, reward_dtype)
                row[...] = np.sum(
                    self._cumulative_discount_vector[: error.length]
                    * np.zeros((error.length,) + tuple(self._reward_shape), reward_dtype),
                    axis=0,
                )
            except ValueError as numpy_error:
                return numpy_error
        return error

    def __feed_source__(self):
        """What a :class:`memoire.feed.Feed` draws from (its ``BatchSource`` protocol)."""
        from memoire.dopamine_compat.circular_feed_source import CircularFeedSource

        return CircularFeedSource(self)

    def _create_batch_arrays(self, batch_size):
        """New output arrays for one batch, as Dopamine makes (np.empty per element).

        They come from memoire's buffer pool (``_core.empty``): fresh multi-megabyte arrays cost
        page faults on first write, often more than the copy itself, while the pool hands out the
        warm memory of batches the caller already dropped.
        """
        spec = self._batch_arrays_spec.get(batch_size)
        if spec is None:
            spec = [
                (tuple(e.shape), _np_dtype(e.type))
                for e in self.get_transition_elements(batch_size)
            ]
            self._batch_arrays_spec[batch_size] = spec
        return tuple(_core.empty(shape, dtype) for shape, dtype in spec)

    @property
    def sample_count(self):
        """int, transitions drawn by sample_transition_batch without ``indices`` so far (batch
        items; reads of given indices do not count). Not checkpointed."""
        return self._sample_count

    def sample_transition_batch(self, batch_size=None, indices=None):
        """A batch of transitions: a tuple of arrays as get_transition_elements() describes.

        Args:
          batch_size: int, or None for the default.
          indices: None to sample, or ``batch_size`` ints (Dopamine accepts any the way its
            get_range does, wrapping negatives).

        Returns:
          tuple of numpy arrays (state, action, reward, next_state, next_action, next_reward,
          terminal, indices, *extras[, sampling_probabilities]). reward is the n-step discounted
          sum cut at the first terminal; next_* are read n steps on (or after the terminal).
          With ``prefetch_depth > 0``, ``indices=None`` and the default batch size, the arrays
          are the feed's next batch: numpy views of a ring slot, which goes back to the
          sampler threads once all of them are dropped (keeping ``prefetch_depth`` batches at
          once stalls the feed: RuntimeError). Their ``indices`` and ``sampling_probabilities``
          are those of the batch, drawn under the store's lock (priorities set since then are
          seen from the ``prefetch_depth + 1``-th batch on).

        Raises:
          AssertionError: ``len(indices) != batch_size`` or an index Dopamine's get_range rejects.
          RuntimeError: as sample_index_batch.
          ValueError: vector rewards that numpy cannot broadcast against the discounts (as
            Dopamine).
        """
        if batch_size is None:
            batch_size = self._batch_size
        if indices is None and self._prefetch_depth and batch_size == self._batch_size:
            return self._feed_batch()
        if indices is None and self._fast_sampling:
            arrays = self._create_batch_arrays(batch_size)
            try:
                self._core.sample_into(batch_size, list(arrays))
            except (KeyError, IndexError, RuntimeError, ValueError) as e:
                raise self._dopamine_sample_error(e, batch_size) from None
            self._sample_count += int(batch_size)
            return arrays
        drawn = indices is None
        if drawn:
            indices = self.sample_index_batch(batch_size)
        assert len(indices) == batch_size
        index_array = np.asarray(indices)
        if index_array.size and index_array.dtype.kind not in "iu":
            raise TypeError("indices: expected integers, got {}".format(index_array.dtype))
        arrays = self._create_batch_arrays(batch_size)
        try:
            self._core.gather(index_array.astype(np.int64, copy=False).reshape(-1), list(arrays))
        except (KeyError, IndexError, ValueError) as e:
            raise self._dopamine_sample_error(e, batch_size) from None
        if drawn:
            self._sample_count += int(batch_size)
        return arrays

    def _feed_batch(self):
        """The prefetching feed's next batch (the feed starts on first use)."""
        with self._feed_lock:
            feed = self.__dict__.get("_feed")
            if feed is None:
                from memoire.feed import Feed  # pylint: disable=g-import-not-at-top

                feed = Feed(
                    self,
                    self._batch_size,
                    depth=self._prefetch_depth,
                    threads=self._prefetch_threads,
                )
                self._feed = feed
            return tuple(feed.take())

    def stop_prefetch(self):
        """Stops the prefetching feed's sampler threads and drops the batches they drew ahead (a
        no-op without a feed). Batches handed out stay valid; the next default-size sample
        starts a new feed. ``load``, ``seed`` and assigning ``add_count`` call it; garbage
        collection of the buffer stops the feed too."""
        with self._feed_lock:
            feed = self.__dict__.pop("_feed", None)
        if feed is not None:
            feed.close()

    # ---- checkpoints ---------------------------------------------------------------------------

    def _generate_filename(self, checkpoint_dir, name, suffix):
        return _checkpoint.generate_filename(checkpoint_dir, name, suffix)

    def save(self, checkpoint_dir, iteration_number):
        """Writes Dopamine's checkpoint files ``<name>_ckpt.<iteration>.gz`` into checkpoint_dir.

        Does nothing when checkpoint_dir does not exist (as Dopamine). Files are written under
        temporary names and renamed once all are complete; the checkpoint checkpoint_duration
        iterations old is then removed (unless keep_every spares it).
        """
        _checkpoint.save(self, checkpoint_dir, iteration_number)

    def load(self, checkpoint_dir, suffix):
        """Restores a checkpoint written by this class or by Dopamine's.

        Raises:
          tensorflow.errors.NotFoundError (FileNotFoundError without TensorFlow loaded): a file is
            missing (episode_end_indices may be missing, as in Dopamine).
          memoire.ProtocolError: a file is corrupt or does not fit this buffer. The buffer is left
            unchanged on any error.
        """
        _checkpoint.load(self, checkpoint_dir, suffix)
        self.__dict__.pop("_assigned_invalid_range", None)  # the checkpoint's add_count rules
        self.stop_prefetch()  # batches drawn ahead come from the contents before the load


_REQUIRED = ("observation_shape", "stack_size", "replay_capacity", "batch_size")


def _check_prefetch(depth, threads):
    """Raises ValueError unless ``depth`` is an int >= 0 and ``threads`` one in
    [1, max(1, depth)]."""
    for name, value, low in (("prefetch_depth", depth, 0), ("prefetch_threads", threads, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError("{}: expected an int >= {}, got {!r}".format(name, low, value))
    if depth and threads > depth:
        raise ValueError(
            "prefetch_threads: expected <= prefetch_depth ({}), got {}".format(depth, threads)
        )


def _defer(buffer, cls, args):
    """At the top of ``cls.__init__`` (``args`` its locals()): when a required argument is
    missing, records the arguments and returns True (the buffer is unbound)."""
    if all(args[name] is not None for name in _REQUIRED):
        return False
    params = inspect.signature(cls.__init__).parameters
    buffer.__dict__["_unbound"] = (cls, {k: args[k] for k in params if k != "self"})
    return True


def _bind(buffer, given):
    """Completes an unbound buffer's construction: arguments it lacks or left at their default
    come from ``given`` (a wrapper's arguments); the others are kept.

    Raises:
      AttributeError: a required argument is still missing (naming it).
    """
    cls, args = buffer.__dict__["_unbound"]
    params = inspect.signature(cls.__init__).parameters
    merged = {}
    for name, value in args.items():
        unset = (
            value is None if name in _REQUIRED else _dropin.same_value(value, params[name].default)
        )
        merged[name] = given[name] if unset and name in given else value
    missing = [name for name in _REQUIRED if merged[name] is None]
    if missing:
        raise AttributeError(
            "{} was built without {}: pass them, or give the buffer as wrapped_memory to a "
            "WrappedReplayBuffer, which supplies its own".format(cls.__name__, ", ".join(missing))
        )
    del buffer.__dict__["_unbound"]
    try:
        cls.__init__(buffer, **merged)
    except BaseException:
        buffer.__dict__.clear()  # a failed bind leaves the buffer unbound, as it was
        buffer.__dict__["_unbound"] = (cls, args)
        raise


def bind_memory(memory, wrapper_args):
    """Binds ``memory`` (memoire's buffer, possibly unbound) with a wrapper's arguments; a no-op
    for a bound buffer or another object."""
    if isinstance(memory, OutOfGraphReplayBuffer) and "_unbound" in memory.__dict__:
        _bind(memory, wrapper_args)


def _make_wrapped_replay_buffer():
    """Builds WrappedReplayBuffer on first use (it needs TensorFlow and Dopamine)."""
    from dopamine.tf.replay_memory import circular_replay_buffer as dopamine_crb  # pylint: disable=g-import-not-at-top

    dopamine_wrapper = dopamine_crb.WrappedReplayBuffer
    signature = inspect.signature(dopamine_wrapper.__init__)

    class WrappedReplayBuffer(dopamine_wrapper):
        """Dopamine's WrappedReplayBuffer (in-graph sampling tensors) over memoire's buffer.

        Same arguments, tensors (``states``, ``actions``, ``rewards``, ``next_states``,
        ``next_actions``, ``next_rewards``, ``terminals``, ``indices``, ``transition``) and methods
        as Dopamine's: this class is Dopamine's, with another default ``wrapped_memory``.

        ``wrapped_memory``: None (memoire's OutOfGraphReplayBuffer), a buffer, or a buffer class
        (e.g. gin's ``@MemoireOutOfGraphReplayBuffer``); memoire's buffers given unbound or as a
        class take this wrapper's arguments. Arguments not passed take the gin bindings of
        Dopamine's ``WrappedReplayBuffer`` (Dopamine's ``__init__`` runs), so assigning this class
        to ``dopamine.tf.replay_memory.circular_replay_buffer.WrappedReplayBuffer`` keeps every
        Dopamine gin file working.
        """

        def __init__(self, *args, **kwargs):
            bound = signature.bind_partial(self, *args, **kwargs)
            bound.arguments["wrapped_memory"] = _wrapped_memory_of(
                bound.arguments.get("wrapped_memory"), OutOfGraphReplayBuffer
            )
            super().__init__(*bound.args[1:], **bound.kwargs)

    WrappedReplayBuffer.__init__.__signature__ = signature
    WrappedReplayBuffer.__module__ = __name__
    return WrappedReplayBuffer


def _wrapped_memory_of(memory, default_cls):
    """The memory a memoire wrapper hands to Dopamine's ``__init__``: an unbound ``default_cls``
    for None, an instance for a class (unbound when it is memoire's), else ``memory``. Unbound
    buffers bind to the wrapper's final arguments (gin's included) on first use."""
    if memory is None:
        return default_cls()
    if isinstance(memory, type):
        return memory()
    return memory


_LAZY = {"WrappedReplayBuffer": _make_wrapped_replay_buffer}


def __getattr__(name):  # PEP 562: the TF wrapper is built on first access
    if name in _LAZY:
        value = _LAZY.pop(name)()
        globals()[name] = value
        return value
    raise AttributeError("module {!r} has no attribute {!r}".format(__name__, name))
