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

=====================================  =====================================
``MemoireJaxDQNAgent``                  ``dopamine.jax.agents.dqn``
``MemoireJaxRainbowAgent``              ``...rainbow``
``MemoireJaxQuantileAgent``             ``...quantile``
``MemoireJaxImplicitQuantileAgent``     ``...implicit_quantile``
``MemoireJaxFullRainbowAgent``          ``...full_rainbow``
``create_memoire_agent``                ``run_experiment.create_agent``
=====================================  =====================================

The agents' own parameters are still bound through Dopamine's names (``JaxDQNAgent.gamma``...):
the subclass calls the parent's gin-wrapped ``__init__``. The one extra parameter is
``fix_terminal_duplicates`` (google/dopamine#228; False keeps Dopamine's elements), and
``replay_endpoint`` / ``replay_name``: with an endpoint, the agent's replay is the buffer
hosted there (:class:`memoire.dopamine_compat.remote.RemoteReplayBuffer`; serve one with
``python -m memoire.dopamine_compat.remote --serve jax``), e.g.
``MemoireJaxDQNAgent.replay_endpoint = 'tcp://127.0.0.1:PORT'``; checkpoints of the replay are
then written and read by the server, in the server's directories. ``replay_timeout`` (seconds
per attempt) and ``replay_retries`` set how long a call waits for a server that is down or
restarting, ``(1 + retries) * timeout``: 120 s by default, as the TF face's
``MemoireRemoteOutOfGraphReplayBuffer.timeout`` / ``.retries``.

Prefetching: ``prefetch_depth`` (default 0: today's synchronous sampling, batch for batch
Dopamine's) > 0 makes the agent train from a prefetching feed
(:meth:`ReplayBuffer.start_feed`, :mod:`memoire.feed`): native threads draw ``prefetch_depth``
batches ahead, and with ``prefetch_to_device`` (default True) a native thread copies each
batch into a device slot of JAX's default device ahead of the step; the agent's step reads the
slot's arrays (imported once), and the slot goes back once the parameters that step computed
are ready (``_train_step``, :meth:`memoire.feed.Feed.release`). The distribution is the same,
the random stream is not (the
feed draws with the core's generator, seeded from the agent's seed), and a priority update
reaches the batches at most ``prefetch_depth`` steps later (``prefetch_depth + 3`` with
``prefetch_to_device`` on a CUDA or CPU device: the feed's 3 device slots; ``+ 1`` on another
JAX platform). ``prefetch_threads`` sets the
sampler threads; ``prefetch_stack_on_device = True`` (with ``prefetch_to_device``) copies each
distinct frame once and assembles the stacks on the device (the same batches, about 5/8 of the
frame bytes for Atari stacks of 4; for accelerators, slower on a CPU device).
E.g. ``MemoireJaxDQNAgent.prefetch_depth = 4`` (configs/dqn_cartpole_jax_feed.gin). With
``replay_endpoint`` it keeps that many sample requests in flight to the server instead
(:class:`memoire.dopamine_compat.remote.RemoteReplayBuffer`'s ``prefetch_depth``; the other
prefetch settings are the local feed's).

Running. Dopamine's ``create_runner`` passes its own ``create_agent`` positionally to
``Runner``, and gin never overrides a positional argument, so a binding
``Runner.create_agent_fn = ...`` would be silently ignored by ``dopamine.discrete_domains.train``.
Run this module instead, with Dopamine's gin files unchanged (the agent is chosen by the usual
``create_agent.agent_name``); it runs ``memoire train`` (through :func:`memoire.cli.main`)
under Dopamine's module name, same flags, same run layout::

    python -m memoire.dopamine_compat.jax_agents --base_dir=/tmp/run \\
        --gin_files=configs/dqn_cartpole_jax.gin

or in code ``memoire.experiments.runner.create_runner(base_dir).run_experiment()`` (the one
runner factory; its agents for the JAX names are :func:`create_memoire_agent`'s), or pass
``create_memoire_agent`` as ``create_agent_fn`` to a ``Runner`` you build.
"""

from __future__ import annotations

if __name__ == "__main__":
    # `python -m` runs this file as __main__: Dopamine's module name for `memoire train`. The
    # CLI (memoire.cli, below this layer) runs the command, finding it by name in cli.COMMANDS
    # as for `memoire train`, so this file names no upper layer. Before the imports below: the
    # command imports the real module, whose gin names this copy must not register again.
    import sys

    from memoire import cli

    sys.exit(cli.main(["train", *sys.argv[1:]]))

import gin
from dopamine.discrete_domains import run_experiment  # noqa: F401  registers create_agent, Runner
from dopamine.jax.agents.dqn import dqn_agent
from dopamine.jax.agents.full_rainbow import full_rainbow_agent
from dopamine.jax.agents.implicit_quantile import implicit_quantile_agent
from dopamine.jax.agents.quantile import quantile_agent
from dopamine.jax.agents.rainbow import rainbow_agent

from memoire.dopamine_compat import jax_replay_buffer
from memoire.gin_query import query

_MODULE = "memoire.dopamine_compat.jax_agents"
# Dopamine's create_agent by its full name, so that no other `create_agent` answers.
_DOPAMINE_CREATE_AGENT = "dopamine.discrete_domains.run_experiment.create_agent."


class _MemoireReplayMixin:
    """Builds memoire's buffer from the one the Dopamine parent would build."""

    def __init__(
        self,
        *args,
        fix_terminal_duplicates: bool = False,
        replay_endpoint: str | None = None,
        replay_name: str = "replay",
        replay_timeout: float | None = None,
        replay_retries: int | None = None,
        prefetch_depth: int = 0,
        prefetch_threads: int = 1,
        prefetch_to_device: bool = True,
        prefetch_stack_on_device: bool = False,
        **kwargs,
    ):
        if (
            isinstance(prefetch_depth, bool)
            or not isinstance(prefetch_depth, int)
            or prefetch_depth < 0
        ):
            raise ValueError(f"prefetch_depth: expected an int >= 0, got {prefetch_depth!r}")
        self._memoire_fix_terminal_duplicates = bool(fix_terminal_duplicates)
        self._memoire_replay_endpoint = replay_endpoint
        self._memoire_replay_name = replay_name
        # Left out, the proxy's own defaults (one place for them: memoire.dopamine_compat.remote).
        self._memoire_replay_wait = {
            k: v
            for k, v in (("timeout", replay_timeout), ("retries", replay_retries))
            if v is not None
        }
        self._memoire_prefetch_depth = prefetch_depth
        super().__init__(*args, **kwargs)
        if prefetch_depth and not replay_endpoint:
            # Dopamine's agents keep their seed in _seed; the feed's stream derives from it.
            seed = int(getattr(self, "_seed", 0) or 0) % (1 << 63)
            self._replay.start_feed(
                prefetch_depth,
                threads=prefetch_threads,
                seed=seed,
                device="jax" if prefetch_to_device else None,
                stack_on_device=prefetch_stack_on_device,
            )

    def _train_step(self):
        super()._train_step()
        # With a device feed the batch is lent from a device slot: it goes back once the
        # parameters this step computed from it are ready (the learner's thread never waits).
        # Every Dopamine JAX agent keeps them in online_params. No batch taken: a no-op.
        feed = getattr(self._replay, "_feed", None)
        if feed is not None:
            feed.release(after=self.online_params)

    def _build_replay_buffer(self):
        endpoint = getattr(self, "_memoire_replay_endpoint", None)
        if endpoint:
            from memoire.dopamine_compat import remote

            return remote.RemoteReplayBuffer(
                endpoint,
                self._memoire_replay_name,
                prefetch_depth=getattr(self, "_memoire_prefetch_depth", 0),
                **getattr(self, "_memoire_replay_wait", {}),
            )
        dopamine_buffer = super()._build_replay_buffer()
        return jax_replay_buffer.ReplayBuffer.from_dopamine(
            dopamine_buffer,
            fix_terminal_duplicates=getattr(self, "_memoire_fix_terminal_duplicates", False),
        )


def _register(name: str, parent: type) -> type:
    cls = type(
        name,
        (_MemoireReplayMixin, parent),
        {
            "__module__": __name__,
            "__doc__": f"Dopamine's {parent.__name__} with memoire's replay buffer (same settings, "
            "same batches); ``fix_terminal_duplicates`` selects the #228 fix.",
        },
    )
    return gin.configurable(name, module=_MODULE)(cls)


MemoireJaxDQNAgent = _register("MemoireJaxDQNAgent", dqn_agent.JaxDQNAgent)
MemoireJaxRainbowAgent = _register("MemoireJaxRainbowAgent", rainbow_agent.JaxRainbowAgent)
MemoireJaxQuantileAgent = _register("MemoireJaxQuantileAgent", quantile_agent.JaxQuantileAgent)
MemoireJaxImplicitQuantileAgent = _register(
    "MemoireJaxImplicitQuantileAgent", implicit_quantile_agent.JaxImplicitQuantileAgent
)
MemoireJaxFullRainbowAgent = _register(
    "MemoireJaxFullRainbowAgent", full_rainbow_agent.JaxFullRainbowAgent
)

AGENTS = {
    "jax_dqn": MemoireJaxDQNAgent,
    "jax_rainbow": MemoireJaxRainbowAgent,
    "jax_quantile": MemoireJaxQuantileAgent,
    "jax_implicit_quantile": MemoireJaxImplicitQuantileAgent,
    "full_rainbow": MemoireJaxFullRainbowAgent,
}


@gin.configurable("create_memoire_agent", module=_MODULE)
def create_memoire_agent(sess, environment, agent_name=None, summary_writer=None, debug_mode=None):
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
        agent_name = query(_DOPAMINE_CREATE_AGENT + "agent_name", None)
    if debug_mode is None:
        debug_mode = query(_DOPAMINE_CREATE_AGENT + "debug_mode", False)
    if agent_name not in AGENTS:
        raise ValueError(f"agent_name: expected one of {sorted(AGENTS)}, got {agent_name!r}")
    if not debug_mode:
        summary_writer = None
    return AGENTS[agent_name](num_actions=environment.action_space.n, summary_writer=summary_writer)
