"""The PyTorch (and any DLPack consumer's) target of the feed: device slots imported once and
lent per batch, each given back at the next take, ordered after the work the consumer queued on
its stream so far."""

from __future__ import annotations

from memoire import _core
from memoire.feed._slots import SlotLender


class StreamLender(SlotLender):
    """Device slots lent to a consumer whose work on a batch is queued in order on a CUDA
    stream when its thread returns (PyTorch's eager ops and graph replays, CuPy), or done by
    then (a CPU device).

    A slot's arrays are built once (``_slots.SlotLender``; ``convert``: ``torch.from_dlpack``,
    or none for memoire's DLPack arrays) and handed out with every batch the slot holds, at the
    same addresses (a CUDA graph captured on a slot's tensors reads the next batch that slot
    holds). The learner's next ``take`` (or ``release``) gives the batch back: the copy
    thread's next write into the slot waits, on the device, for the work queued on the
    consumer's stream before that point (an event; no thread waits). A batch kept longer must
    be copied (``.clone()``).
    """

    def __init__(self, ring, convert, slots: int, stream, share) -> None:
        super().__init__(ring, convert, slots, share)
        self._stream = stream  # a slot's arrays -> the consumer's stream (DLPack's integer)

    def take(self):
        """(slot, its arrays, what its batches share), giving the previous batch back first."""
        self.release()
        return self._lend()

    def release(self, after=None) -> None:
        """Gives the lent batch back now (``after`` is not needed: the consumer's stream orders
        it)."""
        slot, self._out = self._out, None
        if slot is not None:
            self._ring.release(slot, self._stream(self._views[slot][0]))


def torch_stream(device_id: int):
    """() -> PyTorch's current stream on CUDA device ``device_id`` as a handle."""
    import torch

    device = torch.device("cuda", device_id)
    current = torch.cuda.current_stream

    def stream(_views) -> int:
        return current(device).cuda_stream

    return stream


def dlpack_stream(views) -> int:
    """The stream the consumer last named importing one of ``views`` (memoire's DLPack
    arrays), -1 when none was named."""
    for v in views:
        if isinstance(v, _core.DeviceArray):
            return v.stream
    return -1


def no_stream(_views) -> int:
    return -1
