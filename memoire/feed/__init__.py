"""A prefetching feed: native threads sample batches ahead of the learner.

``Feed(buffer, batch_size)`` starts ``threads`` sampler threads in C++ (no GIL) that draw batches
from ``buffer`` into a ring of ``depth`` reusable, 64-byte aligned host buffers
(``cpp/core/prefetch.h``). The learner's ``next(feed)`` takes the next ready batch: no sampling,
no copy, no allocation on the learner's thread. docs/FEED.md has the whole story and the
figures.

Sources (``_sources``): memoire's JAX ``ReplayBuffer`` (Dopamine's ``ReplayElement``, and with
``with_sample_metadata`` its ``SampleMetadata``, drawn with the core's seedable generator: the
same distribution as ``sample()``, another stream), the TF face's
``OutOfGraph(Prioritized)ReplayBuffer`` (``sample_transition_batch()``'s tuple, drawn by the
buffer's own generator), ``memoire.ReplayMemory`` (``get_batch()``'s ``Batch``; a later
``frame_stack`` change resizes the ring) and a ``SamplingStream`` over the socket (its batches
received and stacked into the ring on arrival).

Host batches (``device=None``) are numpy views of a ring slot; the slot goes back to the samplers
when every array of the batch is dropped (holding ``depth`` batches stalls the feed: ``next``
then raises RuntimeError).

The device path (``device`` on a CUDA or CPU device): one native copy thread copies each host
batch into one of ``device_slots`` device slots (cudaMemcpyAsync on memoire's own stream,
``cpp/core/device_ring.h``; on a CPU device a memcpy into host "device" slots, the same ring).
Each slot is imported into the framework once, and its arrays are lent with every batch it
holds: ``next`` takes a slot index and hands out arrays that already exist (a few microseconds;
no import, no dispatch, no copy on the learner's thread). A lent batch goes back:

- JAX (``"jax"``, a ``jax.Device``): when the learner says what read it, ``feed.release(after)``
  with anything the step computed from it (its loss, new parameters): the slot is refilled
  once that is ready. The learner's thread never waits for it. Without a ``release`` before the
  next ``next``, the batch's arrays are deleted instead (JAX frees them once the work queued on
  them is done, which gives the slot back) and the slot is imported again: correct, slower, and
  a deleted array used later raises. 64-bit parts arrive as JAX holds them (with x64 off,
  float64 as float32 rounded as numpy does, integers as their low 32 bits).
- PyTorch (``"cuda"``, ``"cuda:N"``, ``"cpu"``, a ``torch.device``) and ``dlpack=True``
  (memoire's DLPack arrays for any consumer): at the next ``next`` (or ``release``), ordered
  after the work queued so far on the consumer's current stream. Tensors stay at fixed
  addresses per slot, so a captured CUDA graph can read them. Keep a batch longer: clone it.

Metadata (keys, probabilities, a memory's ``id``, the TF face's ``indices``) stays on the host,
copied per batch. libcudart is loaded at run time (``memoire._cuda``). On other JAX platforms
(TPU, ROCm) each batch is ``jax.device_put`` one step ahead instead.

Prioritized replay: a priority update lands between two batches. Batches already drawn came
from the priorities before it: at most ``depth`` (``depth + device_slots`` on the device path,
``depth + 1`` with ``jax.device_put``).

Errors: a failed draw raises on the ``next`` that receives it, with the exception the buffer's
synchronous ``sample`` raises. Draws go on after an error, so a buffer that fills later feeds
again.

``stack_on_device=True`` (JAX face, JAX device): each distinct frame of a batch travels once
(``frames dtype[F, *obs]``, F padded to a multiple of ``_sources.frames_granule(B)``, and
``index int32[B, 2, stack]``), and a jitted gather assembles state/next_state on the device, bit
for bit the host stacks: about 5/8 of the frame bytes for Atari stacks of 4.

Shutdown: ``close()`` (or ``with``, garbage collection, interpreter exit) stops and joins the
threads; arrays handed out stay valid memory. Thread-safety: one consumer thread per feed.
"""

from __future__ import annotations

import gc
import time
import weakref
from typing import Any, Optional

import numpy as np

from memoire import _core
from memoire.feed import _jax, _sources, _torch
from memoire.feed._sources import BatchSource, DeviceLayout, frames_granule
from memoire.feed._targets import target_of

__all__ = ["BatchSource", "DeviceLayout", "Feed", "frames_granule"]

# How long a take waits for a slot whose arrays JAX has yet to free (a learner that releases
# nothing and runs every slot ahead of its steps) before it says so, in seconds.
_HELD_PATIENCE = 10.0


def _close_native(holder: list) -> None:
    for native in reversed(holder):  # the lender first, then the rings
        native.close()
    holder.clear()


class Feed:
    """Batches of ``buffer`` drawn ahead by native threads (see the module docstring).

    Args:
      buffer: memoire's JAX ``ReplayBuffer``, TF-face ``OutOfGraph(Prioritized)ReplayBuffer``
        or ``memoire.ReplayMemory`` (a ``SamplingStream`` makes its own feed).
      batch_size: int >= 1 (default: the buffer's batch size; required for a ReplayMemory).
      depth: int >= 1, batches drawn ahead (host ring slots).
      threads: int in [1, depth], sampler threads.
      seed: int >= 0 seeding the JAX-face draws (thread t uses seed + t); default 0.
      device: None for host numpy batches; ``"jax"`` (JAX's default device, uncommitted) or a
        ``jax.Device`` (committed to it): JAX arrays; ``"cuda"``, ``"cuda:N"``, ``"cpu"`` or a
        ``torch.device``: PyTorch tensors. On a CUDA or CPU device batches are lent from
        ``device_slots`` device slots (the device path); on another JAX platform each is
        ``jax.device_put`` one step ahead.
      with_sample_metadata: JAX face: yield ``(batch, metadata)`` as ``sample`` does.
      stack_on_device: JAX face with a JAX device: copy each distinct frame once and stack on
        the device (same batches, fewer bytes moved).
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
        self._kind, self._batches = _sources.kind_of(buffer)
        if self._kind == "stream":
            # One consumer per connection: the stream's own feed (SamplingStream makes it).
            if buffer._feed_made:
                raise ValueError("buffer: a SamplingStream has its own feed; iterate the stream")
            buffer._feed_made = True
            if buffer.shared_memory and device is None:
                raise ValueError("buffer: a shared-memory stream's slots are its ring (no feed)")
        if batch_size is None:
            if self._kind == "memory":
                raise ValueError("batch_size: expected an int >= 1 for a ReplayMemory, got None")
            batch_size = buffer.batch_size if self._kind == "stream" else self._batches.batch_size
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
        # Only a source with sample metadata pairs its batches with it.
        self._with_metadata = bool(with_sample_metadata) and (
            self._batches is not None and self._batches.has_metadata
        )
        self._target = target_of(device, bool(dlpack))
        self._device_slots = int(device_slots)
        if self._target.cuda:
            # A missing or unusable CUDA runtime fails here, with what was found.
            count = _cuda_runtime().device_count
            if not 0 <= self._target.device_id < count:
                raise ValueError(f"device: expected a CUDA device in [0, {count}), got {device!r}")
        if stack_on_device and not (
            self._batches is not None
            and self._batches.stacks_on_device
            and self._target.framework == "jax"
        ):
            what = self._kind if self._batches is None else self._batches.name
            raise ValueError(
                "stack_on_device: expected a JAX ReplayBuffer feed with a JAX device "
                f"(got a {what} feed, device={device!r})"
            )
        if self._target.put and self._kind in ("memory", "stream"):
            raise ValueError(
                f"device: a ReplayMemory or stream feed goes to CUDA or CPU devices, got {device!r}"
            )
        self._stack_on_device = bool(stack_on_device)
        self._last_transfer_bytes = 0  # the host and device_put paths
        self._last_slot = -1  # the device path: the slot of the last batch lent
        self._source = None  # the native source the rings draw from
        # The native rings (and the lender over the device ring), shared with the finalizer.
        self._holder: list = []
        self._finalizer = weakref.finalize(self, _close_native, self._holder)
        self._host = self._ring = self._lender = None
        self._put = None  # jax.device_put one step ahead (_jax.PutAhead)
        self._closed = False

    # ---- the native rings ----

    def _native(self):
        """The host ring over the buffer's current source (rebuilt when the buffer replaced
        its store, e.g. on load, or when a memory's frame_stack changed), or None when the JAX
        buffer has no store yet."""
        source = _sources.native_source(self._kind, self._buffer, self._batches)
        if source is None:
            return None
        if source is not self._source:
            self._close_rings()
            n = self._batch_size
            if self._kind == "stream" and self._buffer.shared_memory:
                # The server writes each batch into a slot of the mapping: those slots are the
                # host ring the device ring copies from (only with a device: see the stream).
                host = source[0]
            else:
                templates, granule = _sources.host_templates(
                    self._kind, self._batches, n, self._stack_on_device
                )
                host = _core.Feed(
                    source, templates, n, self._depth, self._threads, self._seed, granule
                )
                self._holder.append(host)
            self._host = host
            if self._target.ring:
                self._make_device_ring(host)
            self._source = source
        return self._host

    def _make_device_ring(self, host) -> None:
        t = self._target
        dtypes = host.dtypes
        layout = _sources.device_layout(
            self._kind, self._batches, len(dtypes), self._stack_on_device
        )
        narrow = None
        if t.framework == "jax":
            narrow = _jax.narrowed(dtypes, layout.to_device)
        ring = _core.DeviceFeed(
            host,
            _cuda_runtime() if t.cuda else None,
            t.device_id,
            self._device_slots,
            layout.to_device,
            layout.trim,
            narrow,
        )
        self._holder.append(ring)
        self._ring = ring
        # (Nothing the holder keeps may reference the feed: the finalizer holds the holder.)
        share = _sources.slot_share(self._kind, self._batches, self._stack_on_device)
        if t.framework == "jax":
            convert = _jax.jax_convert(t.jax_device, committed=t.committed)
            self._lender = _jax.JaxLender(ring, convert, self._device_slots, share)
        else:
            if t.framework == "dlpack":  # memoire's DLPack arrays themselves
                convert = lambda a: a  # noqa: E731
                stream = _torch.dlpack_stream if t.cuda else _torch.no_stream
            else:
                import torch

                convert = torch.from_dlpack
                stream = _torch.torch_stream(t.device_id) if t.cuda else _torch.no_stream
            self._lender = _torch.StreamLender(ring, convert, self._device_slots, stream, share)
        self._holder.append(self._lender)

    def _close_rings(self) -> None:
        _close_native(self._holder)
        self._host = self._ring = self._lender = None

    # ---- the learner's side ----

    def __iter__(self) -> "Feed":
        return self

    def __next__(self):
        """The next batch (host arrays, or the device framework's arrays with ``device``);
        blocks until ready."""
        if self._target.ring:
            return self._take_lent()
        if self._target.put:
            if self._put is None:
                self._put = _jax.PutAhead(
                    self._target.put_to,
                    self._stack_on_device,
                    with_metadata=self._with_metadata,
                    element=None if self._batches is None else self._batches.element,
                )
            batch, self._last_transfer_bytes = self._put.next(self._take_host)
            return batch
        return self._take_host()

    def take(self):
        """Same as ``next(feed)``."""
        return next(self)

    def release(self, after=None) -> None:
        """Gives the last batch back to the device path once ``after`` is ready.

        ``after``: whatever the learner computed from the batch (its step's loss, its new
        parameters: a JAX array or any pytree of them); the batch's device slot is refilled
        once that is ready, and the learner's thread does not wait for it. Best something the
        next step does not donate (the loss): a donated one stands for its batch only through
        a later release's. None: nothing reads the batch any more (its slot goes back now). PyTorch and DLPack batches go back at the
        next ``next`` anyway, ordered after the consumer's stream; host batches when dropped.
        A no-op where no batch is lent.
        """
        if self._lender is not None:
            self._lender.release(after)

    def _take_lent(self):
        """The next batch of the device path: the lent arrays of a device slot."""
        if self._closed:
            raise RuntimeError("the feed is closed")
        if self._native() is None:  # a JAX buffer before its first add, as sample() raises
            raise ValueError("No samples in replay buffer!")
        deadline = None
        while True:
            try:
                slot, views, shared = self._lender.take()
                break
            except (KeyError, IndexError, RuntimeError, ValueError) as e:
                if hasattr(e, "frame_stack"):  # the memory's frame_stack changed: resize
                    self._source = None
                    return self._take_lent()
                if hasattr(e, "held"):
                    # Every slot still holds a batch whose arrays JAX has yet to free (the
                    # work queued on them runs): wait for them, up to a point.
                    deadline = deadline or time.monotonic() + _HELD_PATIENCE
                    if time.monotonic() < deadline:
                        gc.collect()
                        continue
                raise self._sample_error(e) from None
        self._last_slot = slot
        return self._lent_batch(views, shared)

    def _lent_batch(self, views: tuple, shared):
        """The batch object for a slot's arrays (``shared``: what every batch of the slot
        shares, built once per import); metadata (on the host) is copied per batch."""
        kind = self._kind
        if kind in ("memory", "stream"):
            return _sources.memory_batch(kind, views, *shared, views[17].copy())
        element = None
        if self._stack_on_device:
            element = _jax.stack_distinct(
                _jax.Distinct(*views[2:4], *views[5:]), self._batches.element
            )
        return self._batches.batch(
            views,
            size=self._batch_size,
            lent=True,
            shared=shared,
            element=element,
            with_metadata=self._with_metadata,
        )

    def _take_host(self):
        """The next batch as host arrays (views of a ring slot), in the buffer's layout."""
        if self._closed:
            raise RuntimeError("the feed is closed")
        native = self._native()
        if native is None:  # a JAX buffer before its first add, as sample() raises
            raise ValueError("No samples in replay buffer!")
        try:
            try:
                parts = native.take()
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
                parts = native.take()
        except (KeyError, IndexError, RuntimeError, ValueError) as e:
            raise self._sample_error(e) from None
        kind = self._kind
        if kind in ("memory", "stream"):
            return _sources.memory_batch(kind, parts, parts[0:7], parts[7:14], parts[17])
        element = None
        if self._stack_on_device:  # only on the device_put path: the frames up to the padding
            frames, index, counts = parts[2:5]
            element = _jax.Distinct(frames[: int(counts[1])], index, *parts[5:])
        return self._batches.batch(
            parts,
            size=self._batch_size,
            lent=False,
            shared=None,
            element=element,
            with_metadata=self._with_metadata,
        )

    def _sample_error(self, error: Exception) -> Exception:
        """The exception the buffer's synchronous sample raises where the draw raised ``error``."""
        if self._batches is not None:
            own = self._batches.sample_error(error, self._batch_size)
            if own is not None:
                return own
        if isinstance(error, RuntimeError) and hasattr(error, "timeout"):  # a silent server
            return TimeoutError(str(error))
        if isinstance(error, RuntimeError) and hasattr(error, "needed"):
            return ValueError("No samples in replay buffer!")
        return error

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def last_transfer_bytes(self) -> int:
        """Bytes the last batch put on the device moved host -> device (0 before the first
        and with device=None): its arrays, the metadata (which stays on the host) excluded."""
        if self._last_slot >= 0 and self._ring is not None:
            return self._ring.copied_bytes(self._last_slot)
        return self._last_transfer_bytes

    @property
    def last_slot(self) -> int:
        """The device path: the device slot (0..device_slots-1) whose arrays the last batch
        is; each slot's arrays stay at the same addresses, so a step captured once per slot
        (a CUDA graph on its tensors) replays for every batch that slot holds. -1 before the
        first batch and without a device ring."""
        return self._last_slot

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

    @property
    def taken(self) -> int:
        """Batches handed out so far by the current rings (they restart when the buffer
        replaces its store, e.g. on load)."""
        native = self._ring if self._ring is not None else self._host
        return 0 if native is None else native.taken

    def close(self) -> None:
        """Stops and joins the sampler threads; later ``next`` calls raise RuntimeError.
        Batches already handed out stay valid memory. Idempotent."""
        self._closed = True
        self._put = None
        self._finalizer()

    def __enter__(self) -> "Feed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cuda_runtime():
    from memoire import _cuda

    return _cuda.runtime()
