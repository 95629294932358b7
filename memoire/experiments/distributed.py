"""Distributed training: one learner, N actor processes, from the same gin file.

Roles:

- **Actors** run the environment the gin configuration names (what Dopamine's runner would
  build: its ``create_environment_fn``, by default Atari with the gin-bound game; see
  :func:`memoire.experiments.train.environment_fn`) with the agent's epsilon-greedy policy on the
  learner's latest network parameters, and send their experience in chunks. An actor is the
  gin-configured Dopamine agent with its replay memory swapped for a recorder: the agent's own
  ``begin_episode``/``step``/``end_episode`` choose actions and build transitions exactly as in
  a single process, but nothing is trained there.
- **The learner** is Dopamine's Runner (TrainRunner under ``create_runner.schedule =
  'continuous_train'``) with memoire's trackers, whose training phase ingests actors'
  transitions instead of stepping an environment: each transition goes into the
  agent's replay memory and is followed by one ``_train_step`` (so ``update_period`` and
  ``min_replay_history`` keep their single-process meaning), and every ``publish_period``
  training steps the online parameters are published. On memoire's replay buffer (the
  default, see :mod:`memoire.experiments.train`) the transitions up to each sampling training
  step go in with one ``add_batch`` call (see :func:`ingest`). The evaluation phase and checkpoints
  (replay memory included) are Dopamine's, so a killed run resumes like a local one.

The transport sits behind four small interfaces (:class:`ExperienceSink`,
:class:`ExperienceSource`, :class:`ParameterPublisher`, :class:`ParameterSource`). This
module implements them over ``multiprocessing`` queues (one machine, ``transport =
'multiprocessing'``); a ZeroMQ implementation (``pub_bytes``/``sub_bytes`` for parameters,
a memoire server in central mode for experience) plugs in at :func:`make_transport`.

Parameters travel as ``flax.serialization.to_bytes`` (msgpack), never pickle. Experience
chunks travel as :class:`Chunk` objects (numpy arrays); the ZeroMQ transport will encode them
with memoire's codec.

Gin settings (``DistributedConfig.*``): ``num_actors`` (0 = single process), ``publish_period``,
``chunk_size``, ``queue_chunks``, ``transport``, ``experience_endpoint``, ``param_endpoint``.
"""

from __future__ import annotations

import dataclasses
import os
import queue as queue_lib
import sys
import time
from typing import Any, Protocol

import gin
import numpy as np

from memoire import cli
from memoire.experiments import trackers


@gin.configurable(module="memoire.distributed")
class DistributedConfig:
    """Settings of a distributed launch (all gin-bindable).

    Args:
      num_actors: actor processes; 0 runs everything in one process.
      publish_period: learner training steps between parameter publications.
      chunk_size: transitions per experience chunk an actor sends (an episode end also sends).
      queue_chunks: chunks in flight before actors block (backpressure keeps actors from
        running ahead of the learner without bound).
      transport: 'multiprocessing' (queues, this machine) or 'zmq' (a memoire server embedded
        in the learner; actors may run on other machines).
      experience_endpoint: the learner server's REP endpoint actors send experience to
        (ZeroMQ transport); 'auto' lets the OS choose a loopback port.
      param_endpoint: the learner server's PUB endpoint for parameters (ZeroMQ); 'auto' too.
      actor_threads: XLA CPU threads per actor process (actors only run small forward passes).
      spawn_actors: False starts no actor here: actors on this or other machines join with
        ``memoire actor --rep ... --pub ...`` (ZeroMQ transport; bind the endpoints to an
        interface they can reach, e.g. 'tcp://0.0.0.0:5555').

    Raises:
      ValueError: on a negative count, a period or size below 1, or an unknown transport.
    """

    def __init__(self, num_actors: int = 0, publish_period: int = 100, chunk_size: int = 64,
                 queue_chunks: int = 32, transport: str = "multiprocessing",
                 experience_endpoint: str = "auto",
                 param_endpoint: str = "auto", actor_threads: int = 1,
                 spawn_actors: bool = True):
        if num_actors < 0:
            raise ValueError(f"num_actors must be >= 0, got {num_actors}")
        for name, v in (("publish_period", publish_period), ("chunk_size", chunk_size),
                        ("queue_chunks", queue_chunks), ("actor_threads", actor_threads)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if transport not in ("multiprocessing", "zmq"):
            raise ValueError(f"transport must be 'multiprocessing' or 'zmq', got {transport!r}")
        self.num_actors = int(num_actors)
        self.publish_period = int(publish_period)
        self.chunk_size = int(chunk_size)
        self.queue_chunks = int(queue_chunks)
        self.transport = transport
        self.experience_endpoint = experience_endpoint
        self.param_endpoint = param_endpoint
        self.actor_threads = int(actor_threads)
        self.spawn_actors = bool(spawn_actors)
        if not self.spawn_actors and transport != "zmq":
            raise ValueError("spawn_actors=False needs transport 'zmq' (actors started by "
                             "endpoint with `memoire actor`)")

    def as_dict(self) -> dict:
        return dict(vars(self))


# ---------------------------------------------------------------------------------------------
# Experience chunks.


@dataclasses.dataclass
class Chunk:
    """Consecutive transitions of one actor, as the agent stored them.

    Attributes:
      observation: ``obs_dtype[n, *obs_shape]``, the observation each action was taken at.
      action: ``int32[n]``.
      reward: ``float32[n]``, as the agent received it (clipped if the runner clips).
      terminal: ``bool[n]``, the environment reached a terminal state after this step.
      episode_end: ``bool[n]``, the episode ended after this step (terminal or truncated).
      episodes: ``float64[m, 3]``, one row per episode that ended in this chunk:
        undiscounted unclipped return, length, terminated (1.0) or truncated (0.0).
    """

    observation: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminal: np.ndarray
    episode_end: np.ndarray
    episodes: np.ndarray

    def __len__(self) -> int:
        return len(self.action)

    def validate(self) -> None:
        """Raises ValueError naming the first field whose length, rank or dtype is wrong."""
        n = len(self.action)
        for name in ("observation", "action", "reward", "terminal", "episode_end"):
            a = getattr(self, name)
            if not isinstance(a, np.ndarray) or a.ndim < 1 or len(a) != n:
                raise ValueError(f"chunk field {name}: expected an array of length {n}, got "
                                 f"{getattr(a, 'shape', type(a).__name__)}")
        for name in ("action", "reward", "terminal", "episode_end"):
            if getattr(self, name).ndim != 1:
                raise ValueError(f"chunk field {name}: expected shape [{n}], got "
                                 f"{getattr(self, name).shape}")
        if self.terminal.dtype != np.bool_ or self.episode_end.dtype != np.bool_:
            raise ValueError("chunk fields terminal and episode_end must be bool, got "
                             f"{self.terminal.dtype} and {self.episode_end.dtype}")
        if np.any(self.terminal & ~self.episode_end):
            raise ValueError("chunk: a terminal step must also be an episode end")
        if (self.episodes.ndim != 2 or self.episodes.shape[1] != 3
                or len(self.episodes) != int(self.episode_end.sum())):
            raise ValueError(f"chunk field episodes: expected shape [{int(self.episode_end.sum())}"
                             f", 3], got {self.episodes.shape}")

    @staticmethod
    def concatenate(chunks: list["Chunk"]) -> "Chunk":
        return Chunk(*(np.concatenate([getattr(c, f.name) for c in chunks])
                       for f in dataclasses.fields(Chunk)))

    def split(self, n: int) -> tuple["Chunk", "Chunk"]:
        """(first n transitions, the rest); episode rows follow their episode ends."""
        m = int(self.episode_end[:n].sum())
        head = Chunk(self.observation[:n], self.action[:n], self.reward[:n], self.terminal[:n],
                     self.episode_end[:n], self.episodes[:m])
        tail = Chunk(self.observation[n:], self.action[n:], self.reward[n:], self.terminal[n:],
                     self.episode_end[n:], self.episodes[m:])
        return head, tail


class EpisodeAssembler:
    """Releases each actor's transitions only up to its last episode end.

    Dopamine's replay memories turn a single stream of transitions into training elements
    (n-step returns, frame stacks), so interleaving two actors' half-episodes would splice
    them. The learner keeps each actor's unfinished episode here until it ends.
    """

    def __init__(self):
        self._pending: dict[int, list[Chunk]] = {}

    def add(self, actor_id: int, chunk: Chunk) -> Chunk | None:
        """Adds a chunk; returns the complete episodes now available from that actor, if any."""
        parts = self._pending.setdefault(actor_id, [])
        parts.append(chunk)
        if not chunk.episode_end.any():
            return None
        whole = Chunk.concatenate(parts)
        last_end = int(np.flatnonzero(whole.episode_end)[-1]) + 1
        done, rest = whole.split(last_end)
        self._pending[actor_id] = [rest] if len(rest) else []
        return done

    def pending(self, actor_id: int) -> int:
        """Transitions held back for ``actor_id``."""
        return sum(len(c) for c in self._pending.get(actor_id, []))


# ---------------------------------------------------------------------------------------------
# Transport interfaces and the multiprocessing implementation.


class ExperienceSink(Protocol):
    def add_chunk(self, actor_id: int, chunk: Chunk) -> bool:
        """Sends a chunk; blocks while the learner is behind. False if shutting down."""


class ExperienceSource(Protocol):
    def get_chunk(self, timeout: float) -> tuple[int, Chunk] | None:
        """The next ``(actor_id, chunk)``, or None after ``timeout`` seconds."""


class ParameterPublisher(Protocol):
    def publish(self, version: int, payload: bytes) -> None:
        """Makes ``payload`` (serialized parameters) the latest, tagged ``version``. Never
        blocks."""


class ParameterSource(Protocol):
    def latest(self) -> tuple[int, bytes] | None:
        """The newest ``(version, payload)`` published since the last call, or None."""


class QueueExperienceSink:
    """ExperienceSink over a bounded ``multiprocessing`` queue; gives up when ``stop`` is set."""

    def __init__(self, q, stop, poll_s: float = 0.2):
        self._q, self._stop, self._poll = q, stop, poll_s

    def add_chunk(self, actor_id: int, chunk: Chunk) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put((actor_id, chunk), timeout=self._poll)
                return True
            except queue_lib.Full:
                continue
        return False


class QueueExperienceSource:
    def __init__(self, q):
        self._q = q

    def get_chunk(self, timeout: float) -> tuple[int, Chunk] | None:
        try:
            return self._q.get(timeout=timeout)
        except queue_lib.Empty:
            return None


class QueueParameterPublisher:
    """Publishes to one small queue per actor; when one is full the oldest entry is dropped,
    so a slow actor gets the newest parameters, not a backlog. Waits at most about 0.2 s per
    actor queue."""

    def __init__(self, queues):
        self._queues = list(queues)

    def publish(self, version: int, payload: bytes) -> None:
        for q in self._queues:
            for _ in range(4):  # bounded: the actor may race us for the slot
                try:
                    q.put_nowait((version, payload))
                    break
                except queue_lib.Full:
                    try:  # drop the oldest; it may still be in the feeder thread, so wait a bit
                        q.get(timeout=0.05)
                    except queue_lib.Empty:
                        pass


class QueueParameterSource:
    def __init__(self, q):
        self._q = q

    def latest(self) -> tuple[int, bytes] | None:
        newest = None
        while True:
            try:
                newest = self._q.get_nowait()
            except queue_lib.Empty:
                return newest


@dataclasses.dataclass
class LocalTransport:
    """The multiprocessing transport's pieces.

    Attributes:
      source, publisher: the learner's ends.
      actor_args: per actor, picklable arguments ``(experience_queue, param_queue, stop)``
        for :func:`actor_main`.
      stop: event that tells actors to finish.
      queues: every queue, so shutdown can unblock and abandon them.
    """

    source: QueueExperienceSource
    publisher: QueueParameterPublisher
    actor_args: list
    stop: Any
    queues: list

    def shutdown(self, procs, timeout_s: float = 10.0) -> None:
        """Stops actors: sets ``stop``, drains experience so blocked puts return, joins with
        a deadline, terminates stragglers, and abandons unsent queue data (a queue's feeder
        thread would otherwise wait forever on a pipe no one reads)."""
        self.stop.set()
        exp_q = self.queues[0]
        deadline = time.time() + timeout_s
        while any(p.is_alive() for p in procs) and time.time() < deadline:
            try:
                exp_q.get(timeout=0.1)
            except queue_lib.Empty:
                pass
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.time()))
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for q in self.queues:
            q.cancel_join_thread()
            q.close()


@dataclasses.dataclass
class QueueActorEnds:
    """An actor's ends of the multiprocessing transport (picklable into the spawned actor)."""

    exp_q: Any
    param_q: Any
    stop: Any

    def open(self):
        """Returns ``(sink, parameter_source, should_stop, close)``."""
        def close() -> None:
            self.exp_q.cancel_join_thread()  # the learner may have stopped reading: don't hang
        return (QueueExperienceSink(self.exp_q, self.stop), QueueParameterSource(self.param_q),
                self.stop.is_set, close)


def make_transport(config: DistributedConfig, ctx):
    """Builds the transport ``config.transport`` names, for ``config.num_actors`` actors:
    ``'multiprocessing'`` (queues, this machine) or ``'zmq'`` (a memoire server embedded in the
    learner; see :mod:`memoire.experiments.distributed_zmq`). Each ``actor_args[i]`` is a
    one-tuple of an object whose ``open()`` gives the actor its ends."""
    if config.transport == "zmq":
        from memoire.experiments import distributed_zmq

        return distributed_zmq.make_zmq_transport(config, ctx)
    exp_q = ctx.Queue(maxsize=config.queue_chunks)
    param_qs = [ctx.Queue(maxsize=2) for _ in range(config.num_actors)]
    stop = ctx.Event()
    return LocalTransport(source=QueueExperienceSource(exp_q),
                          publisher=QueueParameterPublisher(param_qs),
                          actor_args=[(QueueActorEnds(exp_q, param_qs[i], stop),)
                                      for i in range(config.num_actors)],
                          stop=stop, queues=[exp_q] + param_qs)


# ---------------------------------------------------------------------------------------------
# Parameters.


def params_to_bytes(params: Any) -> bytes:
    """Serializes a parameter pytree with flax's msgpack format (no pickle)."""
    from flax import serialization

    return serialization.to_bytes(params)


def params_from_bytes(template: Any, payload: bytes) -> Any:
    """Restores parameters shaped like ``template`` from :func:`params_to_bytes` output.

    Raises:
      ValueError: if the payload does not match the template's structure.
    """
    from flax import serialization

    try:
        return serialization.from_bytes(template, payload)
    except Exception as e:  # msgpack and flax raise several types for a bad payload
        raise ValueError(f"parameter payload does not match the agent's parameters: {e}") from e


# ---------------------------------------------------------------------------------------------
# Actor.


class _Recorder:
    """Stands in for an actor agent's replay memory: keeps the transitions the agent stores.

    ``add_count`` stays 0, so the agent's ``_train_step`` never trains (it only counts steps,
    which drives the epsilon schedule).
    """

    add_count = 0
    _sampling_distribution = None  # the agent's isinstance check for prioritized replay

    def __init__(self):
        self.elements: list = []

    def add(self, element, *args, **kwargs) -> None:
        self.elements.append(element)

    def take(self) -> list:
        out, self.elements = self.elements, []
        return out


def _chunk_from_elements(elements: list, episodes: list) -> Chunk:
    return Chunk(
        observation=np.stack([np.asarray(e.observation) for e in elements]),
        action=np.asarray([int(e.action) for e in elements], np.int32),
        reward=np.asarray([float(e.reward) for e in elements], np.float32),
        terminal=np.asarray([bool(e.is_terminal) for e in elements], np.bool_),
        episode_end=np.asarray([bool(e.episode_end) for e in elements], np.bool_),
        episodes=np.asarray(episodes, np.float64).reshape(-1, 3),
    )


def _default_priority(agent):
    """The priority the agent's ``_store_transition`` gives a new transition (Dopamine 4.1.2's
    JAX agents: None without a prioritized distribution, 1.0 for the 'uniform' scheme, else the
    largest priority recorded)."""
    from dopamine.jax.replay_memory import samplers

    dist = agent._replay._sampling_distribution
    if not isinstance(dist, samplers.PrioritizedSamplingDistribution):
        return None
    if getattr(agent, "_replay_scheme", None) == "uniform":
        return 1.0
    return dist._sum_tree.max_recorded_priority


def ingest(agent, chunk: Chunk, after_step=lambda: None) -> None:
    """Stores ``chunk`` in a JAX agent's replay memory with one ``_train_step`` per transition,
    as if the agent had stepped the environment itself.

    On a memory with ``add_batch`` (memoire's), the transitions up to and including the next
    step whose ``_train_step`` samples (``training_steps % update_period == 0``) are added in
    one call, then their training steps run: every sample sees exactly the transitions it would
    have seen one add at a time, and the priority of new transitions (fixed between training
    updates) is the agent's rule. Other memories get one ``_store_transition`` per transition.

    Args:
      agent: a Dopamine JAX agent (JaxDQNAgent or a subclass), not in eval mode.
      chunk: the transitions, in order; episodes complete or continuing the previous chunk's.
      after_step: called after every training step (the learner publishes parameters there).
    """
    replay = agent._replay
    n = len(chunk)
    if not hasattr(replay, "add_batch"):
        for i in range(n):
            agent._store_transition(chunk.observation[i], chunk.action[i], chunk.reward[i],
                                    bool(chunk.terminal[i]),
                                    episode_end=bool(chunk.episode_end[i]))
            agent._train_step()
            after_step()
        return
    period = int(agent.update_period)
    start = 0
    while start < n:
        end = min(n, start + (-int(agent.training_steps)) % period + 1)
        replay.add_batch(chunk.observation[start:end], chunk.action[start:end],
                         chunk.reward[start:end], chunk.terminal[start:end],
                         chunk.episode_end[start:end], priorities=_default_priority(agent))
        for _ in range(end - start):
            agent._train_step()
            after_step()
        start = end


def environment_from_gin():
    """Builds the environment Dopamine's Runner would for the loaded gin configuration (see
    :func:`memoire.experiments.train.environment_fn`: the runner's ``create_environment_fn``,
    else Atari with the gin-bound game)."""
    from memoire.experiments.train import environment_fn

    return environment_fn()()


def run_actor(actor_id: int, sink: ExperienceSink, params: ParameterSource, *,
              chunk_size: int, seed: int, should_stop, max_steps: int | None = None) -> int:
    """Runs one actor until ``should_stop()`` or ``max_steps`` environment steps.

    Gin must already be loaded. Returns the environment steps taken.
    """
    from memoire.experiments import replay_routing, train

    environment = environment_from_gin()
    agent = replay_routing.create_agent_fn()(None, environment, summary_writer=None)
    recorder = _Recorder()
    agent._replay = recorder  # the actor trains nothing; its memory only collects
    agent.eval_mode = False
    ends = train._install_end_recorder(environment)
    train.seed_environment(environment, seed)
    max_per_episode = train.query("Runner.max_steps_per_episode", 27000)
    clip = train.query("Runner.clip_rewards", True)

    def refresh():
        got = params.latest()
        if got is not None:
            version, payload = got
            agent.online_params = params_from_bytes(agent.online_params, payload)
            agent.training_steps = max(agent.training_steps, int(version))

    steps = 0
    episodes: list = []

    def flush() -> bool:
        nonlocal episodes
        elements = recorder.take()
        if not elements:
            return True
        ok = sink.add_chunk(actor_id, _chunk_from_elements(elements, episodes))
        episodes = []
        refresh()
        return ok

    refresh()
    while not should_stop() and (max_steps is None or steps < max_steps):
        action = agent.begin_episode(environment.reset())
        length, total = 0, 0.0
        while True:
            observation, reward, _, _ = environment.step(action)
            length += 1
            total += reward
            steps += 1
            clipped = np.clip(reward, -1, 1) if clip else reward
            if (environment.game_over or (ends is not None and ends.truncated)
                    or length == max_per_episode):
                terminated = bool(ends.terminated if ends is not None
                                  else environment.game_over)
                agent.end_episode(clipped, terminated)
                episodes.append((total, length, float(terminated)))
                break
            action = agent.step(clipped, observation)
            if len(recorder.elements) >= chunk_size and not flush():
                return steps
            if should_stop():
                return steps
        if not flush():
            return steps
    flush()
    return steps


def actor_main(actor_id: int, facts: dict, config: dict, ends) -> None:
    """Entry point of an actor process: loads gin, seeds, opens its transport ends
    (``ends.open()``) and runs :func:`run_actor`."""
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                          f"intra_op_parallelism_threads={config['actor_threads']}")
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)
    from memoire.experiments import train

    seed = int(np.random.SeedSequence([facts["seed"], actor_id + 1]).generate_state(1)[0])
    train.load_gin(facts["gin_files"], facts["bindings"])
    train.seed_everything(seed)
    sink, params, should_stop, close = ends.open()
    try:
        run_actor(actor_id, sink, params, chunk_size=config["chunk_size"], seed=seed,
                  should_stop=should_stop, max_steps=config.get("max_steps"))
    except KeyboardInterrupt:
        pass
    finally:
        close()


# ---------------------------------------------------------------------------------------------
# Learner.


def _learner_class():
    from memoire.experiments.train import runner_class

    base = runner_class()  # the schedule's: TrainRunner ('continuous_train') has no eval phase

    class LearnerRunner(base):
        """Dopamine's Runner whose training phase ingests actors' experience."""

        def __init__(self, base_dir, create_agent_fn, *, source: ExperienceSource,
                     publisher: ParameterPublisher, publish_period: int,
                     actors_alive=lambda: True, seed=None, **kwargs):
            super().__init__(base_dir, create_agent_fn, seed=seed, **kwargs)
            from dopamine.jax.agents.dqn import dqn_agent

            if not isinstance(self._agent, dqn_agent.JaxDQNAgent):
                raise ValueError("distributed training needs a JAX agent (JaxDQNAgent or a "
                                 f"subclass), got {type(self._agent).__name__}")
            self._source = source
            self._publisher = publisher
            self._publish_period = publish_period
            self._actors_alive = actors_alive
            self._assembler = EpisodeAssembler()
            self.dropped_chunks = 0
            self._publish()

        def _publish(self) -> None:
            self._publisher.publish(int(self._agent.training_steps),
                                    params_to_bytes(self._agent.online_params))

        def _after_step(self) -> None:
            if self._agent.training_steps % self._publish_period == 0:
                self._publish()

        def _ingest(self, chunk: Chunk) -> None:
            ingest(self._agent, chunk, self._after_step)

        def _run_train_phase(self, statistics):
            self._phase = "train"
            self._agent.eval_mode = False
            start = time.time()
            steps, returns = 0, []
            idle_since = time.time()
            while steps < self._training_steps:
                got = self._source.get_chunk(timeout=0.5)
                if got is None:
                    if not self._actors_alive():
                        raise RuntimeError("all actors have exited; see their output above")
                    if time.time() - idle_since > 600:
                        raise TimeoutError("no experience from any actor for 600 s")
                    continue
                idle_since = time.time()
                actor_id, chunk = got
                try:
                    chunk.validate()
                except ValueError as e:  # counted and dropped: a peer never kills the learner
                    self.dropped_chunks += 1
                    print(f"[memoire] dropped a chunk from actor {actor_id}: {e}",
                          file=sys.stderr, flush=True)
                    continue
                done = self._assembler.add(actor_id, chunk)
                if done is None:
                    continue
                self._ingest(done)
                steps += len(done)
                for ret, length, terminated in done.episodes:
                    self._episodes.record(iteration=self._iteration, phase="train",
                                          episode_return=ret, length=int(length),
                                          terminated=bool(terminated), actor=actor_id)
                    returns.append(ret)
                    statistics.append({"train_episode_lengths": int(length),
                                       "train_episode_returns": ret})
            average_return = float(np.mean(returns)) if returns else 0.0
            steps_per_second = steps / max(time.time() - start, 1e-9)
            statistics.append({"train_average_return": average_return})
            statistics.append({"train_average_steps_per_second": steps_per_second})
            return len(returns), average_return, steps_per_second

    return LearnerRunner


def run(facts: dict, config: DistributedConfig) -> int:
    """Starts ``config.num_actors`` actor processes and runs the learner here.

    Actors are stopped (event, then join with a timeout, then terminate) however the learner
    ends. Returns 0 on success.
    """
    import multiprocessing as mp

    from memoire.experiments import replay_routing, train

    ctx = mp.get_context("spawn")  # fork after TF/JAX start is unsafe
    transport = make_transport(config, ctx)
    actor_facts = {k: facts[k] for k in ("gin_files", "bindings", "seed")}
    procs = [ctx.Process(target=actor_main, name=f"memoire-actor-{i}", daemon=True,
                         args=(i, actor_facts, config.as_dict(), *transport.actor_args[i]))
             for i in range(config.num_actors if config.spawn_actors else 0)]
    for p in procs:
        p.start()
    alive = (lambda: any(p.is_alive() for p in procs)) if procs else (lambda: True)
    runner = None
    try:
        runner = _learner_class()(facts["dir"], replay_routing.create_agent_fn(),
                                  source=transport.source, publisher=transport.publisher,
                                  publish_period=config.publish_period,
                                  actors_alive=alive,
                                  seed=facts["seed"])
        train.write_operative_config(facts["dir"])
        if runner.start_iteration > 0:
            print(f"[memoire] resuming {facts['dir']} at iteration {runner.start_iteration}",
                  flush=True)
        where = ""
        if getattr(transport, "endpoints", None):
            where = f" (server rep {transport.endpoints['rep']}, pub {transport.endpoints['pub']})"
        who = f"{config.num_actors} actor(s)" if procs else "actors started by endpoint"
        print(f"[memoire] learner with {who} over {config.transport}{where}", flush=True)
        runner.run_experiment()
        train.write_operative_config(facts["dir"])
    finally:
        transport.shutdown(procs)
        if runner is not None:
            runner.close()
    return 0


def build_actor_parser():
    """The parser of ``memoire actor``."""
    parser = cli.ArgumentParser(prog="memoire actor", description=actor_cli.__doc__)
    parser.add_argument("--gin_files", action="append", default=[], required=True,
                        help="the learner's gin file (repeatable): same agent and environment")
    parser.add_argument("--gin_bindings", action="append", default=[],
                        help="gin binding (repeatable), as the learner's")
    parser.add_argument("--rep", required=True, help="the learner server's REP endpoint")
    parser.add_argument("--pub", required=True, help="the learner server's PUB endpoint")
    parser.add_argument("--actor_id", type=int, default=0,
                        help="this actor's number among the learner's actors")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of this actor's environment and exploration")
    parser.add_argument("--max_steps", type=int, default=None,
                        help="stop after this many environment steps (default: no limit)")
    parser.add_argument("--chunk_size", type=int, default=64,
                        help="steps per episode chunk streamed to the learner")
    return parser


@cli.entry_point("memoire actor")
def actor_cli(argv=None) -> int:
    """``memoire actor``: one actor joining a learner by endpoint (another machine, or a learner
    started with ``DistributedConfig.spawn_actors = False``).

        memoire actor --gin_files F [--gin_bindings B] --rep tcp://HOST:PORT --pub tcp://HOST:PORT
                      [--actor_id K] [--seed S] [--max_steps N]

    The gin files are the learner's (same agent and environment). It runs until ``--max_steps``
    environment steps, Ctrl-C, or the learner stops answering.
    """
    from memoire.experiments import distributed_zmq

    parser = build_actor_parser()
    args = parser.parse_args(argv)
    if args.chunk_size < 1:
        parser.error(f"--chunk_size must be >= 1, got {args.chunk_size}")
    cli.check_files(args.gin_files, "--gin_files")

    facts = {"gin_files": args.gin_files, "bindings": args.gin_bindings, "seed": args.seed}
    config = {"chunk_size": args.chunk_size, "actor_threads": 1, "max_steps": args.max_steps}
    actor_main(args.actor_id, facts, config, distributed_zmq.ActorEndpoints(args.rep, args.pub))
    return 0
