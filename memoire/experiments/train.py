"""Train a Dopamine agent from gin files: what ``memoire train`` runs.

The command's arguments are parsed by :mod:`memoire.commands.train`, then :func:`launch` runs.

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

The runner is Dopamine's with memoire's trackers (:mod:`memoire.experiments.runner`).

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
a learner and that many actor processes (see :mod:`memoire.experiments.distributed`) instead;
with ``--launcher ray`` (gin: ``DistributedConfig.launcher = 'ray'``) they are Ray actors on a
Ray cluster (see :mod:`memoire.experiments.ray_launcher`); with ``--launcher slurm`` the command
writes and submits a SLURM job whose tasks are the learner and the actors (see
:mod:`memoire.experiments.slurm_launcher`).
"""

from __future__ import annotations

import logging
import os
import signal

import gin

from memoire import cli
from memoire.experiments import (
    distributed,  # registers DistributedConfig before gin is read
    ray_launcher,  # registers RayConfig (Ray itself: only when used)
    replay_routing,
    slurm_launcher,  # registers SlurmConfig
)
from memoire.experiments import runner as runner_lib
from memoire.experiments import sweep as sweep_lib
from memoire.gin_query import query

log = logging.getLogger(__name__)

# How long the learner waits for the replay server gin points it at before it says there is
# none (seconds; a running server answers at once). Once it has answered, the agent's proxy
# rides out restarts for its own (1 + retries) * timeout seconds.
SERVER_WAIT_S = 5.0


def _launcher_bindings(args) -> list[str]:
    out = []
    if getattr(args, "launcher", None):
        out.append(f"DistributedConfig.launcher = '{args.launcher}'")
    if getattr(args, "ray_address", None) is not None:
        out.append(f"RayConfig.address = {args.ray_address!r}")
    if getattr(args, "insecure", False):
        out += ["RayConfig.curve = 'off'", "SlurmConfig.curve = 'off'"]
    return out


def _check_launcher() -> None:
    """A Ray launch needs actors and Ray itself, a SLURM launch actors and a valid
    SlurmConfig (checked before anything is written)."""
    config = distributed.DistributedConfig()
    if config.launcher == "slurm":
        if config.num_actors < 1:
            raise ValueError(
                "DistributedConfig.launcher = 'slurm' needs DistributedConfig.num_actors >= 1"
            )
        slurm_launcher.SlurmConfig()
    if config.launcher == "ray":
        if config.num_actors < 1:
            raise ValueError(
                "DistributedConfig.launcher = 'ray' needs DistributedConfig.num_actors >= 1"
            )
        ray_launcher.RayConfig()
        ray_launcher.import_ray()


def prepare(args, write: bool = True) -> dict:
    """Resolves sweep, setting, run, seed and directory, loads gin, checks the agent and the
    directory, then writes ``setting.json`` (unless ``write`` is False: a SLURM job's actor
    tasks only read). Returns those facts as a dict (keys: sweep, setting, run, seed, dir,
    gin_files, bindings).

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
    extra += _launcher_bindings(args)
    bindings = setting_bindings + extra
    gin.clear_config()
    try:
        runner_lib.load_gin(gin_files, bindings)
    except (OSError, ValueError, SyntaxError, ImportError) as e:
        # Gin's own errors name the file and line; ImportError: a gin `import` line.
        raise cli.UsageError(f"gin: {e}") from None
    seed_bindings = runner_lib.agent_seed_bindings(seed)
    try:
        replay_routing.check_agent_name()
        with gin.unlock_config():
            if seed_bindings:
                gin.parse_config(seed_bindings)
            replay_routing.replay_backend()  # a bad name fails here, before anything runs
            replay_routing.tf_replay_bindings(seed)
        _check_launcher()
    except ValueError as e:
        raise cli.UsageError(e) from None
    facts = dict(
        sweep=sweep,
        setting=setting,
        run=run,
        seed=seed,
        dir=directory,
        gin_files=gin_files,
        bindings=bindings + seed_bindings,
        record=dict(
            index=args.index,
            setting=setting,
            run=run,
            seed=seed,
            bindings=setting_bindings,
            gin_files=gin_files,
            sweep_file=args.sweep,
            extra_bindings=extra,
        ),
    )
    if write:
        write_record(facts)
    return facts


def write_record(facts: dict) -> None:
    """Writes the run's ``setting.json`` (what :func:`prepare` found)."""
    sweep_lib.write_setting_record(facts["dir"], **facts["record"])


def iterations_left(facts: dict) -> int:
    """Iterations the run in ``facts['dir']`` has still to train: ``Runner.num_iterations``
    minus those its last complete checkpoint holds (Dopamine's runner resumes after it)."""
    import inspect

    from dopamine.discrete_domains import checkpointer, run_experiment

    default = inspect.signature(run_experiment.Runner.__init__).parameters["num_iterations"]
    total = int(query("Runner.num_iterations", default.default))
    done = checkpointer.get_latest_checkpoint_number(os.path.join(facts["dir"], "checkpoints")) + 1
    return max(0, total - done)


def _replay_servers() -> list:
    """``(selector, endpoint, name)`` of each replay server gin points an agent at (a JAX
    agent's ``replay_endpoint``, a TF agent's ``MemoireRemoteOutOfGraphReplayBuffer``)."""
    from memoire.dopamine_compat import jax_agents

    agents = [n for n in vars(jax_agents) if n.startswith("MemoireJax") and n.endswith("Agent")]
    selectors = [(f"{a}.replay_endpoint", f"{a}.replay_name") for a in sorted(agents)]
    remote = "MemoireRemoteOutOfGraphReplayBuffer"
    selectors.append((f"{remote}.endpoint", f"{remote}.name"))
    out = []
    for endpoint, name in selectors:
        where = query(endpoint, None)
        if where:
            out.append((endpoint, str(where), str(query(name, "replay"))))
    return out


def check_replay_server(wait: float = SERVER_WAIT_S) -> None:
    """Says which replay server the run's agent uses, once, and checks within ``wait``
    seconds that it answers (nothing is asked of a run with its replay in process).

    Raises:
      cli.UsageError: nothing answered at the endpoint, or it serves no buffer of that name.
    """
    from memoire.remote import RemoteError, RemoteObject

    for selector, endpoint, name in _replay_servers():
        log.info(
            "replay on the server at %s (buffer %r); waiting up to %g s for it",
            endpoint,
            name,
            wait,
        )
        try:
            with RemoteObject(endpoint, name, timeout=wait, retries=0) as server:
                server.call("describe")
        except TimeoutError:
            raise cli.UsageError(
                f"no replay server answers at {endpoint} (waited {wait:g} s): start it first "
                f"(memoire serve --buffer KIND --gin_files F), or check {selector}"
            ) from None
        except (RemoteError, ValueError) as e:
            raise cli.UsageError(f"the replay server at {endpoint} ({selector}): {e}") from None


def run_local(facts: dict) -> int:
    """Runs one process: Dopamine's runner with trackers; resumes from checkpoints."""
    runner = runner_lib.create_runner(facts["dir"], seed=facts["seed"])
    runner_lib.write_operative_config(facts["dir"])
    if runner.start_iteration > 0:
        log.info("resuming %s at iteration %d", facts["dir"], runner.start_iteration)
    try:
        runner.run_experiment()
    finally:
        runner.close()
    runner_lib.write_operative_config(facts["dir"])
    return 0


def launch(args) -> int:
    """Runs ``memoire train`` as parsed into ``args`` (see :mod:`memoire.commands.train`):
    prepares the run (:func:`prepare`), then a local run, or a distributed one (the learner
    and its actors, spawned or on Ray). SIGTERM and Ctrl-C stop it cleanly (actors stopped,
    records closed) with one line. Returns the process exit code (128 + the signal's number
    when a signal stopped it).

    Raises:
      cli.UsageError: as :func:`prepare`; no replay server, or no Ray cluster, where gin
        names one (before anything is written).
    """
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.INFO if args.verbose else absl_logging.WARNING)
    slurm_task = slurm_launcher.in_task()
    facts = prepare(args, write=False)
    config = distributed.DistributedConfig()
    if config.launcher == "slurm" and not slurm_task:
        write_record(facts)
        return slurm_launcher.submit_run(args, facts, config)
    if slurm_task:
        if slurm_launcher.task_rank() == 0:
            write_record(facts)
        return _run(facts, config, slurm_task)
    # SIGTERM as Ctrl-C: every `finally` runs (actors stopped, sockets and records closed)
    # instead of the process vanishing; the second one is ignored while that cleanup runs.
    slurm_launcher.catch_sigterm()
    try:
        return _run(facts, config, slurm_task)
    except (slurm_launcher.Terminated, KeyboardInterrupt) as e:
        how = signal.SIGTERM if isinstance(e, slurm_launcher.Terminated) else signal.SIGINT
        log.info(
            "stopped by %s; the same command resumes from the last checkpoint in %s",
            "SIGTERM" if how == signal.SIGTERM else "Ctrl-C",
            facts["dir"],
        )
        return 128 + int(how)


def _run(facts: dict, config: distributed.DistributedConfig, slurm_task: bool) -> int:
    """What :func:`launch` runs once the run is prepared (nothing written yet, but in a SLURM
    task): checks the replay server, writes the record, then trains."""
    if config.num_actors > 0 and config.launcher != "slurm" and not iterations_left(facts):
        # A finished distributed run starts nothing: no actors, no Ray cluster.
        log.info(
            "%s: all its iterations are done; nothing to train, no actor started. Delete the "
            "folder, or choose another --base_dir, to start over",
            facts["dir"],
        )
        write_record(facts)
        return 0
    check_replay_server()
    ray_session = None
    if config.num_actors > 0 and config.launcher == "ray":
        ray_session = ray_launcher.open_session(config)  # no cluster, no room: said here
    if not slurm_task:
        write_record(facts)
    runner_lib.seed_everything(facts["seed"])
    import tensorflow as tf

    # As Dopamine's train.py does: TF agents need graph mode; JAX agents switch back to v2.
    tf.compat.v1.disable_v2_behavior()
    log.info(
        "setting %d run %d seed %d -> %s",
        facts["setting"],
        facts["run"],
        facts["seed"],
        facts["dir"],
    )
    if ray_session is not None:
        return ray_launcher.run(facts, config, ray_session)  # says its own failures
    try:
        if config.launcher == "slurm":
            return slurm_launcher.run_task(facts, config)
        if config.num_actors > 0:
            return distributed.run(facts, config)
    except distributed.NoActors as e:
        log.error("the learner stops: %s", e)
        return 1
    return run_local(facts)
