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

from memoire._core import CapacityError, ProtocolError
from memoire.memory import Batch, ReplayMemory

__all__ = ["ReplayMemory", "Batch", "CapacityError", "ProtocolError", "__version__"]

try:  # the network layer needs pyzmq; the core does not
    from memoire.client import ReplayMemoryClient  # noqa: F401
    from memoire.server import ReplayMemoryServer  # noqa: F401

    __all__ += ["ReplayMemoryServer", "ReplayMemoryClient"]
except ImportError as _e:  # pragma: no cover - only without pyzmq or before the module exists
    if "zmq" not in str(_e) and "memoire.server" not in str(_e) and "memoire.client" not in str(_e):
        raise
