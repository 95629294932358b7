"""The JAX face's ``ReplayBuffer`` (Dopamine's ``replay_memory/replay_buffer.py``): the
composition of an accumulator's settings, a sampling distribution and memoire's C++
``TransitionStore``, with Dopamine's methods, results and state dict (see the package
docstring, :mod:`memoire.dopamine_compat.jax_replay_buffer`).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
from dopamine.jax import checkpointers as dopamine_checkpointers
from orbax import checkpoint as orbax

from memoire import _core
from memoire.dopamine_compat.jax_replay_buffer import chunk_ingest, gin_defaults, orbax_managers
from memoire.dopamine_compat.jax_replay_buffer import state_dict as _state_dict
from memoire.dopamine_compat.jax_replay_buffer.accumulator import (
    TransitionAccumulator,
    accumulator_settings,
)
from memoire.dopamine_compat.jax_replay_buffer.elements import (
    ELEMENT_FIELDS,
    ReplayElement,
    TransitionElement,
)
from memoire.dopamine_compat.jax_replay_buffer.feed_source import JaxFeedSource
from memoire.dopamine_compat.jax_replay_buffer.samplers import (
    PrioritizedSamplingDistribution,
    as_memoire_distribution,
)
from memoire.dopamine_compat.jax_replay_buffer.store_handle import StoreHandle


class ReplayBuffer(dopamine_checkpointers.Checkpointable):
    """Dopamine's JAX ``ReplayBuffer`` on memoire's C++ store (see the package docstring).

    Args:
      transition_accumulator: a :class:`TransitionAccumulator` (memoire's or Dopamine's; only its
        settings are used).
      sampling_distribution: a Uniform- or PrioritizedSamplingDistribution (memoire's or
        Dopamine's; a Dopamine one is replaced by memoire's shim sharing its Generator).
      batch_size: int, the default ``sample`` size.
      max_capacity: int >= 1, elements kept; the oldest is evicted beyond it.
      (batch_size and max_capacity not passed, and checkpoint_duration and compress left at
      their defaults, take the gin bindings of Dopamine's ``ReplayBuffer``, so this class can
      be assigned to ``dopamine.jax.replay_memory.replay_buffer.ReplayBuffer``.)
      checkpoint_duration: int >= 1, checkpoints kept by ``save``.
      compress: bool, whether checkpoints hold snappy-compressed stacks (Dopamine's format for
        ``compress=True``). Memory never holds stacks.

    Attributes:
      add_count: int, elements added so far (the next element's key), what agents compare with
        ``min_replay_history``. Settable as Dopamine's plain attribute is, while the buffer holds
        no element (the next element then gets that key; agents' tests set 0 to keep an agent
        from training) or to its current value; with elements stored memoire's keys are
        consecutive ending at ``add_count - 1``, so another value raises ValueError (in
        Dopamine it would give two elements one key, or keep evicting below capacity).

    Raises:
      ValueError: ``checkpoint_duration < 1`` or ``max_capacity < 1``.
      TypeError: an unsupported accumulator or sampling distribution.
    """

    def __init__(
        self,
        transition_accumulator,
        sampling_distribution,
        *,
        batch_size: Optional[int] = None,
        max_capacity: Optional[int] = None,
        checkpoint_duration: int = 4,
        compress: bool = True,
    ):
        batch_size, max_capacity, checkpoint_duration, compress = gin_defaults.resolve(
            batch_size, max_capacity, checkpoint_duration, compress
        )
        (self._stack_size, self._update_horizon, self._gamma, self._fix_terminal_duplicates) = (
            accumulator_settings(transition_accumulator)
        )
        if checkpoint_duration < 1:
            raise ValueError(f"Invalid checkpoint_duration: {checkpoint_duration}")
        if int(max_capacity) < 1:
            raise ValueError(f"max_capacity: expected >= 1, got {max_capacity}")
        self._max_capacity = int(max_capacity)
        self._batch_size = batch_size
        self._checkpoint_duration = checkpoint_duration
        self._compress = compress
        self._transition_accumulator = transition_accumulator
        # The store is shared through one handle: the parts hold it, not each other.
        self._handle = StoreHandle()
        if isinstance(transition_accumulator, TransitionAccumulator):
            transition_accumulator.attach(self._handle)
        self._sampling_distribution = as_memoire_distribution(sampling_distribution)
        self._sampling_distribution.attach(self._handle)
        self._prioritized = isinstance(self._sampling_distribution, PrioritizedSamplingDistribution)
        self._obs_shape = None
        self._obs_dtype = None
        self._action_shape = None
        self._action_dtype = None
        self._sample_count = 0
        self._feed = None  # a memoire.feed.Feed serving sample(), see start_feed
        self._first_key = 0  # add_count assigned before the store exists (the first key)

    @classmethod
    def from_dopamine(cls, buffer, *, fix_terminal_duplicates: bool = False) -> "ReplayBuffer":
        """memoire's buffer with the settings (and contents, if any) of Dopamine's ``buffer``.

        The sampling distribution's numpy Generator is shared, not copied, so draws continue
        its stream. This is how :mod:`memoire.dopamine_compat.jax_agents` builds its buffers
        from what the parent agent's ``_build_replay_buffer`` configured (gin included).
        """
        stack, horizon, gamma, _ = accumulator_settings(buffer._transition_accumulator)
        acc = TransitionAccumulator(
            stack, horizon, gamma, fix_terminal_duplicates=fix_terminal_duplicates
        )
        ours = cls(
            acc,
            buffer._sampling_distribution,
            batch_size=buffer._batch_size,
            max_capacity=buffer._max_capacity,
            checkpoint_duration=buffer._checkpoint_duration,
            compress=buffer._compress,
        )
        if buffer.add_count:
            ours.from_state_dict(buffer.to_state_dict())
        return ours

    # ---- properties ----

    @property
    def _store(self):
        """The C++ store, built by the first add (it fixes observation and action layouts);
        None before."""
        return self._handle.store

    @property
    def add_count(self) -> int:
        return self._first_key if self._store is None else self._store.add_count

    @add_count.setter
    def add_count(self, value: int) -> None:
        """Sets the next element's key (see the class docstring: only while no element is
        stored, or to the current value).

        Raises:
          ValueError: not an integer in [0, 2**31], or elements are stored and ``value`` differs
            from add_count.
        """
        value = _state_dict.checked_add_count(value, "add_count")
        if value == self.add_count:
            return
        if len(self):
            raise ValueError(
                f"add_count: {len(self)} elements are stored under keys {self.add_count - len(self)}"
                f"..{self.add_count - 1}; add_count can change only while none is (call clear() "
                f"first), or elements would share keys"
            )
        self.stop_feed()
        if self._store is None:
            self._first_key = value
        else:
            self._set_next_key(self._store, value)

    def _set_next_key(self, store, key: int) -> None:
        """Makes ``key`` the next element's key of ``store``, which holds no element (its
        partial trajectory is kept)."""
        _state_dict.set_next_key(self, store, key)

    @property
    def batch_size(self) -> int:
        """int, the default ``sample`` size."""
        return self._batch_size

    @property
    def prioritized(self) -> bool:
        """bool, whether sampling follows priorities (a PrioritizedSamplingDistribution)."""
        return self._prioritized

    @property
    def max_recorded_priority(self):
        """The largest leaf value ever set (Dopamine's ``_sum_tree.max_recorded_priority``);
        1.0 for a uniform buffer."""
        if self._prioritized:
            return self._sampling_distribution._sum_tree.max_recorded_priority
        return 1.0

    def __len__(self) -> int:
        return 0 if self._store is None else self._store.size

    @property
    def frame_capacity(self) -> int:
        """Frames the C++ ring holds (memory is about ``frame_capacity`` observations)."""
        return 0 if self._store is None else self._store.frame_capacity

    # ---- adding ----

    def _build_store(self, obs: np.ndarray, action: np.ndarray) -> None:
        self._commit_store(self._make_store(obs, action), obs, action)
        if self._first_key:
            self._set_next_key(self._store, self._first_key)
            self._first_key = 0

    def _commit_store(self, store, obs: np.ndarray, action: np.ndarray) -> None:
        self._handle.store = store
        self._obs_shape, self._obs_dtype = obs.shape, obs.dtype
        self._action_shape, self._action_dtype = action.shape, action.dtype

    def _make_store(self, obs: np.ndarray, action: np.ndarray):
        """A new C++ store for observations like ``obs`` and actions like ``action``."""
        if obs.dtype.kind not in "biuf" or obs.size == 0:
            raise ValueError(
                f"observation: expected a non-empty numeric array, got {obs.dtype}{list(obs.shape)}"
            )
        if action.dtype.kind not in "biuf":
            raise ValueError(f"action: expected a number or numeric array, got {action.dtype}")
        dist = self._sampling_distribution
        return _core.TransitionStore(
            max_capacity=self._max_capacity,
            stack_size=self._stack_size,
            update_horizon=self._update_horizon,
            gamma=self._gamma,
            fix_terminal_duplicates=self._fix_terminal_duplicates,
            prioritized=self._prioritized,
            tree_capacity=dist._max_capacity if self._prioritized else 0,
            frame_bytes=obs.nbytes,
            elem_bytes=obs.dtype.itemsize,
            action_bytes=action.nbytes,
        )

    def _coerce(self, value, dtype, shape, what: str) -> np.ndarray:
        a = np.asarray(value)
        if a.shape != shape:
            raise ValueError(f"{what}: expected {dtype}{list(shape)}, got {a.dtype}{list(a.shape)}")
        if a.dtype != dtype:
            if not np.can_cast(a.dtype, dtype, "same_kind"):
                raise ValueError(
                    f"{what}: expected {dtype}{list(shape)}, got "
                    f"{a.dtype}{list(a.shape)} (no same_kind cast)"
                )
            a = a.astype(dtype)
        return np.ascontiguousarray(a)

    def add(self, transition: TransitionElement, **kwargs: Any) -> None:
        """Adds one step; it may yield 0, 1 or (at a terminal) several elements.

        Args:
          transition: ``TransitionElement(observation, action, reward, is_terminal,
            episode_end=False)``: the observation the action was taken in
            (``dtype[*obs_shape]``), the action, the reward that followed, whether the episode
            terminated, whether it ended (a time limit).
          **kwargs: ``priority=`` (float >= 0 or None) for a prioritized buffer; ignored by a
            uniform one.

        Raises:
          ValueError: an observation or action of another shape (or an impossible cast) than
            the first add's; a negative priority. TypeError: a prioritized add without
            ``priority=``.
        """
        obs = np.asarray(transition.observation)
        action = np.asarray(transition.action)
        if self._store is None:
            self._build_store(obs, action)
        if (
            obs.dtype != self._obs_dtype
            or obs.shape != self._obs_shape
            or not obs.flags.c_contiguous
        ):
            obs = self._coerce(obs, self._obs_dtype, self._obs_shape, "observation")
        if action.dtype != self._action_dtype or action.shape != self._action_shape:
            action = self._coerce(action, self._action_dtype, self._action_shape, "action")
        value = 0.0
        if self._prioritized:
            if "priority" not in kwargs:
                raise TypeError("add() of a prioritized buffer needs the keyword 'priority'")
            value = self._sampling_distribution.leaf_value(kwargs["priority"])
        emitted = self._store.add(
            obs,
            action,
            float(transition.reward),
            bool(transition.is_terminal),
            bool(transition.episode_end),
            float(value),
        )
        if emitted and self._prioritized:
            self._sampling_distribution.record_added(np.asarray([value], dtype=np.float64))

    def add_batch(
        self, observations, actions, rewards, is_terminal, episode_end=None, *, priorities=None
    ) -> np.ndarray:
        """memoire's bulk add: the same as ``K`` :meth:`add` calls in order, in one native call
        (the C++ loop runs with the GIL released).

        Args:
          observations: ``dtype[K, *obs_shape]``, step ``b``'s observation (cast like ``add``).
          actions: ``[K, *action_shape]``.
          rewards: ``float[K]``.
          is_terminal: ``bool[K]``, the episode terminated after step ``b``.
          episode_end: ``bool[K]`` or None (all False), the episode ended after step ``b``
            (a time limit when not terminal).
          priorities: ``float[K]``, or one float for every step, >= 0, or None (0 each), for
            a prioritized buffer (raised to the exponent as ``add`` does); ignored by a
            uniform one.

        Returns:
          ``int64[K]``: the elements each step yielded.

        Raises:
          ValueError: arrays of different lengths, an observation or action of another shape
            (or an impossible cast) than the first add's, a negative or NaN priority. Nothing
            is added then.
        """
        obs = np.asarray(observations)
        acts = np.asarray(actions)
        rew = np.ascontiguousarray(rewards, dtype=np.float64).reshape(-1)
        k = rew.size
        if obs.ndim < 1 or len(obs) != k or acts.ndim < 1 or len(acts) != k:
            raise ValueError(
                f"add_batch: expected observations, actions and rewards of one "
                f"length, got {obs.shape}, {acts.shape}, {rew.shape}"
            )
        terms = np.ascontiguousarray(is_terminal, dtype=np.bool_).reshape(-1)
        ends = (
            np.zeros(k, np.bool_)
            if episode_end is None
            else np.ascontiguousarray(episode_end, dtype=np.bool_).reshape(-1)
        )
        if terms.size != k or ends.size != k:
            raise ValueError(
                f"add_batch: expected is_terminal and episode_end of length {k}, "
                f"got {terms.size} and {ends.size}"
            )
        if k == 0:
            return np.zeros(0, np.int64)
        if self._store is None:
            self._build_store(obs[0], acts[0])
        if (
            obs.dtype != self._obs_dtype
            or obs.shape[1:] != self._obs_shape
            or not obs.flags.c_contiguous
        ):
            obs = self._coerce(obs, self._obs_dtype, (k, *self._obs_shape), "observations")
        if (
            acts.dtype != self._action_dtype
            or acts.shape[1:] != self._action_shape
            or not acts.flags.c_contiguous
        ):
            acts = self._coerce(acts, self._action_dtype, (k, *self._action_shape), "actions")
        values = None
        if self._prioritized:
            raw = (
                np.zeros(k)
                if priorities is None
                else np.asarray(priorities, dtype=np.float64).reshape(-1)
            )
            if raw.size == 1:
                raw = np.full(k, raw[0])
            if raw.size != k:
                raise ValueError(f"priorities: expected {k} values (one per step), got {raw.size}")
            if np.isnan(raw).any() or (raw < 0).any():
                raise ValueError(f"priorities: expected values >= 0, got {raw.tolist()}")
            values = self._sampling_distribution.leaf_values(raw).astype(np.float64)
        emitted = self._store.add_batch(
            obs, acts, rew, terms.view(np.uint8), ends.view(np.uint8), values
        )
        if self._prioritized and emitted.any():
            self._sampling_distribution.record_added(values[emitted > 0])
        return emitted

    # ---- experience streamed by actors ----

    def chunk_ingest(self, observation, action, **limits) -> "_core.ChunkIngest":
        """A native ingest that stores whole episodes, streamed by actors as chunk messages
        (:mod:`memoire.experience`), into this buffer: each episode goes in as ``add_batch``
        would take it, its last step ending the episode.

        Args:
          observation, action: one step's; they fix the observation and action dtypes and
            shapes as a first ``add`` would (ignored once something was added).
          limits: the ingest's budgets (``max_message_bytes``, ``max_open_episodes``,
            ``open_episode_timeout`` seconds, ``max_episode_bytes``, ``max_open_bytes``; the
            older ``max_streams``, ``stream_timeout``, ``max_stream_bytes`` work too).

        Returns:
          ``memoire._core.ChunkIngest`` whose ``row_spec`` is observation, action (this
          buffer's dtypes and shapes), reward float64 and terminal bool. New elements of a
          prioritized buffer get the priority of :meth:`set_ingest_priority` (1.0 until set).
          Nothing else may add to this buffer while the ingest stores into it, and a ``load``
          that replaces the store needs a new ingest.
        """
        return chunk_ingest.ingest_into(self, observation, action, **limits)

    def set_ingest_priority(self, ingest: "_core.ChunkIngest", priority: float) -> None:
        """Gives the elements ``ingest`` stores from now on ``priority`` (as ``add``'s: raised
        to the exponent), recorded in ``max_recorded_priority`` as ``add`` records it. A
        uniform buffer ignores it.

        Raises:
          ValueError: a negative or non-finite priority.
        """
        if self._prioritized:
            chunk_ingest.set_priority(self._sampling_distribution, ingest, priority)

    # ---- sampling ----

    @property
    def sample_count(self) -> int:
        """Transitions drawn by :meth:`sample` so far (batch items; ``get_elements`` does not
        count). Not checkpointed: it restarts at 0 with the process."""
        return self._sample_count

    def __feed_source__(self) -> JaxFeedSource:
        """What a :class:`memoire.feed.Feed` draws from (its ``BatchSource`` protocol)."""
        return JaxFeedSource(self)

    def _empty_batch(self, n: int):
        s = self._stack_size
        state = np.empty((n, *self._obs_shape, s), self._obs_dtype)
        return (
            state,
            np.empty((n, *self._action_shape), self._action_dtype),
            np.empty(n, np.float64),
            np.empty_like(state),
            np.empty(n, np.bool_),
            np.empty(n, np.bool_),
        )

    def _gather(self, keys: np.ndarray) -> ReplayElement:
        keys = np.asarray(keys).reshape(-1)
        out = self._empty_batch(keys.size)
        self._store.gather(keys.astype(np.int64, copy=False), *out)  # KeyError(key)
        return ReplayElement(**dict(zip(ELEMENT_FIELDS, out)))

    def sample(self, size: Optional[int] = None, *, with_sample_metadata: bool = False):
        """A batch of stored elements, drawn by the sampling distribution.

        Args:
          size: int >= 1, the batch size (default: ``batch_size``).
          with_sample_metadata: also return the draw's metadata.

        Returns:
          ``ReplayElement`` of arrays: state and next_state ``dtype[size, *obs_shape, stack]``
          (oldest frame first along the last axis, zeros before an episode's first frame),
          action ``dtype[size, *action_shape]``, reward ``float64[size]`` (the n-step discounted
          sum), is_terminal and episode_end ``bool[size]``. With ``with_sample_metadata``, a
          tuple ``(batch, metadata)``: ``SampleMetadata(keys=int32[size])``, or for a
          prioritized buffer ``PrioritizedSampleMetadata(keys, probabilities=float64[size])``.

        After :meth:`start_feed`, a batch of the feed's size is the feed's next batch instead
        (same layout; not Dopamine's random stream).

        Raises:
          ValueError: nothing stored, or ``size < 1``.
        """
        feed = self._feed
        if feed is not None and (size is None or size == feed.batch_size):
            batch, metadata = next(feed)
            return (batch, metadata) if with_sample_metadata else batch
        if self.add_count < 1:
            raise ValueError("No samples in replay buffer!")
        if size is None:
            size = self._batch_size
        if size < 1:
            raise ValueError(f"Invalid size: {size}, size must be >= 1.")
        samples = self._sampling_distribution.sample(size)
        batch = self._gather(samples.keys)
        self._sample_count += int(size)
        return (batch, samples) if with_sample_metadata else batch

    def start_feed(
        self,
        depth: int = 4,
        *,
        threads: int = 1,
        seed: int = 0,
        device=None,
        stack_on_device: bool = False,
    ):
        """Serves ``sample()`` at the default batch size from a prefetching feed from now on.

        Native threads draw ``depth`` batches ahead (:class:`memoire.feed.Feed`, which see):
        the same distribution as ``sample()``, but drawn with the core's generator (``seed``),
        so batches are no longer Dopamine's stream; after a priority ``update`` at most
        ``depth`` batches come from the old priorities (with ``device``: ``depth +
        feed.device_slots``, 3 device slots by default, on a CUDA or CPU device; ``depth + 1``
        on another JAX platform). With ``device`` (``"jax"`` or a ``jax.Device``) the batch
        arrays arrive as JAX arrays, copied ahead by a native thread (metadata stays numpy); with ``stack_on_device`` too, each distinct
        frame is copied once and the stacks are assembled on the device (same batches, fewer
        bytes). Returns the feed; :meth:`stop_feed` ends it.
        """
        from memoire.feed import Feed

        self.stop_feed()
        self._feed = Feed(
            self,
            self._batch_size,
            depth=depth,
            threads=threads,
            seed=seed,
            device=device,
            with_sample_metadata=True,
            stack_on_device=stack_on_device,
        )
        return self._feed

    def stop_feed(self) -> None:
        """Closes the feed started by :meth:`start_feed` (if any); ``sample()`` draws inline
        again, continuing the numpy Generator's stream."""
        feed, self._feed = self._feed, None
        if feed is not None:
            feed.close()

    def get_elements(self, keys) -> ReplayElement:
        """The stored elements of ``keys`` (``int[n]``) as one batch, like ``sample``.

        Raises:
          KeyError: a key is not stored.
        """
        if self._store is None:
            raise KeyError(int(np.asarray(keys).reshape(-1)[0]))
        return self._gather(keys)

    def keys(self) -> np.ndarray:
        """``int64[len(self)]``: the stored keys, oldest first."""
        n = len(self)
        return np.arange(self.add_count - n, self.add_count, dtype=np.int64)

    def priorities(self, keys) -> np.ndarray:
        """``float64[n]``: the tree's leaf values of ``keys`` (1.0 each for a uniform buffer).

        Raises:
          KeyError: a key is not stored.
        """
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if self._store is None:
            raise KeyError(int(keys[0]) if keys.size else None)
        return self._store.priorities(keys)  # KeyError(key) for a key not stored

    def stored_priorities(self) -> Optional[np.ndarray]:
        """``float64[len(self)]``: the leaf values of the stored keys, oldest first; None for a
        uniform buffer. One name for what a tracker reads on every memoire face, local or
        remote."""
        if not self._prioritized:
            return None
        return self.priorities(self.keys()) if len(self) else np.zeros(0)

    def update(self, keys, **kwargs: Any) -> None:
        """Forwards to the sampling distribution (``priorities=`` for a prioritized buffer)."""
        self._sampling_distribution.update(keys, **kwargs)

    # ---- clearing ----

    def end_episode(self) -> None:
        """Ends the episode in progress: the accumulator's partial trajectory (steps that
        yielded no element yet) is dropped, so the next add starts a new episode. Stored
        elements stay. A server calls it on the buffer it restored from a checkpoint, whose
        actor's episode did not survive."""
        self._handle.clear_trajectory()

    def forget_checkpoint_folder(self, checkpoint_dir: str) -> None:
        """Closes and drops the orbax manager this buffer keeps for ``checkpoint_dir`` (one per
        folder ``save``/``load`` used; a no-op for another), before the folder is renamed or
        removed."""
        self._checkpoint_managers().forget(checkpoint_dir)

    def clear(self) -> None:
        """Forgets every element and the partial trajectory; add_count restarts at 0."""
        self._handle.clear()
        self._first_key = 0

    # ---- checkpoints ----

    def to_state_dict(self) -> dict[str, Any]:
        """Dopamine's state dict layout (``add_count``, ``memory`` with keys, per-element leaves
        ``[state, action, reward, next_state, is_terminal, episode_end]`` and a pickled tree
        definition, ``sampling_distribution``, ``transition_accumulator``)."""
        return _state_dict.to_state_dict(self)

    def from_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a state dict written by this class or by Dopamine's buffer.

        The pickled ``treedef`` entries are never unpickled: elements must be lists of the six
        ReplayElement leaves and steps lists of the five TransitionElement leaves.

        Raises:
          ValueError: a malformed state dict, or one whose shapes differ from this buffer's
            (nothing is changed then).
        """
        _state_dict.from_state_dict(self, state_dict)

    def _make_checkpoint_manager(self, checkpoint_dir: str) -> orbax.CheckpointManager:
        """The orbax manager of ``checkpoint_dir`` (Dopamine's method name; one per folder)."""
        return self._checkpoint_managers().get(checkpoint_dir)

    def _checkpoint_managers(self) -> orbax_managers.CheckpointManagers:
        managers = self.__dict__.get("_orbax_managers")
        if managers is None:
            managers = orbax_managers.CheckpointManagers(self._checkpoint_duration)
            self._orbax_managers = managers
        return managers

    def save(self, checkpoint_dir: str, iteration_number: int) -> None:
        """Writes a checkpoint in Dopamine's layout (``<dir>/<iteration>/replay/``, msgpack).

        Args:
          checkpoint_dir: str, the directory; created if missing.
          iteration_number: int, the checkpoint's step.
        """
        orbax_managers.save(self._make_checkpoint_manager(checkpoint_dir), self, iteration_number)

    def load(self, checkpoint_dir: str, iteration_number: int) -> None:
        """Restores a checkpoint written by ``save`` or by Dopamine's buffer.

        The file is decoded strictly (see :class:`.checkpointers.CheckedCheckpointHandler`) and the state
        checked against this buffer (shapes, dtypes, keys, ``add_count`` in ``[0, 2**31]``)
        before anything changes.

        Raises:
          FileNotFoundError: no such checkpoint. CheckpointError (a ValueError): a malformed
            one, or one that does not fit this buffer; the buffer is unchanged.
        """
        orbax_managers.load(
            self._make_checkpoint_manager(checkpoint_dir), self, checkpoint_dir, iteration_number
        )
