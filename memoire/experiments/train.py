"""Train a Dopamine agent from gin files: ``memoire train``.

``python -m memoire.experiments.train`` is the same.

Accepts Dopamine's flags, so Dopamine's own gin files work unchanged::

    memoire train --gin_files configs/dqn_cartpole_jax_local.gin --base_dir runs/dqn
    memoire train --sweep configs/sweep_dqn_cartpole.gin --index 5 --base_dir runs/sweep

A launch with index ``N`` of a sweep of ``S`` settings (a plain launch is a sweep of one
setting) is setting ``N mod S``, run ``N div S``, seeded by the run number; everything it
writes lives in ``base_dir/setting_<s>/run_<k>/``:

- ``setting.json``: index, setting, run, seed and the bindings that make the setting;
- ``config.gin``: gin's operative configuration, rewritten once the runner is built and again
  at the end (only parameters actually used appear in it);
- ``episodes.csv`` and ``replay.csv``: the trackers (see :mod:`memoire.experiments.trackers`);
- Dopamine's ``checkpoints/``, ``logs/`` and ``metrics/``.

Starting the same command again after a kill resumes from the last complete checkpoint (agent,
optimizer and replay memory), and the trackers drop the rows of the interrupted iteration.

Replay: agents run on memoire's replay buffers unless ``--replay dopamine`` (gin:
``replay_backend.name = 'dopamine'``) asks for Dopamine's own, for comparison (see
:mod:`memoire.experiments.replay_routing`). Which memory ran is the ``memory`` column of
``replay.csv``.

Environments: whatever the runner's ``create_environment_fn`` builds, by default Dopamine's
Atari (``atari_lib.create_atari_environment`` with the gin-bound game), so Dopamine's stock
Atari gin files run unchanged, e.g. with a short budget::

    memoire train --gin_files dopamine/jax/agents/dqn/configs/dqn.gin --base_dir runs/pong \
        --gin_bindings 'Runner.num_iterations = 2' --gin_bindings 'Runner.training_steps = 5000'

Dopamine's stock TF files ``import gin.tf.external_configurables``, which needs
``tf.estimator`` (gone from TensorFlow 2.16+); they stop with a one-line error, and
``configs/atari/tf_*.gin`` are the same files with that import replaced.

Gin is loaded in this order, later winning: the sweep's included files, ``--gin_files``, the
sweep setting's bindings, ``--gin_bindings``, then the seed of the agent (only if no file bound
it). If ``memoire.distributed.DistributedConfig.num_actors`` is bound above 0, the launch runs
a learner and that many actor processes (see :mod:`memoire.experiments.distributed`) instead.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import sys
import time
from typing import Any, Sequence

import gin
import numpy as np

from memoire import cli
from memoire.experiments import replay_routing
from memoire.experiments import sweep as sweep_lib
from memoire.experiments import trackers
from memoire.experiments.replay_routing import query

CONFIG_FILE = "config.gin"

# Dopamine's create_agent names -> the gin configurable whose `seed` the run number sets.
_AGENT_CLASSES = {
    "jax_dqn": "JaxDQNAgent",
    "jax_quantile": "JaxQuantileAgent",
    "jax_rainbow": "JaxRainbowAgent",
    "full_rainbow": "JaxFullRainbowAgent",
    "jax_implicit_quantile": "JaxImplicitQuantileAgent",
}


# ---------------------------------------------------------------------------------------------
# Environment end recording.


class _AleEnds:
    """The end flags of Dopamine's Atari environment, read from the emulator.

    Dopamine's ``AtariPreprocessing`` folds the ALE's ``(terminated, truncated)`` into one
    ``game_over`` and reads ``environment.env.ale`` directly, so no wrapper may sit between
    it and the ALE; the ALE itself still knows why the game stopped (its frame cap,
    ``max_num_frames_per_episode``, truncates).
    """

    def __init__(self, ale: Any):
        self._ale = ale

    @property
    def terminated(self) -> bool:
        return bool(self._ale.game_over(with_truncation=False))

    @property
    def truncated(self) -> bool:
        return bool(self._ale.game_truncated())


def _install_end_recorder(environment: Any):
    """Something whose ``terminated`` / ``truncated`` say how the environment's last step ended.

    Dopamine's wrappers fold gymnasium's ``(terminated, truncated)`` into one ``game_over``
    that does not tell a time limit from a true end. For ``GymPreprocessing`` (gym_lib) this
    wraps the gymnasium env inside it to record both flags of the last step; for Atari
    (``AtariPreprocessing``) it reads the ALE's own flags. Returns None for other
    environments, whose only truncation is the runner's ``max_steps_per_episode``.
    """
    import gymnasium

    # By the wrapper's class name: importing gym_lib here would register gin configurables
    # after the config is locked (the gin files import what they use).
    kind = type(environment).__name__
    inner = getattr(environment, "environment", None)
    if kind == "AtariPreprocessing":
        ale = getattr(getattr(inner, "unwrapped", None), "ale", None)
        return None if ale is None else _AleEnds(ale)
    if kind != "GymPreprocessing" or not isinstance(inner, gymnasium.Env):
        return None

    class EndRecorder(gymnasium.Wrapper):
        terminated = False
        truncated = False

        def reset(self, **kwargs):
            self.terminated = self.truncated = False
            return self.env.reset(**kwargs)

        def step(self, action):
            out = self.env.step(action)
            self.terminated, self.truncated = bool(out[2]), bool(out[3])
            return out

    recorder = EndRecorder(inner)
    environment.environment = recorder
    return recorder


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
        self._seed = seed
        self._ends = _install_end_recorder(self._environment)
        if seed is not None:
            seed_environment(self._environment, seed)
        self._phase = "train"
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

    def _run_one_phase(self, min_steps, statistics, run_mode_str):
        self._phase = run_mode_str
        return super()._run_one_phase(min_steps, statistics, run_mode_str)

    def _run_one_episode(self):
        # Dopamine's loop (run_experiment.Runner._run_one_episode), plus: stop at the
        # environment's own time limit, and store `terminated` as the environment said it.
        step_number = 0
        total_reward = 0.0
        action = self._initialize_episode()
        while True:
            observation, reward, is_terminal = self._run_one_step(action)
            total_reward += reward
            step_number += 1
            if self._clip_rewards:
                reward = np.clip(reward, -1, 1)
            env_truncated = self._ends is not None and self._ends.truncated
            if (self._environment.game_over or env_truncated
                    or step_number == self._max_steps_per_episode):
                break
            elif is_terminal:  # a life lost, not the end of the game
                self._end_episode(reward, is_terminal)
                action = self._agent.begin_episode(observation)
            else:
                action = self._agent.step(reward, observation)
        # A terminal state reached at the very step the time limit hits is a termination.
        terminated = bool(self._ends.terminated if self._ends is not None
                          else self._environment.game_over)
        self._end_episode(reward, terminated)
        self._episodes.record(iteration=self._iteration, phase=self._phase,
                              episode_return=total_reward, length=step_number,
                              terminated=terminated)
        return step_number, total_reward

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
        self._replay_tracker.record(iteration=iteration, env_steps=self._episodes.env_steps,
                                    replay_size=self._probe.size,
                                    add_count=self._probe.add_count,
                                    sampled=self._probe.sampled, memory=self._probe.name)
        print(_iteration_line(iteration, self._num_iterations, statistics,
                              self._episodes.env_steps,
                              (self._episodes.env_steps - steps0) / max(time.time() - start,
                                                                        1e-9),
                              self._probe.size), flush=True)
        return statistics

    def close(self) -> None:
        self._episodes.close()
        self._replay_tracker.close()


def _iteration_line(iteration, num_iterations, statistics, env_steps, steps_per_s, size):
    def mean(key):
        v = statistics.get(key)
        return f"{np.mean(v):.1f}" if v else "-"

    return (f"[memoire] iteration {iteration + 1}/{num_iterations}: "
            f"train return {mean('train_episode_returns')}, "
            f"eval return {mean('eval_episode_returns')}, env steps {env_steps}, "
            f"{steps_per_s:.0f} steps/s, replay size {size}")


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
        raise ValueError(f"create_runner.schedule must be one of {sorted(classes)}, "
                         f"got {schedule!r}")
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


def create_runner(base_dir: str, seed: int | None = None, create_agent=None,
                  schedule: str | None = None):
    """Builds the tracked runner for ``schedule`` (see :func:`runner_class`), with
    :func:`~.replay_routing.create_agent_fn`'s agents unless ``create_agent`` is given (the one
    runner factory: ``memoire train``, distributed learners and code all build runners here).

    Raises:
      ValueError: for a schedule other than 'continuous_train_and_eval' or 'continuous_train'.
    """
    return runner_class(schedule)(base_dir, create_agent or replay_routing.create_agent_fn(),
                                  seed=seed)


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
        return not (record.module == "resource_reader"
                    and str(record.msg).startswith("Path not found"))


_gin_search_miss_filter = _GinSearchMissFilter()


def load_gin(gin_files: Sequence[str], bindings: Sequence[str]) -> None:
    """Parses gin as Dopamine's ``run_experiment.load_gin_configs`` does (unknown names are
    errors), after importing the modules Dopamine's train.py imports. Includes are also
    searched beside each of ``gin_files``."""
    from dopamine.discrete_domains import run_experiment  # noqa: F401  registers Dopamine
    from memoire.experiments import distributed  # noqa: F401  registers DistributedConfig
    from memoire.dopamine_compat import jax_agents  # noqa: F401  registers memoire's agents

    # Let `include 'x.gin'` inside a file find its neighbours, wherever we run from.
    logging.getLogger().addFilter(_gin_search_miss_filter)  # adding it twice keeps one
    for f in gin_files:
        d = os.path.dirname(os.path.abspath(f))
        if d not in _search_paths:
            gin.add_config_file_search_path(d)
            _search_paths.add(d)
    try:
        gin.parse_config_files_and_bindings(list(gin_files), bindings=list(bindings),
                                            skip_unknown=False)
    except AttributeError as e:
        if "estimator" not in str(e):
            raise
        raise ValueError(_NO_GIN_TF) from None


# One line: the import fails deep inside gin.tf with "module 'tensorflow' has no attribute
# 'estimator'", which says nothing about the gin file.
_NO_GIN_TF = (
    "`import gin.tf.external_configurables` needs tf.estimator, which this TensorFlow "
    "(2.16+) no longer has, so Dopamine's stock TF gin files cannot load (under Dopamine's own "
    "runner either); use the equivalent in configs/atari/ (tf_dqn.gin, tf_rainbow.gin, "
    "tf_c51.gin, tf_implicit_quantile.gin), or replace that line with "
    "`import memoire.dopamine_compat.tf_configurables`")


def write_operative_config(directory: str) -> str:
    path = os.path.join(directory, CONFIG_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(gin.operative_config_str())
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------
# Command line.


def parse_args(argv: Sequence[str] | None):
    return build_parser().parse_args(argv)


def build_parser() -> cli.ArgumentParser:
    """The parser of ``memoire train``."""
    p = cli.ArgumentParser(prog="memoire train", description=__doc__.split("\n")[0])
    p.add_argument("--base_dir", required=True,
                   help="experiment directory; runs go to setting_<s>/run_<k>/ under it")
    p.add_argument("--gin_files", action="append", default=[],
                   help="gin file (repeatable), as in Dopamine; Dopamine's stock files work")
    p.add_argument("--gin_bindings", action="append", default=[],
                   help="gin binding (repeatable), as in Dopamine; wins over the files")
    p.add_argument("--index", type=int, default=0,
                   help="sweep index N: setting N mod S, run N div S (seed = run)")
    p.add_argument("--sweep", default=None, help="sweep gin file (see memoire.experiments.sweep)")
    p.add_argument("--replay", choices=replay_routing.REPLAY_BACKENDS, default=None,
                   help="whose replay buffer the agent uses (default: gin's "
                        "replay_backend.name, else memoire)")
    p.add_argument("--verbose", action="store_true", help="keep Dopamine's INFO logging")
    return p


def prepare(args) -> dict:
    """Resolves sweep, setting, run, seed and directory, loads gin, checks the agent and the
    directory, then writes ``setting.json``. Returns those facts as a dict (keys: sweep,
    setting, run, seed, dir, gin_files, bindings).

    Raises:
      cli.UsageError: a missing or unparsable file, a bad binding, an unknown agent or replay
        backend, a ``base_dir`` that cannot be a directory. Nothing has been written then.
    """
    try:
        sweep = sweep_lib.load_sweep(args.sweep) if args.sweep else sweep_lib.Sweep()
        setting, run = sweep.locate(args.index)
        setting_bindings = sweep.bindings(setting)
    except FileNotFoundError as e:  # the sweep file or a file it includes
        raise cli.UsageError(f"--sweep: {e.filename or args.sweep!r}: no such file") from None
    except sweep_lib.SweepError as e:
        raise cli.UsageError(e) from None
    seed = sweep_lib.seed_for_run(run)
    directory = sweep_lib.run_dir(args.base_dir, setting, run)
    cli.check_output_dir(directory, "--base_dir")
    cli.check_files(args.gin_files, "--gin_files")
    gin_files = list(sweep.gin_files) + list(args.gin_files)
    extra = list(args.gin_bindings)
    if getattr(args, "replay", None):
        extra.append(f"replay_backend.name = '{args.replay}'")
    bindings = setting_bindings + extra
    gin.clear_config()
    try:
        load_gin(gin_files, bindings)
    except (OSError, ValueError, SyntaxError, ImportError) as e:
        # Gin's own errors name the file and line; ImportError: a gin `import` line.
        raise cli.UsageError(f"gin: {e}") from None
    seed_bindings = agent_seed_bindings(seed)
    try:
        replay_routing.check_agent_name()
        with gin.unlock_config():
            if seed_bindings:
                gin.parse_config(seed_bindings)
            replay_routing.replay_backend()  # a bad name fails here, before anything runs
            replay_routing.tf_replay_bindings(seed)
    except ValueError as e:
        raise cli.UsageError(e) from None
    sweep_lib.write_setting_record(directory, index=args.index, setting=setting, run=run,
                                   seed=seed, bindings=setting_bindings, gin_files=gin_files,
                                   sweep_file=args.sweep, extra_bindings=extra)
    return dict(sweep=sweep, setting=setting, run=run, seed=seed, dir=directory,
                gin_files=gin_files, bindings=bindings + seed_bindings)


def run_local(facts: dict) -> int:
    """Runs one process: Dopamine's runner with trackers; resumes from checkpoints."""
    runner = create_runner(facts["dir"], seed=facts["seed"])
    write_operative_config(facts["dir"])
    if runner.start_iteration > 0:
        print(f"[memoire] resuming {facts['dir']} at iteration {runner.start_iteration}",
              flush=True)
    try:
        runner.run_experiment()
    finally:
        runner.close()
    write_operative_config(facts["dir"])
    return 0


@cli.entry_point("memoire train")
def main(argv: Sequence[str] | None = None) -> int:
    """``memoire train``. Returns the process exit code."""
    args = parse_args(argv)
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.INFO if args.verbose else absl_logging.WARNING)
    facts = prepare(args)
    seed_everything(facts["seed"])
    import tensorflow as tf

    # As Dopamine's train.py does: TF agents need graph mode; JAX agents switch back to v2.
    tf.compat.v1.disable_v2_behavior()
    print(f"[memoire] setting {facts['setting']} run {facts['run']} seed {facts['seed']} "
          f"-> {facts['dir']}", flush=True)
    from memoire.experiments import distributed

    config = distributed.DistributedConfig()
    if config.num_actors > 0:
        return distributed.run(facts, config)
    return run_local(facts)


if __name__ == "__main__":
    sys.exit(main())
