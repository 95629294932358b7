"""The actor: the gin-configured Dopamine agent playing the environment with the learner's
latest parameters, its transitions streamed to the learner; nothing is trained here.

The agent's own ``begin_episode``/``step``/``end_episode`` choose actions and build transitions
through the one episode loop (:func:`memoire.experiments.episode_loop.play_episode`), as in a
local run; its replay memory is a stand-in that streams each transition
(:class:`memoire.experience.ChunkStream`), and each game's end closes the streamed episode.
"""

from __future__ import annotations

import functools
import logging
import os

import numpy as np

from memoire import cli
from memoire.experience import ChunkStream
from memoire.experiments import episode_loop
from memoire.experiments.distributed.params import params_from_bytes
from memoire.experiments.distributed.sockets import ActorEndpoints, ActorLink
from memoire.gin_query import query

log = logging.getLogger(__package__)  # one logger for a distributed run's lines


def actor_row_spec(agent) -> list:
    """The rows an actor streams, as the learner's buffer takes them
    (:meth:`memoire.dopamine_compat.jax_replay_buffer.ReplayBuffer.chunk_ingest` built from the
    same agent's observation shape and dtype): observation, action int32, reward float64,
    terminal bool."""
    return [
        ("observation", np.dtype(agent.observation_dtype), tuple(agent.observation_shape)),
        ("action", np.dtype(np.int32), ()),
        ("reward", np.dtype(np.float64), ()),
        ("terminal", np.dtype(np.bool_), ()),
    ]


class _StreamingMemory:
    """Stands in for an actor agent's replay memory: streams each transition the agent stores.

    ``add_count`` stays 0, so the agent's ``_train_step`` never trains (it only counts steps,
    which drives the epsilon schedule). A game's end is sent by the actor's loop, which knows
    its return; a lost life the agent stores as terminal stays inside the streamed episode,
    as a terminal row, as a local run's buffer stores it.
    """

    add_count = 0
    _sampling_distribution = None  # the agent's isinstance check for prioritized replay

    def __init__(self, stream: ChunkStream):
        self._stream = stream
        self.ok = True  # False once a send failed (the open episode is lost)

    def add(self, element, *args, **kwargs) -> None:
        self.ok = (
            self._stream.add(
                {
                    "observation": element.observation,
                    "action": element.action,
                    "reward": element.reward,
                    "terminal": element.is_terminal,
                }
            )
            and self.ok
        )


def environment_from_gin():
    """Builds the environment Dopamine's Runner would for the loaded gin configuration (see
    :func:`memoire.experiments.runner.environment_fn`: the runner's ``create_environment_fn``,
    else Atari with the gin-bound game)."""
    from memoire.experiments.runner import environment_fn

    return environment_fn()()


def run_actor(link: ActorLink, *, chunk_size: int, seed: int, max_steps: int | None = None) -> int:
    """Runs one actor on ``link`` until the learner says stop, the link gives up, or
    ``max_steps`` environment steps (checked between games).

    Gin must already be loaded. Returns the environment steps taken.
    """
    from memoire.experiments import replay_routing

    environment = environment_from_gin()
    agent = replay_routing.create_agent_fn()(None, environment, summary_writer=None)
    stream = ChunkStream(
        actor_row_spec(agent),
        link.send,
        chunk_rows=chunk_size,
        uuid=link.uuid,
        keepalive=link.keepalive,
        try_send=link.try_send,
    )
    try:
        return _play(agent, environment, link, stream, chunk_size, seed, max_steps)
    finally:
        stream.close()


def _play(agent, environment, link, stream, chunk_size, seed, max_steps) -> int:
    """run_actor's loop over games (the stream's keepalive thread runs meanwhile)."""
    from memoire.experiments import runner

    memory = _StreamingMemory(stream)
    agent._replay = memory  # the actor trains nothing; its memory only streams
    agent.eval_mode = False
    end_recorder = episode_loop.install_end_recorder(environment)
    runner.seed_environment(environment, seed)
    max_per_episode = query("Runner.max_steps_per_episode", 27000)
    clip = query("Runner.clip_rewards", True)

    def take_newest_parameters() -> None:
        newest = link.latest()
        if newest is not None:
            version, payload = newest
            agent.online_params = params_from_bytes(agent.online_params, payload)
            agent.training_steps = max(agent.training_steps, int(version))

    def keep_going(steps_before: int, length: int) -> bool:
        # the newest parameters every chunk_size steps of the actor; a stop abandons the game
        if (steps_before + length) % chunk_size == 0:
            take_newest_parameters()
        return memory.ok and not link.should_stop()

    steps = finished = 0
    take_newest_parameters()
    while not link.should_stop() and (max_steps is None or steps < max_steps):
        if not link.wait_for_learner(finished):
            return steps
        episode = episode_loop.play_episode(
            environment,
            agent,
            end_recorder,
            max_steps_per_episode=max_per_episode,
            clip_rewards=clip,
            end_agent_episode=agent.end_episode,
            keep_going=functools.partial(keep_going, steps),
        )
        steps += episode.length
        if episode.abandoned:
            return steps
        memory.ok = stream.end_episode(
            episode.terminated, info=(episode.total_reward, episode.length, episode.terminated)
        )
        finished += 1
        take_newest_parameters()
    return steps


def actor_main(actor_id: int, run_spec: dict, config: dict, endpoints: ActorEndpoints) -> int:
    """Entry point of an actor process: connects (``endpoints.open()``, then
    :meth:`ActorLink.connect`: one line once connected), loads gin, seeds and runs
    :func:`run_actor`. Returns 0, or 1 when it stopped because the learner went silent
    (:attr:`ActorLink.gave_up`, logged).

    Args:
      actor_id: names the actor in the learner's records and its logs; with ``run_spec['seed']``
        it seeds the actor.
      run_spec: the run's ``gin_files``, ``bindings`` and ``seed``.
      config: :meth:`DistributedConfig.as_dict` (``actor_threads``, ``chunk_size``; and
        ``max_steps``, when given, for ``memoire actor``).
      endpoints: where the learner is.

    Raises:
      NoLearner: no learner at ``endpoints.experience`` (before anything heavy is imported).
    """
    cli.configure_logging()  # as every memoire process: level from $MEMOIRE_LOG_LEVEL, no chatter
    os.environ.setdefault(
        "XLA_FLAGS",
        "--xla_cpu_multi_thread_eigen=false "
        f"intra_op_parallelism_threads={config['actor_threads']}",
    )
    link = endpoints.open(actor_id)
    try:
        link.connect()
        log.info("actor %d connected to the learner at %s", actor_id, endpoints.experience)
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.WARNING)
        from memoire.experiments import runner

        seed = int(np.random.SeedSequence([run_spec["seed"], actor_id + 1]).generate_state(1)[0])
        runner.load_gin(run_spec["gin_files"], run_spec["bindings"])
        runner.seed_everything(seed)
        run_actor(
            link,
            chunk_size=config["chunk_size"],
            seed=seed,
            max_steps=config.get("max_steps"),
        )
    except KeyboardInterrupt:
        pass
    finally:
        link.close()
    return 0 if link.gave_up is None else 1
