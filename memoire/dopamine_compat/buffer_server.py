"""Serving Dopamine-compatible buffers to the proxies of :mod:`memoire.dopamine_compat.remote`.

:func:`serve_buffer` hosts a buffer (an ``OutOfGraph(Prioritized)ReplayBuffer`` or a JAX
``ReplayBuffer``) on a remote-call host: a standalone :class:`memoire.server.RpcServer`
(:func:`start_buffer_server`, ``memoire serve --buffer KIND``), which needs no replay memory,
or a :class:`memoire.ReplayMemoryServer` beside its own memory.

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
the server allows non-finite rewards (``--allow_nonfinite``).

A server started with a checkpoint folder (``start_buffer_server(checkpoint_dir=D,
checkpoint_every=S)``, ``memoire serve --buffer KIND --checkpoint_dir D --checkpoint_every S``)
loads the newest checkpoint there before it answers, writes one on request (the proxies'
``checkpoint()``), every S seconds and when ``memoire serve`` stops (SIGTERM, Ctrl-C), and keeps
the newest 3 (:class:`BufferCheckpoints`, on :mod:`memoire.server.checkpoints`).

Threads and ownership: the host owns the buffer it serves; a hosted buffer serves calls one at
a time (from the host's REP worker threads), and its checkpoints are written between calls.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import threading
from typing import Callable, Optional

import numpy as np

from memoire.checkpoint_io import temporary_name
from memoire.dopamine_compat import circular_replay_buffer as _crb
from memoire.dopamine_compat import prioritized_replay_buffer as _prb
from memoire.server.checkpoints import DEFAULT_KEEP, Checkpoints, check_period, fsync_tree
from memoire.transport import CurveKeys

_CIRCULAR_METHODS = (
    "describe",
    "add_batch",
    "sample_transition_batch",
    "sample_index_batch",
    "state",
    "is_valid_transitions",
    "set_priority",
    "get_priority",
    "max_recorded_priority",
    "priorities",
    "save",
    "load",
    "checkpoint",
)


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
        raise PermissionError(
            "remote save/load: this buffer server has no checkpoint root; "
            "start it with --checkpoint_root DIR (serve_buffer(..., "
            "checkpoint_root=DIR))"
        )
    if not isinstance(name, str) or not name or "\0" in name or len(name) > 4096:
        raise ValueError(
            f"checkpoint: expected a folder name under the server's checkpoint root, got {name!r}"
        )
    target = os.path.normpath(os.path.join(root, name))
    if not _inside(target, root) and os.path.isabs(name):
        target = os.path.realpath(name)  # a caller's spelling of the root through a symlink
    if not _inside(target, root):
        raise PermissionError(
            f"checkpoint {name!r}: outside the server's checkpoint root {root}; "
            "name a folder under it"
        )
    rel = os.path.relpath(target, root)
    path = root
    for part in [] if rel == os.curdir else rel.split(os.sep):
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
                    raise ValueError(
                        f"checkpoint {name!r}: more than {MAX_CHECKPOINT_ENTRIES} entries"
                    )
                mode = e.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    stack.append(e.path)
                elif not stat.S_ISREG(mode):
                    raise ValueError(
                        f"checkpoint {name!r}: {e.path} is not a regular file (a FIFO, "
                        "device, socket or symlink); refused"
                    )


def _no_limit(batch_size, what: str = "batch_size") -> int:
    return int(batch_size)


def _no_check(what: str, **arrays) -> None:
    del what, arrays  # in-process use: values are the caller's own (Dopamine stores them)


class _HostedBuffer:
    """What every hosted buffer face keeps: the buffer, the checkpoint root and the server's
    checks (batch sizes; finite priorities always, since sampling by priority needs them; finite
    rewards unless allow_nonfinite)."""

    def __init__(
        self,
        buffer,
        checkpoint_root: Optional[str] = None,
        check_batch: Callable = _no_limit,
        check_finite: Callable = _no_check,
        allow_nonfinite: bool = True,
        checkpoints: Optional["BufferCheckpoints"] = None,
    ):
        self._b = buffer
        self._root = checkpoint_root
        self._check_batch = check_batch
        self._check_finite = check_finite
        self._check_rewards = _no_check if allow_nonfinite else check_finite
        self._checkpoints = checkpoints

    def checkpoint(self) -> str:
        """Writes a checkpoint into the server's checkpoint folder now; returns its name.

        Raises:
          RuntimeError: the server has no checkpoint folder. OSError: the write failed.
        """
        if self._checkpoints is None:
            raise RuntimeError(
                "checkpoint: this buffer server has no checkpoint folder "
                "(memoire serve --buffer KIND --checkpoint_dir D)"
            )
        return os.path.basename(self._checkpoints.save())


class _CircularService(_HostedBuffer):
    """The hosted face of an OutOfGraph(Prioritized)ReplayBuffer: codec-friendly arguments and
    results only."""

    def __init__(self, buffer: _crb.OutOfGraphReplayBuffer, **checks):
        super().__init__(buffer, **checks)
        names = [e.name for e in buffer.get_storage_signature()]
        self._reward_column = names.index("reward")

    def describe(self) -> dict:
        """The buffer's constructor arguments (:meth:`OutOfGraphReplayBuffer.arguments`) as codec
        values (dtypes by name, extras as (name, shape, dtype name)), and ``prioritized``."""
        args = self._b.arguments()
        for key in ("observation_dtype", "terminal_dtype", "action_dtype", "reward_dtype"):
            args[key] = _dtype_name(args[key])
        args["extra_storage_types"] = [
            (e.name, tuple(int(d) for d in e.shape), _dtype_name(e.type))
            for e in args["extra_storage_types"]
        ]
        args["gamma"] = float(args["gamma"])
        args["prioritized"] = isinstance(self._b, _prb.OutOfGraphPrioritizedReplayBuffer)
        return args

    def add_batch(self, columns, ends, priorities):
        b = self._b
        columns = list(columns)
        if len(columns) > self._reward_column:  # else the core names what is missing
            self._check_rewards("add_batch", rewards=columns[self._reward_column])
        self._check_finite("add_batch", priorities=priorities)
        if len(columns) < 4:
            raise ValueError(
                "add_batch: expected the columns observation, action, reward, terminal and the "
                f"extras, got {len(columns)} column(s)"
            )
        # `ends` holds terminals already (the proxy's episode ends): the same rows either way.
        b.add_batch(*columns, priorities=priorities, episode_ends=ends)

    def sample_transition_batch(self, batch_size, indices):
        if batch_size is not None:
            self._check_batch(batch_size, "sample_transition_batch")
        if indices is not None:
            self._check_batch(np.size(indices), "sample_transition_batch")
        batch = self._b.sample_transition_batch(batch_size, indices)
        if self._b.prefetch_depth:
            # A prefetched batch views a slot of the buffer's feed, which the reply cache would
            # hold (one per caller) and so stall the feed: reply with a copy.
            batch = [np.array(a) for a in batch]
        return tuple(batch)

    def sample_index_batch(self, batch_size):
        self._check_batch(batch_size, "sample_index_batch")
        return np.asarray(self._b.sample_index_batch(batch_size), np.int64)

    def state(self) -> dict:
        b = self._b
        return {
            "add_count": int(b.add_count),
            "episode_end_indices": np.asarray(sorted(b.episode_end_indices), np.int64),
            "next_is_episode_start": bool(b.next_experience_is_episode_start),
        }

    def is_valid_transitions(self, indices):
        return self._b.is_valid_transitions(indices)

    def set_priority(self, indices, priorities):
        self._check_finite("set_priority", priorities=priorities)
        self._b.set_priority(indices, priorities)

    def get_priority(self, indices):
        return self._b.get_priority(indices)

    def max_recorded_priority(self) -> float:
        return float(self._b.sum_tree.max_recorded_priority)

    def priorities(self):
        """float64[n], the stored slots' priorities (None for a uniform buffer): what a
        tracker shows for a remote run."""
        return self._b.stored_priorities()

    def save(self, checkpoint_dir, iteration_number):
        self._b.save(_checkpoint_dir(self._root, checkpoint_dir, True), iteration_number)

    def load(self, checkpoint_dir, suffix):
        try:
            self._b.load(_checkpoint_dir(self._root, checkpoint_dir, False), suffix)
        except Exception as e:  # tf.errors.NotFoundError has no wire mapping: send its meaning
            if type(e).__name__ == "NotFoundError":
                raise FileNotFoundError(str(e)) from None
            raise


class _JaxService(_HostedBuffer):
    """The hosted face of a JAX ``ReplayBuffer``."""

    def describe(self) -> dict:
        return {"batch_size": int(self._b.batch_size), "prioritized": bool(self._b.prioritized)}

    def add_many(self, observations, actions, rewards, terminals, episode_ends, priorities):
        self._check_rewards("add_many", rewards=rewards)
        kwargs = {}
        if priorities is not None:
            # A proxy sends NaN for priority=None, which the buffer's add counts as 0 (its bulk add
            # refuses NaN): only infinities are non-finite here.
            zeroed = np.asarray(priorities, np.float64)
            zeroed = np.where(np.isnan(zeroed), 0.0, zeroed)
            self._check_finite("add_many", priorities=zeroed)
            kwargs["priorities"] = zeroed
        self._b.add_batch(observations, actions, rewards, terminals, episode_ends, **kwargs)

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

    def priorities(self):
        """float64[len], the stored keys' leaf values, oldest first (None for a uniform
        buffer): what a tracker shows for a remote run."""
        return self._b.stored_priorities()

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


def serve_buffer(
    server,
    buffer,
    name: str = "replay",
    *,
    checkpoint_root: Optional[str] = None,
    allow_nonfinite: Optional[bool] = None,
    checkpoints: Optional["BufferCheckpoints"] = None,
) -> None:
    """Hosts `buffer` (an OutOfGraph(Prioritized)ReplayBuffer or a JAX ReplayBuffer) on
    `server` under `name`, for the proxies of this module. Remote ``save``/``load`` are confined
    to `checkpoint_root` (an existing folder; None: refused, PermissionError), see
    :func:`checkpoint_dir`; sampled batches are bounded by ``server.max_batch``.

    Values from peers follow memoire's non-finite rule (docs/LIMITS.md): a NaN or infinite
    reward in ``add_batch``/``add_many`` raises ValueError in the caller, stores nothing and is
    counted in ``server.stats()["rejected"]["nonfinite"]``, unless `allow_nonfinite` (None: the
    server's own setting, ``server.allow_nonfinite``); non-finite priorities (``add_batch``,
    ``set_priority``, ``add_many``, ``update``) are refused and counted whatever the setting.

    `checkpoints`: the server's checkpoint folder of `buffer` (:class:`BufferCheckpoints`),
    written by the remote ``checkpoint()`` (None: that call raises RuntimeError).

    Raises:
      TypeError: `buffer` is none of those classes. ValueError: `checkpoint_root` is no folder.
    """
    if allow_nonfinite is None:
        allow_nonfinite = server.allow_nonfinite
    checks = dict(
        check_batch=server.check_batch,
        check_finite=server.check_finite,
        allow_nonfinite=bool(allow_nonfinite),
        checkpoints=checkpoints,
    )
    root = None
    if checkpoint_root is not None:
        root = os.path.realpath(str(checkpoint_root))
        if not os.path.isdir(root):
            raise ValueError(
                f"checkpoint_root: expected an existing folder, got {checkpoint_root!r}"
            )
    if isinstance(buffer, _crb.OutOfGraphReplayBuffer):
        server.host(
            name,
            _CircularService(buffer, checkpoint_root=root, **checks),
            methods=_CIRCULAR_METHODS,
        )
        return
    from memoire.dopamine_compat import jax_replay_buffer as _jrb

    if isinstance(buffer, _jrb.ReplayBuffer):
        server.host(
            name,
            _JaxService(buffer, checkpoint_root=root, **checks),
            methods=(
                "describe",
                "add_many",
                "sample",
                "update",
                "state",
                "max_recorded_priority",
                "priorities",
                "save",
                "load",
                "checkpoint",
            ),
        )
        return
    raise TypeError(
        f"serve_buffer: expected an OutOfGraphReplayBuffer, "
        f"OutOfGraphPrioritizedReplayBuffer or jax ReplayBuffer, got "
        f"{type(buffer).__name__}"
    )


# ---- the server's checkpoint folder ----------------------------------------------------------


class BufferCheckpoints(Checkpoints):
    """Checkpoints of a hosted buffer in `folder`, the newest `keep` kept (see
    :mod:`memoire.server.checkpoints`): one folder each, ``buffer-<sequence>.ckpt/``, holding the
    buffer's own ``save(folder, 0)``: Dopamine's replay files for an OutOfGraph buffer
    (:mod:`memoire.dopamine_compat.checkpoint`), orbax's for a JAX buffer. The folder is written
    under a temporary name and renamed when complete and fsync-ed.

    `lock`: held while the buffer is read or written (the host's lock for the buffer's calls,
    :meth:`memoire.server.rpc_host.RpcHost.lock`; None: one of its own).

    A checkpoint is a consistent cut, taken between two calls. Loading one also ends the
    episode that was in progress when it was taken, as a truncation (not a terminal): the
    steps that followed it were lost with the server, so the next step a client adds starts an
    episode rather than joining across the gap.
    """

    PREFIX = "buffer"
    FOLDERS = True
    # A damaged checkpoint raises what its reader raises (orbax, msgpack, gzip, numpy, ...),
    # always before the buffer changes: any error skips it.
    REFUSED = (Exception,)

    def __init__(self, buffer, folder: str, keep: int = DEFAULT_KEEP, lock=None):
        self.buffer = buffer
        self.lock = threading.RLock() if lock is None else lock
        super().__init__(folder, keep)

    def save(self) -> str:
        # The buffer's lock first, then the folder's, whoever saves: a remote checkpoint()
        # already holds the former (it runs as a hosted call), the periodic thread does not.
        with self.lock:
            return super().save()

    def load_newest(self):
        with self.lock:
            return super().load_newest()

    def _write(self, path: str) -> None:
        temp = temporary_name(path)
        os.mkdir(temp)
        try:
            self.buffer.save(temp, 0)  # under self.lock (save)
            fsync_tree(temp)
            os.rename(temp, path)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        finally:
            _forget_checkpoint_manager(self.buffer, temp)

    def _read(self, path: str) -> None:
        try:
            self.buffer.load(path, 0)  # under self.lock (load_newest)
            self.buffer.end_episode()
        finally:
            _forget_checkpoint_manager(self.buffer, path)

    def _summary(self) -> str:
        return f"add_count {int(self.buffer.add_count)}"  # under self.lock (save, load)


def _forget_checkpoint_manager(buffer, folder: str) -> None:
    """Drops the orbax manager a JAX buffer keeps per checkpoint folder (one per save here,
    each folder renamed or removed after)."""
    forget = getattr(buffer, "forget_checkpoint_folder", None)
    if forget is not None:
        forget(folder)


# ---- building and starting -----------------------------------------------------------------

BUFFER_KINDS = ("circular", "prioritized", "jax", "jax_prioritized")


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

        cls = (
            gin_registry.MemoireOutOfGraphReplayBuffer
            if kind == "circular"
            else gin_registry.MemoireOutOfGraphPrioritizedReplayBuffer
        )
        if "observation_shape" in kwargs:
            kwargs["observation_shape"] = tuple(kwargs["observation_shape"])
        buffer = cls(**kwargs)
        _crb.bind_memory(buffer, {})  # no wrapper will supply missing arguments: fail here
        return buffer
    if kind in ("jax", "jax_prioritized"):
        from dopamine.jax.replay_memory import accumulator, replay_buffer, samplers

        from memoire.dopamine_compat import jax_replay_buffer

        seed = kwargs.pop("seed", None)
        acc = accumulator.TransitionAccumulator(
            stack_size=int(kwargs.pop("stack_size", 1)),
            update_horizon=int(kwargs.pop("update_horizon", 1)),
            gamma=float(kwargs.pop("gamma", 0.99)),
        )
        dist = (
            samplers.UniformSamplingDistribution(seed=seed)
            if kind == "jax"
            else samplers.PrioritizedSamplingDistribution(seed=seed)
        )
        dopamine_buffer = replay_buffer.ReplayBuffer(
            transition_accumulator=acc, sampling_distribution=dist, **kwargs
        )
        return jax_replay_buffer.ReplayBuffer.from_dopamine(dopamine_buffer)
    raise ValueError(f"kind: expected one of {BUFFER_KINDS}, got {kind!r}")


def start_buffer_server(
    kind: str,
    name: str = "replay",
    *,
    rep_endpoint: str = "tcp://127.0.0.1:*",
    seed: Optional[int] = None,
    checkpoint_root: Optional[str] = None,
    keys: Optional[CurveKeys] = None,
    server_kwargs: Optional[dict] = None,
    allow_nonfinite: bool = False,
    checkpoint_dir: Optional[str] = None,
    checkpoint_every: Optional[float] = None,
    **buffer_kwargs,
):
    """Builds a buffer (:func:`build_buffer`) and serves it under `name` on a new
    :class:`memoire.server.RpcServer` (no replay memory) bound to `rep_endpoint` (loopback,
    OS-chosen port by default), with CURVE `keys` (server side:
    :class:`memoire.transport.CurveKeys`) if given, remote checkpoints under `checkpoint_root`
    (None: refused) and `server_kwargs` (the host's limits: ``max_batch``,
    ``reply_cache_bytes``, ...). `seed` seeds the buffer's sampling (unless `buffer_kwargs` name
    one). `allow_nonfinite`: store NaN/infinite rewards that peers send (default: refused,
    ValueError, counted ``nonfinite``; see :func:`serve_buffer`).

    `checkpoint_dir`: the server's own checkpoint folder (:class:`BufferCheckpoints`, created if
    missing): its newest loadable checkpoint is loaded before the server answers, and one is
    written on request (the proxies' ``checkpoint()``), every `checkpoint_every` seconds (None:
    no periodic saves) and by ``memoire serve`` when it stops. ``server.checkpoints`` is it (None
    without a folder); ``server.close()`` ends the periodic saves.

    Returns:
      (server, endpoint): the running server (``server.close()`` stops it) and the REP endpoint
      that :class:`RemoteOutOfGraphReplayBuffer` / :class:`RemoteReplayBuffer` take.

    Raises:
      ValueError, TypeError: as :func:`build_buffer`; `checkpoint_every` without a folder or
        not > 0. CheckpointError: the folder holds checkpoints and none loads (another buffer's).
      TimeoutError: the server did not bind.
    """
    from memoire.server import RpcServer

    check_period(checkpoint_dir, checkpoint_every)
    if seed is not None:
        buffer_kwargs.setdefault("seed", int(seed))
    buffer = build_buffer(kind, **buffer_kwargs)
    checkpoints = None
    if checkpoint_dir is not None:
        checkpoints = BufferCheckpoints(buffer, checkpoint_dir)
        checkpoints.load_newest()
    server_kwargs = dict(server_kwargs or {})
    server_kwargs["allow_nonfinite"] = bool(allow_nonfinite or server_kwargs.get("allow_nonfinite"))
    server = RpcServer(keys=keys, **server_kwargs)
    try:
        # Hosted before it binds: a client that reconnects to a restarted server never meets a
        # server without its buffer.
        serve_buffer(server, buffer, name, checkpoint_root=checkpoint_root, checkpoints=checkpoints)
        if checkpoints is not None:
            checkpoints.lock = server.rpc.lock(name)
            server.checkpoints = checkpoints
            if checkpoint_every is not None:
                checkpoints.every(checkpoint_every)
        endpoint = server.start(rep_endpoint)
    except BaseException:
        server.close()
        raise
    return server, endpoint
