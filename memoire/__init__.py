"""memoire: a replay memory for reinforcement learning.

A C++ core with a Python face, distributed over ZeroMQ, and a drop-in for Google Dopamine's
replay buffers (:mod:`memoire.dopamine_compat`).

    >>> import numpy as np, memoire
    >>> rem = memoire.ReplayMemory(np.zeros([4], np.float32), np.zeros([], np.int64),
    ...                            np.zeros([], np.float32), np.zeros([], np.float32),
    ...                            np.zeros([], np.float32), np.zeros([], np.float32),
    ...                            np.zeros([0], np.uint8), max_step=1000)
"""

__version__ = "0.1.0"  # the one version source: pyproject.toml reads it (scikit-build-core regex)

import importlib
import importlib.util

from memoire._core import CapacityError, ProtocolError
from memoire.memory import Batch, ReplayMemory

# The network layer (pyzmq, its sockets and threads) loads on first access of its classes
# (PEP 562): the library's modules import this package for its core (`from memoire import
# _core`), and a learner's feed or a Dopamine buffer needs no ZeroMQ. name -> its module.
_NETWORK = {"ReplayMemoryServer": "memoire.server", "ReplayMemoryClient": "memoire.client"}

__all__ = ["ReplayMemory", "Batch", "CapacityError", "ProtocolError", "__version__"]
if importlib.util.find_spec("zmq") is not None:  # looks for pyzmq without importing it
    __all__ += list(_NETWORK)


def __getattr__(name: str):
    module = _NETWORK.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != "zmq":
            raise
        raise ImportError(
            f"memoire.{name} needs pyzmq (the network layer's transport), which is not "
            f"installed: pip install pyzmq ({e})",
            name=e.name,
        ) from e
    globals()[name] = value  # found directly from now on
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
