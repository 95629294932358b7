"""Registers memoire's Dopamine-compatible classes with gin, under names of their own.

Importing this module registers, in gin module ``memoire.dopamine_compat``:

=============================================  ==============================================
gin name                                       class
=============================================  ==============================================
``MemoireOutOfGraphReplayBuffer``              circular_replay_buffer.OutOfGraphReplayBuffer
``MemoireOutOfGraphPrioritizedReplayBuffer``   prioritized_replay_buffer.OutOfGraphPrioritizedReplayBuffer
``MemoireRemoteOutOfGraphReplayBuffer``        remote.RemoteOutOfGraphReplayBuffer (a proxy)
``MemoireWrappedReplayBuffer``                 circular_replay_buffer.WrappedReplayBuffer (*)
``MemoireWrappedPrioritizedReplayBuffer``      prioritized_replay_buffer.WrappedPrioritizedReplayBuffer (*)
=============================================  ==============================================

(*) only when TensorFlow and dopamine-rl are importable.

Why not Dopamine's names: gin resolves a short selector such as ``WrappedReplayBuffer.batch_size``
by suffix over every registered configurable, so a second ``WrappedReplayBuffer`` (in any
module) would make Dopamine's own gin files fail with "Ambiguous selector". The distinct names
keep every Dopamine config working unchanged.

Plugging memoire into an unmodified Dopamine TF agent (the agent builds Dopamine's wrapper and
never passes ``wrapped_memory``, so gin can fill it)::

    import memoire.dopamine_compat.gin_registry
    WrappedReplayBuffer.wrapped_memory = @MemoireOutOfGraphReplayBuffer()

Built with no arguments, memoire's buffer is unbound and takes, on first use, the arguments of
the wrapper that holds it: the agent's shape, dtype, stack, horizon and discount, and the
wrapper's capacity and batch size (see configs/dqn_cartpole_tf.gin). Arguments bound on the
memory itself win. The same holds for ``WrappedPrioritizedReplayBuffer.wrapped_memory =
@MemoireOutOfGraphPrioritizedReplayBuffer()``, and for memoire's wrappers, which also accept
the class alone (``MemoireWrappedReplayBuffer.wrapped_memory = @MemoireOutOfGraphReplayBuffer``).
As in Dopamine, the wrappers keep observation_shape, stack_size, update_horizon and gamma out
of gin.

In Python, memoire's classes may also be assigned into Dopamine's modules (e.g.
``prioritized_replay_buffer.WrappedPrioritizedReplayBuffer = WrappedPrioritizedReplayBuffer``);
Dopamine's gin bindings of the replaced class then apply to memoire's.

A TF agent's replay on a server (``memoire serve --buffer circular``
hosts it; see configs/dqn_cartpole_tf_remote.gin)::

    WrappedReplayBuffer.wrapped_memory = @MemoireRemoteOutOfGraphReplayBuffer()
    MemoireRemoteOutOfGraphReplayBuffer.endpoint = 'tcp://127.0.0.1:PORT'

The proxy takes the server buffer's settings (uniform or prioritized, shapes, horizon).
"""

import gin

from memoire.dopamine_compat import circular_replay_buffer as _crb
from memoire.dopamine_compat import prioritized_replay_buffer as _prb
from memoire.dopamine_compat import remote as _remote

MODULE = "memoire.dopamine_compat"
_AGENT_OWNED = ["observation_shape", "stack_size", "update_horizon", "gamma"]

MemoireOutOfGraphReplayBuffer = gin.external_configurable(
    _crb.OutOfGraphReplayBuffer, name="MemoireOutOfGraphReplayBuffer", module=MODULE
)
MemoireOutOfGraphPrioritizedReplayBuffer = gin.external_configurable(
    _prb.OutOfGraphPrioritizedReplayBuffer,
    name="MemoireOutOfGraphPrioritizedReplayBuffer",
    module=MODULE,
)
MemoireRemoteOutOfGraphReplayBuffer = gin.external_configurable(
    _remote.RemoteOutOfGraphReplayBuffer,
    name="MemoireRemoteOutOfGraphReplayBuffer",
    module=MODULE,
    denylist=["keys"],
)

try:
    _wrapped = _crb.WrappedReplayBuffer
    _wrapped_prioritized = _prb.WrappedPrioritizedReplayBuffer
except ImportError:  # no TensorFlow / dopamine-rl: the out-of-graph classes still register
    _wrapped = _wrapped_prioritized = None

if _wrapped is not None:
    MemoireWrappedReplayBuffer = gin.external_configurable(
        _wrapped, name="MemoireWrappedReplayBuffer", module=MODULE, denylist=_AGENT_OWNED
    )
    MemoireWrappedPrioritizedReplayBuffer = gin.external_configurable(
        _wrapped_prioritized,
        name="MemoireWrappedPrioritizedReplayBuffer",
        module=MODULE,
        denylist=_AGENT_OWNED,
    )
