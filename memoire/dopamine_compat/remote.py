"""Proxies of Dopamine-compatible buffers served by a memoire server, over the typed RPC.

A buffer runs embedded by default (the classes of :mod:`circular_replay_buffer`,
:mod:`prioritized_replay_buffer`, :mod:`jax_replay_buffer`). To share one between a learner
and actor processes, serve it (:mod:`memoire.dopamine_compat.buffer_server`: ``memoire serve
--buffer KIND``, or :func:`~memoire.dopamine_compat.buffer_server.serve_buffer` on a server of
your own) and reach it by endpoint::

    # server process
    server, endpoint = buffer_server.start_buffer_server("prioritized", observation_shape=(84, 84),
                                                         stack_size=4, replay_capacity=1_000_000,
                                                         batch_size=32)
    # actor processes (add) and the learner (sample, set_priority) alike
    replay = RemoteOutOfGraphReplayBuffer(endpoint, "replay")

The proxy looks like the local class to an agent: the same methods, attributes, return types,
dtypes and shapes, and the same exception types for bad calls (raised by the proxy's own copy
of the class's checks at ``add`` time, or by the server). ``add`` is buffered: rows are checked
at once, then sent in bulk (``add_batch``) when an episode ends, when ``flush_rows`` rows are
pending, and before any call that reads the buffer, so one process always sees its own adds.
Each bulk add is atomic on the server; episodes from several actors interleave only when an
episode outgrows ``flush_rows`` (Dopamine's buffer is one stream: use whole episodes).

``save``/``load`` run on the server, confined to its checkpoint root
(:func:`memoire.dopamine_compat.buffer_server.checkpoint_dir`). Batch sizes are bounded by the
server's ``max_batch`` (docs/LIMITS.md). NaN or infinite rewards and priorities that peers send
are refused (ValueError, counted ``nonfinite``) unless the server allows non-finite rewards
(``--allow_nonfinite``); a local buffer stores NaN rewards, as Dopamine's does.

A server restarted on the same endpoint is reached again: a call that gets no answer is resent
(the same request, run once) until it has waited ``(1 + retries) * timeout`` seconds (120 s by
default), then raises TimeoutError. Nothing is cached from the server but its constructor
arguments (``add_count`` and the rest are read on each use), so after a restart from a
checkpoint the proxy sees the restored buffer (restart it with the same settings).

Prefetching (``prefetch_depth=N``, gin ``MemoireRemoteOutOfGraphReplayBuffer.prefetch_depth``):
a background thread with its own connection keeps up to N default-size
``sample_transition_batch`` requests ahead of the learner
(:mod:`memoire.dopamine_compat._remote_prefetch`), so a batch's network round trip overlaps
the learner's step. Batches and priorities are at most N batches stale, as with the local
feed (docs/FEED.md); explicit indices or another batch size are synchronous calls.

``python -m memoire.dopamine_compat.remote --serve KIND ...`` is ``memoire serve --buffer KIND
...`` (kept for scripts and configs written before).

Thread safety: a proxy is used by one thread at a time (its RPC channel serialises calls);
the hosted buffer serves calls one at a time.
"""

from __future__ import annotations

import math
import sys
import weakref
from typing import Any, Optional

import numpy as np

from memoire.dopamine_compat import circular_replay_buffer as _crb
from memoire.dopamine_compat import prioritized_replay_buffer as _prb
from memoire.remote import RemoteObject
from memoire.transport import DEFAULT_TIMEOUT, CurveKeys

# A proxy's call resends the same request (run once: the server keeps its last reply to each
# caller) until it has waited (1 + retries) * timeout seconds: 2 minutes by default, so a
# learner rides out its buffer server's restart from a checkpoint (docs: README, "what a
# crash can lose").
DEFAULT_RETRIES = 23

# Dopamine's buffer keeps these constructor arguments as attributes ``_<name>``, which code
# written against it reads; a proxy has them too, from the served buffer's arguments.
_DOPAMINE_ATTRIBUTES = (
    "observation_shape",
    "stack_size",
    "replay_capacity",
    "batch_size",
    "update_horizon",
    "gamma",
    "observation_dtype",
    "terminal_dtype",
    "action_shape",
    "action_dtype",
    "reward_shape",
    "reward_dtype",
    "extra_storage_types",
)


def _arguments(description: dict) -> dict:
    """A served buffer's constructor arguments (``OutOfGraphReplayBuffer.arguments()``) from the
    codec values of its ``describe``."""
    args = {k: v for k, v in description.items() if k != "prioritized"}
    for key in ("observation_dtype", "terminal_dtype", "action_dtype", "reward_dtype"):
        args[key] = np.dtype(args[key])
    for key in ("observation_shape", "action_shape", "reward_shape"):
        args[key] = tuple(args[key])
    args["extra_storage_types"] = [
        _crb.ReplayElement(n, tuple(s), np.dtype(t)) for n, s, t in args["extra_storage_types"]
    ]
    return args


class _SumTreeProxy:
    """``buffer.sum_tree.max_recorded_priority``, as agents read it."""

    def __init__(self, owner):
        self._owner = owner

    @property
    def max_recorded_priority(self) -> float:
        self._owner.flush()
        return self._owner._remote.call("max_recorded_priority")


class _BufferRemote(RemoteObject):
    """The proxies' channel: a :class:`RemoteObject` whose TimeoutError says what it means."""

    def __init__(self, endpoint: str, name: str, *, timeout: float, retries: int, **kwargs):
        super().__init__(endpoint, name, timeout=timeout, retries=retries, **kwargs)
        self.endpoint = endpoint
        self.window = (1 + int(retries)) * float(timeout)

    def call(self, method: str, *args, **kwargs) -> Any:
        try:
            return super().call(method, *args, **kwargs)
        except TimeoutError as e:
            raise TimeoutError(
                f"{self.name}.{method}: the buffer server at {self.endpoint} did not answer for "
                f"{self.window:g} s ({e}); it is down, or is taking longer than that to "
                "restart (a proxy waits (1 + retries) * timeout seconds)"
            ) from None


class _RemoteBuffer:
    """What both proxies share: the connection to the hosted buffer, its description, adds kept
    pending until an episode ends or `flush_rows` accumulate, default-size samples requested
    ahead (``prefetch_depth``), and closing."""

    def __init__(
        self,
        endpoint: str,
        name: str,
        flush_rows: int,
        keys: Optional[CurveKeys],
        timeout: float,
        retries: int,
        prefetch_depth: int = 0,
    ):
        if int(flush_rows) < 1:
            raise ValueError(f"flush_rows: expected >= 1, got {flush_rows}")
        _crb._check_prefetch(prefetch_depth, 1)  # pylint: disable=protected-access
        self._remote = _BufferRemote(endpoint, name, keys=keys, timeout=timeout, retries=retries)
        self._description = self._remote.call("describe")
        self._prioritized = bool(self._description["prioritized"])
        self._pending: list = []
        self._flush_rows = int(flush_rows)
        self._prefetch_depth = int(prefetch_depth)
        self._connect = lambda: RemoteObject(
            endpoint, name, keys=keys, timeout=timeout, retries=retries
        )
        self._prefetcher = None

    def _prefetched(self, fetch):
        """The next batch requested ahead by ``fetch(connection)`` (started on first use)."""
        if self._prefetcher is None:
            from memoire.dopamine_compat._remote_prefetch import RemotePrefetcher

            self._prefetcher = RemotePrefetcher(self._connect, fetch, self._prefetch_depth)
            weakref.finalize(self, self._prefetcher.close)
        return self._prefetcher.take()

    def stop_prefetch(self) -> None:
        """Stops the prefetching thread and drops the batches it requested (a no-op without
        one); the next default-size sample starts it again. ``load`` and ``close`` call it."""
        prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None:
            prefetcher.close()

    def flush(self) -> None:
        raise NotImplementedError

    def checkpoint(self) -> str:
        """Sends pending adds, then has the server write a checkpoint into its own checkpoint
        folder (``memoire serve --buffer KIND --checkpoint_dir D``); returns its name.

        Raises:
          RuntimeError: the server has no checkpoint folder. OSError: the write failed.
        """
        self.flush()
        return self._remote.call("checkpoint")

    def stored_priorities(self) -> Optional[np.ndarray]:
        """Sends pending adds, then returns the served buffer's ``stored_priorities()`` (one
        ``priorities`` call): float64, one per stored transition, or None for a uniform
        buffer. What a tracker shows for a remote run."""
        self.flush()
        return self._remote.call("priorities")

    def close(self) -> None:
        """Stops prefetching, sends pending adds, then closes the connection."""
        self.stop_prefetch()
        try:
            self.flush()
        finally:
            self._remote.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteOutOfGraphReplayBuffer(_RemoteBuffer):
    """A Dopamine ``OutOfGraphReplayBuffer`` (or prioritized one, as the server's is) whose data
    lives on a memoire server (see the module docstring).

    Args:
      endpoint: the server's REP endpoint.
      name: the name the buffer was hosted under
        (:func:`memoire.dopamine_compat.buffer_server.serve_buffer`).
      flush_rows: pending adds that trigger a bulk send (episode ends always do).
      keys, timeout, retries: as :class:`memoire.remote.RemoteObject`; a call waits at most
        ``(1 + retries) * timeout`` seconds (2 minutes by default) for a server that does not
        answer, e.g. one restarting from its checkpoint, then raises TimeoutError.
      prefetch_depth: int >= 0; N > 0 keeps N default-size sample requests in flight (see the
        module docstring). 0 (default): every sample is one synchronous call.

    Raises:
      TimeoutError: the server did not answer. KeyError: no buffer hosted under `name`.
      ValueError: a bad flush_rows or prefetch_depth.
    """

    def __init__(
        self,
        endpoint: str,
        name: str = "replay",
        *,
        flush_rows: int = 256,
        keys: Optional[CurveKeys] = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        prefetch_depth: int = 0,
    ):
        super().__init__(endpoint, name, flush_rows, keys, timeout, retries, prefetch_depth)
        cls = (
            _prb.OutOfGraphPrioritizedReplayBuffer
            if self._prioritized
            else _crb.OutOfGraphReplayBuffer
        )
        args = _arguments(self._description)
        self._arguments = args
        # A minimal local twin (capacity stack + horizon): its add() is the local class's own
        # argument check, so a bad add raises here exactly as it would locally, and its
        # signatures are the local class's.
        self._twin = cls(**dict(args, replay_capacity=args["update_horizon"] + args["stack_size"]))
        self._storage = self._twin.get_storage_signature()
        self.sum_tree = _SumTreeProxy(self)
        for key in _DOPAMINE_ATTRIBUTES:
            setattr(self, "_" + key, args[key])
        self._state_shape = args["observation_shape"] + (args["stack_size"],)
        self._cumulative_discount_vector = np.array(
            [math.pow(args["gamma"], n) for n in range(args["update_horizon"])], dtype=np.float32
        )

    def arguments(self) -> dict:
        """The served buffer's constructor arguments, as the local class's ``arguments()``."""
        return dict(self._arguments)

    # ---- signatures (local) ----
    def get_add_args_signature(self):
        return self._twin.get_add_args_signature()

    def get_storage_signature(self):
        return self._twin.get_storage_signature()

    def get_transition_elements(self, batch_size=None):
        return self._twin.get_transition_elements(batch_size)

    # ---- adding (buffered) ----
    def add(self, observation, action, reward, terminal, *args, priority=None, episode_end=False):
        """Checks the row as the local class does (same exceptions), then buffers it; see the
        module docstring for when it is sent."""
        if self._prioritized:
            self._twin.add(
                observation,
                action,
                reward,
                terminal,
                *args,
                priority=priority,
                episode_end=episode_end,
            )
        else:
            self._twin.add(observation, action, reward, terminal, *args, episode_end=episode_end)
        values = (observation, action, reward, terminal) + tuple(args)
        if (
            self._prioritized
            and priority is None
            and len(values) == len(self._twin.get_add_args_signature())
        ):
            priority = values[-1]  # passed positionally, as Dopamine's TF Rainbow agent does
        row = [
            np.asarray(v, dtype=_crb._np_dtype(e.type)).reshape(e.shape)
            for v, e in zip(values, self._storage)
        ]
        end = bool(terminal) or bool(episode_end)
        self._pending.append((row, end, priority))
        if end or len(self._pending) >= self._flush_rows:
            self.flush()

    def add_batch(
        self, observations, actions, rewards, terminals, *args, priorities=None, episode_ends=None
    ):
        """memoire's bulk add, sent at once (after pending adds)."""
        self.flush()
        terminals = np.asarray(terminals)
        ends = terminals != 0
        if episode_ends is not None:
            ends = ends | (np.asarray(episode_ends) != 0)
        self._send([observations, actions, rewards, terminals] + list(args), ends, priorities)

    def flush(self) -> None:
        """Sends the pending adds (one bulk call)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        columns = [np.stack([r[0][k] for r in pending]) for k in range(len(self._storage))]
        ends = np.array([r[1] for r in pending], np.uint8)
        priorities = np.array([r[2] for r in pending], np.float64) if self._prioritized else None
        self._send(columns, ends, priorities)

    def _send(self, columns, ends, priorities) -> None:
        cols = [
            np.ascontiguousarray(np.asarray(c, dtype=_crb._np_dtype(e.type)))
            for c, e in zip(columns, self._storage)
        ]
        self._remote.call(
            "add_batch",
            cols,
            np.asarray(ends, np.uint8),
            None if priorities is None else np.asarray(priorities, np.float64),
        )

    # ---- state ----
    def _state(self) -> dict:
        self.flush()
        return self._remote.call("state")

    @property
    def add_count(self):
        return np.array(self._state()["add_count"])

    @property
    def episode_end_indices(self):
        return set(int(i) for i in self._state()["episode_end_indices"])

    @property
    def invalid_range(self):
        count = int(self._state()["add_count"])
        if count == 0:
            return np.zeros((self._stack_size))
        return _crb.invalid_range(
            count % self._replay_capacity,
            self._replay_capacity,
            self._stack_size,
            self._update_horizon,
        )

    def is_empty(self):
        return np.bool_(self._state()["add_count"] == 0)

    def is_full(self):
        return np.bool_(self._state()["add_count"] >= self._replay_capacity)

    def cursor(self):
        return np.int64(self._state()["add_count"] % self._replay_capacity)

    def is_valid_transition(self, index):
        if index < 0 or index >= self._replay_capacity:
            return False
        return bool(self.is_valid_transitions([index])[0])

    def is_valid_transitions(self, indices):
        self.flush()
        return self._remote.call("is_valid_transitions", np.asarray(indices, np.int64))

    # ---- sampling and priorities ----
    def sample_index_batch(self, batch_size):
        self.flush()
        return self._remote.call("sample_index_batch", int(batch_size)).tolist()

    def sample_transition_batch(self, batch_size=None, indices=None):
        """As the local class: a tuple of arrays described by get_transition_elements(). With
        ``prefetch_depth``, a default-size draw is the next batch requested ahead."""
        self.flush()
        if indices is None and self._prefetch_depth and batch_size in (None, self._batch_size):
            return self._prefetched(
                lambda remote: remote.call("sample_transition_batch", None, None)
            )
        if indices is not None:
            indices = np.asarray(indices)
            if indices.dtype == object:
                raise TypeError("indices: expected integers")
        return self._remote.call("sample_transition_batch", batch_size, indices)

    def set_priority(self, indices, priorities):
        self.flush()
        self._remote.call("set_priority", np.asarray(indices), np.asarray(priorities))

    def get_priority(self, indices):
        self.flush()
        return self._remote.call("get_priority", np.asarray(indices))

    # ---- checkpoints (server side) ----
    def save(self, checkpoint_dir, iteration_number):
        self.flush()
        self._remote.call("save", str(checkpoint_dir), int(iteration_number))

    def load(self, checkpoint_dir, suffix):
        """Restores the server's buffer from the server's `checkpoint_dir`.

        Raises:
          tensorflow.errors.NotFoundError (FileNotFoundError without TensorFlow loaded): no such
            checkpoint on the server, as the local class raises (agents catch it).
        """
        self._pending = []
        self.stop_prefetch()  # requested batches come from the contents before the load
        try:
            self._remote.call("load", str(checkpoint_dir), int(suffix))
        except FileNotFoundError as e:
            tf = sys.modules.get("tensorflow")
            if tf is None:
                raise
            raise tf.errors.NotFoundError(None, None, str(e)) from None


class RemoteReplayBuffer(_RemoteBuffer):
    """Dopamine's JAX ``ReplayBuffer`` on a memoire server: ``add(TransitionElement,
    priority=...)`` buffered (sent per episode or per ``flush_rows``), ``sample``, ``update``,
    ``add_count``, ``len``, ``max_recorded_priority``. Batches come back as Dopamine's
    ``ReplayElement`` of numpy arrays (and ``SampleMetadata`` with ``with_sample_metadata``).

    ``prefetch_depth`` (int >= 0, default 0: every sample is one synchronous call) > 0 keeps
    that many default-size ``sample`` requests in flight on a connection of their own, as the
    TF-face proxy does (see the module docstring): at most that many batches predate an
    ``update`` or an add. The JAX agents set it from ``MemoireJaxDQNAgent.prefetch_depth`` (and
    the other agents') when they use a server (``replay_endpoint``).
    """

    def __init__(
        self,
        endpoint: str,
        name: str = "replay",
        *,
        flush_rows: int = 256,
        keys: Optional[CurveKeys] = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        prefetch_depth: int = 0,
    ):
        super().__init__(endpoint, name, flush_rows, keys, timeout, retries, prefetch_depth)
        self._batch_size = self._description["batch_size"]
        self._sampling_distribution = _remote_distribution(self)

    def add(self, transition, **kwargs: Any) -> None:
        if self._prioritized:
            if "priority" not in kwargs:
                raise TypeError("add() of a prioritized buffer needs the keyword 'priority'")
            p = kwargs["priority"]
            if p is not None and not float(p) >= 0:
                raise ValueError(f"priority: expected a value >= 0, got {p}")
        end = bool(transition.is_terminal) or bool(transition.episode_end)
        self._pending.append(
            (
                np.asarray(transition.observation),
                np.asarray(transition.action),
                float(transition.reward),
                bool(transition.is_terminal),
                bool(transition.episode_end),
                kwargs.get("priority"),
            )
        )
        if end or len(self._pending) >= self._flush_rows:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        cols = list(zip(*pending))
        priorities = None
        if self._prioritized:
            priorities = np.array([np.nan if p is None else p for p in cols[5]], np.float64)
        self._remote.call(
            "add_many",
            np.stack(cols[0]),
            np.stack(cols[1]),
            np.asarray(cols[2], np.float64),
            np.asarray(cols[3], np.bool_),
            np.asarray(cols[4], np.bool_),
            priorities,
        )

    @property
    def add_count(self) -> int:
        self.flush()
        return self._remote.call("state")["add_count"]

    def __len__(self) -> int:
        self.flush()
        return self._remote.call("state")["len"]

    @property
    def max_recorded_priority(self):
        self.flush()
        return self._remote.call("max_recorded_priority")

    def sample(self, size: Optional[int] = None, *, with_sample_metadata: bool = False):
        from dopamine.jax.replay_memory import elements, samplers

        self.flush()
        if self._prefetch_depth and size in (None, self._batch_size):
            out = self._prefetched(lambda remote: remote.call("sample", None, True))
            if not with_sample_metadata:
                out = out[0]
        else:
            out = self._remote.call("sample", size, bool(with_sample_metadata))
        if with_sample_metadata:
            batch, meta = out
            cls = (
                samplers.PrioritizedSampleMetadata
                if "probabilities" in meta
                else samplers.SampleMetadata
            )
            return elements.ReplayElement(**batch), cls(**meta)
        return elements.ReplayElement(**out)

    def update(self, keys, **kwargs: Any) -> None:
        self.flush()
        p = kwargs.get("priorities")
        self._remote.call("update", np.asarray(keys), None if p is None else np.asarray(p))

    def save(self, checkpoint_dir, iteration_number) -> None:
        """Checkpoints the server's buffer into the server's `checkpoint_dir` (Dopamine's layout)."""
        self.flush()
        self._remote.call("save", str(checkpoint_dir), int(iteration_number))

    def load(self, checkpoint_dir, iteration_number) -> None:
        """Restores the server's buffer from the server's `checkpoint_dir`; pending adds are
        dropped (as a local load replaces the contents).

        Raises:
          FileNotFoundError: no such checkpoint on the server (agents catch it).
        """
        self._pending = []
        self.stop_prefetch()  # requested batches come from the contents before the load
        self._remote.call("load", str(checkpoint_dir), int(iteration_number))


class _RemoteMaxPriority:
    """``_sampling_distribution._sum_tree.max_recorded_priority``, read from the server."""

    def __init__(self, owner: "RemoteReplayBuffer"):
        self._owner = owner

    @property
    def max_recorded_priority(self) -> float:
        return self._owner.max_recorded_priority


def _remote_distribution(owner: "RemoteReplayBuffer"):
    """What Dopamine's JAX agents inspect at ``buffer._sampling_distribution``: an instance of
    Dopamine's ``PrioritizedSamplingDistribution`` (their isinstance check) whose ``_sum_tree``
    reads the server's maximum, or a plain object for a uniform buffer. It samples nothing."""
    if not owner._prioritized:
        return _UniformView()
    from dopamine.jax.replay_memory import samplers

    class _PrioritizedView(samplers.PrioritizedSamplingDistribution):
        def __init__(self):  # pylint: disable=super-init-not-called
            self._sum_tree = _RemoteMaxPriority(owner)

    return _PrioritizedView()


class _UniformView:
    """A uniform remote buffer's ``_sampling_distribution`` (agents only test its type)."""


# ---- gin ---------------------------------------------------------------------------------
# Registered by memoire.dopamine_compat.gin_registry as MemoireRemoteOutOfGraphReplayBuffer:
#   WrappedReplayBuffer.wrapped_memory = @MemoireRemoteOutOfGraphReplayBuffer()
#   MemoireRemoteOutOfGraphReplayBuffer.endpoint = 'tcp://127.0.0.1:PORT'
# The class itself is the factory: gin calls it with the bound endpoint and name. This module
# imports neither gin_registry nor the serving side, so neither imports it back.

if __name__ == "__main__":  # the buffer server's old entry: memoire serve --buffer KIND ...
    # The CLI (memoire.cli, below this layer) runs the command, found by name as for `memoire
    # serve`: this file names no upper layer.
    from memoire import cli

    args = ["--buffer" if a == "--serve" else a for a in sys.argv[1:]]
    sys.exit(cli.main(["serve", *args]))
