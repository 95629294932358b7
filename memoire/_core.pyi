"""Type stubs for memoire._core, the native module. Use the memoire package, not this module.

Errors: each core status code raises one type: ValueError (bad argument), IndexError (an index
outside [0, bound): attributes ``index`` and ``bound``), KeyError(key) (a key or slot not stored:
attribute ``key`` too), RuntimeError (wrong state), CapacityError, ProtocolError. Other data a
caller acts on comes as attributes as well (``field``, ``expected``/``received``, ``needed``,
``sampled``, ``length``; see cpp/core/status.h); no caller parses a message.
"""

from typing import Any, List, Optional, Sequence, Tuple, overload

import numpy as np

# pybind11_builtins.pybind11_type, the metaclass of every class pybind11 binds (stub-only name:
# stubtest checks that the stub declares a metaclass where the runtime has one).
class _pybind11_type(type): ...
class ProtocolError(ValueError): ...
class CapacityError(ValueError): ...

class ReplayMemory(metaclass=_pybind11_type):
    def __init__(
        self,
        state_buf: np.ndarray,
        action_buf: np.ndarray,
        reward_buf: np.ndarray,
        prob_buf: np.ndarray,
        value_buf: np.ndarray,
        qvest_buf: np.ndarray,
        info_buf: np.ndarray,
        max_step: int,
        *,
        vector_prob: bool = ...,
        compress_states: bool = ...,
    ) -> None: ...
    @property
    def state_buf(self) -> np.ndarray: ...
    @property
    def action_buf(self) -> np.ndarray: ...
    @property
    def reward_buf(self) -> np.ndarray: ...
    @property
    def prob_buf(self) -> np.ndarray: ...
    @property
    def value_buf(self) -> np.ndarray: ...
    @property
    def qvest_buf(self) -> np.ndarray: ...
    @property
    def info_buf(self) -> np.ndarray: ...
    @property
    def entry_size(self) -> int: ...
    @property
    def max_step(self) -> int: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def compress_states(self) -> bool: ...
    @property
    def stored_state_bytes(self) -> int: ...
    uuid: int
    priority_exponent: float
    priority_epsilon: float
    mix_lambda: float
    frame_stack: int
    multi_step: int
    cache_size: int
    max_episode: int
    reuse_cache: bool
    allow_nonfinite: bool
    discount_factor: np.ndarray
    reward_coeff: np.ndarray
    cache_flags: np.ndarray
    @property
    def size(self) -> int: ...
    @property
    def num_sampleable(self) -> int: ...
    @property
    def total_weight(self) -> float: ...
    @property
    def episode_open(self) -> bool: ...
    @property
    def open_length(self) -> int: ...
    @property
    def total_added(self) -> int: ...
    def seed(self, seed: int) -> None: ...
    def num_episode(self) -> int: ...
    def info(self) -> str: ...
    def new_episode(self) -> None: ...
    def add_entry(
        self, s: Any, a: Any, r: Any, p: Any, v: Any, i: Any, init_w: float = 1.0
    ) -> None: ...
    def add_entries(self, s: Any, a: Any, r: Any, p: Any, v: Any, i: Any, init_w: Any) -> None: ...
    def close_episode(
        self,
        episodic_weight_multiplier: float = 1.0,
        do_update_value: bool = True,
        do_update_weight: bool = True,
        terminal: bool = True,
    ) -> None: ...
    def _sample(
        self, batch_size: int
    ) -> Tuple[tuple, tuple, np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...
    def _push_cache(
        self, socket: int, header: bytes, cache_size: int, uuid: int, timeout_ms: int
    ) -> bool: ...
    def update_weights(self, ids: np.ndarray, weights: np.ndarray) -> int: ...
    def _save_fd(self, fd: int) -> None: ...
    def _load_fd(self, fd: int) -> None: ...
    @staticmethod
    def _checkpoint_checksum(data: bytes, section: int) -> int: ...

class CircularBuffer(metaclass=_pybind11_type):
    """Dopamine's circular buffer store (memoire.dopamine_compat.circular_replay_buffer)."""
    def __init__(
        self,
        fields: list,
        capacity: int,
        stack_size: int,
        update_horizon: int,
        gamma: float,
        max_sample_attempts: int,
        prioritized: bool,
        episode_end_breaks_stacks: bool,
        seed: int,
    ) -> None: ...
    MAX_ADD_COUNT: int  # 2**62: add_count never passes it (setter, restore and adds refuse)
    add_count: int
    max_recorded_priority: float
    next_is_episode_start: bool
    @property
    def capacity(self) -> int: ...
    @property
    def padded_leaves(self) -> int: ...
    @property
    def total_priority(self) -> float: ...
    # ValueError: argument count (expected, received) or shape (field: the argument's index).
    def add(
        self,
        observation: Any,
        action: Any,
        reward: Any,
        terminal: Any,
        extras: tuple,
        priority: Any,
        episode_end: Any,
    ) -> None: ...
    def add_batch(self, columns: list, episode_end: Any, priorities: Any) -> None: ...
    def column(self, field: int) -> np.ndarray: ...
    def episode_ends(self) -> list: ...
    def set_episode_ends(self, slots: list) -> None: ...
    # Where Dopamine's get_range asserts: IndexError(index, bound) outside the ring, KeyError(key)
    # for a slot not yet written; ValueError(length) for vector rewards numpy would not broadcast.
    def gather(self, indices: Any, outputs: list) -> None: ...
    # IndexError(index, bound = padded_leaves) for an index outside [-bound, bound).
    def get_priorities(self, indices: Any) -> np.ndarray: ...
    def set_priorities(self, indices: Any, priorities: Any) -> None: ...
    def is_valid(self, index: int) -> bool: ...
    def is_valid_many(self, indices: Any) -> np.ndarray: ...
    def restore_from(
        self,
        staging: CircularBuffer,
        add_count: int,
        episode_ends: list,
        priorities: Any,
        max_recorded_priority: float,
    ) -> None: ...
    # RuntimeError: too few slots written (needed), attempts ran out (sampled), all priorities 0.
    def sample_indices(self, batch_size: int) -> np.ndarray: ...
    def sample_into(self, batch_size: int, outputs: list) -> np.ndarray: ...
    def sample_tree(self, batch_size: int, stratified: bool) -> np.ndarray: ...
    def seed(self, seed: int) -> None: ...

class TransitionStore(metaclass=_pybind11_type):
    """Dopamine JAX ReplayBuffer's store (memoire.dopamine_compat.jax_replay_buffer)."""
    def __init__(
        self,
        max_capacity: int,
        stack_size: int,
        update_horizon: int,
        gamma: float,
        fix_terminal_duplicates: bool,
        prioritized: bool,
        tree_capacity: int,
        frame_bytes: int,
        elem_bytes: int,
        action_bytes: int,
    ) -> None: ...
    MAX_ADD_COUNT: int  # 2**31: keys stay int32 (import_state and adds refuse to pass it)
    @property
    def add_count(self) -> int: ...
    @property
    def frame_capacity(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def tree_root(self) -> float: ...
    def add_batch(
        self,
        frames: np.ndarray,
        actions: np.ndarray,
        rewards: Any,
        terminals: np.ndarray,
        episode_ends: np.ndarray,
        priorities: Any,
    ) -> np.ndarray: ...
    def add(
        self,
        frame: np.ndarray,
        action: np.ndarray,
        reward: float,
        terminal: bool,
        episode_end: bool,
        priority: float,
    ) -> int: ...
    def clear(self) -> None: ...
    def clear_trajectory(self) -> None: ...
    def export_sampler(self) -> tuple: ...
    def export_window(self) -> tuple: ...
    # gather, priorities and update raise KeyError(key) for a key not stored.
    def gather(
        self,
        keys: Any,
        state: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_state: np.ndarray,
        is_terminal: np.ndarray,
        episode_end: np.ndarray,
    ) -> None: ...
    # Positional only (the binding names no argument): the arrays of a Dopamine checkpoint, as
    # memoire/dopamine_compat/jax_replay_buffer/replay_buffer.py passes them.
    def import_state(
        self,
        add_count: int,
        states: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_states: np.ndarray,
        terminals: np.ndarray,
        episode_ends: np.ndarray,
        key_by_index: Any,
        nodes: Optional[np.ndarray],
        win_frames: np.ndarray,
        win_actions: np.ndarray,
        win_rewards: np.ndarray,
        win_terminals: np.ndarray,
        win_episode_ends: np.ndarray,
        /,
    ) -> None: ...
    def keys_at(self, indices: Any) -> np.ndarray: ...
    def priorities(self, keys: Any) -> np.ndarray: ...
    def query(self, targets: Any) -> tuple: ...
    def update(self, keys: Any, values: Any) -> None: ...

class CacheRing(metaclass=_pybind11_type):
    def __init__(
        self,
        columns: list,
        cache_size: int,
        n_caches: int,
        seed: int,
        max_payload_bytes: int = 1 << 32,
    ) -> None: ...
    def insert(self, frames: list) -> None: ...
    def receive(
        self, socket: int, timeout_ms: int, max_messages: int = 256
    ) -> Tuple[int, Optional[List[np.ndarray]]]: ...
    def get_batch(
        self, n: int, reuse: bool, timeout: float, out: Optional[dict] = None
    ) -> dict: ...
    def relayout(self, columns: list, cache_size: int) -> None: ...
    def close(self) -> None: ...
    allow_nonfinite: bool
    @property
    def held(self) -> int: ...
    @property
    def unused_rows(self) -> int: ...

def empty(shape: Any, dtype: Any) -> np.ndarray:
    """A C-contiguous array from memoire's buffer pool (warm pages of dropped batches)."""

# ---- codec (cpp/core/codec.h): header frames of memoire's wire format

WIRE_VERSION: int
WIRE_DTYPES: list
protocol: Any  # submodule: core/protocol.h's constants (read through memoire/protocol.py)

class WireMessage(metaclass=_pybind11_type):
    """A decoded, checked header: type, flags and the entry table
    (name, kind, dtype_code, shape, frame, depth)."""
    @property
    def version(self) -> int: ...
    @property
    def type(self) -> int: ...
    @property
    def flags(self) -> int: ...
    @property
    def entries(self) -> list: ...
    def check(self, spec: "WireSpec") -> int: ...

class WireSpec(metaclass=_pybind11_type):
    """Expected top-level arrays: [(name, dtype_code, shape, optional)]; -1 matches any size."""
    def __init__(self, specs: list, allow_extra: bool = False) -> None: ...

def encode_header(type: int, flags: int, entries: list, version: int = 1) -> bytes: ...
def attach_libzmq(path: str) -> Optional[str]: ...
def encode_flat(type: int, flags: int, values: dict) -> Optional[bytes]: ...
def decode_header(
    header: Any, frame_sizes: list, max_payload_bytes: int = 1 << 32, max_entries: int = 65536
) -> WireMessage: ...
def peek_header(header: Any) -> Optional[Tuple[int, int]]: ...

class ChunkIngest(metaclass=_pybind11_type):
    @overload
    def __init__(
        self,
        memory: ReplayMemory,
        max_message_bytes: int = ...,
        max_open_episodes: int = 4096,
        open_episode_timeout: float = 600.0,
        max_episode_bytes: int = ...,
        max_open_bytes: int = ...,
        peer_timeout: float = 10.0,
    ) -> None: ...
    @overload
    def __init__(
        self,
        buffer: CircularBuffer,
        *,
        allow_nonfinite: bool = False,
        max_message_bytes: int = ...,
        max_open_episodes: int = 4096,
        open_episode_timeout: float = 600.0,
        max_episode_bytes: int = ...,
        max_open_bytes: int = ...,
        peer_timeout: float = 10.0,
    ) -> None: ...
    @overload
    def __init__(
        self,
        store: TransitionStore,
        *,
        observation_dtype: Any,
        observation_shape: Sequence[int],
        action_dtype: Any,
        action_shape: Sequence[int],
        allow_nonfinite: bool = False,
        max_message_bytes: int = ...,
        max_open_episodes: int = 4096,
        open_episode_timeout: float = 600.0,
        max_episode_bytes: int = ...,
        max_open_bytes: int = ...,
        peer_timeout: float = 10.0,
    ) -> None: ...
    @property
    def row_spec(self) -> list: ...
    priority: float
    def take_committed(self) -> Tuple[list, int]: ...
    def take_returned(self) -> list: ...
    def reap(self, now: Optional[float] = None) -> None: ...
    def listen(self, now: Optional[float] = None) -> list: ...
    def open_streams(self) -> list: ...
    def ingest(
        self, frames: Any, now: Optional[float] = None
    ) -> Optional[Tuple[int, int, Optional[str], int, Optional[str]]]: ...
    def receive(
        self, socket: int, timeout_ms: int, max_messages: int = 64
    ) -> Tuple[int, int, list, Optional[list]]: ...
    def counters(self) -> dict: ...
    max_open_episodes: int
    open_episode_timeout: float
    peer_timeout: float
    max_message_bytes: int
    max_episode_bytes: int
    max_open_bytes: int

class Feed(metaclass=_pybind11_type):
    """Native prefetching feed (memoire.feed.Feed): `threads` sampler threads draw batches of
    `batch_size` from a TransitionStore, CircularBuffer or ReplayMemory (or receive them from a
    sampling stream's StreamSources, one thread per connection) into `depth` ring slots, one
    64-byte aligned buffer per template array (its dtype and shape)."""
    def __init__(
        self,
        source: Any,  # a store, a ReplayMemory, a StreamSource or a list of them
        templates: list,
        batch_size: int,
        depth: int,
        threads: int,
        seed: int,
        frames_granule: int = 0,  # > 0: a TransitionStore's distinct frames + index
    ) -> None: ...
    @staticmethod
    def distinct_frames_capacity(batch_size: int, stack_size: int, granule: int) -> int: ...
    # The next batch: a tuple of arrays viewing one slot, reused once they are all dropped.
    # Raises the draw's error; RuntimeError when closed or every slot stays held (attr `held`).
    def take(self) -> tuple: ...
    def close(self) -> None: ...
    @property
    def dtypes(self) -> List[Optional[np.dtype]]: ...
    @property
    def depth(self) -> int: ...
    @property
    def threads(self) -> int: ...
    @property
    def taken(self) -> int: ...
    @property
    def filled(self) -> int: ...

class CudaRuntime(metaclass=_pybind11_type):
    """libcudart loaded at run time (memoire._cuda.runtime): the first of `paths` already loaded,
    else the first that loads with the needed functions, version >= 11.0 and a device;
    RuntimeError (one line naming what was found) otherwise."""
    def __init__(self, paths: List[str]) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def device_count(self) -> int: ...

class DeviceArray(metaclass=_pybind11_type):
    """One array of a device batch viewing a device slot: a DLPack producer (zero-copy)."""
    def __dlpack__(
        self,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple: ...
    @property
    def shape(self) -> tuple: ...
    @property
    def dtype(self) -> np.dtype: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def pointer(self) -> int: ...
    @property
    def slot(self) -> int: ...
    @property
    def stream(self) -> int: ...
    def give_back_when_freed(self) -> None: ...

class DeviceFeed(metaclass=_pybind11_type):
    """A ring of device slots filled from a Feed's host ring by a native copy thread
    (memoire.feed.Feed(device=...)): CUDA with a CudaRuntime, the host stand-in with None."""
    def __init__(
        self,
        feed: Feed,
        runtime: Optional[CudaRuntime] = None,
        device: int = 0,
        slots: int = 3,
        to_device: Optional[List[bool]] = None,
        trim: Optional[List[int]] = None,
        narrow: Optional[List[bool]] = None,
    ) -> None: ...
    # Slots are lent: the next ready one, its arrays (DeviceArray per device part, numpy views
    # of its host mirror per host part, None per absent), and giving it back.
    def take_slot(self) -> int: ...
    def views(self, slot: int) -> tuple: ...
    def release(self, slot: int, stream: int = -1) -> None: ...
    def copied_bytes(self, slot: int) -> int: ...
    def close(self) -> None: ...
    @property
    def slots(self) -> int: ...
    @property
    def pinned(self) -> int: ...
    @property
    def held(self) -> int: ...
    @property
    def copied(self) -> int: ...
    @property
    def taken(self) -> int: ...
    @property
    def last_copy_bytes(self) -> int: ...
    @property
    def dlpack_device(self) -> tuple: ...

class StreamSource(metaclass=_pybind11_type):
    """A learner's end of a sampling stream (memoire.stream.SamplingStream): over the socket a
    Feed source that receives each batch from a connected DEALER (its `underlying` address) and
    stacks it; with shared memory (shm_path) `take` hands out views of the server's slots."""
    def __init__(
        self,
        socket: int,
        templates: list,
        batch_size: int,
        frame_stack: int,
        multi_step: int,
        flags: list[bool],
        timeout_ms: int,
        ping_ms: int,
        credit_chunk: int,
        credit_message: list,
        ping_message: list,
        max_payload_bytes: int = ...,
        shm_path: str = ...,
        shm_slots: int = ...,
        shm_slot_bytes: int = ...,
        compressed_state: bool = ...,
    ) -> None: ...
    def take(self) -> tuple:
        """Shared memory: the next batch as views of its slot (prev[7], next[7] with None for a
        stack left out, weight, prob, done, id, num_sampleable[1], total_weight[1]); the slot
        goes back to the server when every view is dropped."""
    def post(self, frames: list) -> None: ...
    def stop(self) -> None: ...
    @property
    def dtypes(self) -> List[Optional[np.dtype]]: ...
    @property
    def received(self) -> int: ...
    @property
    def credit_returned(self) -> int: ...
    @property
    def last_seq(self) -> int: ...

class StreamShm(metaclass=_pybind11_type):
    """A server's shared memory for one sampling stream (a file in /dev/shm): the stream's ring
    (`ring_bytes`), then `slots` batches of `batch_size` in the learner's final layout, sized by
    the memory's settings now."""
    def __init__(self, memory: ReplayMemory, batch_size: int, slots: int) -> None: ...
    @staticmethod
    def slot_bytes_for(memory: ReplayMemory, batch_size: int) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def slot_bytes(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def ring_bytes(self) -> int: ...

# The shared-memory ring version this build speaks (cpp/core/stream_ring.h).
STREAM_RING_VERSION: int

# Byte offsets of a ring's words for `slots` slots (for tests that play a raw peer).
def stream_ring_offsets(slots: int) -> dict[str, int]: ...

# Samples `count` batches and sends each as a STREAM_BATCH to `identity` on a ROUTER socket;
# returns (sent, error message or None).
class StreamHub(metaclass=_pybind11_type):
    """The native side of a stream worker's ROUTER socket: it waits on the socket with the GIL
    released and keeps every stream's native samplers: a shared-memory stream's trade notices
    and slots with their learner through the stream's ring; a rows stream's batches are sent
    by `poll` as they come out, in order."""
    def __init__(self, socket: int) -> None: ...
    def add(
        self,
        identity: bytes,
        memory: ReplayMemory,
        shm: StreamShm,
        threads: int,
        ahead: int,
        limiter: RateLimiter | None,
        error_pause_ms: int,
        limited_pause_ms: int,
    ) -> None: ...
    def add_rows(
        self,
        identity: bytes,
        memory: ReplayMemory,
        batch_size: int,
        window: int,
        send: list[bool],
        compressed_state: bool,
        credit: int,
        threads: int,
        limiter: RateLimiter | None,
        error_pause_ms: int,
        limited_pause_ms: int,
        send_timeout_ms: int,
    ) -> None: ...
    # `k` more batches for the peer's rows stream; False when it has none.
    def grant(self, identity: bytes, k: int) -> bool: ...
    # A rows stream's credit not yet sent (undrawn, drawing, queued); -1 when none.
    def outstanding(self, identity: bytes) -> int: ...
    def remove(self, identity: bytes) -> bool: ...
    def clear(self) -> None: ...
    # The frames (identity, then the message) of the next message, or None (timeout, or a
    # sampler refused a credit: see refusals).
    def poll(self, timeout_ms: int) -> list[bytes] | None: ...
    # (identity, why) of the samplers that refused their learner's credit and stopped.
    def refusals(self) -> list[tuple[bytes, str]]: ...
    def idle_seconds(self, identity: bytes) -> float: ...
    def held(self, identity: bytes) -> int: ...
    def take_counts(self) -> dict[str, int]: ...
    @property
    def samplers_waiting(self) -> int: ...

class RateLimiter(metaclass=_pybind11_type):
    """Keeps samples per insert within a band, with Reverb's semantics (the Python face is
    memoire.rate_limiter). Counts are transitions; timeouts are seconds (None: no bound)."""
    def __init__(
        self, samples_per_insert: float, min_size_to_sample: int, min_diff: float, max_diff: float
    ) -> None: ...
    def can_insert(self, n: int = 1) -> bool: ...
    def can_sample(self, n: int = 1) -> bool: ...
    def await_sample(
        self, n: int, timeout: Optional[float] = None, raise_on_timeout: bool = True
    ) -> bool: ...
    def wait_can_sample(self, n: int, timeout: Optional[float]) -> bool: ...
    def await_insert(
        self, timeout: Optional[float] = None, raise_on_timeout: bool = True
    ) -> bool: ...
    def inserted(self, n: int) -> None: ...
    def record_sample_wait(self, seconds: float, timed_out: bool) -> None: ...
    def cancel(self) -> None: ...
    def describe(self) -> str: ...
    @property
    def samples_per_insert(self) -> float: ...
    @property
    def min_size_to_sample(self) -> int: ...
    @property
    def min_diff(self) -> float: ...
    @property
    def max_diff(self) -> float: ...
    def counters(self) -> dict: ...
