"""Differential tests: memoire's OutOfGraphReplayBuffer against dopamine-rl 4.1.2's."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

dopamine_crb = pytest.importorskip("dopamine.tf.replay_memory.circular_replay_buffer")

import dopamine_diff as dd  # noqa: E402

from memoire.dopamine_compat import OutOfGraphReplayBuffer  # noqa: E402

pytestmark = pytest.mark.dopamine
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_pair(sc, **ours_kwargs):
    return (
        OutOfGraphReplayBuffer(**sc.kwargs(), seed=sc.seed, **ours_kwargs),
        dopamine_crb.OutOfGraphReplayBuffer(**sc.kwargs()),
    )


@SETTINGS
@given(dd.scenarios())
def test_same_state_validity_and_batches(sc):
    ours, theirs = make_pair(sc)
    dd.assert_same_state(ours, theirs, sc.capacity)
    # Compare after every few adds, so partially filled and wrapped buffers are both seen.
    rng = np.random.default_rng(sc.seed)
    for i in range(len(sc.steps)):
        obs, action, reward, terminal, extras, end = dd.step_values(sc, rng, i)
        ours.add(obs, action, reward, terminal, *extras, episode_end=end)
        theirs.add(obs, action, reward, terminal, *extras, episode_end=end)
        if i % 7 == 6 or i == len(sc.steps) - 1:
            dd.assert_same_state(ours, theirs, sc.capacity)
            dd.assert_same_batches(ours, theirs, sc)
    for name in theirs._store:  # pylint: disable=protected-access
        written = min(int(theirs.add_count), sc.capacity)
        assert np.array_equal(ours._store[name][:written], theirs._store[name][:written])  # pylint: disable=protected-access


@SETTINGS
@given(dd.scenarios(vector_rewards=False))
def test_observation_and_terminal_stacks(sc):
    ours, theirs = make_pair(sc)
    dd.feed(sc, [ours, theirs])
    for i in dd.comparable_indices(ours, sc.capacity, sc.update_horizon, sc.stack_size):
        if i < 0:
            continue
        dd.assert_same_outcome(
            lambda: (ours.get_observation_stack(i), ours.get_terminal_stack(i)),
            lambda: (theirs.get_observation_stack(i), theirs.get_terminal_stack(i)),
        )


@settings(max_examples=30, deadline=None)
@given(dd.scenarios(max_steps=40, vector_rewards=False))
def test_uniform_sampling_returns_valid_indices_or_same_error(sc):
    ours, theirs = make_pair(sc)
    dd.feed(sc, [ours, theirs])
    o = dd.outcome(lambda: ours.sample_index_batch(16))
    t = dd.outcome(lambda: theirs.sample_index_batch(16))
    if o[0] == "raise" or t[0] == "raise":
        # Different draws may fail after different numbers of attempts, never for different reasons.
        assert o[0] == t[0] == "raise" or "Max sample attempts" in str(o + t), (o, t)
        if "Cannot sample" in str(o) or "Cannot sample" in str(t):
            assert o == t
        return
    assert len(o[1]) == 16 and all(isinstance(i, int) for i in o[1])
    assert all(theirs.is_valid_transition(i) for i in o[1])
    batch = ours.sample_transition_batch()
    assert [e.shape for e in batch] == [e.shape for e in theirs.get_transition_elements()]
    assert all(theirs.is_valid_transition(i) for i in batch[7])
    dd.assert_same_arrays(batch, theirs.sample_transition_batch(4, batch[7].tolist()))


def test_uniform_sampling_is_uniform_over_valid_indices():
    ours = OutOfGraphReplayBuffer((1,), 1, 10, 4, seed=3)
    for i in range(25):
        ours.add(np.array([i], np.uint8), 0, 0.0, i % 6 == 5)
    valid = [i for i in range(10) if ours.is_valid_transition(i)]
    counts = np.bincount(
        np.concatenate([ours.sample_index_batch(100) for _ in range(200)]), minlength=10
    )
    assert set(np.flatnonzero(counts)) == set(valid)
    freq = counts[valid] / counts.sum()
    assert np.all(np.abs(freq - 1 / len(valid)) < 0.02), freq


def test_constructor_errors_match():
    for kw in [
        dict(observation_shape=(2,), stack_size=4, replay_capacity=4, batch_size=1),
        dict(observation_shape=[2], stack_size=1, replay_capacity=10, batch_size=1),
        dict(
            observation_shape=(2,), stack_size=2, replay_capacity=5, batch_size=1, update_horizon=4
        ),
    ]:
        dd.assert_same_outcome(
            lambda: OutOfGraphReplayBuffer(**kw) and (),
            lambda: dopamine_crb.OutOfGraphReplayBuffer(**kw) and (),
        )


def test_add_errors_match_and_change_nothing():
    ours = OutOfGraphReplayBuffer(
        (2,), 2, 10, 1, extra_storage_types=[dd.ReplayElement("extra", (3,), np.float32)]
    )
    theirs = dopamine_crb.OutOfGraphReplayBuffer(
        (2,), 2, 10, 1, extra_storage_types=[dd.ReplayElement("extra", (3,), np.float32)]
    )
    good = (np.zeros(2, np.uint8), 1, 1.0, False, np.zeros(3, np.float32))
    bad_calls = [
        ((np.zeros(3, np.uint8), 1, 1.0, False, np.zeros(3)), {}),  # observation shape
        ((np.zeros(2, np.uint8), [1, 2], 1.0, False, np.zeros(3)), {}),  # action shape (list)
        ((np.zeros(2, np.uint8), 1, np.zeros(1), False, np.zeros(3)), {}),  # reward shape
        ((np.zeros(2, np.uint8), 1, 1.0, False), {}),  # missing extra
        ((np.zeros(2, np.uint8), 1, 1.0, False, np.zeros(3), 5), {}),  # one too many
        (good, {"priority": 1.0}),  # priority is one argument too many here
        ((np.zeros(2, np.uint8), 1, 1.0, False, (1, 2, 3, 4)), {}),  # tuple extra shape
        (([1, 2], 1, 1.0, False, np.zeros(3)), {}),  # a list observation is fine
    ]
    for args, kwargs in bad_calls:
        before = int(ours.add_count)
        o = dd.outcome(lambda: ours.add(*args, **kwargs))
        t = dd.outcome(lambda: theirs.add(*args, **kwargs))
        assert o == t, (args, kwargs, o, t)
        if o[0] == "raise":
            assert int(ours.add_count) == before
    ours.add(*good)
    theirs.add(*good)
    dd.assert_same_state(ours, theirs, 10)


def test_numpy_casting_on_add_matches():
    ours = OutOfGraphReplayBuffer((2,), 1, 10, 1, observation_dtype=np.uint8)
    theirs = dopamine_crb.OutOfGraphReplayBuffer((2,), 1, 10, 1, observation_dtype=np.uint8)
    adds = [
        (np.array([1.7, 300.2]), 2.9, np.float64(1.25), 2),  # float obs, float action, terminal 2
        ((3, 4), np.int64(7), 1, np.bool_(False)),
        ([5.5, 6], True, False, 0.0),
        (np.array([7, 8], np.int32), np.array(9, np.int16), np.float32(0.1), 0.5),
    ]
    for a in adds:
        ours.add(*a)
        theirs.add(*a)
    for name in theirs._store:  # pylint: disable=protected-access
        assert np.array_equal(ours._store[name][: len(adds)], theirs._store[name][: len(adds)]), (
            name
        )  # pylint: disable=protected-access
    dd.assert_same_state(ours, theirs, 10)


def test_sampling_errors_match():
    ours = OutOfGraphReplayBuffer((2,), 3, 12, 2, update_horizon=2)
    theirs = dopamine_crb.OutOfGraphReplayBuffer((2,), 3, 12, 2, update_horizon=2)
    dd.assert_same_outcome(lambda: ours.sample_index_batch(2), lambda: theirs.sample_index_batch(2))
    for _i in range(3):
        ours.add(np.zeros(2, np.uint8), 0, 0.0, False)
        theirs.add(np.zeros(2, np.uint8), 0, 0.0, False)
    dd.assert_same_outcome(lambda: ours.sample_index_batch(2), lambda: theirs.sample_index_batch(2))
    dd.assert_same_outcome(
        lambda: ours.sample_transition_batch(3, [2, 2]),
        lambda: theirs.sample_transition_batch(3, [2, 2]),
    )
    # Every index invalid: the attempts run out with Dopamine's message.
    few = OutOfGraphReplayBuffer((1,), 1, 10, 1, max_sample_attempts=5, seed=1)
    for _i in range(12):
        few.add(np.zeros(1, np.uint8), 0, 0.0, False, episode_end=True)
    with pytest.raises(
        RuntimeError,
        match=r"Max sample attempts: Tried 5 times but only sampled "
        r"0 valid indices. Batch size is 3",
    ):
        few.sample_index_batch(3)


def test_issue_213_fix_is_opt_in():
    """google/dopamine#213: a stack across a truncated episode is valid in Dopamine."""

    def fill(b):
        b.add(np.array([1]), 1, 1, False, episode_end=True)
        b.add(np.array([2]), 2, 2, False)
        b.add(np.array([3]), 3, 3, False)

    theirs = dopamine_crb.OutOfGraphReplayBuffer((1,), 2, 10, 1)
    default = OutOfGraphReplayBuffer((1,), 2, 10, 1)
    fixed = OutOfGraphReplayBuffer((1,), 2, 10, 1, episode_end_breaks_stacks=True)
    for b in (theirs, default, fixed):
        fill(b)
    # Slots: 0 pad, 1 obs1 (end), 2 pad, 3 obs2, 4 obs3. Index 2 stacks [obs1, pad].
    assert theirs.is_valid_transition(2) and default.is_valid_transition(2)
    assert not fixed.is_valid_transition(2)
    assert [fixed.is_valid_transition(i) for i in range(10)] == [
        False,
        False,
        False,
        True,
        False,
        False,
        False,
        False,
        False,
        False,
    ]


def test_batched_add_equals_single_adds():
    rng = np.random.default_rng(0)
    k = 37
    obs = rng.integers(0, 255, (k, 3, 2)).astype(np.uint8)
    act = rng.integers(0, 4, k).astype(np.int32)
    rew = rng.standard_normal(k).astype(np.float32)
    term = (rng.random(k) < 0.1).astype(np.uint8)
    ends = rng.random(k) < 0.1
    single = OutOfGraphReplayBuffer((3, 2), 4, 23, 1, update_horizon=3)
    bulk = OutOfGraphReplayBuffer((3, 2), 4, 23, 1, update_horizon=3)
    for i in range(k):
        single.add(obs[i], act[i], rew[i], term[i], episode_end=ends[i])
    bulk.add_batch(obs, act, rew, term, episode_ends=ends)
    dd.assert_same_state(bulk, single, 23)
    idx = [i for i in range(23) if single.is_valid_transition(i)]
    assert idx
    dd.assert_same_arrays(
        bulk.sample_transition_batch(len(idx), idx), single.sample_transition_batch(len(idx), idx)
    )
    with pytest.raises(ValueError, match="observation"):
        bulk.add_batch(obs[:, :2], act, rew, term)
    assert int(bulk.add_count) == int(single.add_count)


@settings(max_examples=20, deadline=None)
@given(st.integers(8, 140), st.sampled_from([np.float32, np.float64]), st.integers(0, 2**31))
def test_long_horizon_sums_match_numpy_pairwise_order(horizon, dtype, seed):
    """numpy sums 8+ terms pairwise; memoire reproduces the rounding bit for bit."""
    cap = horizon + 5
    kw = dict(
        observation_shape=(1,),
        stack_size=1,
        replay_capacity=cap,
        batch_size=1,
        update_horizon=horizon,
        gamma=0.97,
        reward_dtype=dtype,
    )
    ours, theirs = OutOfGraphReplayBuffer(**kw), dopamine_crb.OutOfGraphReplayBuffer(**kw)
    rng = np.random.default_rng(seed)
    for _ in range(cap + 3):
        r = (rng.standard_normal() * 10.0 ** rng.integers(-3, 4)).astype(dtype)
        ours.add(np.zeros(1, np.uint8), 0, r, False)
        theirs.add(np.zeros(1, np.uint8), 0, r, False)
    idx = [i for i in range(cap) if theirs.is_valid_transition(i)]
    dd.assert_same_arrays(
        ours.sample_transition_batch(len(idx), idx), theirs.sample_transition_batch(len(idx), idx)
    )


def test_returned_batches_never_alias_batches_still_held():
    buf = OutOfGraphReplayBuffer((4, 4), 4, 50, 8, seed=0)
    for i in range(60):
        buf.add(np.full((4, 4), i, np.uint8), i, float(i), i % 10 == 9)
    held = [buf.sample_transition_batch() for _ in range(3)]
    view = buf.sample_transition_batch()[0][2:]  # only a view survives
    for _ in range(4):
        new = buf.sample_transition_batch()
        for old in held:
            assert not any(np.shares_memory(a, b) for a in new for b in old)
        assert not np.shares_memory(new[0], view)
        held.append(new)


def test_sample_count_counts_drawn_transitions():
    from memoire.dopamine_compat import OutOfGraphPrioritizedReplayBuffer

    for cls in (OutOfGraphReplayBuffer, OutOfGraphPrioritizedReplayBuffer):
        buf = cls((2,), 1, replay_capacity=50, batch_size=4, seed=1)
        with pytest.raises((RuntimeError, ValueError)):  # Dopamine's errors when empty
            buf.sample_transition_batch()  # nothing drawn: not counted
        for i in range(20):
            args = (np.full(2, i, np.uint8), 0, 1.0, i % 7 == 6)
            buf.add(*args, priority=1.0) if cls is not OutOfGraphReplayBuffer else buf.add(*args)
        buf.sample_transition_batch()
        buf.sample_transition_batch(batch_size=3)
        buf.sample_transition_batch(batch_size=2, indices=[1, 2])  # a read, not a draw
        assert buf.sample_count == 4 + 3, cls.__name__
