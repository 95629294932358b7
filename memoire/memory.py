"""memoire.ReplayMemory: the episodic replay memory of the native core.

Storage, returns, priorities and sampling all run in C++ (``memoire._core``); this module adds
the two constructors (the memoire API's buffer templates and the older sizes), docstrings and the :class:`Batch` result.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator

import numpy as np

from memoire import _core
from memoire.checkpoint_io import CheckpointError, atomic_create, open_regular
from memoire.protocol import FIELDS  # noqa: F401 (re-exported: the field names)


@dataclasses.dataclass
class Batch:
    """A batch of transitions.

    Iterating gives ``(prev, next, weight)`` as the seed's ``get_batch`` returns.

    Attributes:
      prev: tuple of 7 arrays (s, a, r, p, v, q, i), each ``dtype[batch, frame_stack, *shape]``:
        the stacked entries ending at the sampled entry (oldest first). ``None`` where
        ``cache_flags`` disables the field.
      next: the same for the stacked entries ending ``multi_step`` entries later.
      weight: ``float32[batch]``, each entry's priority weight ``w``.
      prob: ``float64[batch]``, the probability with which each entry was drawn
        (``w / total_weight``); importance weights are ``(num_sampleable * prob) ** -beta``.
      done: ``bool[batch]``, True where ``next`` ends on the last entry of a terminated episode.
      id: ``int64[batch]``, entry ids for :meth:`ReplayMemory.update_weights`.

    All arrays of one batch are views into one block allocated per call (fast for large
    stacks); keeping any of them keeps the whole block alive.
    """

    prev: tuple
    next: tuple
    weight: np.ndarray
    prob: np.ndarray
    done: np.ndarray
    id: np.ndarray

    def __iter__(self) -> Iterator:
        return iter((self.prev, self.next, self.weight))

    def __len__(self) -> int:
        return len(self.weight)

    def importance_weights(self, beta: float, num_sampleable: int) -> np.ndarray:
        """``float32[batch]`` importance-sampling corrections ``(N * prob) ** -beta``, scaled so
        the largest is 1."""
        w = (num_sampleable * self.prob) ** (-beta)
        return (w / w.max()).astype(np.float32)


def _os_error(call, fd):
    """``call(fd)``; an I/O failure in the core (RuntimeError carrying ``errno``) as OSError."""
    try:
        call(fd)
    except RuntimeError as e:
        code = getattr(e, "errno", None)
        if code is None:
            raise
        raise OSError(code, str(e)) from None


def _legacy_templates(state_size, action_size, reward_size, prob_size, value_size):
    """The older constructor's sizes as buffer templates: prob is a scalar for prob_size 1
    (the memoire API's layout), else float32[prob_size] (0 included)."""
    for name, size in (
        ("state_size", state_size),
        ("action_size", action_size),
        ("reward_size", reward_size),
        ("prob_size", prob_size),
        ("value_size", value_size),
    ):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {size!r}")
    if value_size != reward_size:
        raise ValueError(
            f"value_size: expected reward_size={reward_size} (one value per reward), got {value_size}"
        )
    return (
        np.zeros([state_size], np.uint8),
        np.zeros([action_size], np.float32),
        np.zeros([reward_size], np.float32),
        np.zeros([] if prob_size == 1 else [prob_size], np.float32),
        np.zeros([value_size], np.float32),
        np.zeros([reward_size], np.float32),
        np.zeros([0], np.uint8),
    )


_TEMPLATE_NAMES = (
    "state_buf",
    "action_buf",
    "reward_buf",
    "prob_buf",
    "value_buf",
    "qvest_buf",
    "info_buf",
)


def _check_templates(args: tuple, kwargs: dict) -> None:
    """Raises ValueError for a template given as a dtype (``np.float32``, ``np.dtype('f4')``)
    instead of an array: numpy would turn it into an object array, whose error ("dtype object
    is not supported") does not say what went wrong."""
    given = list(zip(_TEMPLATE_NAMES, args)) + [
        (k, kwargs[k]) for k in _TEMPLATE_NAMES if k in kwargs
    ]
    for name, template in given:
        if isinstance(template, type):
            what = f"the type {template.__module__}.{template.__qualname__}"
        elif isinstance(template, np.dtype):
            what = f"the dtype {template}"
        else:
            continue
        raise ValueError(
            f"{name}: expected an array template (`np.zeros(shape, dtype)`), got {what}"
        )


class ReplayMemory(_core.ReplayMemory):
    """An episodic replay memory with prioritized sampling.

    Two constructors (the memoire API's, and the older one by sizes)::

        ReplayMemory(state_buf, action_buf, reward_buf, prob_buf, value_buf, qvest_buf,
                     info_buf, max_step)
        ReplayMemory(state_size, action_size, reward_size, prob_size, value_size, capacity)

    Buffer templates are numpy arrays whose dtype and shape define each field (values are
    ignored): state, action and info any dtype and shape; reward, value and qvest float32 of
    one shape; prob float32 of shape ``[]``. The older form stores uint8 states of
    ``[state_size]`` and float32 others (prob a scalar when ``prob_size`` is 1, else
    ``float32[prob_size]``, 0 allowed), with an empty info field.

    Entries live in a ring of ``max_step`` slots. An episode is opened by :meth:`new_episode`,
    filled by :meth:`add_entry` and closed by :meth:`close_episode`, which computes
    lambda-returns (``q``) and priority weights::

        G[L-1] = r[L-1]            (terminated)   or   v[L-1]   (truncated: terminal=False)
        G[k]   = r[k] + gamma * ((1 - lambda) * v[k+1] + lambda * G[k+1])
        w[k]   = multiplier * init_w[k] * (|sum(reward_coeff * (G[k] - v[k]))| + eps) ** alpha

    (per reward element, ``gamma = discount_factor``, ``lambda = mix_lambda``,
    ``alpha = priority_exponent``, ``eps = priority_epsilon``). When the ring is full, or more
    than ``max_episode`` episodes are closed, whole oldest episodes are evicted.

    Entry ``k`` of an episode of ``L`` entries is sampled only when ``k >= frame_stack - 1``,
    ``k + multi_step <= L - 1`` and its weight is positive.

    Settings and their defaults (all read-write; an out-of-range value raises ValueError and
    changes nothing): ``priority_exponent=0.0`` (uniform over ``init_w``),
    ``priority_epsilon=1e-6``, ``mix_lambda=0.95``, ``frame_stack=1``, ``multi_step=1``,
    ``cache_size=128``, ``max_episode=0`` (no limit beyond ``max_step``),
    ``reuse_cache=False``, ``discount_factor=0.99`` and ``reward_coeff=1.0`` per reward
    element, ``cache_flags`` all True (14 flags: prev s,a,r,p,v,q,i then next s,a,r,p,v,q,i),
    ``allow_nonfinite=False``: an add whose reward, prob or value holds a NaN or an infinity
    raises ValueError and stores nothing (the same rule for a server's episodes from actors,
    which are dropped and counted as ``nonfinite``); True stores them. ``init_w`` must be
    finite whatever the setting.

    Compressed states (keyword ``compress_states=True``, either constructor; fixed for the
    memory's life): each stored state is kept LZ4-compressed in its own block (an Atari
    screen of 7,056 B takes about a tenth of that; a state that does not compress is kept raw),
    so memory follows what the states compress to. Adds compress before taking the lock;
    sampling, sampling streams, caches and :meth:`save` decode in C++ without the GIL and
    return exactly the bytes that were added. Sampling costs more (decoding; see
    ``benchmarks/bench_compression.py``). Read-only: ``compress_states``, and
    ``stored_state_bytes``, the bytes the stored states take (their compressed blocks, without
    the allocator's headers; without compression, their raw rows). Checkpoints hold raw
    states, so either kind of memory loads the other's.

    Thread safety: every method may be called from any thread; calls are serialised by the
    memory's own lock and copy with the GIL released, so one thread can add while another
    samples.
    """

    def __init__(self, *args, compress_states=False, **kwargs):
        if not isinstance(compress_states, (bool, np.bool_)):
            raise ValueError(f"compress_states: expected True or False, got {compress_states!r}")
        compress = bool(compress_states)
        if len(args) == 6 and not kwargs and all(isinstance(a, (int, np.integer)) for a in args):
            *sizes, capacity = args
            legacy = _legacy_templates(*sizes)
            super().__init__(*legacy, int(capacity), vector_prob=True, compress_states=compress)
        elif not args and "capacity" in kwargs:
            capacity = kwargs.pop("capacity")
            legacy = _legacy_templates(**kwargs)
            super().__init__(*legacy, int(capacity), vector_prob=True, compress_states=compress)
        else:
            _check_templates(args, kwargs)
            super().__init__(*args, compress_states=compress, **kwargs)
        self.uuid = int.from_bytes(np.random.default_rng().bytes(4), "little")
        info = self.info_buf
        self._empty_info = np.zeros(info.shape, info.dtype)
        self._info_is_empty = info.size == 0

    # The older API's names.
    state_size = property(lambda self: int(self.state_buf.size), doc="Elements per state.")
    action_size = property(lambda self: int(self.action_buf.size), doc="Elements per action.")
    reward_size = property(lambda self: int(self.reward_buf.size), doc="Elements per reward.")
    prob_size = property(
        lambda self: int(self.prob_buf.size), doc="Elements per prob (1 for a scalar prob)."
    )
    value_size = property(lambda self: int(self.value_buf.size), doc="Elements per value.")
    capacity = property(lambda self: self.max_step, doc="Alias of max_step.")
    td_lambda = property(
        lambda self: self.mix_lambda,
        lambda self, v: setattr(self, "mix_lambda", v),
        doc="Alias of mix_lambda.",
    )
    rwd_coeff = property(
        lambda self: self.reward_coeff,
        lambda self, v: setattr(self, "reward_coeff", v),
        doc="Alias of reward_coeff.",
    )

    def add_entry(self, s, a, r, p, v, i=None, init_w=1.0):
        """Adds an entry to the open episode.

        Args:
          s, a, r, p, v, i: one row of each field, matching the buffer templates (values of
            another dtype are cast when numpy's ``same_kind`` rule allows). ``i`` may be
            omitted when info is empty (the older API's form ``add_entry(s, a, r, p, v, init_w)``).
          init_w: float, the entry's initial weight (finite, >= 0).

        Raises:
          RuntimeError: no open episode. ValueError: a row of the wrong shape or dtype.
          CapacityError: the open episode alone would exceed ``max_step``.
        """
        if i is None:
            i = self._empty_info
        elif self._info_is_empty and np.ndim(i) == 0:
            init_w, i = i, self._empty_info  # the older API: add_entry(s, a, r, p, v, init_w)
        super().add_entry(s, a, r, p, v, i, init_w)

    def get_batch(self, batch_size: int) -> Batch:
        """Samples ``batch_size`` transitions with probability proportional to weight.

        Draws are stratified over equal slices of the total weight, with replacement.

        Raises:
          RuntimeError: nothing is sampleable yet. ValueError: ``batch_size < 1``.
        """
        return Batch(*self._sample(int(batch_size)))

    sample = get_batch

    def save(self, path) -> None:
        """Writes the whole memory to the file `path`, atomically.

        Saved: every stored entry (the open episode's included), the closed episodes, weights
        (so priorities), the settings, ``uuid``, the generator's state and the counters.
        :meth:`load` of the file makes a memory that holds the same, and samples the same
        batches from the same generator state (or after the same :meth:`seed`).

        Streamed: each stored column goes from the memory to the file in 4 MiB pieces, in C++
        without the GIL, with no copy of the memory. The memory's lock is held while it writes,
        so adds and samples from other threads wait for it. Atomic: the file is written under a
        temporary name beside `path` (``path.tmp-<token>``), fsync-ed, then renamed over `path`;
        a crash leaves `path` as it was. Format: ``cpp/core/replay_memory_checkpoint.cc``
        (version 1; a header with a magic, then checksummed sections).

        Raises:
          OSError: the file cannot be written (no space, no folder, ...); `path` is untouched.
        """
        with atomic_create(path) as fd:
            _os_error(self._save_fd, fd)

    def load(self, path) -> None:
        """Replaces this memory's contents with the checkpoint `path` written by :meth:`save`.

        The file is treated as hostile: it must be a regular file (no FIFO, device or symlink),
        start with the magic and a version this memoire reads, and have been written by a
        memory of the same templates (dtypes and shapes) and ``max_step``. Every count is
        checked against the memory and the file's exact size before anything is allocated,
        and every section against its checksum as it is read into a staging memory; this
        memory changes only once all of it was read and checked. Settings, ``uuid`` and the
        generator's state are those saved.

        Raises:
          CheckpointError (a ValueError; memoire.ProtocolError): a truncated, altered or
            foreign file, or one of another memory's shape; the message names the file and what
            was expected. The memory is unchanged.
          FileNotFoundError, OSError: the file cannot be read; the memory is unchanged.
        """
        path = os.fspath(path)
        with open_regular(path) as f:
            try:
                _os_error(self._load_fd, f.fileno())
            except _core.ProtocolError as e:
                raise CheckpointError(f"{path}: {e}") from None

    def print_info(self) -> None:
        """Prints the schema, counts and settings."""
        print(self.info())

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return (
            f"ReplayMemory(max_step={self.max_step}, episodes={self.num_episode()}, "
            f"stored={self.size}, sampleable={self.num_sampleable})"
        )
