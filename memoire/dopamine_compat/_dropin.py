"""How memoire's buffers take arguments they were not given, so every drop-in idiom works.

Two sources, one per idiom:

- gin bindings of Dopamine's own configurable. Dopamine's agents build their buffer through a
  module attribute (``circular_replay_buffer.WrappedReplayBuffer(...)``,
  ``replay_buffer.ReplayBuffer(...)``) and leave capacity and batch size to gin
  (``WrappedReplayBuffer.replay_capacity = ...``). When memoire's class is assigned to that
  attribute, :func:`dopamine_gin_bindings` gives it the bindings Dopamine's class would have
  received.
- the wrapper that holds the buffer. ``WrappedReplayBuffer.wrapped_memory =
  @MemoireOutOfGraphReplayBuffer()`` builds the memory before the wrapper runs and without its
  arguments; the memory is then *unbound*, and on first use :func:`enclosing_wrapper_args` reads
  the arguments of the wrapper ``__init__`` that is storing it (Dopamine's or memoire's): the
  wrapper is the only holder of the agent's shape, stack, horizon, discount, capacity and batch.
"""

import sys

# Arguments of Dopamine's WrappedReplayBuffer / WrappedPrioritizedReplayBuffer.
WRAPPER_ARGS = frozenset(
    [
        "observation_shape",
        "stack_size",
        "use_staging",
        "replay_capacity",
        "batch_size",
        "update_horizon",
        "gamma",
        "wrapped_memory",
        "max_sample_attempts",
        "extra_storage_types",
        "observation_dtype",
        "terminal_dtype",
        "action_shape",
        "action_dtype",
        "reward_shape",
        "reward_dtype",
    ]
)

_MAX_FRAMES = 64  # how far up the stack a wrapper's __init__ is looked for


def dopamine_gin_bindings(dopamine_cls):
    """dict: the gin bindings of Dopamine's configurable ``dopamine_cls`` in the current scope
    ({} without gin or bindings)."""
    gin = sys.modules.get("gin")
    if gin is None:
        return {}
    try:
        return dict(gin.get_bindings(dopamine_cls))
    except (ValueError, KeyError):  # not registered with gin
        return {}


def enclosing_wrapper_args(memory):
    """dict: the arguments of the wrapper ``__init__`` frames on the stack that are storing
    ``memory`` as their ``wrapped_memory`` (outermost wins: Dopamine's prioritized wrapper
    forwards only some of its arguments to its parent's ``__init__``); {} when there is none."""
    frames = []
    frame = sys._getframe(1)  # pylint: disable=protected-access
    for _ in range(_MAX_FRAMES):
        if frame is None:
            break
        if frame.f_code.co_name == "__init__":
            local = frame.f_locals
            if local.get("wrapped_memory") is memory and "observation_shape" in local:
                frames.append({k: v for k, v in local.items() if k in WRAPPER_ARGS})
        frame = frame.f_back
    args = {}
    for found in frames:  # innermost first, so outer frames override
        args.update(found)
    args.pop("wrapped_memory", None)
    return args


def same_value(a, b):
    """Whether a (possibly defaulted) argument value equals the default ``b``."""
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except (TypeError, ValueError):
        return False
