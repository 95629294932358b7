"""The learner: Dopamine's Runner (TrainRunner under ``create_runner.schedule =
'continuous_train'``) with memoire's trackers, whose training phase takes actors' episodes
instead of stepping an environment.

Experience takes memoire's one path: chunk messages on the learner's PULL socket, checked and
stored whole by the native ingest straight into the agent's replay buffer (memoire's JAX
``ReplayBuffer.chunk_ingest``), with the GIL released. After each stored episode the learner
runs one ``_train_step`` per transition (so ``update_period`` and ``min_replay_history`` keep
their single-process meaning, counted in transitions), or, with ``samples_per_insert``, as
often as memoire's rate limiter allows; every ``publish_period`` training steps it publishes
the online parameters. The evaluation phase and checkpoints (replay memory included) are
Dopamine's, so a killed run resumes like a local one.
"""

from __future__ import annotations

import collections
import logging
import time

import numpy as np

from memoire import transport
from memoire.experience import ExperienceReceiver
from memoire.experiments.distributed.actor import actor_row_spec
from memoire.experiments.distributed.config import DistributedConfig
from memoire.experiments.distributed.params import params_to_bytes
from memoire.experiments.distributed.sockets import LearnerSockets
from memoire.experiments.distributed.summary import experience_summary

log = logging.getLogger(__package__)  # one logger for a distributed run's lines

# A learner whose actors have sent nothing for this long gives up (seconds).
NO_EXPERIENCE_S = 600.0


class NoActors(RuntimeError):
    """The learner has no actor left to take experience from: the run ends with one line."""


class LearnerMixin:
    """Makes a tracked Dopamine runner (:func:`memoire.experiments.runner.runner_class`) the
    learner: its training phase takes actors' episodes from ``sockets`` instead of stepping
    an environment. :func:`learner_runner_class` puts it on the schedule's runner.

    Args:
      base_dir, create_agent_fn, seed, kwargs: the tracked runner's.
      sockets: the learner's bound :class:`~.sockets.LearnerSockets`.
      publish_period: training steps between parameter publications.
      actors_alive: False once no actor is left (the run then ends with :class:`NoActors`).
      samples_per_insert, rate_error_buffer: the replay ratio kept with memoire's rate
        limiter, and its margin in samples (``DistributedConfig``'s).
      peer_timeout: seconds after which the ingest drops a silent actor's open episode.

    Raises:
      ValueError: an agent that is no JAX agent, or a replay buffer that is not memoire's.
    """

    def __init__(
        self,
        base_dir,
        create_agent_fn,
        *,
        sockets: LearnerSockets,
        publish_period: int,
        actors_alive=lambda: True,
        seed=None,
        samples_per_insert: float = 0.0,
        rate_error_buffer: float = 0.0,
        peer_timeout: float = transport.PEER_TIMEOUT_S,
        **kwargs,
    ):
        super().__init__(base_dir, create_agent_fn, seed=seed, **kwargs)
        from dopamine.jax.agents.dqn import dqn_agent

        agent = self._agent
        if not isinstance(agent, dqn_agent.JaxDQNAgent):
            raise ValueError(
                "distributed training needs a JAX agent (JaxDQNAgent or a "
                f"subclass), got {type(agent).__name__}"
            )
        if not hasattr(agent._replay, "chunk_ingest"):
            raise ValueError(
                "distributed training needs memoire's JAX replay buffer "
                "(memoire.dopamine_compat ReplayBuffer, the default of "
                f"`memoire train`), got {type(agent._replay).__name__}"
            )
        # Built after the checkpoint (if any) was restored: it stores into that buffer.
        spec = actor_row_spec(agent)
        ingest = agent._replay.chunk_ingest(
            np.zeros(spec[0][2], spec[0][1]), np.int32(0), peer_timeout=peer_timeout
        )
        self._receiver = ExperienceReceiver(ingest, sockets.pull)
        self.row_offsets: collections.Counter = collections.Counter()
        self._sockets = sockets
        self._publish_period = publish_period
        self._actors_alive = actors_alive
        self._limiter = None
        if samples_per_insert > 0:
            from memoire.rate_limiter import SampleToInsertRatio

            self._batch = int(agent._replay._batch_size)
            self._limiter = SampleToInsertRatio(
                samples_per_insert,
                agent.min_replay_history + 1,  # Dopamine trains past it
                rate_error_buffer or 100 * self._batch,
            )
        self._publish()

    def _publish(self) -> None:
        self._sockets.publish(
            int(self._agent.training_steps), params_to_bytes(self._agent.online_params)
        )

    def _new_priority(self) -> float:
        """The priority the agent's ``_store_transition`` gives a new transition (Dopamine
        4.1.2's JAX agents: 1.0 for the 'uniform' scheme, else the largest recorded)."""
        if getattr(self._agent, "_replay_scheme", None) == "uniform":
            return 1.0
        return float(self._agent._replay.max_recorded_priority)

    def _train_one(self) -> None:
        self._agent._train_step()
        if self._agent.training_steps % self._publish_period == 0:
            self._publish()

    def _take_experience(self) -> list:
        """Episodes stored from actors (ExperienceReceiver.poll). With a rate limiter, none
        while it holds inserts back (actors wait on their sockets' high-water marks), and
        no wait while it lets the learner train."""
        lim = self._limiter
        if lim is None:
            return self._receiver.poll(timeout=0.5)
        if not lim.can_insert(1):
            return []
        stored = self._receiver.poll(timeout=0.0 if lim.can_sample(self._batch) else 0.5)
        lim.inserted(sum(rows for _, _, rows, _ in stored))
        return stored

    def _train_limited(self, most: int = 16) -> int:
        """With a rate limiter: up to `most` gradient updates (``update_period`` training
        steps each, one batch sampled) as far as it allows now. Returns training steps."""
        steps = 0
        for _ in range(most if self._limiter is not None else 0):
            if not self._limiter.await_sample(self._batch, 0.0, raise_on_timeout=False):
                break
            for _ in range(self._agent.update_period):
                self._train_one()
                steps += 1
        return steps

    def _run_train_phase(self, statistics):
        self._phase = "train"
        agent = self._agent
        agent.eval_mode = False
        replay = agent._replay
        start = time.time()
        steps, returns = 0, []
        idle_since = time.time()
        while steps < self._training_steps:
            replay.set_ingest_priority(self._receiver.ingest, self._new_priority())
            stored = self._take_experience()
            self._sockets.acknowledge(stored)
            trained = self._train_limited()
            if not stored and not trained:
                if not self._actors_alive():
                    raise NoActors(
                        "all actors have exited or disconnected (killed); see their lines above"
                    )
                if time.time() - idle_since > NO_EXPERIENCE_S:
                    raise NoActors(
                        f"no experience from any actor for {NO_EXPERIENCE_S:g} s (actors "
                        f"reach the learner at {self._sockets.endpoints['experience']})"
                    )
                continue
            idle_since = time.time()
            steps += trained
            for uuid, _, rows, info in stored:
                if self._limiter is None:
                    for _ in range(rows):
                        self._train_one()
                    steps += rows
                if info is None:
                    continue
                ret, length, terminated = info
                # rows stored minus the steps the actor took: one value for whole episodes
                self.row_offsets[int(rows) - int(length)] += 1
                self._episodes.record(
                    iteration=self._iteration,
                    phase="train",
                    episode_return=ret,
                    length=int(length),
                    terminated=bool(terminated),
                    actor=int(uuid) & 0xFFFFFFFF,
                )
                returns.append(ret)
                statistics.append(
                    {"train_episode_lengths": int(length), "train_episode_returns": ret}
                )
        average_return = float(np.mean(returns)) if returns else 0.0
        steps_per_second = steps / max(time.time() - start, 1e-9)
        statistics.append({"train_average_return": average_return})
        statistics.append({"train_average_steps_per_second": steps_per_second})
        return len(returns), average_return, steps_per_second


def learner_runner_class(schedule: str | None = None) -> type:
    """The learner's runner class for ``schedule``: :class:`LearnerMixin` on the tracked
    runner of that schedule (default: the bound ``create_runner.schedule``; 'continuous_train'
    has no evaluation phase), which is known only once gin is read.

    Raises:
      ValueError: for a schedule other than 'continuous_train_and_eval' or 'continuous_train'.
    """
    from memoire.experiments.runner import runner_class

    return type("LearnerRunner", (LearnerMixin, runner_class(schedule)), {"__module__": __name__})


def run_learner(
    run_spec: dict,
    config: DistributedConfig,
    sockets: LearnerSockets,
    actors_label: str,
    actors_alive=lambda: True,
    actors_report=lambda: "",
) -> None:
    """Runs the learner on bound ``sockets`` until its last iteration (resuming from
    ``run_spec['dir']``'s checkpoints), in this process, with gin loaded. ``actors_label`` names the actors
    in the log; ``actors_alive()`` False ends the run with an error; ``actors_report()`` is
    what the launcher says of its actors in the closing line (:func:`experience_summary`). The
    caller stops the actors and closes the sockets."""
    from memoire.experiments import replay_routing, runner

    learner = learner_runner_class()(
        run_spec["dir"],
        replay_routing.create_agent_fn(),
        sockets=sockets,
        publish_period=config.publish_period,
        actors_alive=actors_alive,
        seed=run_spec["seed"],
        samples_per_insert=config.samples_per_insert,
        rate_error_buffer=config.rate_error_buffer,
        peer_timeout=config.peer_timeout,
    )
    try:
        runner.write_operative_config(run_spec["dir"])
        if learner.start_iteration > 0:
            log.info("resuming %s at iteration %d", run_spec["dir"], learner.start_iteration)
        log.info(
            "learner with %s (experience %s, parameters %s)",
            actors_label,
            sockets.endpoints["experience"],
            sockets.endpoints["params"],
        )
        learner.run_experiment()
        # What the actors' experience came to: stored, dropped by reason (peer_lost: actors
        # killed or frozen mid-episode), keepalives.
        log.info(
            "%s",
            experience_summary(
                learner._receiver.ingest.counters(),
                dict(learner.row_offsets),
                sockets.refused if sockets.encrypted else None,
                actors_report(),
            ),
        )
        runner.write_operative_config(run_spec["dir"])
    finally:
        learner.close()
