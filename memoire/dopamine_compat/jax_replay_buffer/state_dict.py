"""The JAX ``ReplayBuffer``'s state dict: Dopamine's layout written and read, every entry
checked before the store changes (the buffer's ``to_state_dict``/``from_state_dict`` call
these), and the one import of a whole state into the native store.
"""

from __future__ import annotations

import pickle
from typing import Any, Optional, Sequence

import jax
import numpy as np
from dopamine.jax.replay_memory import elements as dopamine_elements

from memoire import _core
from memoire.dopamine_compat.jax_replay_buffer import checkpointers
from memoire.dopamine_compat.jax_replay_buffer.elements import ReplayElement, TransitionElement


def checked_add_count(value, what: str) -> int:
    """``value`` as the next element's key: an integer in [0, 2**31] (keys are int32).

    Raises:
      ValueError: anything else (``what`` names it).
    """
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, np.integer))
        or not 0 <= value <= _core.TransitionStore.MAX_ADD_COUNT
    ):
        raise ValueError(
            f"{what}: expected an integer in [0, 2**31] (keys are int32), got {value!r}"
        )
    return int(value)


def import_into(
    store,
    add_count: int,
    *,
    elements: Sequence[np.ndarray],
    key_by_index: np.ndarray,
    nodes: Optional[np.ndarray],
    trajectory: Sequence[np.ndarray],
) -> None:
    """Replaces ``store``'s contents (one native call; the store checks and changes nothing on
    a mismatch).

    Args:
      add_count: the next element's key.
      elements: (states ``dtype[m, *obs, stack]``, actions ``[m, *action]``, rewards
        ``float64[m]``, next states, is_terminal ``bool[m]``, episode_end ``bool[m]``), keyed
        ``add_count - m .. add_count - 1``.
      key_by_index: ``int64[m]``, the sampler's keys in its order.
      nodes: ``float64[store.num_nodes]``, the sum tree (prioritized), or None.
      trajectory: the accumulator's open steps (observations ``dtype[k, *obs]``, actions,
        rewards ``float64[k]``, is_terminal and episode_end ``bool[k]``).
    """
    store.import_state(add_count, *elements, key_by_index, nodes, *trajectory)


def set_next_key(buffer, store, key: int) -> None:
    """Makes ``key`` the next element's key of ``store`` (``buffer``'s, or one it is about to
    take), which holds no element; its partial trajectory is kept."""
    frames, actions, rewards, terms, ends = store.export_window()
    k = len(rewards)
    no_stack = np.zeros((0, *buffer._obs_shape, buffer._stack_size), buffer._obs_dtype)
    import_into(
        store,
        key,
        elements=(
            no_stack,
            np.zeros((0, *buffer._action_shape), buffer._action_dtype),
            np.zeros(0, np.float64),
            no_stack,
            np.zeros(0, np.bool_),
            np.zeros(0, np.bool_),
        ),
        key_by_index=np.zeros(0, np.int64),
        nodes=np.zeros(store.num_nodes, np.float64) if buffer._prioritized else None,
        trajectory=(
            np.ascontiguousarray(frames).view(buffer._obs_dtype).reshape((k, *buffer._obs_shape)),
            np.ascontiguousarray(actions)
            .view(buffer._action_dtype)
            .reshape((k, *buffer._action_shape)),
            np.asarray(rewards, np.float64).reshape(k),
            np.asarray(terms, np.bool_).reshape(k),
            np.asarray(ends, np.bool_).reshape(k),
        ),
    )


def to_state_dict(buffer) -> dict[str, Any]:
    """Dopamine's state dict layout (``add_count``, ``memory`` with keys, per-element leaves
    ``[state, action, reward, next_state, is_terminal, episode_end]`` and a pickled tree
    definition, ``sampling_distribution``, ``transition_accumulator``)."""
    keys = buffer.keys()
    values = []
    chunk = 1024
    for start in range(0, keys.size, chunk):
        b = buffer.get_elements(keys[start : start + chunk])
        states, next_states = b.state, b.next_state
        for k in range(len(b.reward)):
            s, ns = states[k], next_states[k]
            if buffer._compress:
                s, ns = dopamine_elements.compress(s), dopamine_elements.compress(ns)
            values.append(
                [
                    s,
                    b.action[k],
                    float(b.reward[k]),
                    ns,
                    bool(b.is_terminal[k]),
                    bool(b.episode_end[k]),
                ]
            )
    element_def = jax.tree_util.tree_structure(ReplayElement(*([0] * 6)))
    trajectory = []
    if buffer._store is not None:
        frames, actions, rewards, terms, ends = buffer._store.export_window()
        for k in range(len(rewards)):
            trajectory.append(
                [
                    frames[k].view(buffer._obs_dtype).reshape(buffer._obs_shape).copy(),
                    actions[k].view(buffer._action_dtype).reshape(buffer._action_shape).copy(),
                    float(rewards[k]),
                    bool(terms[k]),
                    bool(ends[k]),
                ]
            )
    step_def = jax.tree_util.tree_structure(TransitionElement(0, 0, 0, 0, 0))
    return {
        "add_count": buffer.add_count,
        "memory": {
            "keys": keys.tolist(),
            "values": values,
            "treedef": pickle.dumps(element_def),
        },
        "sampling_distribution": buffer._sampling_distribution.to_state_dict(),
        "transition_accumulator": {"trajectory": trajectory, "treedef": pickle.dumps(step_def)},
    }


def from_state_dict(buffer, state_dict: dict[str, Any]) -> None:
    """Restores a state dict written by this class or by Dopamine's buffer.

    The pickled ``treedef`` entries are never unpickled: elements must be lists of the six
    ReplayElement leaves and steps lists of the five TransitionElement leaves.

    Raises:
      ValueError: a malformed state dict, or one whose shapes differ from this buffer's
        (nothing is changed then).
    """
    try:
        add_count = state_dict["add_count"]
        memory = state_dict["memory"]
        mkeys = [int(k) for k in memory["keys"]]
        values = memory["values"]
        dist_state = state_dict["sampling_distribution"]
        trajectory = state_dict["transition_accumulator"]["trajectory"]
    except (KeyError, TypeError) as e:
        raise ValueError(f"replay buffer state dict: missing or malformed entry {e}") from None
    add_count = checked_add_count(add_count, "replay buffer state dict: add_count")
    if (
        not isinstance(values, list)
        or not isinstance(trajectory, list)
        or not isinstance(dist_state, dict)
    ):
        raise ValueError(
            "replay buffer state dict: expected lists of elements and steps and "
            "a sampling_distribution dict"
        )
    if len(values) != len(mkeys) or mkeys != list(range(add_count - len(mkeys), add_count)):
        raise ValueError(
            "replay buffer state dict: expected consecutive keys ending at "
            f"add_count - 1 = {add_count - 1}, one element each"
        )
    cols = [[] for _ in range(6)]
    for v in values:
        if not isinstance(v, (list, tuple)) or len(v) != 6:
            raise ValueError(
                "replay buffer state dict: each element must hold the 6 leaves "
                "[state, action, reward, next_state, is_terminal, episode_end]"
            )
        for c, leaf in zip(cols, v):
            c.append(leaf)
    steps = [[] for _ in range(5)]
    for t in trajectory:
        if not isinstance(t, (list, tuple)) or len(t) != 5:
            raise ValueError(
                "replay buffer state dict: each accumulator step must hold the "
                "5 leaves [observation, action, reward, is_terminal, "
                "episode_end]"
            )
        for c, leaf in zip(steps, t):
            c.append(leaf)

    def unpack(x):
        x = np.asarray(x)
        return checkpointers.uncompress_checked(x) if x.dtype.names is not None else x

    s = buffer._stack_size
    states = [unpack(x) for x in cols[0]]
    next_states = [unpack(x) for x in cols[3]]
    if states:
        obs_shape, obs_dtype = states[0].shape[:-1], states[0].dtype
        action_tmpl = np.asarray(cols[1][0])
    elif steps[0]:
        obs_shape, obs_dtype = np.asarray(steps[0][0]).shape, np.asarray(steps[0][0]).dtype
        action_tmpl = np.asarray(steps[1][0])
    else:
        obs_shape, obs_dtype, action_tmpl = None, None, None
    if obs_shape is not None:
        if buffer._store is not None and (
            obs_shape != buffer._obs_shape or obs_dtype != buffer._obs_dtype
        ):
            raise ValueError(
                f"replay buffer state dict: observations {obs_dtype}"
                f"{list(obs_shape)}, this buffer holds {buffer._obs_dtype}"
                f"{list(buffer._obs_shape)}"
            )
        stack_shape = (*obs_shape, s)
        for x in states + next_states:
            if x.shape != stack_shape or x.dtype != obs_dtype:
                raise ValueError(
                    f"replay buffer state dict: expected stacks {obs_dtype}"
                    f"{list(stack_shape)}, got {x.dtype}{list(x.shape)}"
                )

    def stacked(xs, shape, dtype):
        return (
            np.ascontiguousarray(np.stack(xs)).astype(dtype, copy=False)
            if xs
            else np.zeros((0, *shape), dtype)
        )

    nodes = None
    if buffer._prioritized:
        try:
            nodes = np.asarray(dist_state["sum_tree"]["nodes"], dtype=np.float64)
        except (KeyError, TypeError):
            raise ValueError(
                "replay buffer state dict: prioritized sampler without sum_tree.nodes"
            ) from None
    try:
        key_by_index = np.asarray(dist_state.get("key_by_index", []), dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(
            "replay buffer state dict: sampler key_by_index is not a list of keys"
        ) from None
    # The generator state is checked on a scratch generator first: applying it is the last
    # step, which must not fail once the store has changed.
    try:
        type(buffer._sampling_distribution._rng.bit_generator)().state = dist_state["rng_state"]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"replay buffer state dict: bad sampler rng_state ({e})") from None
    if obs_shape is None:  # an empty checkpoint
        if len(key_by_index):
            raise ValueError("replay buffer state dict: sampler keys without elements")
        buffer._sampling_distribution.from_state_dict(dist_state)
        buffer.clear()
        buffer.add_count = add_count  # Dopamine's counter, kept with nothing stored
        return
    store, obs_tmpl = buffer._store, None
    if store is None:  # built here, kept only if the import succeeds
        obs_tmpl = np.zeros(obs_shape, obs_dtype)
        action_tmpl = np.asarray(action_tmpl)
        store = buffer._make_store(obs_tmpl, action_tmpl)
        obs_shape, obs_dtype = obs_tmpl.shape, obs_tmpl.dtype
        action_shape, action_dtype = action_tmpl.shape, action_tmpl.dtype
    else:
        obs_shape, obs_dtype = buffer._obs_shape, buffer._obs_dtype
        action_shape, action_dtype = buffer._action_shape, buffer._action_dtype
    if buffer._prioritized and nodes.size != store.num_nodes:
        raise ValueError(
            f"replay buffer state dict: sum tree of {nodes.size} nodes, this "
            f"buffer's has {store.num_nodes} (max_capacity differs)"
        )
    m = len(states)
    if key_by_index.shape != (m,):
        raise ValueError(
            f"replay buffer state dict: sampler key_by_index holds "
            f"{key_by_index.size} keys, expected {m} (one per element)"
        )
    import_into(
        store,
        add_count,
        elements=(
            stacked(states, (*obs_shape, s), obs_dtype),
            stacked([np.asarray(a) for a in cols[1]], action_shape, action_dtype),
            np.asarray(cols[2], dtype=np.float64).reshape(m),
            stacked(next_states, (*obs_shape, s), obs_dtype),
            np.asarray(cols[4], dtype=np.bool_).reshape(m),
            np.asarray(cols[5], dtype=np.bool_).reshape(m),
        ),
        key_by_index=key_by_index,
        nodes=nodes,
        trajectory=(
            stacked([np.asarray(o) for o in steps[0]], obs_shape, obs_dtype),
            stacked([np.asarray(a) for a in steps[1]], action_shape, action_dtype),
            np.asarray(steps[2], dtype=np.float64).reshape(len(steps[2])),
            np.asarray(steps[3], dtype=np.bool_).reshape(len(steps[3])),
            np.asarray(steps[4], dtype=np.bool_).reshape(len(steps[4])),
        ),
    )
    if obs_tmpl is not None:
        buffer._commit_store(store, obs_tmpl, action_tmpl)
    buffer._first_key = 0
    buffer._sampling_distribution.from_state_dict(dist_state)
