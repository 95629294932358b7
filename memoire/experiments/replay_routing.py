"""Which replay buffer a Dopamine agent run by ``memoire train`` uses, and how it gets there.

``replay_backend.name`` (gin; ``memoire train --replay``) is 'memoire' by default or 'dopamine'
(Dopamine's own buffers, for comparison):

- Dopamine's JAX agents (jax_dqn, jax_rainbow, jax_quantile, jax_implicit_quantile,
  full_rainbow) are built by :func:`memoire.dopamine_compat.jax_agents.create_memoire_agent`:
  Dopamine's agent with memoire's ``ReplayBuffer`` (Dopamine passes ``create_agent``
  positionally to its Runner, so no gin binding can swap it: :func:`create_agent_fn` does).
- Dopamine's TF agents (dqn, rainbow, implicit_quantile) build Dopamine's in-graph wrapper,
  whose ``wrapped_memory`` gin fills: :func:`tf_replay_bindings` binds it to memoire's
  out-of-graph buffer with the agent's settings, unless a gin file bound one itself.

Kept apart from the modules a ``python -m`` entry runs as ``__main__`` (and spawned actors
as ``__mp_main__``) besides importing them, because a gin configurable must be registered
once per process.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any

import gin

import memoire.dopamine_compat  # noqa: F401  first: its upstream_compat steps precede Dopamine's import
from memoire.gin_query import query

log = logging.getLogger(__name__)

REPLAY_BACKENDS = ("memoire", "dopamine")

# Dopamine's TF agents -> (agent class path, the wrapper the agent builds, memoire's memory).
_TF_AGENTS = {
    "dqn": (
        "dopamine.tf.agents.dqn.dqn_agent.DQNAgent",
        "WrappedReplayBuffer",
        "MemoireOutOfGraphReplayBuffer",
    ),
    "rainbow": (
        "dopamine.tf.agents.rainbow.rainbow_agent.RainbowAgent",
        "WrappedPrioritizedReplayBuffer",
        "MemoireOutOfGraphPrioritizedReplayBuffer",
    ),
    "implicit_quantile": (
        "dopamine.tf.agents.implicit_quantile.implicit_quantile_agent.ImplicitQuantileAgent",
        "WrappedPrioritizedReplayBuffer",
        "MemoireOutOfGraphPrioritizedReplayBuffer",
    ),
}


# The names Dopamine 4.1.2's run_experiment.create_agent builds (it also takes any name that
# starts with 'dqn' as the TF DQN agent).
DOPAMINE_AGENTS = (
    "dqn",
    "rainbow",
    "implicit_quantile",
    "jax_dqn",
    "jax_quantile",
    "jax_rainbow",
    "full_rainbow",
    "jax_implicit_quantile",
    "ppo",
)


def check_agent_name() -> str:
    """The bound ``create_agent.agent_name``, checked before anything is built.

    Raises:
      ValueError: nothing bound, or a name Dopamine's ``create_agent`` does not know.
    """
    name = query("create_agent.agent_name", None)
    if name is None:
        raise ValueError(
            "create_agent.agent_name is not bound; expected one of "
            f"{', '.join(DOPAMINE_AGENTS)} (bind it in a gin file)"
        )
    if not isinstance(name, str) or not (name in DOPAMINE_AGENTS or name.startswith("dqn")):
        raise ValueError(
            f"create_agent.agent_name: expected one of {', '.join(DOPAMINE_AGENTS)}, got {name!r}"
        )
    return name


@gin.configurable(module="memoire.replay_routing")
def replay_backend(name: str = "memoire") -> str:
    """Whose replay buffer the agent uses: 'memoire' (default) or 'dopamine'.

    Raises:
      ValueError: another name.
    """
    if name not in REPLAY_BACKENDS:
        raise ValueError(f"replay_backend.name: expected one of {REPLAY_BACKENDS}, got {name!r}")
    return name


def create_agent_fn():
    """The ``create_agent`` for the bound agent and replay backend.

    memoire's JAX agent factory for Dopamine's JAX agents on memoire's replay; Dopamine's own
    ``create_agent`` otherwise (TF agents reach memoire's memory through gin, see
    :func:`tf_replay_bindings`). An agent memoire has no variant of keeps Dopamine's buffer
    (a warning is logged).
    """
    from dopamine.discrete_domains import run_experiment

    name = query("create_agent.agent_name", None)
    if replay_backend() == "memoire":
        from memoire.dopamine_compat import jax_agents

        if name in jax_agents.AGENTS:
            return jax_agents.create_memoire_agent
        if name not in _TF_AGENTS:
            log.warning(
                "agent %r has no memoire replay variant; it runs as Dopamine builds it", name
            )
    return run_experiment.create_agent


def _bound_or_default(configurable: str, cls: type, param: str) -> Any:
    """What ``cls.__init__`` will receive for ``param``: the gin binding, else its default."""
    value = query(f"{configurable}.{param}", inspect.Parameter.empty)
    if value is inspect.Parameter.empty:
        value = inspect.signature(cls.__init__).parameters[param].default
    return value


def tf_replay_bindings(seed: int | None = None) -> list[str]:
    """Routes a Dopamine TF agent's replay to memoire's out-of-graph buffer through gin.

    When ``create_agent.agent_name`` is a TF agent (dqn, rainbow, implicit_quantile), the
    replay backend is memoire's and no gin file bound the wrapper's ``wrapped_memory``, binds
    ``<Wrapper>.wrapped_memory = @Memoire...ReplayBuffer()`` and the memory's settings: the
    agent's observation shape and dtype, stack size, horizon and discount (its bindings, else
    its defaults) and the wrapper's capacity and batch size (likewise), and the memory's
    sampling ``seed`` (Dopamine's TF buffer draws from numpy's global generator, which
    :func:`memoire.experiments.runner.seed_everything` seeds; memoire's owns one). Gin must be
    unlocked.

    Returns:
      The selectors bound (for the log), [] when nothing was needed.
    """
    entry = _TF_AGENTS.get(query("create_agent.agent_name", None))
    if entry is None or replay_backend() != "memoire":
        return []
    agent_path, wrapper, memory = entry
    if query(f"{wrapper}.wrapped_memory", None) is not None:
        return []  # the gin files chose the memory themselves
    from dopamine.tf.replay_memory import circular_replay_buffer, prioritized_replay_buffer

    import memoire.dopamine_compat.gin_registry  # noqa: F401  registers Memoire* names

    module, cls_name = agent_path.rsplit(".", 1)
    agent_cls = getattr(importlib.import_module(module), cls_name)
    wrapper_cls = {
        "WrappedReplayBuffer": circular_replay_buffer.WrappedReplayBuffer,
        "WrappedPrioritizedReplayBuffer": prioritized_replay_buffer.WrappedPrioritizedReplayBuffer,
    }[wrapper]
    values = {
        p: _bound_or_default(cls_name, agent_cls, p)
        for p in ("observation_shape", "observation_dtype", "stack_size", "update_horizon", "gamma")
    }
    values.update(
        {p: _bound_or_default(wrapper, wrapper_cls, p) for p in ("replay_capacity", "batch_size")}
    )
    if seed is not None:
        values["seed"] = int(seed)
    gin.parse_config(f"{wrapper}.wrapped_memory = @memoire.dopamine_compat.{memory}()")
    for p, v in values.items():
        gin.bind_parameter(f"memoire.dopamine_compat.{memory}.{p}", v)
    return [f"{wrapper}.wrapped_memory"] + [f"{memory}.{p}" for p in values]
