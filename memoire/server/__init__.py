"""ReplayMemoryServer: the learner's end of a distributed memoire (the memoire API).

Actors (:class:`memoire.ReplayMemoryClient`) on many machines feed one server over ZeroMQ.
Two topologies share one server:

- **cache mode** (the seed's): actors keep local memories, sample caches of ``cache_size``
  transitions by priority and push them; the server keeps the newest ``n_caches`` caches and
  :meth:`ReplayMemoryServer.get_batch` builds batches from them.
- **central mode**: actors stream episodes (in chunks) and the server's own memory
  (:attr:`ReplayMemoryServer.rem`) holds them; the learner samples there with :meth:`sample`
  and updates priorities with :meth:`update_priorities`, locally or remotely through the
  hosted ``"memory"`` object (:class:`memoire.remote.RemoteMemory`).

The server is composed of services, each in its own module of this package:

- :mod:`~memoire.server.workers`: sockets, worker loops, proxies, PUB and the logfile;
- :mod:`~memoire.server.rpc_host`: remote calls to hosted objects (also standalone, with no
  memory: :class:`RpcServer`);
- :mod:`~memoire.server.cache_service`: the cache ring and :meth:`get_batch`;
- :mod:`~memoire.server.central_service`: the chunk ingest, :meth:`sample`,
  :meth:`update_priorities` and the client counters.
- :mod:`~memoire.server.sampling_service`: sampling streams to learners in other processes
  (:meth:`start_stream`; the learner's end is :class:`memoire.stream.SamplingStream`).

Sockets (endpoints as in ZeroMQ, modes ``'Bind'`` or ``'Conn'``):

- PUB (bound at construction): :meth:`pub_bytes` to every client's :meth:`sub_bytes`.
- REP (:meth:`rep_worker_main`): handshakes (schema and settings), counters, remote calls.
- PULL (:meth:`pull_worker_main`): caches, episode chunks, log lines.

Worker main loops block the calling thread (without holding the GIL) until :meth:`close`;
run each in its own ``threading.Thread``, or let :meth:`start` do it. Every message is checked
by the codec (:mod:`memoire.codec`); a malformed, truncated, oversized or wrong-version message
is counted in :meth:`stats` (``rejected``), logged on the ``memoire.server`` logger and
dropped; REP requests get an error reply. A worker never dies from what a peer sends.

Thread safety: all public methods may be called from any thread. ``pub_bytes`` serialises on a
lock (the PUB socket is created by the constructor's thread and then only used under it).
"""

from memoire.server.cache_service import CacheBatch
from memoire.server.central_service import default_stream_budgets
from memoire.server.replay_memory_server import ReplayMemoryServer
from memoire.server.rpc_host import RpcHost, RpcServer

__all__ = ["ReplayMemoryServer", "CacheBatch", "RpcServer", "RpcHost", "default_stream_budgets"]
