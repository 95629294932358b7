"""``DistributedConfig``: the gin settings of a distributed launch (``DistributedConfig.*``),
checked when built."""

from __future__ import annotations

import gin

from memoire import transport

LAUNCHERS = ("local", "ray", "slurm")  # who starts a distributed run's learner and actors


@gin.configurable(module="memoire.distributed")
class DistributedConfig:
    """Settings of a distributed launch (all gin-bindable).

    Args:
      num_actors: actor processes; 0 runs everything in one process.
      publish_period: learner training steps between parameter publications.
      chunk_size: transitions per experience chunk an actor sends (an episode end also sends).
      queue_chunks: chunks an actor's socket queues before a send waits.
      episodes_ahead: finished episodes an actor may have that the learner has not stored yet
        when it starts the next one (0: lockstep); bounds how stale the learner's data is.
      transport: 'multiprocessing' (actors spawned on this machine, ``ipc://`` sockets) or
        'zmq' (TCP sockets; actors may run on other machines).
      experience_endpoint: the learner's PULL endpoint for experience ('zmq'); 'auto' lets the
        OS choose a loopback port.
      param_endpoint: the learner's PUB endpoint for parameters ('zmq'); 'auto' too.
      actor_threads: XLA CPU threads per actor process (actors only run small forward passes).
      spawn_actors: False starts no actor here: actors on this or other machines join with
        ``memoire actor --experience ... --params ...`` (transport 'zmq'; bind the endpoints to
        an interface they can reach, e.g. 'tcp://0.0.0.0:5555').
      launcher: 'local' (actor processes spawned here), 'ray' (the learner and the actors
        are Ray actors on a Ray cluster, see :mod:`memoire.experiments.ray_launcher`; needs
        ``pip install memoire[ray]``) or 'slurm' (the learner and the actors are the tasks of
        one SLURM job, see :mod:`memoire.experiments.slurm_launcher`).
      samples_per_insert: the replay ratio the learner keeps with memoire's rate limiter
        (:func:`memoire.rate_limiter.SampleToInsertRatio`): transitions sampled per
        transition stored (a gradient update samples one batch; DQN's batch 32 every 4 steps
        is 8). The learner then trains whenever the limiter allows, also while actors are
        slow, and stops taking experience while it is behind (actors wait on their sockets).
        0 (default): one training step per stored transition, as Dopamine's own loop.
      rate_error_buffer: the limiter's margin in samples (0: 100 batches).
      keepalive: seconds an actor with an open episode and nothing to send waits before it
        sends a KEEPALIVE on its experience channel (:class:`memoire.experience.Keepalive`).
      peer_timeout: seconds of the learner's listening after which an actor not heard from
        (killed, frozen) has its open episode dropped; the episodes of other actors are kept
        (docs/LIMITS.md).

    Raises:
      ValueError: on a negative count, a period or size below 1, a rate or time out of range,
        an unknown transport or launcher, or ``spawn_actors=False`` without transport 'zmq'.
    """

    def __init__(
        self,
        num_actors: int = 0,
        publish_period: int = 100,
        chunk_size: int = 64,
        queue_chunks: int = 32,
        episodes_ahead: int = 1,
        transport: str = "multiprocessing",
        experience_endpoint: str = "auto",
        param_endpoint: str = "auto",
        actor_threads: int = 1,
        spawn_actors: bool = True,
        launcher: str = "local",
        samples_per_insert: float = 0.0,
        rate_error_buffer: float = 0.0,
        keepalive: float = transport.KEEPALIVE_S,
        peer_timeout: float = transport.PEER_TIMEOUT_S,
    ):
        if num_actors < 0:
            raise ValueError(f"num_actors must be >= 0, got {num_actors}")
        if episodes_ahead < 0:
            raise ValueError(f"episodes_ahead must be >= 0, got {episodes_ahead}")
        for name, v in (
            ("publish_period", publish_period),
            ("chunk_size", chunk_size),
            ("queue_chunks", queue_chunks),
            ("actor_threads", actor_threads),
        ):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        for name, v in (
            ("samples_per_insert", samples_per_insert),
            ("rate_error_buffer", rate_error_buffer),
        ):
            if not (0 <= float(v) < float("inf")):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")
        for name, v in (("keepalive", keepalive), ("peer_timeout", peer_timeout)):
            if not (0 < float(v) < float("inf")):
                raise ValueError(f"{name} must be finite seconds > 0, got {v}")
        if float(keepalive) >= float(peer_timeout):
            raise ValueError(
                f"keepalive ({keepalive} s) must be shorter than peer_timeout ({peer_timeout} s)"
            )
        self.keepalive = float(keepalive)
        self.peer_timeout = float(peer_timeout)
        self.samples_per_insert = float(samples_per_insert)
        self.rate_error_buffer = float(rate_error_buffer)
        if transport not in ("multiprocessing", "zmq"):
            raise ValueError(f"transport must be 'multiprocessing' or 'zmq', got {transport!r}")
        self.num_actors = int(num_actors)
        self.publish_period = int(publish_period)
        self.chunk_size = int(chunk_size)
        self.queue_chunks = int(queue_chunks)
        self.episodes_ahead = int(episodes_ahead)
        self.transport = transport
        self.experience_endpoint = experience_endpoint
        self.param_endpoint = param_endpoint
        self.actor_threads = int(actor_threads)
        self.spawn_actors = bool(spawn_actors)
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
        self.launcher = launcher
        if not self.spawn_actors and transport != "zmq":
            raise ValueError(
                "spawn_actors=False needs transport 'zmq' (actors started by "
                "endpoint with `memoire actor`)"
            )

    def as_dict(self) -> dict:
        """The settings as a plain dict (what an actor process is handed)."""
        return dict(vars(self))
