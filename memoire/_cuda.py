"""The CUDA runtime (libcudart), found and loaded at run time for the device feed.

memoire has no CUDA build dependency: JAX's and PyTorch's CUDA wheels ship libcudart (under
``site-packages/nvidia/...``), and a framework that runs on a GPU has usually loaded it already.
``runtime()`` loads the first candidate (one already in the process first) and checks it
(functions present, version >= 11.0, a device visible); otherwise it raises one RuntimeError line
naming what was found. ``MEMOIRE_CUDART=/path/libcudart.so.N`` puts a library first.
"""

from __future__ import annotations

import glob
import os
import sys
from typing import List, Optional

from memoire import _core

__all__ = ["candidates", "runtime"]

# sonames for the default loader path, newest first
_SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")
# where the CUDA wheels put it, under a site-packages folder
_WHEEL_GLOBS = (
    "nvidia/cuda_runtime/lib/libcudart.so*",  # nvidia-cuda-runtime-cu11/cu12
    "nvidia/cu1[0-9]/lib/libcudart.so*",  # the CUDA 13 wheels' layout
    "nvidia/*/lib/libcudart.so*",
    "torch/lib/libcudart*.so*",
)

_RUNTIME: Optional[_core.CudaRuntime] = None


def candidates() -> List[str]:
    """Library paths to try, in order: $MEMOIRE_CUDART, the wheels' copies on sys.path (newest
    version first), then the sonames for the default loader path."""
    found: List[str] = []
    env = os.environ.get("MEMOIRE_CUDART")
    if env:
        found.append(env)
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        for pattern in _WHEEL_GLOBS:
            for path in sorted(glob.glob(os.path.join(entry, pattern)), reverse=True):
                if path not in found:
                    found.append(path)
    return found + [s for s in _SONAMES if s not in found]


def runtime() -> _core.CudaRuntime:
    """The loaded CUDA runtime (loaded once per process). RuntimeError (one line naming what was
    found) where none can be used: no library, a library without the needed functions, a
    version before 11.0, or no device / a driver too old for it."""
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = _core.CudaRuntime(candidates())
    return _RUNTIME
