"""What every lender of the device path does: a slot's arrays are built once (the first time the
slot comes round) and lent with every batch it holds; the lender's subclass says when a lent slot
goes back (``_jax.JaxLender``, ``_torch.StreamLender``)."""

from __future__ import annotations

from memoire import _core


class SlotLender:
    """Lends device slots of ``ring`` (a ``_core.DeviceFeed``) by their arrays, built once.

    ``convert`` takes a ``_core.DeviceArray`` to the framework's array (zero-copy); ``share``
    takes a slot's arrays to what every batch of the slot shares. One consumer thread.
    """

    def __init__(self, ring, convert, slots: int, share) -> None:
        self._ring = ring
        self._convert = convert
        self._share = share
        self._views: list = [None] * slots  # per slot: (its arrays, what its batches share)
        self._raw: list = [None] * slots  # per slot: the DeviceArrays those were built from
        self._out = None  # the slot lent and not yet given back

    def _lend(self):
        """(slot, its arrays, what its batches share) of the next ready slot, now lent:
        framework arrays for the device parts, numpy views of the slot's host mirror for the
        host parts (the caller copies what it hands out: they hold the slot), None for absent."""
        slot = self._ring.take_slot()
        views = self._views[slot]
        if views is None:
            raw = self._raw[slot] = self._ring.views(slot)
            arrays = tuple(self._convert(p) if isinstance(p, _core.DeviceArray) else p for p in raw)
            views = self._views[slot] = (arrays, self._share(arrays))
        self._out = slot
        return slot, *views

    def close(self) -> None:
        """Forgets every slot's arrays (those the learner holds still view valid memory)."""
        self._out = None
        self._views = [None] * len(self._views)
        self._raw = [None] * len(self._raw)
