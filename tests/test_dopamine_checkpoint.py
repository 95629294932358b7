"""Checkpoints: memoire <-> dopamine-rl 4.1.2 in both directions; safety of load and save."""

import gzip
import io
import os
import pickle

import numpy as np
import pytest

dopamine_crb = pytest.importorskip("dopamine.tf.replay_memory.circular_replay_buffer")
dopamine_prb = pytest.importorskip("dopamine.tf.replay_memory.prioritized_replay_buffer")
import dopamine_diff as dd  # noqa: E402
import tensorflow as tf  # noqa: E402  (Dopamine imports it anyway)

from memoire import ProtocolError  # noqa: E402
from memoire.dopamine_compat import (
    OutOfGraphPrioritizedReplayBuffer,  # noqa: E402
    OutOfGraphReplayBuffer,  # noqa: E402
    checkpoint,  # noqa: E402
)

pytestmark = pytest.mark.dopamine

SC = dd.Scenario(
    observation_shape=(3, 2),
    observation_dtype=np.uint8,
    stack_size=3,
    update_horizon=2,
    capacity=17,
    gamma=0.9,
    reward_shape=(),
    reward_dtype=np.float32,
    terminal_dtype=np.uint8,
    action_shape=(),
    extras=[dd.ReplayElement("extra", (2,), np.int64)],
    steps=[(i % 9 == 8, i % 13 == 12) for i in range(40)],
    seed=5,
)


def filled(cls, prioritized=False, steps=SC.steps, **kw):
    sc = dd.Scenario(**{**SC.__dict__, "steps": steps})
    b = cls(**sc.kwargs(), **kw)
    pri = [float(i % 5) * 0.7 for i in range(len(steps))] if prioritized else None
    dd.feed(sc, [b], priorities=pri)
    return b


def assert_equivalent(a, b, episode_start=False):
    dd.assert_same_state(a, b, SC.capacity, episode_start)
    dd.assert_same_batches(a, b, SC)
    if hasattr(b, "sum_tree"):
        every = np.arange(SC.capacity, dtype=np.int32)
        np.testing.assert_array_equal(a.get_priority(every), b.get_priority(every))
        assert a.sum_tree.max_recorded_priority == b.sum_tree.max_recorded_priority


@pytest.mark.parametrize("prioritized", [False, True])
def test_both_directions(tmp_path, prioritized):
    ours_cls = OutOfGraphPrioritizedReplayBuffer if prioritized else OutOfGraphReplayBuffer
    theirs_cls = (
        dopamine_prb.OutOfGraphPrioritizedReplayBuffer
        if prioritized
        else dopamine_crb.OutOfGraphReplayBuffer
    )
    ours, theirs = filled(ours_cls, prioritized), filled(theirs_cls, prioritized)
    (tmp_path / "m").mkdir()
    (tmp_path / "d").mkdir()
    ours.save(str(tmp_path / "m"), 3)
    theirs.save(str(tmp_path / "d"), 3)
    assert sorted(os.listdir(tmp_path / "m")) == sorted(os.listdir(tmp_path / "d"))
    # Dopamine reads memoire's files; memoire reads Dopamine's.
    theirs_loaded = theirs_cls(**SC.kwargs())
    theirs_loaded.load(str(tmp_path / "m"), 3)
    ours_loaded = ours_cls(**SC.kwargs())
    ours_loaded.load(str(tmp_path / "d"), 3)
    assert_equivalent(ours_loaded, theirs)
    assert_equivalent(ours, theirs_loaded)
    if prioritized:  # Dopamine's own tree, rebuilt from our pickle, samples valid indices
        assert all(
            theirs_loaded.is_valid_transition(i) for i in theirs_loaded.sample_index_batch(8)
        )
    # Our round trip.
    again = ours_cls(**SC.kwargs())
    again.load(str(tmp_path / "m"), 3)
    assert_equivalent(again, theirs)


def test_missing_and_corrupt_files_leave_buffer_unchanged(tmp_path):
    src = filled(OutOfGraphReplayBuffer)
    src.save(str(tmp_path), 0)
    target = filled(OutOfGraphReplayBuffer, steps=SC.steps[:11])
    reference = filled(OutOfGraphReplayBuffer, steps=SC.steps[:11])

    def name(attr):
        return checkpoint.generate_filename(str(tmp_path), attr, 0)

    def attempt(exc, match=None):
        with pytest.raises(exc, match=match):
            target.load(str(tmp_path), 0)
        assert_equivalent(target, reference)

    with pytest.raises(tf.errors.NotFoundError, match="Missing file"):
        target.load(str(tmp_path), 1)
    os.rename(name("add_count"), name("add_count") + ".away")
    attempt(tf.errors.NotFoundError, "Missing file")
    os.rename(name("add_count") + ".away", name("add_count"))

    def rewrite(attr, raw):
        with open(name(attr), "wb") as f:
            f.write(raw)

    good = {a: open(name(a), "rb").read() for a in checkpoint.attribute_names(src)}
    # Truncated gzip, garbage, a column of the wrong shape, a bad add_count, a malicious pickle.
    rewrite(
        "$store$_observation", good["$store$_observation"][: len(good["$store$_observation"]) // 2]
    )
    attempt(ProtocolError)
    rewrite("$store$_observation", b"not gzip at all")
    attempt(ProtocolError)
    buf = io.BytesIO()
    np.save(buf, np.zeros((SC.capacity, 2, 3), np.uint8))
    rewrite("$store$_observation", gzip.compress(buf.getvalue()))
    attempt(ProtocolError, "expected shape")
    rewrite("$store$_observation", good["$store$_observation"])
    buf = io.BytesIO()
    np.save(buf, np.array(10**6))
    rewrite("add_count", gzip.compress(buf.getvalue()))
    attempt(ProtocolError, "invalid_range")
    rewrite("add_count", good["add_count"])

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > {}".format(tmp_path / "pwned"),))

    rewrite("episode_end_indices", gzip.compress(pickle.dumps({1, Evil()})))
    attempt(ProtocolError, "posix.system|os.system|does not load")
    assert not (tmp_path / "pwned").exists()
    rewrite("episode_end_indices", gzip.compress(pickle.dumps({1, 2, 999})))
    attempt(ProtocolError, "set of slots")
    rewrite("episode_end_indices", good["episode_end_indices"])
    target.load(str(tmp_path), 0)
    assert_equivalent(target, src)


def test_interrupted_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    buf = filled(OutOfGraphReplayBuffer)
    buf.save(str(tmp_path), 4)
    before = sorted(os.listdir(tmp_path))
    calls = {"n": 0}
    real = checkpoint._payload  # pylint: disable=protected-access

    def failing(b, attr):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed mid-save")
        return real(b, attr)

    monkeypatch.setattr(checkpoint, "_payload", failing)
    buf.add(np.ones((3, 2), np.uint8), 1, 1.0, False, np.ones(2, np.int64))
    with pytest.raises(KeyboardInterrupt):
        buf.save(str(tmp_path), 5)
    assert sorted(os.listdir(tmp_path)) == before  # no partial iteration 5, no temp files
    fresh = OutOfGraphReplayBuffer(**SC.kwargs())
    fresh.load(str(tmp_path), 4)
    assert_equivalent(fresh, filled(OutOfGraphReplayBuffer))


def test_stale_checkpoints_removed_like_dopamine(tmp_path):
    for cls, sub in [(OutOfGraphReplayBuffer, "m"), (dopamine_crb.OutOfGraphReplayBuffer, "d")]:
        (tmp_path / sub).mkdir()
        b = filled(cls, checkpoint_duration=2)
        for it in range(5):
            b.save(str(tmp_path / sub), it)
    assert sorted(os.listdir(tmp_path / "m")) == sorted(os.listdir(tmp_path / "d"))
    assert {f.split(".")[1] for f in os.listdir(tmp_path / "m")} == {"3", "4"}


def test_keep_every_matches_dopamine_by_default_and_fix_is_opt_in(tmp_path):
    dirs = {}
    for key, cls, kw in [
        ("d", dopamine_crb.OutOfGraphReplayBuffer, {}),
        ("m", OutOfGraphReplayBuffer, {}),
        ("fix", OutOfGraphReplayBuffer, {"fix_keep_every": True}),
    ]:
        dirs[key] = tmp_path / key
        dirs[key].mkdir()
        b = filled(cls, checkpoint_duration=2, keep_every=3, **kw)
        for it in range(7):
            b.save(str(dirs[key]), it)
    listing = {k: sorted(os.listdir(v)) for k, v in dirs.items()}
    assert listing["m"] == listing["d"]

    def per_iteration(files, it):
        return [f for f in files if f.split(".")[1] == str(it)]

    # Iteration 5 spares iteration 3 (a multiple of 3): Dopamine wrote only its first file.
    assert len(per_iteration(listing["d"], 5)) == 1
    n_files = len(checkpoint.attribute_names(OutOfGraphReplayBuffer(**SC.kwargs())))
    assert len(per_iteration(listing["fix"], 5)) == n_files
    assert len(per_iteration(listing["fix"], 3)) == n_files  # kept
    fixed = OutOfGraphReplayBuffer(**SC.kwargs())
    fixed.load(str(dirs["fix"]), 5)
    with pytest.raises(tf.errors.NotFoundError):
        OutOfGraphReplayBuffer(**SC.kwargs()).load(str(dirs["m"]), 5)


def test_save_to_missing_directory_is_a_no_op(tmp_path):
    buf = filled(OutOfGraphReplayBuffer)
    buf.save(str(tmp_path / "nope"), 0)
    assert not (tmp_path / "nope").exists()


def test_old_checkpoint_without_episode_end_indices(tmp_path):
    src = filled(dopamine_crb.OutOfGraphReplayBuffer)
    src.save(str(tmp_path), 0)
    os.remove(checkpoint.generate_filename(str(tmp_path), "episode_end_indices", 0))
    ours = OutOfGraphReplayBuffer(**SC.kwargs())
    ours.load(str(tmp_path), 0)
    theirs = dopamine_crb.OutOfGraphReplayBuffer(**SC.kwargs())
    theirs.load(str(tmp_path), 0)
    dd.assert_same_state(ours, theirs, SC.capacity)
