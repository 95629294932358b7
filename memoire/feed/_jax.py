"""The JAX target of the feed: device slots imported into JAX once and lent per batch, the
stacks of ``stack_on_device`` assembled on the device, and ``jax.device_put`` one step ahead for
the platforms the ring does not reach (TPU, ROCm)."""

from __future__ import annotations

import collections
import functools
from typing import Any, NamedTuple

import numpy as np

from memoire import _core
from memoire.feed._slots import SlotLender


@functools.lru_cache(maxsize=None)
def jax_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype JAX holds ``dtype`` as (float64 -> float32 etc. with x64 off)."""
    import jax

    try:
        return np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    except AttributeError:  # another JAX: ask an array
        return np.dtype(jax.numpy.zeros(0, dtype).dtype)


def narrowed(dtypes, to_device) -> list:
    """Per part: whether the device ring narrows it (a 64-bit part on the device that JAX holds
    as 32-bit, with x64 off), so the arrays imported once are already what a jitted step takes."""
    return [
        bool(on and dt is not None and jax_dtype(dt) != dt) for dt, on in zip(dtypes, to_device)
    ]


# Switches for a device check (benchmarks/gpu_feed_probe.py): jaxlib's private DLPack import
# (else jax.dlpack.from_dlpack), and the uncommitted re-wrap of device="jax" arrays.
_JAX_PRIVATE_IMPORT = True
# The platforms where device="jax" arrays are re-wrapped as uncommitted (a private ArrayImpl
# constructor). Not on GPUs: there (JAX 0.11.2, CUDA 13, two device runs) the re-wrapped
# arrays crashed the interpreter at a later garbage collection; without the re-wrap, and with
# jax.dlpack.from_dlpack, the same checks passed. GPU batches are committed to their device.
_JAX_UNCOMMITTED_WRAP = ("cpu",)


def jax_convert(device, committed: bool):
    """A function taking a ``_core.DeviceArray`` to a ``jax.Array`` on ``device``, zero-copy,
    committed to it or not (``device="jax"``: uncommitted, as ``device_put(x)`` makes it).

    ``jax.dlpack.from_dlpack`` ends in ``jnp.asarray``, which dispatches an operation per
    array. So the import is done as ``from_dlpack`` does it internally, through jaxlib's
    ``dlpack_managed_tensor_to_buffer``; where that private function is missing or its
    signature changed, the public ``from_dlpack``. Each slot is imported once, so this is not
    on the learner's path per batch."""
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
            # complete, and given back once what read it is done, so neither side waits on a
            # stream.
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


def ready_marker(after):
    """One JAX array of ``after`` (an array or any pytree of them) whose readiness says that the
    computation that made it is done, or None (nothing to wait for)."""
    if after is None:
        return None
    if hasattr(after, "is_ready"):
        return after
    import jax

    for leaf in jax.tree_util.tree_leaves(after):
        if hasattr(leaf, "is_ready"):
            return leaf
    return None


class JaxLender(SlotLender):
    """Device slots lent to a JAX learner (``_slots.SlotLender``: arrays imported once).

    A lent slot goes back to the copy thread once the learner has said what read it
    (``release(after)``: when ``after`` is ready) -- the learner's thread never waits for it,
    except when it runs ``device_slots - 1`` batches ahead of its own steps. A batch taken with
    no ``release`` before the next ``take`` is given back by deleting its arrays: JAX frees
    them once the work queued on them is done, which gives the slot back, and the slot is
    imported again when it comes round. One consumer thread.
    """

    def __init__(self, ring, convert, slots: int, share) -> None:
        super().__init__(ring, convert, slots, share)
        self._pending: collections.deque = collections.deque()  # (slot, marker)
        # Taking a batch leaves one slot for the copy thread to fill meanwhile.
        self._keep = max(0, slots - 2)
        self.dropped = 0  # batches given back by deleting their arrays (no release came)

    def take(self):
        """(slot, its arrays, what its batches share): see ``SlotLender._lend``."""
        self._settle()
        return self._lend()

    def release(self, after=None) -> None:
        slot = self._out
        if slot is None:
            return
        self._out = None
        marker = ready_marker(after)
        if marker is None:
            self._ring.release(slot)
        else:
            self._pending.append((slot, marker))

    def _settle(self) -> None:
        if self._out is not None:  # taken, never released: free its arrays instead
            slot, self._out = self._out, None
            self._drop(slot)
        pending = self._pending
        while pending:
            slot, marker = pending[0]
            if marker.is_deleted():
                # Donated to a later step (params passed back in): that step read it, so the
                # readiness of a later marker stands for it; none yet: wait for one.
                marker = next((m for _, m in pending if not m.is_deleted()), None)
                if marker is None:
                    break
            if len(pending) <= self._keep and not marker.is_ready():
                break
            marker.block_until_ready()  # at once, unless the learner ran too far ahead
            pending.popleft()
            self._ring.release(slot)

    def _drop(self, slot: int) -> None:
        self.dropped += 1
        (views, _), self._views[slot] = self._views[slot], None
        raw, self._raw[slot] = self._raw[slot], None
        # Every array of the slot shares one lease: the last one freed now gives the slot back.
        next(p for p in raw if isinstance(p, _core.DeviceArray)).give_back_when_freed()
        del raw
        for p in views:
            if hasattr(p, "delete"):
                p.delete()  # JAX frees it (and runs the DLPack deleter) once its work is done

    def close(self) -> None:
        self._pending.clear()
        super().close()


class Distinct(NamedTuple):
    """A JAX-face batch as it travels with ``stack_on_device``: ``frames dtype[P, *obs_shape]``
    (the distinct frames, zero-padded to P), ``index int32[B, 2, stack]`` (state's frames,
    then next_state's, oldest first), and the other fields of ``ReplayElement``."""

    frames: Any
    index: Any
    action: Any
    reward: Any
    is_terminal: Any
    episode_end: Any


_STACK_JIT = None


def stack_distinct(d: Distinct, element):
    """The element a ``Distinct`` batch stands for, ``element(state, action, reward,
    next_state, is_terminal, episode_end)`` (the source's type), its stacks assembled by a
    jitted gather where its arrays are (state/next_state ``dtype[B, *obs_shape, stack]``,
    oldest frame first)."""
    global _STACK_JIT
    if _STACK_JIT is None:
        import jax
        import jax.numpy as jnp

        def stack(frames, index):
            stacks = jnp.take(frames, index, axis=0, mode="clip")  # [B, 2, stack, *obs]
            stacks = jnp.moveaxis(stacks, 2, -1)  # [B, 2, *obs, stack]
            return stacks[:, 0], stacks[:, 1]

        _STACK_JIT = jax.jit(stack)
    state, next_state = _STACK_JIT(d.frames, d.index)
    return element(state, d.action, d.reward, next_state, d.is_terminal, d.episode_end)


class PutAhead:
    """Batches put on a JAX device by ``jax.device_put`` one step ahead (TPU, ROCm: platforms
    the device ring does not reach): the next batch's transfer is started before the current
    one is handed out, so it overlaps the learner's step. A host slot is reused once its
    transfer is complete. An error in the draw ahead is raised by the next call."""

    def __init__(self, put_to, stack_on_device: bool, with_metadata: bool, element=None) -> None:
        self._put_to = put_to
        self._stack_on_device = stack_on_device
        self._element = element  # with stack_on_device: the source's element type
        self._with_metadata = with_metadata
        self._pending = None  # (host batch, its device copy in flight, metadata, bytes)
        self._error: Exception | None = None

    def next(self, take_host):
        """(the next device batch, or (batch, metadata); the bytes it moved)."""
        import jax

        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._pending is None:
            self._pending = self._put(take_host())
        host, current, meta, nbytes = self._pending
        self._pending = None
        try:
            self._pending = self._put(take_host())
        except (KeyError, IndexError, RuntimeError, ValueError, AssertionError) as e:
            # Without its traceback: the frame it holds would keep `host` (a slot) alive.
            self._error = e.with_traceback(None)
        # The slot of `host` is reused once its views are dropped: the copy must be done first
        # (it had the learner's previous step to run).
        jax.block_until_ready(current)
        del host
        return (current if meta is None else (current, meta)), nbytes

    def _put(self, taken):
        import jax

        host, meta = taken if self._with_metadata else (taken, None)
        nbytes = sum(a.nbytes for a in jax.tree_util.tree_leaves(host))
        put = jax.device_put(host, self._put_to)
        if self._stack_on_device:
            put = stack_distinct(
                put, self._element
            )  # dispatched, runs on the device after the copy
        return host, put, meta, nbytes
