"""The tracked Dopamine runner that ``memoire train`` and distributed training run.

Dopamine's ``Runner`` / ``TrainRunner`` with memoire's trackers (:class:`TrackingMixin`:
``episodes.csv``, ``replay.csv`` and a progress line per iteration, see
:mod:`memoire.experiments.trackers`; the replay figures also as TensorBoard scalars through
Dopamine's collector dispatcher), built by the one runner factory :func:`create_runner`;
the environment the runner would build (:func:`environment_fn`), seeds, gin loading and the
operative config. The episode loop is :mod:`memoire.experiments.episode_loop`'s. The command
line is :mod:`memoire.commands.train`, which runs :mod:`memoire.experiments.train`.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import time
import types
from typing import Any, Sequence

import gin
import numpy as np

from memoire import cli, progress
from memoire.experiments import episode_loop, replay_routing, trackers
from memoire.gin_query import query

CONFIG_FILE = "config.gin"
# Seconds between the INFO lines that show a long phase is alive (each episode: DEBUG).
PHASE_LINE_EVERY_S = 60.0

log = logging.getLogger(__name__)

# Dopamine's create_agent names -> the gin configurable whose `seed` the run number sets.
_AGENT_CLASSES = {
    "jax_dqn": "JaxDQNAgent",
    "jax_quantile": "JaxQuantileAgent",
    "jax_rainbow": "JaxRainbowAgent",
    "full_rainbow": "JaxFullRainbowAgent",
    "jax_implicit_quantile": "JaxImplicitQuantileAgent",
}


# ---------------------------------------------------------------------------------------------
# Environments.


def seed_environment(environment: Any, seed: int) -> None:
    """Seeds a gymnasium env inside Dopamine's wrapper (its own generator; later resets go on
    from it). Other environments are left alone."""
    inner = getattr(environment, "environment", None)
    if inner is not None and hasattr(inner, "reset") and hasattr(inner, "np_random"):
        inner.reset(seed=int(seed))
        if hasattr(inner, "action_space"):
            inner.action_space.seed(int(seed))


# ---------------------------------------------------------------------------------------------
# Runners.


class TrackingMixin:
    """Adds trackers, seeding and per-iteration lines to a Dopamine Runner, without changing it.

    Overrides ``_run_one_episode`` to tell termination from truncation (and to end an episode
    at the environment's own time limit), ``_run_one_phase`` to know the phase, and
    ``_run_one_iteration`` to write the replay figures and a progress line.
    """

    def __init__(self, base_dir, create_agent_fn, *, seed: int | None = None, **kwargs):
        super().__init__(base_dir, create_agent_fn, **kwargs)
        _write_tensorboard_without_tf(getattr(self, "_collector_dispatcher", None))
        self._seed = seed
        self._end_recorder = episode_loop.install_end_recorder(self._environment)
        if seed is not None:
            seed_environment(self._environment, seed)
        self._phase = "train"
        self._phase_steps, self._phase_min_steps, self._phase_line_at = 0, 0, time.monotonic()
        self._say_episodes = False  # Dopamine's fine_grained_print_to_console, per phase
        self._iteration = self._start_iteration
        self._episodes = trackers.EpisodeTracker(base_dir, self._start_iteration)
        self._replay_tracker = trackers.ReplayTracker(base_dir, self._start_iteration)
        self._probe = trackers.ReplayProbe(self._agent)
        self._replay_tracker.start_clock(self._probe.add_count, self._probe.sampled)

    @property
    def start_iteration(self) -> int:
        """The first iteration this runner will play (> 0 after a resume)."""
        return self._start_iteration

    @property
    def agent(self):
        return self._agent

    def run_experiment(self):
        """Dopamine's loop over iterations, with memoire's progress instead of Dopamine's tqdm
        bar (which interleaves with log lines, and fills a log file with carriage returns): a
        bar on a terminal (log lines above it), nothing more in a log, whose per-iteration
        lines say the same. A run that has done all its iterations says so and trains no more."""
        if self._num_iterations <= self._start_iteration:
            log.info(
                "%s: all %d iterations are done (a finished run resumes as finished); "
                "nothing to train. Delete the folder, or choose another --base_dir, to start over",
                self._base_dir,
                self._num_iterations,
            )
        from dopamine.discrete_domains import run_experiment as dopamine_runner

        with progress.Progress(self._num_iterations, "iterations", log, unit="it") as bar:
            bar.update(self._start_iteration, quiet=True)

            def counted(iterable, **_):
                for item in iterable:
                    yield item
                    bar.update(1, quiet=True)

            # Dopamine's run_experiment names its bar module `tqdm` (import tqdm.auto as tqdm).
            saved = dopamine_runner.tqdm
            dopamine_runner.tqdm = types.SimpleNamespace(tqdm=counted)
            try:
                return super().run_experiment()
            finally:
                dopamine_runner.tqdm = saved

    def _run_one_phase(self, min_steps, statistics, run_mode_str):
        # Dopamine writes a line per episode to stdout (sys.stdout.write, fine-grained printing),
        # which is for the command's result: _run_one_episode logs it instead (see there).
        self._phase = run_mode_str
        self._phase_steps, self._phase_min_steps = 0, min_steps
        self._phase_line_at = time.monotonic()
        fine = self._say_episodes = getattr(self, "_fine_grained_print_to_console", False)
        self._fine_grained_print_to_console_enabled = False
        try:
            return super()._run_one_phase(min_steps, statistics, run_mode_str)
        finally:
            self._fine_grained_print_to_console_enabled = fine

    def _say_episode(self, length: int, episode_return: float) -> None:
        """Dopamine's fine-grained line (``Steps executed: ... Return: ...``), on stderr: each
        episode at DEBUG, and at most one INFO line per :data:`PHASE_LINE_EVERY_S` seconds
        of a phase, so that a long iteration shows it is alive."""
        self._phase_steps += length
        if not self._say_episodes:
            return
        text = (
            f"iteration {self._iteration + 1}/{self._num_iterations} {self._phase}: "
            f"{self._phase_steps}/{self._phase_min_steps} steps, episode length {length}, "
            f"return {episode_return:g}"
        )
        now = time.monotonic()
        if now - self._phase_line_at >= PHASE_LINE_EVERY_S:
            self._phase_line_at = now
            log.info(text)
        else:
            log.debug(text)

    def _run_one_episode(self):
        # Dopamine's loop, as memoire plays it everywhere (episode_loop.play_episode).
        episode = episode_loop.play_episode(
            self._environment,
            self._agent,
            self._end_recorder,
            max_steps_per_episode=self._max_steps_per_episode,
            clip_rewards=self._clip_rewards,
            end_agent_episode=self._end_episode,
        )
        self._say_episode(episode.length, episode.total_reward)
        self._episodes.record(
            iteration=self._iteration,
            phase=self._phase,
            episode_return=episode.total_reward,
            length=episode.length,
            terminated=episode.terminated,
        )
        return episode.length, episode.total_reward

    def _end_episode(self, reward, terminal=True):
        agent = self._agent
        replay = getattr(agent, "_replay", None)
        memory = getattr(replay, "memory", None)
        if terminal or memory is None or agent.eval_mode:
            return super()._end_episode(reward, terminal)
        # A TF agent's end_episode stores every end as terminal (Dopamine has no truncation
        # signal there). Store a truncation through the agent's own _store_transition (its
        # priority rule included) as not terminal, with the memory's episode_end set for this
        # one add: the memory then never bootstraps across the cut (nor treats it as terminal).
        memory.add = functools.partial(type(memory).add, memory, episode_end=True)
        try:
            agent._store_transition(agent._observation, agent.action, reward, False)
        finally:
            del memory.add

    def _run_one_iteration(self, iteration):
        self._iteration = iteration
        start = time.time()
        steps0 = self._episodes.env_steps
        statistics = super()._run_one_iteration(iteration)
        sampled = self._probe.sampled
        row = self._replay_tracker.record(
            iteration=iteration,
            env_steps=self._episodes.env_steps,
            replay_size=self._probe.size,
            add_count=self._probe.add_count,
            sampled=sampled,
            memory=self._probe.name,
        )
        self._write_replay_statistics(iteration, row, sampled)
        log.info(
            _iteration_line(
                iteration,
                self._num_iterations,
                statistics,
                self._episodes.env_steps,
                (self._episodes.env_steps - steps0) / max(time.time() - start, 1e-9),
                self._probe.size,
            )
        )
        return statistics

    def _write_replay_statistics(self, iteration, row, sampled) -> None:
        """The replay figures (:func:`~.trackers.replay_scalars`) to Dopamine's collector
        dispatcher, at step ``iteration``: its TensorBoard collector writes them into the run's
        event files beside Dopamine's ``Train/...`` summaries (and its other collectors take
        them as they take Dopamine's). Nothing without a dispatcher."""
        dispatcher = getattr(self, "_collector_dispatcher", None)
        if dispatcher is None:
            return
        from dopamine.metrics import statistics_instance

        values = trackers.replay_scalars(row, self._probe.priorities(), sampled)
        dispatcher.write(
            [
                statistics_instance.StatisticsInstance(tag, value, iteration)
                for tag, value in values.items()
            ]
        )

    def close(self) -> None:
        self._episodes.close()
        self._replay_tracker.close()


def _write_tensorboard_without_tf(dispatcher) -> None:
    """Swaps Dopamine's 'tensorboard' collector in ``dispatcher`` for
    :func:`tensorboard_collector`'s when TensorFlow runs in graph mode, where Dopamine's writes
    nothing: its ``tf.summary.scalar`` calls build ops no session runs, and its file writer is
    never initialized. ``memoire train`` (as Dopamine's train.py) disables TF2 behaviour, and
    Dopamine's JAX agents turn it back on only in ``debug_mode``: without this, such runs have
    no TensorBoard files at all, neither Dopamine's ``Train/...`` figures nor the replay's.
    The same figures then go to the same folder (``metrics/tensorboard``)."""
    if dispatcher is None:
        return
    import tensorflow as tf

    if tf.executing_eagerly():
        return
    from dopamine.metrics import tensorboard_collector as dopamine_tensorboard

    # The dispatcher keeps its collectors in a list; the agent holds the same dispatcher.
    collectors = dispatcher._collectors
    for i, c in enumerate(collectors):
        if isinstance(c, dopamine_tensorboard.TensorboardCollector):
            collectors[i] = tensorboard_collector()(os.path.dirname(os.path.dirname(c._base_dir)))


@functools.lru_cache(maxsize=None)
def tensorboard_collector():
    """The class of a Dopamine collector named 'tensorboard' that writes scalars with
    :class:`memoire.tensorboard.SummaryWriter` (no TensorFlow), into
    ``base_dir/metrics/tensorboard`` as Dopamine's does. Registered nowhere by default (see
    :func:`_write_tensorboard_without_tf`); ``collector_dispatcher.add_collector`` takes it."""
    from dopamine.metrics import collector

    from memoire.tensorboard import SummaryWriter

    class TensorboardCollector(collector.Collector):
        def __init__(self, base_dir: str):
            if not isinstance(base_dir, str):
                raise ValueError("Must specify a base directory for TensorboardCollector.")
            super().__init__(base_dir)
            self._writer = SummaryWriter(self._base_dir)

        def get_name(self) -> str:
            return "tensorboard"

        def write(self, statistics) -> None:
            by_step: dict[int, dict[str, float]] = {}
            for s in statistics:
                if self.check_type(s.type):
                    by_step.setdefault(int(s.step), {})[s.name] = float(s.value)
            for step, values in by_step.items():
                self._writer.scalars(step, values)

        def close(self) -> None:
            self._writer.close()

    return TensorboardCollector


def _iteration_line(iteration, num_iterations, statistics, env_steps, steps_per_s, size):
    def mean(key):
        v = statistics.get(key)
        return f"{np.mean(v):.1f}" if v else "-"

    return (
        f"iteration {iteration + 1}/{num_iterations}: "
        f"train return {mean('train_episode_returns')}, "
        f"eval return {mean('eval_episode_returns')}, env steps {env_steps}, "
        f"{steps_per_s:.0f} steps/s, replay size {size}"
    )


def _runner_classes():
    from dopamine.discrete_domains import run_experiment

    class TrackedRunner(TrackingMixin, run_experiment.Runner):
        """Dopamine's Runner (train then eval each iteration) with memoire's trackers."""

    class TrackedTrainRunner(TrackingMixin, run_experiment.TrainRunner):
        """Dopamine's TrainRunner (train only) with memoire's trackers."""

    return {"continuous_train_and_eval": TrackedRunner, "continuous_train": TrackedTrainRunner}


def runner_class(schedule: str | None = None):
    """The tracked runner class for ``schedule``, default: what ``create_runner.schedule``
    (Dopamine's binding) names, else 'continuous_train_and_eval'.

    Raises:
      ValueError: for a schedule other than 'continuous_train_and_eval' or 'continuous_train'.
    """
    if schedule is None:
        schedule = query("create_runner.schedule", "continuous_train_and_eval")
    classes = _runner_classes()
    if schedule not in classes:
        raise ValueError(
            f"create_runner.schedule must be one of {sorted(classes)}, got {schedule!r}"
        )
    return classes[schedule]


def environment_fn():
    """The function Dopamine's runner for the bound schedule builds its environment with.

    That is the runner class's ``create_environment_fn`` binding, else Dopamine's default,
    ``atari_lib.create_atari_environment`` (configured by its own bindings, e.g. ``game_name``).
    ``TrainRunner`` passes its own argument on to ``Runner``, so under 'continuous_train' only
    ``TrainRunner.create_environment_fn`` counts, as in Dopamine.
    """
    from dopamine.discrete_domains import atari_lib

    name = runner_class().__bases__[-1].__name__  # Tracked<X>(TrackingMixin, X): Dopamine's X
    ref = query(f"{name}.create_environment_fn", None)
    if ref is None:
        return atari_lib.create_atari_environment
    return getattr(ref, "scoped_configurable_fn", ref)


def create_runner(
    base_dir: str, seed: int | None = None, create_agent=None, schedule: str | None = None
):
    """Builds the tracked runner for ``schedule`` (see :func:`runner_class`), with
    :func:`~.replay_routing.create_agent_fn`'s agents unless ``create_agent`` is given (the one
    runner factory: ``memoire train``, distributed learners and code all build runners here).

    Raises:
      ValueError: for a schedule other than 'continuous_train_and_eval' or 'continuous_train'.
    """
    # The agent's first session run (TF agents) logs through absl's C++ logging, which no
    # setting reaches: cli.filtered_stderr drops such lines (unless --log-level debug).
    with cli.filtered_stderr():
        return runner_class(schedule)(
            base_dir, create_agent or replay_routing.create_agent_fn(), seed=seed
        )


# ---------------------------------------------------------------------------------------------
# Gin and seeds.


def seed_everything(seed: int) -> None:
    """Seeds the global generators Dopamine and TF draw from (memoire's own objects own
    their generators and are seeded separately)."""
    random.seed(seed)
    np.random.seed(seed)  # Dopamine's TF buffers sample from numpy's global generator.
    import tensorflow as tf

    tf.random.set_seed(seed)


def agent_seed_bindings(seed: int) -> list[str]:
    """``<AgentClass>.seed = seed`` for the JAX agent ``create_agent.agent_name`` selects,
    unless a gin file already bound that seed. [] for other agents."""
    cls = _AGENT_CLASSES.get(query("create_agent.agent_name", None))
    if cls is None or query(f"{cls}.seed", None) is not None:
        return []
    return [f"{cls}.seed = {int(seed)}"]


_search_paths: set[str] = set()


class _GinSearchMissFilter(logging.Filter):
    """Drops gin's ``ERROR:root:Path not found: x.gin``. Gin looks for an included file under
    each search path in turn and logs that error for every path the file is not under, on its
    way to the one it is under; a file under none raises (which :func:`prepare` reports)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.module == "resource_reader" and str(record.msg).startswith("Path not found")
        )


_gin_search_miss_filter = _GinSearchMissFilter()


def import_configurables() -> None:
    """Imports the modules Dopamine's train.py imports and memoire's agents, which register
    every configurable a gin file of theirs names (TensorFlow, JAX and Dopamine with them)."""
    from dopamine.discrete_domains import run_experiment  # noqa: F401  registers Dopamine

    from memoire.dopamine_compat import jax_agents  # noqa: F401  registers memoire's agents


def load_gin(gin_files: Sequence[str], bindings: Sequence[str]) -> None:
    """Parses gin as Dopamine's ``run_experiment.load_gin_configs`` does (unknown names are
    errors), after importing the modules Dopamine's train.py imports and memoire's agents.
    Includes are also searched beside each of ``gin_files``. ``DistributedConfig`` is known
    once :mod:`memoire.experiments.distributed` is imported (``memoire train`` imports it; a
    gin file can, with ``import memoire.experiments.distributed``)."""
    import_configurables()
    # Let `include 'x.gin'` inside a file find its neighbours, wherever we run from.
    logging.getLogger().addFilter(_gin_search_miss_filter)  # adding it twice keeps one
    for f in gin_files:
        d = os.path.dirname(os.path.abspath(f))
        if d not in _search_paths:
            gin.add_config_file_search_path(d)
            _search_paths.add(d)
    try:
        gin.parse_config_files_and_bindings(
            list(gin_files), bindings=list(bindings), skip_unknown=False
        )
    except AttributeError as e:
        if "estimator" not in str(e):
            raise
        raise ValueError(_NO_GIN_TF) from None
    place_tf_agents()


# Dopamine's TF agents and their `tf_device` (Dopamine's default: '/cpu:*').
_TF_AGENTS = ("DQNAgent", "RainbowAgent", "ImplicitQuantileAgent")


def place_tf_agents() -> None:
    """Binds ``<Agent>.tf_device = '/cpu:*'`` (Dopamine's default) where gin asks for a GPU
    that TensorFlow does not see, and says so in one line. Dopamine's stock TF files bind
    '/gpu:0'; on a machine without a GPU, TensorFlow would place the graph on the CPU anyway,
    after a 40-line complaint per variable group."""
    asked = {
        name: device
        for name in _TF_AGENTS
        if "gpu" in str(device := query(f"{name}.tf_device", "")).lower()
    }
    if not asked:
        return
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return
    with gin.unlock_config():
        gin.parse_config([f"{name}.tf_device = '/cpu:*'" for name in asked])
    log.info(
        "no GPU visible to TensorFlow: %s placed on '/cpu:*' instead",
        ", ".join(f"{name}.tf_device {device!r}" for name, device in asked.items()),
    )


# One line: the import fails deep inside gin.tf with "module 'tensorflow' has no attribute
# 'estimator'", which says nothing about the gin file.
_NO_GIN_TF = (
    "`import gin.tf.external_configurables` needs tf.estimator, which this TensorFlow "
    "(2.16+) no longer has, so Dopamine's stock TF gin files cannot load (under Dopamine's own "
    "runner either); use the equivalent in configs/atari/ (tf_dqn.gin, tf_rainbow.gin, "
    "tf_c51.gin, tf_implicit_quantile.gin), or replace that line with "
    "`import memoire.dopamine_compat.tf_configurables`"
)


def write_operative_config(directory: str) -> str:
    path = os.path.join(directory, CONFIG_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(gin.operative_config_str())
    os.replace(tmp, path)
    return path
