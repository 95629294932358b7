"""A prefetching feed: native threads sample batches ahead of the learner.

``Feed(buffer, batch_size)`` starts ``threads`` sampler threads in C++ (no GIL) that draw batches
from ``buffer`` into a ring of ``depth`` reusable, 64-byte aligned host buffers
(``cpp/core/prefetch.h``). The learner's ``next(feed)`` takes the next ready batch: when one is
ready that is a hand-over of a few microseconds (no sampling, no copy, no allocation on the
learner's thread). With ``device`` set, batches arrive already on the device (the device path,
below).

Sources:

- memoire's JAX ``ReplayBuffer`` (``memoire.dopamine_compat.jax_replay_buffer``): batches are the
  ``ReplayElement`` its ``sample()`` returns (state/next_state ``dtype[B, *obs_shape, stack]``,
  action ``dtype[B, *action_shape]``, reward ``float64[B]``, is_terminal/episode_end
  ``bool[B]``); with ``with_sample_metadata=True`` a tuple ``(batch, metadata)`` as
  ``sample(with_sample_metadata=True)``: ``SampleMetadata(keys=int32[B])``, or for a prioritized
  buffer ``PrioritizedSampleMetadata(keys, probabilities=float64[B])``. Draws use the core's
  seedable generator (``seed``), not the numpy Generator the buffer shares with Dopamine: the
  distribution is the same, the stream is not (``sample()`` stays bit-identical to Dopamine).
- memoire's TF-face ``OutOfGraphReplayBuffer`` / ``OutOfGraphPrioritizedReplayBuffer``: batches
  are the tuple ``sample_transition_batch()`` returns (Dopamine's transition elements), drawn by
  the buffer's own generator (its seed; ``seed`` is unused), with Dopamine's validity rules.

- ``memoire.ReplayMemory``: batches are the ``Batch`` its ``get_batch()`` returns (prev, next,
  weight, prob, done, id), drawn by the memory's own generator, in proportion to weight. The
  layout follows the settings when the feed starts; a later ``frame_stack`` change is picked
  up (the ring is resized), a ``cache_flags`` change is not (start a new feed).
- ``memoire.stream.SamplingStream`` over the socket (a learner's stream from a server; it makes
  its own feed): the same ``Batch``, received from the server and stacked into the ring on
  arrival. A shared-memory stream needs no feed: the server's slots are its ring.

The device path (``device`` on a CUDA or CPU device; docs/FEED.md): one native copy thread
copies each host batch from the page-locked ring into one of ``device_slots`` device slots with
cudaMemcpyAsync on memoire's own stream (``cpp/core/device_ring.h``), and ``next`` hands out the
framework's arrays viewing the slot, zero-copy through DLPack: JAX arrays for ``"jax"`` or a
``jax.Device``, torch tensors for ``"cuda"``, ``"cuda:N"``, ``"cpu"`` or a ``torch.device``,
memoire's DLPack producers with ``dlpack=True``. The consumer's stream waits for the copy's
event (never its thread); the slot goes back when the framework frees the arrays (the DLPack
deleter), and the next copy into it waits for the consumer's stream to pass that point.
JAX on a GPU imports the slot once per batch and cuts the parts out of it with one jitted
function (``_JaxSplit``): its batches are new device arrays in JAX's dtypes (32-bit with x64
off), and the slot goes back once that split has run.
libcudart is loaded at run time (``memoire._cuda``); a CUDA device without a usable one raises
RuntimeError naming what was found. On a CPU device a host stand-in (memcpy into host "device"
slots, DLPack kDLCPU) runs the same ring. Metadata (keys, probabilities; a ReplayMemory batch's
``id``; the TF face's ``indices``) stays on the host. On other JAX platforms (TPU, ROCm) each
batch is ``jax.device_put`` one step ahead instead.

Prioritized replay: each batch is drawn and gathered under the store's lock, so a priority
update lands between two batches. Batches already in the ring were drawn before it: after an
``update``, at most ``depth`` batches (``depth + device_slots`` on the device path, ``depth +
1`` with ``jax.device_put``) come from the priorities before it. Every later batch sees it.

Lifetime of a batch: host batches are numpy views of a ring slot; the slot goes back to the
samplers when every array of the batch is dropped (holding on to ``depth`` batches stalls the
feed: ``next`` then raises RuntimeError after a short wait). Device batches hold their device
slot the same way (``device_slots`` of them held: RuntimeError), except JAX's on a GPU (split
out of the slot, they hold none). With ``jax.device_put`` the
put reads straight from the slot and the slot is released once that transfer is complete.

Errors: a failed draw raises on the ``next`` that receives it, with the exception the buffer's
synchronous ``sample`` raises (ValueError("No samples in replay buffer!") for an empty JAX
buffer; Dopamine's RuntimeError/ValueError for the TF face). Draws go on after an error, so a
buffer that fills later feeds again (after at most ``depth`` stale errors).

Shutdown: ``close()`` (or ``with Feed(...) as feed``, or garbage collection, or interpreter
exit) stops and joins the threads. Thread-safety: one consumer thread per feed.

Distinct frames travel once (``stack_on_device=True``, JAX face with a device): a slot holds
the batch's distinct frames ``dtype[F, *obs_shape]`` (F <= 2 * B * stack, the zero frame before
an episode's start counting as one) and ``index int32[B, 2, stack]`` instead of the stacks;
only those (and the small fields) are copied to the device, where a jitted gather assembles
state/next_state in the layout above, bit for bit what the host stacks would be. For
Atari-like stacks of 4 on long episodes a batch moves about 5/8 of the frame bytes. F is
rounded up to a multiple of ``_frames_granule(B)`` (zeros), so the gather compiles for a few
shapes only. ``last_transfer_bytes`` tells what the last batch moved. It is for accelerators:
on JAX's CPU device there is no bus to save and XLA's gather is slower than the native one.

DLPack: host batches are 64-byte aligned numpy views of a slot, so ``np.from_dlpack`` and
``jax.dlpack.from_dlpack`` (on JAX's CPU device) take them without a copy; such an array keeps
the slot, like any view.
"""

from __future__ import annotations

import functools
import gc
import sys
import weakref
from typing import Any, NamedTuple, Optional

import numpy as np

from memoire import _core

__all__ = ["Feed"]


def _close_native(holder: list) -> None:
    for native in holder:
        native.close()
    holder.clear()


class Feed:
    """Batches of ``buffer`` drawn ahead by native threads (see the module docstring).

    Args:
      buffer: memoire's JAX ``ReplayBuffer``, TF-face ``OutOfGraph(Prioritized)ReplayBuffer``
        or ``memoire.ReplayMemory``.
      batch_size: int >= 1 (default: the buffer's batch size; required for a ReplayMemory).
      depth: int >= 1, batches drawn ahead (ring slots).
      threads: int in [1, depth], sampler threads.
      seed: int >= 0 seeding the JAX-face draws (thread t uses seed + t); default 0.
      device: None for host numpy batches; ``"jax"`` (JAX's default device, uncommitted) or a
        ``jax.Device`` (committed to it): JAX arrays; ``"cuda"``, ``"cuda:N"``, ``"cpu"`` or a
        ``torch.device``: PyTorch tensors. On a CUDA or CPU device the batches come from a
        ring of ``device_slots`` device slots a native copy thread fills (the device path,
        zero-copy through DLPack); on another JAX platform by ``jax.device_put`` one step ahead.
      with_sample_metadata: JAX face: yield ``(batch, metadata)`` as ``sample`` does.
      stack_on_device: JAX face with a JAX device: copy each distinct frame once and stack on
        the device (same batches, fewer bytes moved; see the module docstring).
      device_slots: int >= 1, device slots of the device path (default 3: one the learner's
        step reads, one ready, one being copied).
      dlpack: hand out memoire's DLPack arrays (``_core.DeviceArray``: ``__dlpack__``,
        ``__dlpack_device__``) instead of the framework's, for any DLPack consumer
        (``cupy.from_dlpack``, ``np.from_dlpack`` on ``device="cpu"``).

    Raises:
      TypeError: ``buffer`` is not one of the supported buffers.
      ValueError: a bad batch_size, depth, threads, seed, device or device_slots;
        ``stack_on_device`` without a JAX device or for another buffer than the JAX face.
      ImportError: the device's framework (JAX, PyTorch) is not installed.
      RuntimeError: a CUDA device, but no usable CUDA runtime (the message names what was
        found: ``memoire._cuda.runtime``).
    """

    def __init__(
        self,
        buffer,
        batch_size: Optional[int] = None,
        *,
        depth: int = 4,
        threads: int = 1,
        seed: Optional[int] = None,
        device: Any = None,
        with_sample_metadata: bool = False,
        stack_on_device: bool = False,
        device_slots: int = 3,
        dlpack: bool = False,
    ) -> None:
        self._buffer = buffer
        self._kind = _kind_of(buffer)
        if self._kind == "stream":
            # One consumer per connection: the stream's own feed (SamplingStream makes it).
            if buffer._feed_made:
                raise ValueError("buffer: a SamplingStream has its own feed; iterate the stream")
            buffer._feed_made = True
        if batch_size is None:
            if self._kind == "memory":
                raise ValueError("batch_size: expected an int >= 1 for a ReplayMemory, got None")
            batch_size = buffer._batch_size
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, (int, np.integer))
            or batch_size < 1
        ):
            raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
        for name, value in (("depth", depth), ("threads", threads), ("device_slots", device_slots)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if threads > depth:
            raise ValueError(f"threads: expected <= depth ({depth}), got {threads}")
        seed = 0 if seed is None else seed
        if (
            isinstance(seed, bool)
            or not isinstance(seed, (int, np.integer))
            or not 0 <= seed < 2**64
        ):
            raise ValueError(f"seed: expected an int in [0, 2**64), got {seed!r}")
        self._batch_size = int(batch_size)
        self._depth = int(depth)
        self._threads = int(threads)
        self._seed = int(seed)
        self._with_metadata = bool(with_sample_metadata)
        # Where batches go: None (host), the device path (a ring of device slots, DLPack), or
        # jax.device_put one step ahead (a JAX platform other than CUDA and CPU).
        self._target = _target_of(device, bool(dlpack))
        self._device = self._target.jax_device if self._target.put else None
        self._put_to = self._target.put_to
        self._device_slots = int(device_slots)
        if self._target.cuda:
            # A missing or unusable CUDA runtime fails here, with what was found.
            count = _cuda_runtime().device_count
            if not 0 <= self._target.device_id < count:
                raise ValueError(f"device: expected a CUDA device in [0, {count}), got {device!r}")
        if stack_on_device and (self._kind != "jax" or self._target.framework != "jax"):
            raise ValueError(
                "stack_on_device: expected a JAX ReplayBuffer feed with a JAX device "
                f"(got a {self._kind} feed, device={device!r})"
            )
        if self._target.put and self._kind in ("memory", "stream"):
            raise ValueError(
                f"device: a ReplayMemory or stream feed goes to CUDA or CPU devices, got {device!r}"
            )
        self._stack_on_device = bool(stack_on_device)
        self._last_transfer_bytes = 0
        self._source = None  # the native store the ring draws from
        self._holder: list = []  # the native feed, shared with the finalizer
        self._finalizer = weakref.finalize(self, _close_native, self._holder)
        self._pending = None  # (host batch, device batch) in transfer
        self._pending_error: Optional[Exception] = None  # the draw after the pending one failed
        # JAX on CUDA: each batch's device slot is imported once and split on the device.
        self._split = _JaxSplit(self._target.convert) if self._target.split else None
        self._closed = False

    # ---- the native ring ----

    def _native(self):
        """The native feed over the buffer's current store (rebuilt when the buffer replaced
        its store, e.g. on load), or None when the JAX buffer has no store yet."""
        source = {
            "jax": lambda b: b._store,
            "tf": lambda b: b._core,
            "memory": lambda b: b,
            "stream": lambda b: b._sources,  # one per connection
        }[self._kind](self._buffer)
        if source is None:
            return None
        if source is not self._source:
            _close_native(self._holder)
            n = self._batch_size
            granule = 0
            if self._kind == "jax" and self._stack_on_device:
                b = self._buffer
                granule = _frames_granule(n)
                action = b._empty_batch(1)[1]
                frames = _core.Feed.distinct_frames_capacity(n, b._stack_size, granule)
                templates = [
                    np.empty(n, np.int32),
                    np.empty(n, np.float64),
                    np.empty((frames, *b._obs_shape), b._obs_dtype),
                    np.empty((n, 2, b._stack_size), np.int32),
                    np.empty(2, np.int32),
                    np.empty((n, *action.shape[1:]), action.dtype),
                    np.empty(n, np.float64),
                    np.empty(n, np.bool_),
                    np.empty(n, np.bool_),
                ]
            elif self._kind == "jax":
                templates = [
                    np.empty(n, np.int32),
                    np.empty(n, np.float64),
                    *self._buffer._empty_batch(n),
                ]
            elif self._kind == "tf":
                templates = list(self._buffer._create_batch_arrays(n))
            else:  # the native feed sizes a ReplayMemory or stream batch from its layout
                templates = []
            host = _core.Feed(source, templates, n, self._depth, self._threads, self._seed, granule)
            self._holder.append(host)
            if self._target.ring:
                self._holder.append(self._device_feed(host, len(templates)))
            self._source = source
        return self._holder[-1]

    def _device_feed(self, host, parts: int):
        """The ring of device slots over the host ring ``host`` (``parts`` template arrays):
        metadata (keys, probabilities, ids, counts) stays on the host, the rest travels."""
        trim = None
        if self._kind == "jax":
            to_device = [False, False] + [True] * (parts - 2)
            if self._stack_on_device:  # frames travel up to the padded count counts[1]
                to_device[4] = False
                trim = [2, 4, 1]
        elif self._kind == "tf":
            to_device = [True] * parts
            to_device[7] = False  # indices: for set_priority on the host
        else:  # ReplayMemory's 18 parts (id last, for update_weights), a stream's 2 more
            to_device = [True] * 17 + [False] * (1 if self._kind == "memory" else 3)
        t = self._target
        return _core.DeviceFeed(
            host,
            _cuda_runtime() if t.cuda else None,
            t.device_id,
            self._device_slots,
            to_device,
            trim,
        )

    def _take_host(self):
        """The next batch as host arrays (views of a ring slot), in the buffer's layout."""
        if self._closed:
            raise RuntimeError("the feed is closed")
        native = self._native()
        if native is None:  # a JAX buffer before its first add, as sample() raises
            raise ValueError("No samples in replay buffer!")
        split = self._split
        if split is not None:
            # Once this batch is taken, one slot stays free for the copy thread to fill the
            # next one while the learner's step runs: copy and step overlap.
            split.drain(max(0, self._device_slots - 2))
        try:
            try:
                parts = native.take(True) if split is not None else native.take()
            except RuntimeError as e:
                if hasattr(e, "frame_stack"):
                    # The ReplayMemory's frame_stack changed: size a new ring for it.
                    self._source = None
                    return self._take_host()
                if not hasattr(e, "held"):
                    raise
                # Every slot is referenced. A device copy may hold its source batch in a
                # reference cycle (JAX defers that release): collect once, then give up.
                gc.collect()
                parts = native.take(True) if split is not None else native.take()
        except (KeyError, IndexError, RuntimeError, ValueError) as e:
            raise self._sample_error(e) from None
        if split is not None:
            self._last_transfer_bytes = sum(
                p.nbytes for p in parts[1] if isinstance(p, _core.DeviceArray)
            )
            parts = split(*parts)
        elif self._target.ring:
            self._last_transfer_bytes = sum(
                p.nbytes for p in parts if isinstance(p, _core.DeviceArray)
            )
            convert = self._target.convert
            parts = tuple(p if not isinstance(p, _core.DeviceArray) else convert(p) for p in parts)
        if self._kind in ("memory", "stream"):
            from memoire.memory import Batch

            batch = Batch(tuple(parts[0:7]), tuple(parts[7:14]), *parts[14:18])
            if self._kind == "stream":  # as RemoteMemory.sample: the normaliser of the draw
                batch.num_sampleable, batch.total_weight = int(parts[18][0]), float(parts[19][0])
            return batch
        self._buffer._sample_count += self._batch_size
        if self._kind == "tf":
            return parts
        # Dopamine's own element types, which the JAX face returns (the library does not
        # import the face)
        from dopamine.jax.replay_memory import elements, samplers

        if self._stack_on_device:
            # The distinct frames that travel (up to the padded count) and the rest as is.
            frames, index, counts = parts[2:5]
            if self._target.ring:  # already trimmed to the padded count, on the device
                batch = _stack_distinct(_Distinct(frames, index, *parts[5:]))
            else:
                batch = _Distinct(frames[: int(counts[1])], index, *parts[5:])
            parts = parts[:2]
        else:
            batch = elements.ReplayElement(*parts[2:])
        if not self._with_metadata:
            return batch
        if self._buffer._prioritized:
            meta = samplers.PrioritizedSampleMetadata(keys=parts[0], probabilities=parts[1])
        else:
            meta = samplers.SampleMetadata(keys=parts[0])
        return batch, meta

    def _sample_error(self, error: Exception) -> Exception:
        """The exception the buffer's synchronous sample raises where the draw raised ``error``."""
        if self._kind == "tf":
            return self._buffer._dopamine_sample_error(error, self._batch_size)
        if isinstance(error, RuntimeError) and hasattr(error, "timeout"):  # a silent server
            return TimeoutError(str(error))
        if isinstance(error, RuntimeError) and hasattr(error, "needed"):
            return ValueError("No samples in replay buffer!")
        return error

    # ---- the learner's side ----

    def __iter__(self) -> "Feed":
        return self

    def __next__(self):
        """The next batch (host arrays, or the device framework's arrays with ``device``);
        blocks until ready."""
        if self._device is None:  # host batches, or the device path (a ring of device slots)
            return self._take_host()
        import jax

        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise error
        if self._pending is None:
            self._pending = self._put(self._take_host())
        host, current, meta = self._pending
        self._pending = None
        # Start the next transfer before handing this one out, so it overlaps the learner's
        # step on `current`. An error in the next draw is kept for the next call.
        try:
            self._pending = self._put(self._take_host())
        except (KeyError, IndexError, RuntimeError, ValueError, AssertionError) as e:
            # Without its traceback: the frame it holds would keep `host` (a slot) alive.
            self._pending_error = e.with_traceback(None)
        if host is not None:
            # The slot of `host` is reused once its views are dropped: the copy must be done
            # first (it had the learner's previous step to run).
            jax.block_until_ready(current)
            del host
        return current if meta is None else (current, meta)

    def _put(self, taken):
        """(host batch or None, its device copy in flight, metadata or None) for a taken batch;
        the metadata (keys, probabilities) stays on the host, as ``sample`` returns it."""
        import jax

        host, meta = taken if (self._kind == "jax" and self._with_metadata) else (taken, None)
        self._last_transfer_bytes = sum(a.nbytes for a in jax.tree_util.tree_leaves(host))
        put = jax.device_put(host, self._put_to)  # a TPU or ROCm device: never CPU or CUDA
        if self._stack_on_device:
            put = _stack_distinct(put)  # dispatched, runs on the device after the copy
        return host, put, meta

    def take(self):
        """Same as ``next(feed)``."""
        return next(self)

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def last_transfer_bytes(self) -> int:
        """Bytes the last batch put on the device moved host -> device (0 before the first
        and with device=None): its arrays, the metadata (which stays on the host) excluded."""
        return self._last_transfer_bytes

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def device_slots(self) -> int:
        """Device slots of the device path (0 without one): with ``depth``, the bound on
        batches drawn before a priority update (``depth + device_slots``)."""
        return self._device_slots if self._target.ring else 0

    @property
    def threads(self) -> int:
        return self._threads

    def close(self) -> None:
        """Stops and joins the sampler threads; later ``next`` calls raise RuntimeError.
        Batches already handed out stay valid. Idempotent."""
        self._closed = True
        self._pending = None
        self._pending_error = None
        if self._split is not None:
            self._split.drain(0)
        self._finalizer()

    def __enter__(self) -> "Feed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Distinct(NamedTuple):
    """A JAX-face batch as it travels with ``stack_on_device``: ``frames dtype[P, *obs_shape]``
    (the distinct frames, zero-padded to P), ``index int32[B, 2, stack]`` (state's frames,
    then next_state's, oldest first), and the other fields of ``ReplayElement``."""

    frames: Any
    index: Any
    action: Any
    reward: Any
    is_terminal: Any
    episode_end: Any


def _frames_granule(batch_size: int) -> int:
    """Distinct frames travel in multiples of this (zero-padded), so that the device's gather
    compiles for a few shapes: 8 frames, or a quarter of the batch when that is more."""
    return max(8, batch_size // 4)


_STACK_JIT = None


def _stack_distinct(d: _Distinct):
    """The ReplayElement a ``_Distinct`` batch stands for, assembled by a jitted gather where
    its arrays are (state/next_state ``dtype[B, *obs_shape, stack]``, oldest frame first)."""
    global _STACK_JIT
    if _STACK_JIT is None:
        import jax
        import jax.numpy as jnp

        def stack(frames, index):
            stacks = jnp.take(frames, index, axis=0, mode="clip")  # [B, 2, stack, *obs]
            stacks = jnp.moveaxis(stacks, 2, -1)  # [B, 2, *obs, stack]
            return stacks[:, 0], stacks[:, 1]

        _STACK_JIT = jax.jit(stack)
    from dopamine.jax.replay_memory import elements

    state, next_state = _STACK_JIT(d.frames, d.index)
    return elements.ReplayElement(
        state, d.action, d.reward, next_state, d.is_terminal, d.episode_end
    )


# The JAX platforms whose device-path batches are split on the device from one import of the
# slot (_JaxSplit). On the CPU each part is imported zero-copy instead (an import there costs
# microseconds and a split would copy); tests add "cpu" to run the split path.
_SPLIT_PLATFORMS = ("gpu", "cuda")


class _JaxSplit:
    """JAX batches from a device slot with one import and one dispatch per batch.

    ``__call__(block, parts)`` takes what ``DeviceFeed.take(block=True)`` returns: ``block``
    (``DeviceArray uint8[slot bytes]``, the slot's whole device block) and the batch's parts.
    It imports the block once (``convert``) and cuts every device part out of it with one
    jitted function (slice, bitcast, reshape: on the device, asynchronous): new device arrays,
    so the batch the learner holds no longer holds the slot. The imported block stays
    referenced until the split's outputs are ready (``drain``), then goes back to the ring.
    Every array is in a dtype JAX holds (``_split_fn``: with x64 off, 64-bit parts become
    32-bit on the device), so a jitted step never converts an argument on entry (which, for
    a float64 array, waited for the device on the learner's thread). Host parts (metadata)
    are copied out of the slot's host mirror. One consumer thread, like the feed.
    """

    def __init__(self, convert) -> None:
        self._convert = convert
        self._fns: dict = {}  # layout -> the jitted split
        self._blocks: list = []  # (imported block, one output of its split), oldest first

    def drain(self, keep: int) -> None:
        """Lets go of the blocks whose split is done, and waits for the oldest ones until at
        most ``keep`` blocks are referenced (each holds a device slot)."""
        blocks = self._blocks
        while blocks and (len(blocks) > keep or blocks[0][1].is_ready()):
            blocks.pop(0)[1].block_until_ready()

    def __call__(self, block, parts):
        base = block.pointer
        layout = tuple(
            (i, p.pointer - base, tuple(p.shape), p.dtype.str)
            for i, p in enumerate(parts)
            if isinstance(p, _core.DeviceArray)
        )
        fn = self._fns.get(layout)
        if fn is None:
            fn = self._fns[layout] = _split_fn(layout)
        raw = self._convert(block)
        pieces = fn(raw)
        # Host parts (metadata: B values) are copied, so that no array of the batch holds the slot
        out = [p.copy() if isinstance(p, np.ndarray) else p for p in parts]
        for (i, *_), x in zip(layout, pieces):
            out[i] = x
        if pieces:
            self._blocks.append((raw, pieces[0]))
        return tuple(out)


@functools.lru_cache(maxsize=None)
def _jax_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype JAX holds ``dtype`` as (float64 -> float32 etc. with x64 off)."""
    import jax

    try:
        return np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    except AttributeError:  # another JAX: ask an array
        return np.dtype(jax.numpy.zeros(0, dtype).dtype)


def _f64_bits_to_f32(lo, hi):
    """float32 values of float64 bit patterns given as uint32 words (``lo``, ``hi``), in 32-bit
    arithmetic (JAX with x64 off holds no float64): rounded to nearest even as numpy's
    ``astype(float32)``; beyond float32's range +-inf; NaN a quiet NaN; below its normal range
    (|x| < 1.18e-38) +-0, as XLA's GPU kernels flush float32 subnormals."""
    import jax.numpy as jnp
    from jax import lax

    u = np.uint32
    sign = hi & u(0x80000000)
    e = ((hi >> u(20)) & u(0x7FF)).astype(np.int32)  # float64's biased exponent
    mant = ((hi & u(0xFFFFF)) << u(3)) | (lo >> u(29))  # its top 23 mantissa bits
    rest = lo & u(0x1FFFFFFF)  # the 29 bits rounded off
    half = u(0x10000000)
    up = (rest > half) | ((rest == half) & ((mant & u(1)) == u(1)))
    e32 = e - (1023 - 127)
    # A carry out of the mantissa moves to the exponent (and to inf from the largest float32).
    normal = ((jnp.clip(e32, 1, 254).astype(u) << u(23)) | mant) + up.astype(u)
    nan = ((hi & u(0xFFFFF)) | lo) != u(0)
    special = jnp.where(nan, u(0x7FC00000), u(0x7F800000))
    bits = jnp.where(
        e == 0x7FF,
        special,
        jnp.where(e32 >= 255, u(0x7F800000), jnp.where(e32 <= 0, u(0), normal)),
    )
    return lax.bitcast_convert_type(bits | sign, np.float32)


def _split_fn(layout):
    """A jitted function taking ``uint8[n]`` to the arrays ``layout`` names: (part index, byte
    offset, shape, dtype str) each; bools are the bytes != 0; with x64 off (JAX holds no
    64-bit values) a 64-bit integer part is its low word (``jax.device_put``'s conversion) and
    a float64 part float32 (``_f64_bits_to_f32``)."""
    import jax
    from jax import lax

    def split(raw):
        pieces = []
        for _, offset, shape, dtype in layout:
            dt = np.dtype(dtype)
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            seg = lax.slice(raw, (offset,), (offset + n,))
            if dt == np.bool_:
                x = seg != 0
            elif dt.itemsize == 1:
                x = lax.bitcast_convert_type(seg, dt)
            elif _jax_dtype(dt) != dt:  # 64-bit with x64 off
                words = lax.bitcast_convert_type(seg.reshape(-1, 4), np.uint32).reshape(-1, 2)
                if dt.kind == "f":
                    x = _f64_bits_to_f32(words[:, 0], words[:, 1])
                else:
                    x = lax.bitcast_convert_type(words[:, 0], dt.kind + "4")
            else:
                x = lax.bitcast_convert_type(seg.reshape(-1, dt.itemsize), dt)
            pieces.append(x.reshape(shape))
        return tuple(pieces)

    return jax.jit(split)


def _kind_of(buffer) -> str:
    if isinstance(buffer, _core.ReplayMemory):
        return "memory"
    stream = sys.modules.get("memoire.stream")
    if stream is not None and isinstance(buffer, stream.SamplingStream):
        return "stream"
    jrb = sys.modules.get("memoire.dopamine_compat.jax_replay_buffer")
    if jrb is not None and isinstance(buffer, jrb.ReplayBuffer):
        return "jax"
    crb = sys.modules.get("memoire.dopamine_compat.circular_replay_buffer")
    if crb is not None and isinstance(buffer, crb.OutOfGraphReplayBuffer):
        if not buffer._fast_sampling:
            raise TypeError(
                f"buffer: {type(buffer).__name__} draws its own indices "
                "(sample_index_batch is overridden); the feed cannot draw for it"
            )
        return "tf"
    raise TypeError(
        "buffer: expected memoire.ReplayMemory, or memoire's JAX ReplayBuffer or "
        "OutOfGraphReplayBuffer (memoire.dopamine_compat), got "
        f"{type(buffer).__name__}"
    )


class _Target(NamedTuple):
    """Where a feed's batches go. ``ring``: the device path (device slots, DLPack; ``cuda``
    on a CUDA device ``device_id``, else the host stand-in); ``put``: jax.device_put one step
    ahead to ``jax_device`` (``put_to`` is device_put's argument: None keeps it uncommitted);
    ``convert`` turns a ``_core.DeviceArray`` into the framework's array."""

    framework: Optional[str]  # None (host batches), "jax", "torch", "dlpack"
    ring: bool = False
    cuda: bool = False
    device_id: int = 0
    put: bool = False
    jax_device: Any = None
    put_to: Any = None
    convert: Any = None
    split: bool = False  # JAX: one import per batch, split on the device (_JaxSplit)


def _target_of(device, dlpack: bool) -> _Target:
    """The _Target of ``Feed(device=..., dlpack=...)``; ValueError on a device it cannot feed."""
    expected = "None, 'jax', a jax.Device, 'cuda', 'cuda:N', 'cpu' or a torch.device"
    if device is None:
        if dlpack:
            raise ValueError("dlpack: expected a device (host batches are numpy arrays)")
        return _Target(None)
    is_torch = type(device).__module__ == "torch" and type(device).__name__ == "device"
    if is_torch or (
        isinstance(device, str)
        and (device in ("cuda", "cpu") or (device.startswith("cuda:") and device[5:].isdigit()))
    ):
        kind, _, index = str(device).partition(":")
        if dlpack:
            convert = _identity
        else:
            try:
                import torch
            except ImportError:
                raise ImportError(
                    f"device={device!r} hands out PyTorch tensors, and PyTorch is not installed "
                    "(dlpack=True hands out DLPack arrays for any consumer)"
                ) from None
            convert = torch.from_dlpack
        if kind == "cpu":
            return _Target("dlpack" if dlpack else "torch", ring=True, convert=convert)
        if not index and not dlpack:
            import torch

            index = str(torch.cuda.current_device())
        return _Target(
            "dlpack" if dlpack else "torch",
            ring=True,
            cuda=True,
            device_id=int(index or 0),
            convert=convert,
        )
    try:
        import jax
    except ImportError:
        if device == "jax":
            raise ImportError(
                f"device={device!r} needs JAX (pip install jax); device=None hands out host batches"
            ) from None
        raise ValueError(f"device: expected {expected}, got {device!r}") from None
    if isinstance(device, str) and device == "jax":
        target, put_to = jax.devices()[0], None
    elif isinstance(device, jax.Device):
        target, put_to = device, device
    else:
        raise ValueError(f"device: expected {expected}, got {device!r}")
    platform = target.platform
    if platform not in ("cpu", "gpu", "cuda"):  # TPU, ROCm: JAX's own transfer
        if dlpack:
            raise ValueError(f"dlpack: the device path feeds CUDA and CPU devices, not {platform}")
        return _Target("jax", put=True, jax_device=target, put_to=put_to)
    convert = _identity if dlpack else _jax_convert(target, committed=put_to is not None)
    return _Target(
        "dlpack" if dlpack else "jax",
        ring=True,
        cuda=platform != "cpu",
        device_id=getattr(target, "local_hardware_id", None) or 0,
        jax_device=target,
        convert=convert,
        split=not dlpack and platform in _SPLIT_PLATFORMS,
    )


def _identity(x):
    return x


# Switches for a device check (benchmarks/gpu_feed_probe.py): jaxlib's private DLPack import
# (else jax.dlpack.from_dlpack), and the uncommitted re-wrap of device="jax" arrays.
_JAX_PRIVATE_IMPORT = True
# The platforms where device="jax" arrays are re-wrapped as uncommitted (a private ArrayImpl
# constructor). Not on GPUs: there (JAX 0.11.2, CUDA 13, two device runs) the re-wrapped
# arrays crashed the interpreter at a later garbage collection; without the re-wrap, and with
# jax.dlpack.from_dlpack, the same checks passed. GPU batches are committed to their device.
_JAX_UNCOMMITTED_WRAP = ("cpu",)


def _jax_convert(device, committed: bool):
    """A function taking a ``_core.DeviceArray`` to a ``jax.Array`` on ``device``, zero-copy,
    committed to it or not (``device="jax"``: uncommitted, as ``device_put(x)`` makes it).

    ``jax.dlpack.from_dlpack`` ends in ``jnp.asarray``, which dispatches an operation per
    array (hundreds of microseconds on a loaded host): the learner's thread would pay that
    for each array of each batch. So the import is done as ``from_dlpack`` does it internally,
    once the stream is known, through jaxlib's ``dlpack_managed_tensor_to_buffer``; where that
    private function is missing or its signature changed, the public ``from_dlpack``."""
    import jax

    try:
        from jax._src.array import ArrayImpl
        from jax._src.lib import xla_client

        to_buffer = xla_client._xla.dlpack_managed_tensor_to_buffer
    except (ImportError, AttributeError):
        to_buffer = ArrayImpl = None
    try:  # the stream JAX wants the producer to order its copy before (None on CPU)
        stream = device.get_stream_for_external_ready_events()
    except Exception:  # noqa: BLE001 - UNIMPLEMENTED on CPU, per jax.dlpack
        stream = None
    # None: not tried yet; True: the private path works here; False: the public one.
    fast = [None if to_buffer is not None and _JAX_PRIVATE_IMPORT else False]
    wrap = [not committed and device.platform in _JAX_UNCOMMITTED_WRAP]

    def public(a):
        if committed:
            return jax.dlpack.from_dlpack(a, device=device)
        return jax.dlpack.from_dlpack(a)

    def convert(a):
        if fast[0] is False:
            return public(a)
        try:
            # -1: no ordering asked of the producer. A slot is handed out once its copy is
            # complete, and JAX frees an imported buffer once its computations are done, so
            # JAX's DLPack deleter (on one of its own threads) need not call into CUDA.
            x = to_buffer(a.__dlpack__(stream=None if stream is None else -1), device, stream)
        except Exception:  # noqa: BLE001 - once it worked, a failure is the caller's
            if fast[0]:
                raise
            fast[0] = False  # another jaxlib: the public path from now on
            return public(a)
        fast[0] = True
        if wrap[0]:
            try:
                return ArrayImpl(x.aval, x.sharding, x._arrays, committed=False)
            except Exception:  # noqa: BLE001 - another jaxlib: keep it committed
                wrap[0] = False
        return x

    return convert


def _cuda_runtime():
    from memoire import _cuda

    return _cuda.runtime()
