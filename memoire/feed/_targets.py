"""Where a feed's batches go: ``Feed(device=..., dlpack=...)`` parsed into a :class:`Target`."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional


class Target(NamedTuple):
    """Where a feed's batches go.

    ``framework``: None (host numpy batches), ``"jax"``, ``"torch"`` or ``"dlpack"`` (memoire's
    DLPack arrays). ``ring``: the device path (a ring of device slots a native thread copies
    into: on CUDA device ``device_id`` when ``cuda``, else the host stand-in). ``put``:
    ``jax.device_put`` one step ahead to ``jax_device`` instead (a JAX platform the ring does
    not reach); ``put_to`` is device_put's argument (None keeps the arrays uncommitted).
    """

    framework: Optional[str]
    ring: bool = False
    cuda: bool = False
    device_id: int = 0
    put: bool = False
    jax_device: Any = None
    put_to: Any = None
    committed: bool = False  # JAX arrays committed to their device (a jax.Device was named)


EXPECTED = "None, 'jax', a jax.Device, 'cuda', 'cuda:N', 'cpu' or a torch.device"


def target_of(device, dlpack: bool) -> Target:
    """The Target of ``Feed(device=..., dlpack=...)``; ValueError on a device it cannot feed,
    ImportError when the device's framework is missing."""
    if device is None:
        if dlpack:
            raise ValueError("dlpack: expected a device (host batches are numpy arrays)")
        return Target(None)
    is_torch = type(device).__module__ == "torch" and type(device).__name__ == "device"
    if is_torch or (
        isinstance(device, str)
        and (device in ("cuda", "cpu") or (device.startswith("cuda:") and device[5:].isdigit()))
    ):
        kind, _, index = str(device).partition(":")
        framework = "dlpack" if dlpack else "torch"
        if not dlpack:
            try:
                import torch
            except ImportError:
                raise ImportError(
                    f"device={device!r} hands out PyTorch tensors, and PyTorch is not installed "
                    "(dlpack=True hands out DLPack arrays for any consumer)"
                ) from None
            if kind == "cuda" and not index:
                # current_device() asserts on a PyTorch built without CUDA; device 0 then meets
                # the CUDA runtime's one-line RuntimeError, as "cuda:0" does.
                index = str(torch.cuda.current_device()) if torch.cuda.is_available() else "0"
        if kind == "cpu":
            return Target(framework, ring=True)
        return Target(framework, ring=True, cuda=True, device_id=int(index or 0))
    try:
        import jax
    except ImportError:
        if device == "jax":
            raise ImportError(
                f"device={device!r} needs JAX (pip install jax); device=None hands out host batches"
            ) from None
        raise ValueError(f"device: expected {EXPECTED}, got {device!r}") from None
    if isinstance(device, str) and device == "jax":
        target, put_to = jax.devices()[0], None
    elif isinstance(device, jax.Device):
        target, put_to = device, device
    else:
        raise ValueError(f"device: expected {EXPECTED}, got {device!r}")
    platform = target.platform
    if platform not in ("cpu", "gpu", "cuda"):  # TPU, ROCm: JAX's own transfer
        if dlpack:
            raise ValueError(f"dlpack: the device path feeds CUDA and CPU devices, not {platform}")
        return Target("jax", put=True, jax_device=target, put_to=put_to)
    return Target(
        "dlpack" if dlpack else "jax",
        ring=True,
        cuda=platform != "cpu",
        device_id=getattr(target, "local_hardware_id", None) or 0,
        jax_device=target,
        committed=put_to is not None,
    )
