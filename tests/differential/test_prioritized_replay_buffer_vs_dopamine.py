"""Differential tests: memoire's OutOfGraphPrioritizedReplayBuffer against dopamine-rl 4.1.2's."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

dopamine_prb = pytest.importorskip("dopamine.tf.replay_memory.prioritized_replay_buffer")

import dopamine_diff as dd  # noqa: E402

from memoire.dopamine_compat import OutOfGraphPrioritizedReplayBuffer  # noqa: E402

pytestmark = pytest.mark.dopamine
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_pair(sc):
    return (
        OutOfGraphPrioritizedReplayBuffer(**sc.kwargs(), seed=sc.seed),
        dopamine_prb.OutOfGraphPrioritizedReplayBuffer(**sc.kwargs()),
    )


def priorities_for(sc):
    rng = np.random.default_rng(sc.seed + 1)
    values = rng.choice([0.0, 0.5, 1.0, 2.5, 0.1, 7.25, 1e-3], size=len(sc.steps))
    # Mix Python floats and numpy float32 scalars, as agents pass either.
    return [float(v) if i % 2 else np.float32(v) for i, v in enumerate(values)]


def assert_same_priorities(ours, theirs, cap):
    every = np.arange(cap, dtype=np.int32)
    dd.assert_same_arrays([ours.get_priority(every)], [theirs.get_priority(every)])
    assert ours.sum_tree.max_recorded_priority == theirs.sum_tree.max_recorded_priority
    for i in range(cap):
        assert ours.sum_tree.get(i) == theirs.sum_tree.get(i)


@SETTINGS
@given(dd.scenarios(max_steps=50), st.data())
def test_same_priorities_batches_and_validity(sc, data):
    ours, theirs = make_pair(sc)
    dd.feed(sc, [ours, theirs], priorities=priorities_for(sc))
    dd.assert_same_state(ours, theirs, sc.capacity)
    assert_same_priorities(ours, theirs, sc.capacity)
    dd.assert_same_batches(ours, theirs, sc)  # sampling_probabilities included
    # set_priority with int32 indices and float32 priorities (what tf_set_priority passes).
    if int(ours.add_count) > 0:
        k = data.draw(st.integers(1, 6))
        idx = np.array(
            data.draw(st.lists(st.integers(0, sc.capacity - 1), min_size=k, max_size=k)), np.int32
        )
        pri = np.array(
            data.draw(st.lists(st.floats(0, 50, width=32), min_size=k, max_size=k)), np.float32
        )
        ours.set_priority(idx, pri)
        theirs.set_priority(idx, pri)
        assert_same_priorities(ours, theirs, sc.capacity)
        dd.assert_same_batches(ours, theirs, sc)


def test_priority_errors_match_and_change_nothing():
    kw = dict(observation_shape=(2,), stack_size=1, replay_capacity=10, batch_size=2)
    ours = OutOfGraphPrioritizedReplayBuffer(**kw)
    theirs = dopamine_prb.OutOfGraphPrioritizedReplayBuffer(**kw)
    obs = np.zeros(2, np.uint8)
    for b in (ours, theirs):
        b.add(obs, 0, 0.0, False, priority=1.5)
    checks = [
        lambda b: b.add(obs, 0, 0.0, False),  # priority is required
        lambda b: b.add(obs, 0, 0.0, False, np.ones(2)),  # priority must be a scalar
        lambda b: b.add(obs, 0, 0.0, False, priority=-1.0),
        lambda b: b.set_priority(np.array([0], np.int64), np.array([1.0])),
        lambda b: b.set_priority(np.array([0, 1], np.int32), np.array([1.0, -2.0], np.float32)),
        lambda b: b.get_priority(np.array([0], np.int64)),
        lambda b: b.get_priority(np.array(0, np.int32)),
        lambda b: b.sample_index_batch(2),  # one transition, priority 1.5: not enough to be valid
    ]
    for check in checks:
        before = ours.get_priority(np.arange(10, dtype=np.int32))
        o, t = dd.outcome(lambda: check(ours)), dd.outcome(lambda: check(theirs))
        assert o[0] == t[0] == "raise", (o, t)
        if "Max sample attempts" not in str(t):
            assert o == t, (o, t)
        np.testing.assert_array_equal(ours.get_priority(np.arange(10, dtype=np.int32)), before)
    # Stricter than Dopamine (which would corrupt its tree or accept NaN): nothing is set.
    with pytest.raises(IndexError):
        ours.set_priority(np.array([3, 10], np.int32), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match="finite"):
        ours.set_priority(np.array([3], np.int32), np.array([np.nan]))
    with pytest.raises(ValueError, match="one per index"):
        ours.set_priority(np.array([3, 4], np.int32), np.array([1.0]))
    assert ours.get_priority(np.array([3], np.int32))[0] == 0.0


def test_empty_tree_error_matches():
    kw = dict(observation_shape=(1,), stack_size=1, replay_capacity=6, batch_size=2)
    ours = OutOfGraphPrioritizedReplayBuffer(**kw)
    theirs = dopamine_prb.OutOfGraphPrioritizedReplayBuffer(**kw)
    for b in (ours, theirs):
        for _ in range(4):
            b.add(np.zeros(1, np.uint8), 0, 0.0, False, 0.0)
    dd.assert_same_outcome(lambda: ours.sample_index_batch(2), lambda: theirs.sample_index_batch(2))


def test_sampling_follows_priorities_and_skips_invalid():
    buf = OutOfGraphPrioritizedReplayBuffer((1,), 1, 12, 4, seed=11)
    for i in range(8):
        buf.add(np.array([i], np.uint8), 0, 0.0, False, priority=float(i % 4 + 1))
    # Valid: 0..6 (7 is before the cursor); priorities 1,2,3,4,1,2,3.
    draws = np.concatenate([buf.sample_index_batch(32) for _ in range(600)])
    assert set(np.unique(draws)) == set(range(7))
    freq = np.bincount(draws, minlength=7) / draws.size
    want = np.array([1, 2, 3, 4, 1, 2, 3], float)
    want /= want.sum()
    assert np.all(np.abs(freq - want) < 0.01), (freq, want)
    # Stratified: with equal priorities a batch of 7 takes every valid slot once.
    flat = OutOfGraphPrioritizedReplayBuffer((1,), 1, 8, 7, seed=2)
    for i in range(7):
        flat.add(np.array([i], np.uint8), 0, 0.0, False, priority=1.0)
    flat.set_priority(np.array([6], np.int32), np.array([0.0], np.float32))
    assert sorted(flat.sample_index_batch(6)) == [0, 1, 2, 3, 4, 5]
    batch = flat.sample_transition_batch(6)
    assert batch[-1].dtype == np.float32 and np.all(batch[-1] == 1.0)


def test_sum_tree_view_and_max_recorded_priority():
    buf = OutOfGraphPrioritizedReplayBuffer((1,), 2, 5, 1)
    theirs = dopamine_prb.OutOfGraphPrioritizedReplayBuffer((1,), 2, 5, 1)
    for b in (buf, theirs):
        b.add(np.zeros(1, np.uint8), 0, 0.0, False, priority=3.0)
        b.add(np.zeros(1, np.uint8), 0, 0.0, False, priority=0.5)
    assert buf.sum_tree.max_recorded_priority == theirs.sum_tree.max_recorded_priority == 3.0
    for ours_level, their_level in zip(buf.sum_tree.nodes, theirs.sum_tree.nodes):
        np.testing.assert_allclose(ours_level, their_level)
    assert buf.sum_tree._total_priority() == theirs.sum_tree._total_priority()  # pylint: disable=protected-access
