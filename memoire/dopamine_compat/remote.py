"""Dopamine-compatible buffers on a memoire server (central mode), over the typed RPC.

A buffer runs embedded by default (the classes of :mod:`circular_replay_buffer`,
:mod:`prioritized_replay_buffer`, :mod:`jax_replay_buffer`). To share one between a learner
and actor processes, host it on a :class:`memoire.ReplayMemoryServer` and reach it by endpoint::

    # learner process
    server = ReplayMemoryServer(...); endpoints = server.start()
    buffer = OutOfGraphPrioritizedReplayBuffer((84, 84), 4, 1_000_000, 32)
    serve_buffer(server, buffer, name="replay")
    # actor processes (add) and the learner (sample, set_priority) alike
    replay = RemoteOutOfGraphReplayBuffer(endpoints["rep"], "replay")

The proxy looks like the local class to an agent: the same methods, attributes, return types,
dtypes and shapes, and the same exception types for bad calls (raised by the proxy's own copy
of the class's checks at ``add`` time, or by the server). ``add`` is buffered: rows are checked
at once, then sent in bulk (``add_batch``) when an episode ends, when ``flush_rows`` rows are
pending, and before any call that reads the buffer, so one process always sees its own adds.
Each bulk add is atomic on the server; episodes from several actors interleave only when an
episode outgrows ``flush_rows`` (Dopamine's buffer is one stream: use whole episodes).

``save``/``load`` run on the server, confined to the checkpoint root it was given
(``--checkpoint_root``, default: the folder it was started in): the caller names a checkpoint
folder under that root (a relative name, or an absolute path that lies inside the root). A
name that leaves the root, crosses a symlink, or a folder holding anything but regular files
and folders (a FIFO, a device) is refused before any file is opened (:func:`checkpoint_dir`);
the buffer's load then opens each file without blocking or following a symlink and refuses
anything but a regular file (:func:`memoire.dopamine_compat.checkpoint.open_regular`), so a
file swapped in after the check cannot block the server either.
Batch sizes are bounded by the server's ``max_batch`` (docs/LIMITS.md). NaN or infinite
rewards and priorities that peers send are refused (ValueError, counted ``nonfinite``) unless
the server allows non-finite rewards (``--allow_nonfinite``); a local buffer stores NaN
rewards, as Dopamine's does.

Thread safety: a proxy is used by one thread at a time (its RPC channel serialises calls);
the hosted buffer serves calls one at a time.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import signal
import stat
import sys
import threading
from typing import Any, Callable, Optional

import numpy as np

from memoire import cli
from memoire.remote import RemoteObject
from memoire.transport import DEFAULT_RETRIES, DEFAULT_TIMEOUT, CurveKeys

from memoire.dopamine_compat import circular_replay_buffer as _crb
from memoire.dopamine_compat import prioritized_replay_buffer as _prb

_CIRCULAR_METHODS = ("describe", "add_batch", "sample_transition_batch", "sample_index_batch",
                     "state", "is_valid_transitions", "set_priority", "get_priority",
                     "max_recorded_priority", "save", "load")


def _dtype_name(t) -> str:
  return _crb._np_dtype(t).name


MAX_CHECKPOINT_ENTRIES = 100_000  # files and folders a checkpoint folder may hold (checked)


def checkpoint_dir(root: Optional[str], name) -> str:
  """The folder a remote ``save``/``load`` of checkpoint `name` uses under `root`.

  `name` is a relative folder name (``"run1"``, ``"run1/checkpoints"``) or an absolute path
  that lies inside `root`. Checked without opening a file: every existing component is
  ``lstat``-ed (no symlinks; folders only), and the folder's existing tree may hold only
  regular files and folders (no FIFO, device or socket, whose open would block or worse),
  at most :data:`MAX_CHECKPOINT_ENTRIES` entries.

  Raises:
    PermissionError: no `root` (remote checkpoints are off), or `name` leaves it.
    ValueError: `name` is no non-empty str, crosses a symlink or a non-folder, or the folder
      holds a special file.
  """
  if root is None:
    raise PermissionError("remote save/load: this buffer server has no checkpoint root; "
                          "start it with --checkpoint_root DIR (serve_buffer(..., "
                          "checkpoint_root=DIR))")
  if not isinstance(name, str) or not name or "\0" in name or len(name) > 4096:
    raise ValueError(f"checkpoint: expected a folder name under the server's checkpoint root, "
                     f"got {name!r}")
  target = os.path.normpath(os.path.join(root, name))
  if not _inside(target, root) and os.path.isabs(name):
    target = os.path.realpath(name)  # a caller's spelling of the root through a symlink
  if not _inside(target, root):
    raise PermissionError(f"checkpoint {name!r}: outside the server's checkpoint root {root}; "
                          "name a folder under it")
  rel = os.path.relpath(target, root)
  path = root
  for part in ([] if rel == os.curdir else rel.split(os.sep)):
    path = os.path.join(path, part)
    try:
      st = os.lstat(path)
    except FileNotFoundError:
      break  # the rest does not exist yet (save creates it)
    if not stat.S_ISDIR(st.st_mode):
      raise ValueError(f"checkpoint {name!r}: {path} is not a folder (a symlink or a file)")
  else:
    _check_tree(name, target)
  return target


def _inside(path: str, root: str) -> bool:
  return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _check_tree(name: str, top: str) -> None:
  """Refuses a checkpoint folder holding anything but regular files and folders."""
  seen = 0
  stack = [top]
  while stack:
    folder = stack.pop()
    with os.scandir(folder) as entries:
      for e in entries:
        seen += 1
        if seen > MAX_CHECKPOINT_ENTRIES:
          raise ValueError(f"checkpoint {name!r}: more than {MAX_CHECKPOINT_ENTRIES} entries")
        mode = e.stat(follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
          stack.append(e.path)
        elif not stat.S_ISREG(mode):
          raise ValueError(f"checkpoint {name!r}: {e.path} is not a regular file (a FIFO, "
                           "device, socket or symlink); refused")


def _no_limit(batch_size, what: str = "batch_size") -> int:
  return int(batch_size)


def _no_check(what: str, **arrays) -> None:
  del what, arrays  # in-process use: values are the caller's own (Dopamine stores them)


class _CircularService:
  """The hosted face of an OutOfGraph(Prioritized)ReplayBuffer: codec-friendly arguments and
  results only."""

  def __init__(self, buffer: _crb.OutOfGraphReplayBuffer, checkpoint_root: Optional[str] = None,
               check_batch: Callable = _no_limit, check_finite: Callable = _no_check,
               allow_nonfinite: bool = True):
    self._b = buffer
    self._root = checkpoint_root
    self._check_batch = check_batch
    self._check_finite = check_finite  # priorities: always (sampling by priority needs finite ones)
    self._check_rewards = _no_check if allow_nonfinite else check_finite
    names = [e.name for e in buffer.get_storage_signature()]
    self._reward_column = names.index("reward")

  def describe(self) -> dict:
    b = self._b
    return {
        "prioritized": isinstance(b, _prb.OutOfGraphPrioritizedReplayBuffer),
        "observation_shape": tuple(b._observation_shape), "stack_size": b._stack_size,
        "replay_capacity": b._replay_capacity, "batch_size": b._batch_size,
        "update_horizon": b._update_horizon, "gamma": float(b._gamma),
        "max_sample_attempts": b._max_sample_attempts,
        "extra_storage_types": [(e.name, tuple(int(d) for d in e.shape), _dtype_name(e.type))
                                for e in b._extra_storage_types],
        "observation_dtype": _dtype_name(b._observation_dtype),
        "terminal_dtype": _dtype_name(b._terminal_dtype),
        "action_shape": tuple(b._action_shape), "action_dtype": _dtype_name(b._action_dtype),
        "reward_shape": tuple(b._reward_shape), "reward_dtype": _dtype_name(b._reward_dtype),
        "episode_end_breaks_stacks": b._episode_end_breaks_stacks,
    }

  def add_batch(self, columns, ends, priorities):
    b = self._b
    columns = list(columns)
    if len(columns) > self._reward_column:  # else the core names what is missing
      self._check_rewards("add_batch", rewards=columns[self._reward_column])
    self._check_finite("add_batch", priorities=priorities)
    b._core.add_batch(columns, np.ascontiguousarray(ends, dtype=np.uint8), priorities)

  def sample_transition_batch(self, batch_size, indices):
    if batch_size is not None:
      self._check_batch(batch_size, "sample_transition_batch")
    if indices is not None:
      self._check_batch(np.size(indices), "sample_transition_batch")
    return tuple(self._b.sample_transition_batch(batch_size, indices))

  def sample_index_batch(self, batch_size):
    self._check_batch(batch_size, "sample_index_batch")
    return np.asarray(self._b.sample_index_batch(batch_size), np.int64)

  def state(self) -> dict:
    b = self._b
    return {"add_count": int(b._core.add_count),
            "episode_end_indices": np.asarray(sorted(b.episode_end_indices), np.int64),
            "next_is_episode_start": bool(b._next_experience_is_episode_start)}

  def is_valid_transitions(self, indices):
    return self._b.is_valid_transitions(indices)

  def set_priority(self, indices, priorities):
    self._check_finite("set_priority", priorities=priorities)
    self._b.set_priority(indices, priorities)

  def get_priority(self, indices):
    return self._b.get_priority(indices)

  def max_recorded_priority(self) -> float:
    return float(self._b.sum_tree.max_recorded_priority)

  def save(self, checkpoint_dir, iteration_number):
    self._b.save(_checkpoint_dir(self._root, checkpoint_dir, True), iteration_number)

  def load(self, checkpoint_dir, suffix):
    try:
      self._b.load(_checkpoint_dir(self._root, checkpoint_dir, False), suffix)
    except Exception as e:  # tf.errors.NotFoundError has no wire mapping: send its meaning
      if type(e).__name__ == "NotFoundError":
        raise FileNotFoundError(str(e)) from None
      raise


class _JaxService:
  """The hosted face of a JAX ``ReplayBuffer``."""

  def __init__(self, buffer, checkpoint_root: Optional[str] = None,
               check_batch: Callable = _no_limit, check_finite: Callable = _no_check,
               allow_nonfinite: bool = True):
    self._b = buffer
    self._root = checkpoint_root
    self._check_batch = check_batch
    self._check_finite = check_finite  # priorities: always (sampling by priority needs finite ones)
    self._check_rewards = _no_check if allow_nonfinite else check_finite

  def describe(self) -> dict:
    return {"batch_size": int(self._b._batch_size), "prioritized": bool(self._b._prioritized)}

  def add_many(self, observations, actions, rewards, terminals, episode_ends, priorities):
    from dopamine.jax.replay_memory import elements

    self._check_rewards("add_many", rewards=rewards)
    b = self._b
    bulk = getattr(b, "add_batch", None)
    if priorities is not None:
      # A proxy sends NaN for priority=None, which the buffer's add counts as 0 (its bulk add
      # refuses NaN): only infinities are non-finite here.
      zeroed = np.asarray(priorities, np.float64)
      zeroed = np.where(np.isnan(zeroed), 0.0, zeroed)
      self._check_finite("add_many", priorities=zeroed)
      if bulk is not None:
        priorities = zeroed
    if bulk is not None:
      kwargs = {} if priorities is None else {"priorities": priorities}
      bulk(observations, actions, rewards, terminals, episode_ends, **kwargs)
      return
    # Until the JAX buffer has a bulk add: one bound add per step (the accumulator's state
    # machine runs in C++ each time).
    for k in range(len(rewards)):
      kwargs = {}
      if priorities is not None:  # NaN stands for None (the buffer's default priority)
        kwargs["priority"] = None if np.isnan(priorities[k]) else float(priorities[k])
      b.add(elements.TransitionElement(observations[k], actions[k], float(rewards[k]),
                                       bool(terminals[k]), bool(episode_ends[k])), **kwargs)

  def sample(self, size, with_sample_metadata):
    if size is not None:
      self._check_batch(size, "sample")
    out = self._b.sample(size, with_sample_metadata=with_sample_metadata)
    batch, meta = out if with_sample_metadata else (out, None)
    fields = {f.name: np.asarray(getattr(batch, f.name)) for f in dataclasses.fields(batch)}
    if meta is None:
      return fields
    return fields, {f.name: np.asarray(getattr(meta, f.name)) for f in dataclasses.fields(meta)}

  def update(self, keys, priorities):
    self._check_finite("update", priorities=priorities)
    kwargs = {} if priorities is None else {"priorities": priorities}
    self._b.update(keys, **kwargs)

  def state(self) -> dict:
    return {"add_count": int(self._b.add_count), "len": len(self._b)}

  def max_recorded_priority(self) -> float:
    return float(self._b.max_recorded_priority)

  def save(self, checkpoint_dir, iteration_number):
    self._b.save(_checkpoint_dir(self._root, checkpoint_dir, True), iteration_number)

  def load(self, checkpoint_dir, iteration_number):
    self._b.load(_checkpoint_dir(self._root, checkpoint_dir, False), iteration_number)


def _checkpoint_dir(root, name, create: bool) -> str:
  """:func:`checkpoint_dir`, the folder made for a save (a missing one fails a load as the
  buffer's own load does)."""
  path = checkpoint_dir(root, name)
  if create:
    os.makedirs(path, exist_ok=True)
    checkpoint_dir(root, name)  # what makedirs made is checked like the rest
  return path


def serve_buffer(server, buffer, name: str = "replay", *,
                 checkpoint_root: Optional[str] = None,
                 allow_nonfinite: Optional[bool] = None) -> None:
  """Hosts `buffer` (an OutOfGraph(Prioritized)ReplayBuffer or a JAX ReplayBuffer) on
  `server` under `name`, for the proxies of this module. Remote ``save``/``load`` are confined
  to `checkpoint_root` (an existing folder; None: refused, PermissionError), see
  :func:`checkpoint_dir`; sampled batches are bounded by ``server.max_batch``.

  Values from peers follow memoire's non-finite rule (docs/LIMITS.md): a NaN or infinite
  reward in ``add_batch``/``add_many`` raises ValueError in the caller, stores nothing and is
  counted in ``server.stats()["rejected"]["nonfinite"]``, unless `allow_nonfinite` (None: the
  server's own setting, ``server.rem.allow_nonfinite``); non-finite priorities (``add_batch``,
  ``set_priority``, ``add_many``, ``update``) are refused and counted whatever the setting.

  Raises:
    TypeError: `buffer` is none of those classes. ValueError: `checkpoint_root` is no folder.
  """
  if allow_nonfinite is None:
    allow_nonfinite = server.rem.allow_nonfinite
  checks = dict(check_batch=server.check_batch, check_finite=server.check_finite,
                allow_nonfinite=bool(allow_nonfinite))
  root = None
  if checkpoint_root is not None:
    root = os.path.realpath(str(checkpoint_root))
    if not os.path.isdir(root):
      raise ValueError(f"checkpoint_root: expected an existing folder, got {checkpoint_root!r}")
  if isinstance(buffer, _crb.OutOfGraphReplayBuffer):
    server.host(name, _CircularService(buffer, root, **checks),
                methods=_CIRCULAR_METHODS)
    return
  from memoire.dopamine_compat import jax_replay_buffer as _jrb

  if isinstance(buffer, _jrb.ReplayBuffer):
    server.host(name, _JaxService(buffer, root, **checks),
                methods=("describe", "add_many", "sample", "update", "state",
                         "max_recorded_priority", "save", "load"))
    return
  raise TypeError(f"serve_buffer: expected an OutOfGraphReplayBuffer, "
                  f"OutOfGraphPrioritizedReplayBuffer or jax ReplayBuffer, got "
                  f"{type(buffer).__name__}")


class _SumTreeProxy:
  """``buffer.sum_tree.max_recorded_priority``, as agents read it."""

  def __init__(self, owner):
    self._owner = owner

  @property
  def max_recorded_priority(self) -> float:
    self._owner.flush()
    return self._owner._remote.call("max_recorded_priority")


class _RemoteBuffer:
  """What both proxies share: the connection to the hosted buffer, its description, adds kept
  pending until an episode ends or `flush_rows` accumulate, and closing."""

  def __init__(self, endpoint: str, name: str, flush_rows: int, keys: Optional[CurveKeys],
               timeout: float, retries: int):
    if int(flush_rows) < 1:
      raise ValueError(f"flush_rows: expected >= 1, got {flush_rows}")
    self._remote = RemoteObject(endpoint, name, keys=keys, timeout=timeout, retries=retries)
    self._description = self._remote.call("describe")
    self._prioritized = bool(self._description["prioritized"])
    self._pending: list = []
    self._flush_rows = int(flush_rows)

  def flush(self) -> None:
    raise NotImplementedError

  def close(self) -> None:
    """Sends pending adds, then closes the connection."""
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
    name: the name the buffer was hosted under (:func:`serve_buffer`).
    flush_rows: pending adds that trigger a bulk send (episode ends always do).
    keys, timeout, retries: as :class:`memoire.remote.RemoteObject`.

  Raises:
    TimeoutError: the server did not answer. KeyError: no buffer hosted under `name`.
  """

  def __init__(self, endpoint: str, name: str = "replay", *, flush_rows: int = 256,
               keys: Optional[CurveKeys] = None, timeout: float = DEFAULT_TIMEOUT,
               retries: int = DEFAULT_RETRIES):
    super().__init__(endpoint, name, flush_rows, keys, timeout, retries)
    d = self._description
    cls = (_prb.OutOfGraphPrioritizedReplayBuffer if self._prioritized
           else _crb.OutOfGraphReplayBuffer)
    extras = [_crb.ReplayElement(n, tuple(s), np.dtype(t)) for n, s, t in d["extra_storage_types"]]
    kwargs = dict(
        extra_storage_types=extras, observation_dtype=np.dtype(d["observation_dtype"]),
        terminal_dtype=np.dtype(d["terminal_dtype"]), action_shape=tuple(d["action_shape"]),
        action_dtype=np.dtype(d["action_dtype"]), reward_shape=tuple(d["reward_shape"]),
        reward_dtype=np.dtype(d["reward_dtype"]), update_horizon=d["update_horizon"],
        gamma=d["gamma"], max_sample_attempts=d["max_sample_attempts"],
        episode_end_breaks_stacks=d["episode_end_breaks_stacks"])
    # A minimal local twin (capacity stack + horizon): its add() is the local class's own
    # argument check, so a bad add raises here exactly as it would locally, and its
    # signatures are the local class's.
    self._twin = cls(tuple(d["observation_shape"]), d["stack_size"],
                     d["update_horizon"] + d["stack_size"], d["batch_size"], **kwargs)
    self._storage = self._twin.get_storage_signature()
    self.sum_tree = _SumTreeProxy(self)
    for attr in ("_observation_shape", "_stack_size", "_batch_size", "_update_horizon",
                 "_gamma", "_observation_dtype", "_terminal_dtype", "_action_shape",
                 "_action_dtype", "_reward_shape", "_reward_dtype", "_extra_storage_types",
                 "_state_shape", "_cumulative_discount_vector"):
      setattr(self, attr, getattr(self._twin, attr))
    self._replay_capacity = int(d["replay_capacity"])

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
      self._twin.add(observation, action, reward, terminal, *args, priority=priority,
                     episode_end=episode_end)
    else:
      self._twin.add(observation, action, reward, terminal, *args, episode_end=episode_end)
    values = (observation, action, reward, terminal) + tuple(args)
    if (self._prioritized and priority is None
        and len(values) == len(self._twin.get_add_args_signature())):
      priority = values[-1]  # passed positionally, as Dopamine's TF Rainbow agent does
    row = [np.asarray(v, dtype=_crb._np_dtype(e.type)).reshape(e.shape)
           for v, e in zip(values, self._storage)]
    end = bool(terminal) or bool(episode_end)
    self._pending.append((row, end, priority))
    if end or len(self._pending) >= self._flush_rows:
      self.flush()

  def add_batch(self, observations, actions, rewards, terminals, *args, priorities=None,
                episode_ends=None):
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
    priorities = (np.array([r[2] for r in pending], np.float64) if self._prioritized else None)
    self._send(columns, ends, priorities)

  def _send(self, columns, ends, priorities) -> None:
    cols = [np.ascontiguousarray(np.asarray(c, dtype=_crb._np_dtype(e.type)))
            for c, e in zip(columns, self._storage)]
    self._remote.call("add_batch", cols, np.asarray(ends, np.uint8),
                      None if priorities is None else np.asarray(priorities, np.float64))

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
    return _crb.invalid_range(count % self._replay_capacity, self._replay_capacity,
                              self._stack_size, self._update_horizon)

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
    """As the local class: a tuple of arrays described by get_transition_elements()."""
    self.flush()
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
  """

  def __init__(self, endpoint: str, name: str = "replay", *, flush_rows: int = 256,
               keys: Optional[CurveKeys] = None, timeout: float = DEFAULT_TIMEOUT,
               retries: int = DEFAULT_RETRIES):
    super().__init__(endpoint, name, flush_rows, keys, timeout, retries)
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
    self._pending.append((np.asarray(transition.observation), np.asarray(transition.action),
                          float(transition.reward), bool(transition.is_terminal),
                          bool(transition.episode_end), kwargs.get("priority")))
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
    self._remote.call("add_many", np.stack(cols[0]), np.stack(cols[1]),
                      np.asarray(cols[2], np.float64), np.asarray(cols[3], np.bool_),
                      np.asarray(cols[4], np.bool_), priorities)

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
    out = self._remote.call("sample", size, bool(with_sample_metadata))
    if with_sample_metadata:
      batch, meta = out
      cls = samplers.PrioritizedSampleMetadata if "probabilities" in meta else samplers.SampleMetadata
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
# The class itself is the factory: gin calls it with the bound endpoint and name.

# ---- serving -----------------------------------------------------------------------------

BUFFER_KINDS = ("circular", "prioritized", "jax", "jax_prioritized")


def _small_server(seed: Optional[int], **server_kwargs):
  """A ReplayMemoryServer whose own (unused) memory is one tiny row: only its typed RPC
  hosts the Dopamine buffer. `server_kwargs`: keys, bind_host, limits (max_batch, ...)."""
  from memoire import ReplayMemoryServer

  t = [np.zeros([1], np.uint8), np.zeros([], np.int64), np.zeros([], np.float32),
       np.zeros([], np.float32), np.zeros([], np.float32), np.zeros([], np.float32),
       np.zeros([0], np.uint8)]
  return ReplayMemoryServer(*t, 2, None, seed=seed, **server_kwargs)


def build_buffer(kind: str, **kwargs):
  """Builds the buffer a server hosts, with the local class's constructor arguments.

  `circular` / `prioritized`: memoire's ``OutOfGraph(Prioritized)ReplayBuffer`` through its gin
  name (``MemoireOutOfGraph[Prioritized]ReplayBuffer``), so gin bindings of that name apply and
  `kwargs` override them. `jax` / `jax_prioritized`: memoire's JAX ``ReplayBuffer`` built as
  memoire's JAX agents build theirs: from Dopamine's ``ReplayBuffer`` (its gin bindings apply:
  ``ReplayBuffer.max_capacity``, ``.batch_size``, ``PrioritizedSamplingDistribution.*``), with
  `kwargs` ``stack_size`` (1), ``update_horizon`` (1), ``gamma`` (0.99), ``seed`` (None) for the
  accumulator and sampler, the rest passed to Dopamine's ``ReplayBuffer``.

  Raises:
    ValueError: an unknown `kind`. TypeError: arguments the class does not take.
    AttributeError: `circular` / `prioritized` without observation_shape, stack_size,
      replay_capacity or batch_size (naming those missing).
  """
  if kind in ("circular", "prioritized"):
    from memoire.dopamine_compat import gin_registry

    cls = (gin_registry.MemoireOutOfGraphReplayBuffer if kind == "circular"
           else gin_registry.MemoireOutOfGraphPrioritizedReplayBuffer)
    if "observation_shape" in kwargs:
      kwargs["observation_shape"] = tuple(kwargs["observation_shape"])
    buffer = cls(**kwargs)
    _crb.bind_memory(buffer, {})  # no wrapper will supply missing arguments: fail here
    return buffer
  if kind in ("jax", "jax_prioritized"):
    from dopamine.jax.replay_memory import accumulator, replay_buffer, samplers

    from memoire.dopamine_compat import jax_replay_buffer

    seed = kwargs.pop("seed", None)
    acc = accumulator.TransitionAccumulator(stack_size=int(kwargs.pop("stack_size", 1)),
                                            update_horizon=int(kwargs.pop("update_horizon", 1)),
                                            gamma=float(kwargs.pop("gamma", 0.99)))
    dist = (samplers.UniformSamplingDistribution(seed=seed) if kind == "jax"
            else samplers.PrioritizedSamplingDistribution(seed=seed))
    dopamine_buffer = replay_buffer.ReplayBuffer(transition_accumulator=acc,
                                                 sampling_distribution=dist, **kwargs)
    return jax_replay_buffer.ReplayBuffer.from_dopamine(dopamine_buffer)
  raise ValueError(f"kind: expected one of {BUFFER_KINDS}, got {kind!r}")


def start_buffer_server(kind: str, name: str = "replay", *, rep_endpoint: str = "tcp://127.0.0.1:*",
                        seed: Optional[int] = None, checkpoint_root: Optional[str] = None,
                        keys: Optional[CurveKeys] = None, server_kwargs: Optional[dict] = None,
                        allow_nonfinite: bool = False, **buffer_kwargs):
  """Builds a buffer (:func:`build_buffer`) and serves it under `name` on a new
  :class:`memoire.ReplayMemoryServer` bound to `rep_endpoint` (loopback, OS-chosen port by
  default), with CURVE `keys` (server side: :class:`memoire.transport.CurveKeys`) if given,
  remote checkpoints under `checkpoint_root` (None: refused) and `server_kwargs` (the server's
  limits: ``max_batch``, ``reply_cache_bytes``, ...). `allow_nonfinite`: store NaN/infinite
  rewards that peers send (default: refused, ValueError, counted ``nonfinite``; see
  :func:`serve_buffer`).

  Returns:
    (server, endpoint): the running server (``server.close()`` stops it) and the REP endpoint
    that :class:`RemoteOutOfGraphReplayBuffer` / :class:`RemoteReplayBuffer` take.

  Raises:
    ValueError, TypeError: as :func:`build_buffer`. TimeoutError: the server did not bind.
  """
  buffer = build_buffer(kind, **buffer_kwargs)
  server_kwargs = dict(server_kwargs or {})
  server_kwargs["allow_nonfinite"] = bool(allow_nonfinite or server_kwargs.get("allow_nonfinite"))
  server = _small_server(seed, keys=keys, **server_kwargs)
  try:
    endpoints = server.start(rep_endpoint=rep_endpoint)
    serve_buffer(server, buffer, name, checkpoint_root=checkpoint_root)
  except BaseException:
    server.close()
    raise
  return server, endpoints["rep"]


def _literal(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text  # a bare word is a string


def _server_default(name: str):
  import inspect

  from memoire.server import ReplayMemoryServer

  return inspect.signature(ReplayMemoryServer.__init__).parameters[name].default


@cli.entry_point("python -m memoire.dopamine_compat.remote")
def main(argv=None) -> int:
  """``python -m memoire.dopamine_compat.remote --serve KIND [--name N] [--gin_files F]
  [--gin_bindings B] [--arg KEY=VALUE] [--endpoint tcp://127.0.0.1:*]``

  Serves one Dopamine-compatible buffer until SIGTERM/SIGINT; prints ``ENDPOINT <rep>`` (one
  line, flushed) once it answers. KIND: circular, prioritized, jax, jax_prioritized. Buffer
  arguments come from the gin files (the same file an agent reads: the
  ``MemoireOutOfGraph[Prioritized]ReplayBuffer`` / ``ReplayBuffer`` bindings) and from ``--arg``
  (Python literals, e.g. ``--arg observation_shape=(4,1)``), the latter winning.
  """
  parser = cli.ArgumentParser(prog="python -m memoire.dopamine_compat.remote",
                              description=main.__doc__)
  parser.add_argument("--serve", required=True, choices=BUFFER_KINDS,
                      help="the kind of buffer to serve")
  parser.add_argument("--name", default="replay",
                      help="the name clients ask for (an agent's replay_name)")
  parser.add_argument("--endpoint", default="tcp://127.0.0.1:*",
                      help="REP endpoint to bind (port *: chosen by the OS; printed)")
  parser.add_argument("--gin_files", action="append", default=[],
                      help="gin file with the buffer's bindings, e.g. the agent's (repeatable)")
  parser.add_argument("--gin_bindings", action="append", default=[],
                      help="gin binding (repeatable)")
  parser.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                      help="a buffer argument as a Python literal, wins over gin "
                           "(repeatable), e.g. observation_shape=(4,1)")
  parser.add_argument("--seed", type=int, default=None,
                      help="seed of the server memory's sampling generator")
  parser.add_argument("--checkpoint_root", default=".", metavar="DIR",
                      help="folder that remote save/load are confined to: callers name a "
                           "checkpoint folder under it (default: the folder the server is "
                           "started in); 'none' refuses remote checkpoints")
  parser.add_argument("--curve_secret", default=None, metavar="FILE",
                      help="the server's CURVE keypair (a .key_secret file): encrypt and "
                           "authenticate the endpoint (see memoire.transport.CurveKeys)")
  parser.add_argument("--curve_authorized", default=None, metavar="DIR",
                      help="folder of the public keys of clients let in (with --curve_secret; "
                           "default: any client that knows the server's public key)")
  parser.add_argument("--max_batch", type=int, default=None, metavar="ROWS",
                      help="largest batch one remote sample call may ask for (default "
                           f"{_server_default('max_batch')}; docs/LIMITS.md)")
  parser.add_argument("--allow_nonfinite", nargs="?", const="1", default="0",
                      choices=("0", "1"), metavar="0|1",
                      help="1 (or the bare flag) stores NaN/inf rewards sent by peers; 0 "
                           "refuses them, counted as 'nonfinite' (default 0; non-finite "
                           "priorities are always refused; docs/LIMITS.md)")
  parser.add_argument("--reply_cache_bytes", type=int, default=None, metavar="BYTES",
                      help="bytes of replies kept to answer retried calls (default "
                           f"{_server_default('reply_cache_bytes')}; docs/LIMITS.md)")
  args = parser.parse_args(argv)
  kwargs = {}
  for item in args.arg:
    key, sep, value = item.partition("=")
    if not sep or not key:
      parser.error(f"--arg: expected KEY=VALUE, got {item!r}")
    kwargs[key.strip()] = _literal(value.strip())
  try:
    if args.gin_files or args.gin_bindings:
      import gin

      cli.check_files(args.gin_files, "--gin_files")
      # Gin files written for an agent bind its classes too: skip what the server never
      # calls.
      gin.parse_config_files_and_bindings(args.gin_files, args.gin_bindings,
                                          skip_unknown=True)
    if args.curve_authorized and not args.curve_secret:
      raise cli.UsageError("--curve_authorized needs --curve_secret")
    keys = (CurveKeys(args.curve_secret, authorized_dir=args.curve_authorized)
            if args.curve_secret else None)
    limits = {k: getattr(args, k) for k in ("max_batch", "reply_cache_bytes")
              if getattr(args, k) is not None}
    root = (None if args.checkpoint_root.lower() == "none"
            else os.path.abspath(args.checkpoint_root))
    server, endpoint = start_buffer_server(args.serve, args.name, rep_endpoint=args.endpoint,
                                           seed=args.seed, checkpoint_root=root, keys=keys,
                                           server_kwargs=limits,
                                           allow_nonfinite=args.allow_nonfinite == "1", **kwargs)
  except (OSError, ValueError, TypeError, SyntaxError, ImportError) as e:
    raise cli.UsageError(e) from None
  stop = threading.Event()
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.set())
  print(f"ENDPOINT {endpoint}", flush=True)
  try:
    while not stop.wait(0.5):
      pass
  finally:
    server.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
