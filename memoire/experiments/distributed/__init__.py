"""Distributed training: one learner, N actor processes, from the same gin file.

Roles:

- **Actors** (:mod:`.actor`) run the environment the gin configuration names (what Dopamine's
  runner would build: its ``create_environment_fn``, by default Atari with the gin-bound game;
  see :func:`memoire.experiments.runner.environment_fn`) with the agent's epsilon-greedy policy
  on the learner's latest network parameters. An actor is the gin-configured Dopamine agent
  whose replay memory is a :class:`memoire.experience.ChunkStream`: the agent's own
  ``begin_episode``/``step``/``end_episode`` choose actions and build transitions through the
  episode loop a local run plays (:func:`memoire.experiments.episode_loop.play_episode`), and
  each transition is streamed to the learner; nothing is trained there.
- **The learner** (:mod:`.learner`) is Dopamine's Runner (TrainRunner under
  ``create_runner.schedule = 'continuous_train'``) with memoire's trackers, whose training
  phase takes actors' episodes instead of stepping an environment: chunk messages stored whole
  by the native ingest into the agent's replay buffer, one ``_train_step`` per stored
  transition (or as the rate limiter allows), parameters published every ``publish_period``
  training steps. The evaluation phase and checkpoints (replay memory included) are
  Dopamine's, so a killed run resumes like a local one. It ends with one closing line
  (:mod:`.summary`).

Sockets (:mod:`.sockets`): the learner binds both. ``transport = 'multiprocessing'`` (actors
spawned on this machine) uses ``ipc://`` endpoints in a private temporary folder; ``'zmq'``
uses TCP (loopback ports the OS picks unless ``experience_endpoint`` / ``param_endpoint`` name
them), so actors on other machines can join with ``memoire actor``. Backpressure: the learner
publishes, per actor, the last episode it stored, and an actor starts a new episode only while
at most ``episodes_ahead`` of its finished episodes are not stored yet, so actors never run
ahead of the learner by more than that (socket queues alone would not bound it: the kernel's
buffers hold thousands of small chunks). When the learner ends it publishes a stop notice, and
a spawned actor also has a stop event. Parameters travel as ``flax.serialization.to_bytes``
(msgpack, :mod:`.params`), never pickle. Launchers beyond this machine (Ray, SLURM) share the
CURVE policy of :mod:`.curve_policy`; a local launch is :mod:`.local_launch`.

Gin settings (``DistributedConfig.*``, :mod:`.config`): ``num_actors`` (0 = single process),
``publish_period``, ``chunk_size``, ``queue_chunks``, ``episodes_ahead``, ``transport``,
``experience_endpoint``, ``param_endpoint``, ``actor_threads``, ``spawn_actors``,
``launcher``, ``samples_per_insert``, ``rate_error_buffer``, ``keepalive``, ``peer_timeout``.

Every line a distributed run logs comes from the logger ``memoire.experiments.distributed``,
whichever of these modules writes it.
"""

import memoire.dopamine_compat  # noqa: F401  first: its upstream_compat steps precede Dopamine's import
from memoire.experiments.distributed.actor import actor_main
from memoire.experiments.distributed.config import LAUNCHERS, DistributedConfig
from memoire.experiments.distributed.curve_policy import (
    CURVE_SETTINGS,
    insecure_warning,
    use_curve,
)
from memoire.experiments.distributed.learner import NoActors, run_learner
from memoire.experiments.distributed.local_launch import run
from memoire.experiments.distributed.sockets import (
    LEARNER_SILENCE_S,
    LEARNER_WAIT_S,
    ActorEndpoints,
    ActorLink,
    LearnerSockets,
    NoLearner,
)

__all__ = [
    "CURVE_SETTINGS",
    "LAUNCHERS",
    "LEARNER_SILENCE_S",
    "LEARNER_WAIT_S",
    "ActorEndpoints",
    "ActorLink",
    "DistributedConfig",
    "LearnerSockets",
    "NoActors",
    "NoLearner",
    "actor_main",
    "insecure_warning",
    "run",
    "run_learner",
    "use_curve",
]

# These lived in this module before it became a package, and pickles (an actor's endpoints
# handed to its process, a config sent to a Ray actor) name a class by its module: they keep
# naming this one, which holds them all.
for _name in __all__:
    _public = globals()[_name]
    if isinstance(_public, type) or callable(_public):
        _public.__module__ = __name__
del _name, _public
