"""Dopamine's JAX agents on memoire's replay buffer, and the glue to run them from gin.

Each class subclasses a Dopamine 4.1.2 JAX agent and overrides only ``_build_replay_buffer``:
it lets the parent build Dopamine's buffer (so every gin binding of ``ReplayBuffer``,
``PrioritizedSamplingDistribution`` and the agent applies exactly as before) and converts it
with :meth:`ReplayBuffer.from_dopamine` (same settings, same seeded Generator). Everything else
is Dopamine's code, so the agent behaves as Dopamine's own, batch for batch.

Gin names. Dopamine registers ``JaxDQNAgent``, ``create_agent`` and ``create_runner``; a second
configurable of the same short name would make every existing ``JaxDQNAgent.gamma = ...`` line
ambiguous, so memoire's are registered in module ``memoire.dopamine_compat.jax_agents`` under
distinct names:

======================================================  =====================================
``MemoireJaxDQNAgent``                                   ``dopamine.jax.agents.dqn``
``MemoireJaxRainbowAgent``                               ``...rainbow``
``MemoireJaxQuantileAgent``                              ``...quantile``
``MemoireJaxImplicitQuantileAgent``                      ``...implicit_quantile``
``MemoireJaxFullRainbowAgent``                           ``...full_rainbow``
``create_memoire_agent`` / ``create_memoire_runner``     ``run_experiment.create_agent`` / ``create_runner``
======================================================  =====================================

The agents' own parameters are still bound through Dopamine's names (``JaxDQNAgent.gamma``...):
the subclass calls the parent's gin-wrapped ``__init__``. The one extra parameter is
``fix_terminal_duplicates`` (google/dopamine#228; False keeps Dopamine's elements), and
``replay_endpoint`` / ``replay_name``: with an endpoint, the agent's replay is the buffer
hosted there (:class:`memoire.dopamine_compat.remote.RemoteReplayBuffer`; serve one with
``python -m memoire.dopamine_compat.remote --serve jax``), e.g.
``MemoireJaxDQNAgent.replay_endpoint = 'tcp://127.0.0.1:PORT'``; checkpoints of the replay are
then written and read by the server, in the server's directories.

Running. Dopamine's ``create_runner`` passes its own ``create_agent`` positionally to
``Runner``, and gin never overrides a positional argument, so a binding
``Runner.create_agent_fn = ...`` would be silently ignored by ``dopamine.discrete_domains.train``.
Use this module's entry point instead, with Dopamine's gin files unchanged (the agent is chosen
by the usual ``create_agent.agent_name``)::

    python -m memoire.dopamine_compat.jax_agents --base_dir=/tmp/run \\
        --gin_files=configs/dqn_cartpole_jax.gin

or in code ``create_memoire_runner(base_dir).run_experiment()``, or pass
``create_memoire_agent`` as ``create_agent_fn`` to a ``Runner`` you build.
"""

from __future__ import annotations

from dopamine.discrete_domains import run_experiment
from dopamine.jax.agents.dqn import dqn_agent
from dopamine.jax.agents.full_rainbow import full_rainbow_agent
from dopamine.jax.agents.implicit_quantile import implicit_quantile_agent
from dopamine.jax.agents.quantile import quantile_agent
from dopamine.jax.agents.rainbow import rainbow_agent
import gin

from memoire import cli
from memoire.dopamine_compat import jax_replay_buffer

_MODULE = "memoire.dopamine_compat.jax_agents"

if __name__ == "__main__":
    # `python -m` runs this file as __main__; a gin file's `import memoire...jax_agents` would
    # then register every configurable a second time and fail. Run the importable module's main.
    import sys

    from memoire.dopamine_compat import jax_agents as _module

    sys.exit(_module.main())


class _MemoireReplayMixin:
    """Builds memoire's buffer from the one the Dopamine parent would build."""

    def __init__(self, *args, fix_terminal_duplicates: bool = False,
                 replay_endpoint: str | None = None, replay_name: str = "replay", **kwargs):
        self._memoire_fix_terminal_duplicates = bool(fix_terminal_duplicates)
        self._memoire_replay_endpoint = replay_endpoint
        self._memoire_replay_name = replay_name
        super().__init__(*args, **kwargs)

    def _build_replay_buffer(self):
        endpoint = getattr(self, "_memoire_replay_endpoint", None)
        if endpoint:
            from memoire.dopamine_compat import remote

            return remote.RemoteReplayBuffer(endpoint, self._memoire_replay_name)
        dopamine_buffer = super()._build_replay_buffer()
        return jax_replay_buffer.ReplayBuffer.from_dopamine(
            dopamine_buffer, fix_terminal_duplicates=getattr(
                self, "_memoire_fix_terminal_duplicates", False))


def _register(name: str, parent: type) -> type:
    cls = type(name, (_MemoireReplayMixin, parent), {
        "__module__": __name__,
        "__doc__": f"Dopamine's {parent.__name__} with memoire's replay buffer (same settings, "
                   "same batches); ``fix_terminal_duplicates`` selects the #228 fix.",
    })
    return gin.configurable(name, module=_MODULE)(cls)


MemoireJaxDQNAgent = _register("MemoireJaxDQNAgent", dqn_agent.JaxDQNAgent)
MemoireJaxRainbowAgent = _register("MemoireJaxRainbowAgent", rainbow_agent.JaxRainbowAgent)
MemoireJaxQuantileAgent = _register("MemoireJaxQuantileAgent", quantile_agent.JaxQuantileAgent)
MemoireJaxImplicitQuantileAgent = _register(
    "MemoireJaxImplicitQuantileAgent", implicit_quantile_agent.JaxImplicitQuantileAgent)
MemoireJaxFullRainbowAgent = _register("MemoireJaxFullRainbowAgent",
                                       full_rainbow_agent.JaxFullRainbowAgent)

AGENTS = {
    "jax_dqn": MemoireJaxDQNAgent,
    "jax_rainbow": MemoireJaxRainbowAgent,
    "jax_quantile": MemoireJaxQuantileAgent,
    "jax_implicit_quantile": MemoireJaxImplicitQuantileAgent,
    "full_rainbow": MemoireJaxFullRainbowAgent,
}


def _dopamine_binding(name: str, default):
    try:
        return gin.query_parameter(f"dopamine.discrete_domains.run_experiment.create_agent.{name}")
    except ValueError:
        return default


@gin.configurable("create_memoire_agent", module=_MODULE)
def create_memoire_agent(sess, environment, agent_name=None, summary_writer=None,
                         debug_mode=None):
    """Dopamine's ``create_agent`` for the JAX agents, with memoire's buffer.

    Args:
      sess: unused (Dopamine's signature; JAX agents have no session).
      environment: the gym environment (its ``action_space.n`` sizes the agent).
      agent_name: one of ``jax_dqn``, ``jax_rainbow``, ``jax_quantile``,
        ``jax_implicit_quantile``, ``full_rainbow``; default: the value bound to Dopamine's
        ``create_agent.agent_name``.
      summary_writer: passed on when ``debug_mode`` (as Dopamine's create_agent does).
      debug_mode: default: Dopamine's ``create_agent.debug_mode`` binding, else False.

    Raises:
      ValueError: no agent name, or one without a memoire variant.
    """
    del sess
    if agent_name is None:
        agent_name = _dopamine_binding("agent_name", None)
    if debug_mode is None:
        debug_mode = _dopamine_binding("debug_mode", False)
    if agent_name not in AGENTS:
        raise ValueError(f"agent_name: expected one of {sorted(AGENTS)}, got {agent_name!r}")
    if not debug_mode:
        summary_writer = None
    return AGENTS[agent_name](num_actions=environment.action_space.n,
                              summary_writer=summary_writer)


@gin.configurable("create_memoire_runner", module=_MODULE)
def create_memoire_runner(base_dir, schedule=None):
    """Dopamine's ``create_runner`` building agents with :func:`create_memoire_agent`.

    Args:
      base_dir: str, the experiment directory (checkpoints, logs).
      schedule: ``continuous_train_and_eval`` (Runner) or ``continuous_train`` (TrainRunner);
        default: Dopamine's ``create_runner.schedule`` binding, else the former.

    Raises:
      ValueError: an unknown schedule.
    """
    if schedule is None:
        try:
            schedule = gin.query_parameter(
                "dopamine.discrete_domains.run_experiment.create_runner.schedule")
        except ValueError:
            schedule = "continuous_train_and_eval"
    if schedule == "continuous_train_and_eval":
        return run_experiment.Runner(base_dir, create_memoire_agent)
    if schedule == "continuous_train":
        return run_experiment.TrainRunner(base_dir, create_memoire_agent)
    raise ValueError(f"schedule: expected 'continuous_train_and_eval' or 'continuous_train', "
                     f"got {schedule!r}")


@cli.entry_point("python -m memoire.dopamine_compat.jax_agents")
def main(argv=None) -> int:
    """``python -m memoire.dopamine_compat.jax_agents --base_dir=DIR --gin_files=F
    [--gin_bindings=B]``: Dopamine's train.py with memoire's buffer, for Dopamine's JAX
    agents (``create_agent.agent_name`` one of jax_dqn, jax_rainbow, jax_quantile,
    jax_implicit_quantile, full_rainbow)."""
    parser = cli.ArgumentParser(prog="python -m memoire.dopamine_compat.jax_agents",
                                description=main.__doc__)
    parser.add_argument("--base_dir", required=True,
                        help="experiment directory (Dopamine's checkpoints/, logs/ go there)")
    parser.add_argument("--gin_files", action="append", default=[],
                        help="gin file (repeatable), as Dopamine's train.py takes it")
    parser.add_argument("--gin_bindings", action="append", default=[],
                        help="gin binding (repeatable), as Dopamine's train.py takes it")
    args = parser.parse_args(argv)
    from absl import logging  # as Dopamine's train.py: the Runner reports progress at INFO

    cli.check_files(args.gin_files, "--gin_files")
    cli.check_output_dir(args.base_dir, "--base_dir")
    try:
        run_experiment.load_gin_configs(args.gin_files, args.gin_bindings)
    except (OSError, ValueError, SyntaxError, ImportError) as e:
        raise cli.UsageError(f"gin: {e}") from None
    agent_name = _dopamine_binding("agent_name", None)
    if agent_name not in AGENTS:
        raise cli.UsageError(f"create_agent.agent_name: expected one of "
                             f"{', '.join(AGENTS)}, got {agent_name!r}")
    import tensorflow as tf

    logging.set_verbosity(logging.INFO)
    # As Dopamine's train.py: graph mode (else TF's summary writer probes for a GPU and logs
    # "failed call to cuInit: ... ERROR" on a machine without one).
    tf.compat.v1.disable_v2_behavior()
    create_memoire_runner(args.base_dir).run_experiment()
    return 0


if __name__ == "__main__":
    main()
