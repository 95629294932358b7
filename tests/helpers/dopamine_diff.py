"""Shared helpers for the differential tests against dopamine-rl's TF-era replay buffers.

A Scenario is a buffer configuration plus a stream of adds; `feed` plays it into a Dopamine
buffer and a memoire buffer alike, and the `assert_*` helpers compare what is public.
"""

import dataclasses
import warnings

import numpy as np
from hypothesis import strategies as st

from memoire.dopamine_compat import ReplayElement


@dataclasses.dataclass
class Scenario:
    observation_shape: tuple
    observation_dtype: type
    stack_size: int
    update_horizon: int
    capacity: int
    gamma: float
    reward_shape: tuple
    reward_dtype: type
    terminal_dtype: type
    action_shape: tuple
    extras: list
    steps: list  # (terminal, episode_end) per add
    seed: int

    def kwargs(self):
        return dict(
            observation_shape=self.observation_shape,
            stack_size=self.stack_size,
            replay_capacity=self.capacity,
            batch_size=4,
            update_horizon=self.update_horizon,
            gamma=self.gamma,
            extra_storage_types=self.extras or None,
            observation_dtype=self.observation_dtype,
            terminal_dtype=self.terminal_dtype,
            action_shape=self.action_shape,
            reward_shape=self.reward_shape,
            reward_dtype=self.reward_dtype,
        )


@st.composite
def scenarios(draw, max_steps=60, vector_rewards=True):
    stack = draw(st.integers(1, 4))
    horizon = draw(st.integers(1, 4))
    capacity = stack + horizon + draw(st.integers(0, 13))
    reward_shape = draw(st.sampled_from([(), (), (), (2,), (3,)] if vector_rewards else [()]))
    extras = draw(
        st.sampled_from(
            [
                [],
                [ReplayElement("extra", (2,), np.int64)],
                [ReplayElement("logit", (), np.float32), ReplayElement("mask", (3,), np.uint8)],
            ]
        )
    )
    n = draw(st.integers(0, max_steps))
    steps = [
        (draw(st.booleans()) and draw(st.booleans()), draw(st.integers(0, 9)) == 0)
        for _ in range(n)
    ]
    return Scenario(
        observation_shape=draw(st.sampled_from([(), (2,), (3, 2), (5, 7)])),
        observation_dtype=draw(st.sampled_from([np.uint8, np.float32, np.int16])),
        stack_size=stack,
        update_horizon=horizon,
        capacity=capacity,
        gamma=draw(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0])),
        reward_shape=reward_shape,
        reward_dtype=draw(st.sampled_from([np.float32, np.float32, np.float64, np.int32])),
        terminal_dtype=draw(st.sampled_from([np.uint8, np.uint8, np.bool_, np.float32])),
        action_shape=draw(st.sampled_from([(), (), (2,)])),
        extras=extras,
        steps=steps,
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def step_values(sc, rng, i):
    """The i-th add's arguments (values chosen to fit every dtype exactly)."""

    def values(shape, dtype):
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            return (rng.standard_normal(shape) * 10.0 ** rng.integers(-2, 3)).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, shape).astype(dtype)
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000) + 1, shape).astype(dtype)

    obs = values(sc.observation_shape, sc.observation_dtype)
    action = values(sc.action_shape, np.int32)
    if sc.action_shape == () and rng.integers(2):
        action = int(action)  # a Python int, as agents pass
    reward = values(sc.reward_shape, sc.reward_dtype)
    if sc.reward_shape == () and rng.integers(2):
        reward = float(reward) if np.dtype(sc.reward_dtype).kind == "f" else int(reward)
    terminal, episode_end = sc.steps[i]
    extras = [values(tuple(e.shape), e.type) for e in sc.extras]
    return obs, action, reward, terminal, extras, episode_end


def feed(sc, buffers, priorities=None):
    rng = np.random.default_rng(sc.seed)
    for i in range(len(sc.steps)):
        obs, action, reward, terminal, extras, episode_end = step_values(sc, rng, i)
        for b in buffers:
            if priorities is None:
                b.add(obs, action, reward, terminal, *extras, episode_end=episode_end)
            else:
                b.add(
                    obs,
                    action,
                    reward,
                    terminal,
                    *extras,
                    priority=priorities[i],
                    episode_end=episode_end,
                )


def outcome(f):
    """('ok', value) or ('raise', type name, message)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ("ok", f())
    except Exception as e:  # pylint: disable=broad-except
        # gin appends "In call to configurable ..." to errors raised in configurables.
        return ("raise", type(e).__name__, str(e).split("\n  In call to configurable")[0])


def assert_same_arrays(ours, theirs, what=""):
    assert len(ours) == len(theirs), what
    for k, (a, b) in enumerate(zip(ours, theirs)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, (what, k, a.dtype, b.dtype)
        assert a.shape == b.shape, (what, k, a.shape, b.shape)
        # Bitwise: NaN and signed zeros included.
        assert a.tobytes() == b.tobytes(), (what, k, a, b)


def assert_same_outcome(f_ours, f_theirs, what=""):
    o, t = outcome(f_ours), outcome(f_theirs)
    assert o[0] == t[0], (what, o, t)
    if o[0] == "raise":
        assert o[1:] == t[1:], (what, o, t)
    else:
        assert_same_arrays(o[1], t[1], what)


def assert_same_state(ours, theirs, cap, episode_start=True):
    assert int(ours.add_count) == int(theirs.add_count)
    assert isinstance(ours.add_count, np.ndarray) and ours.add_count.dtype == theirs.add_count.dtype
    assert ours.cursor() == theirs.cursor()
    assert bool(ours.is_full()) == bool(theirs.is_full())
    assert bool(ours.is_empty()) == bool(theirs.is_empty())
    r_o, r_t = np.asarray(ours.invalid_range), np.asarray(theirs.invalid_range)
    assert r_o.dtype == r_t.dtype and np.array_equal(r_o, r_t), (r_o, r_t)
    assert ours.episode_end_indices == {int(i) for i in theirs.episode_end_indices}
    if episode_start:  # not checkpointed by Dopamine: a loaded buffer keeps its own
        assert ours._next_experience_is_episode_start == theirs._next_experience_is_episode_start  # pylint: disable=protected-access
    valid_o = [ours.is_valid_transition(i) for i in range(-2, cap + 2)]
    valid_t = [theirs.is_valid_transition(i) for i in range(-2, cap + 2)]
    assert valid_o == valid_t
    assert list(ours.is_valid_transitions(np.arange(-2, cap + 2))) == valid_t
    assert ours.get_transition_elements() == theirs.get_transition_elements()
    assert ours.get_transition_elements(7) == theirs.get_transition_elements(7)
    assert ours.get_storage_signature() == theirs.get_storage_signature()
    assert ours.get_add_args_signature() == theirs.get_add_args_signature()


def comparable_indices(ours, cap, horizon, stack):
    """Indices whose transition reads only written slots in both buffers."""
    if ours.is_full():
        return list(range(-horizon, cap))  # every slot written; negatives wrap as in Dopamine
    cursor = int(ours.cursor())
    return [i for i in range(stack - 1, cap) if i + horizon < cursor]


def assert_same_batches(ours, theirs, sc):
    idx = comparable_indices(ours, sc.capacity, sc.update_horizon, sc.stack_size)
    # One index at a time (errors are per index), then all at once.
    for i in idx:
        assert_same_outcome(
            lambda: ours.sample_transition_batch(1, [i]),
            lambda: theirs.sample_transition_batch(1, [i]),
            ("index", i),
        )
    if idx:
        assert_same_outcome(
            lambda: ours.sample_transition_batch(len(idx), idx),
            lambda: theirs.sample_transition_batch(len(idx), idx),
            "all",
        )
    # Indices that Dopamine's get_range rejects raise the same AssertionError.
    bad = [sc.capacity, sc.capacity + sc.stack_size + 5]
    if not ours.is_full():
        bad.append(int(ours.cursor()))
    for i in bad:
        assert_same_outcome(
            lambda: ours.sample_transition_batch(1, [i]),
            lambda: theirs.sample_transition_batch(1, [i]),
            ("bad index", i),
        )
