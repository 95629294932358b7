"""Checkpoints: memoire <-> dopamine-rl 4.1.2 in both directions; safety of load and save."""

import gzip
import io
import os
import pickle

import numpy as np
import pytest

dopamine_crb = pytest.importorskip("dopamine.tf.replay_memory.circular_replay_buffer")
dopamine_prb = pytest.importorskip("dopamine.tf.replay_memory.prioritized_replay_buffer")
import _hostile as h  # noqa: E402
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


# ---- public attributes a subclass or a caller adds (Dopamine's _return_checkpointable_elements) --


def with_attributes(cls):
    """A subclass of ``cls`` that keeps two public attributes of its own, as a user's might."""

    class Counted(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.episodes_seen = 0
            self.return_history = np.zeros(4, np.float32)

    return Counted


def set_attributes(buffer, seed):
    """Gives ``buffer`` the subclass's attributes and a caller's, all depending on ``seed``."""
    buffer.episodes_seen = 3 + seed
    buffer.return_history = np.arange(4, dtype=np.float32) * (seed + 1)
    buffer.notes = {
        "run": "r{}".format(seed),
        "steps": [1, 2.5, None, (True, b"x")],
        "weights": np.linspace(0.0, 1.0, 3) + seed,
        "tags": {"a", "b{}".format(seed)},
        "best": np.float64(0.5 + seed),
    }


def assert_same_value(a, b, what):
    assert type(a) is type(b), (what, type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, what
        np.testing.assert_array_equal(a, b, err_msg=what)
    elif isinstance(a, dict):
        assert sorted(a) == sorted(b), what
        for key in a:
            assert_same_value(a[key], b[key], "{}[{!r}]".format(what, key))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_value(x, y, "{}[{}]".format(what, i))
    else:
        assert a == b, (what, a, b)


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_added_public_attributes_are_saved_and_restored_as_dopamine_does(tmp_path, prioritized):
    """A subclass's and a caller's public attributes get a checkpoint file each, as in
    Dopamine (same names in both folders), and come back on load in both directions."""
    ours_cls = with_attributes(
        OutOfGraphPrioritizedReplayBuffer if prioritized else OutOfGraphReplayBuffer
    )
    theirs_cls = with_attributes(
        dopamine_prb.OutOfGraphPrioritizedReplayBuffer
        if prioritized
        else dopamine_crb.OutOfGraphReplayBuffer
    )
    ours, theirs = filled(ours_cls, prioritized), filled(theirs_cls, prioritized)
    for b in (ours, theirs):
        set_attributes(b, seed=1)
    (tmp_path / "m").mkdir()
    (tmp_path / "d").mkdir()
    ours.save(str(tmp_path / "m"), 3)
    theirs.save(str(tmp_path / "d"), 3)
    listing = sorted(os.listdir(tmp_path / "m"))
    assert listing == sorted(os.listdir(tmp_path / "d"))
    for name in ("episodes_seen", "return_history", "notes"):
        assert "{}_ckpt.3.gz".format(name) in listing
    # Loaded into buffers whose attributes hold other values: the saved ones come back.
    for folder, cls in [("m", ours_cls), ("d", ours_cls), ("m", theirs_cls)]:
        loaded = cls(**SC.kwargs())
        set_attributes(loaded, seed=7)
        loaded.load(str(tmp_path / folder), 3)
        for name in ("episodes_seen", "return_history", "notes"):
            assert_same_value(getattr(loaded, name), getattr(theirs, name), name)
    loaded = ours_cls(**SC.kwargs())
    loaded.load(str(tmp_path / "d"), 3)
    assert_equivalent(loaded, theirs)
    # An attribute the loading buffer lacks is not read; one it has must be in the folder.
    plain = (OutOfGraphPrioritizedReplayBuffer if prioritized else OutOfGraphReplayBuffer)(
        **SC.kwargs()
    )
    plain.load(str(tmp_path / "m"), 3)
    assert "notes" not in vars(plain)
    plain.extra_flag = True
    with pytest.raises(tf.errors.NotFoundError, match="extra_flag_ckpt"):
        plain.load(str(tmp_path / "m"), 3)


class Opaque:
    """An object of a class of the user's (what Dopamine's testSaveNonNDArrayAttributes saves)."""


def test_added_attribute_holding_an_object_is_written_but_refused_on_load(tmp_path, caplog):
    """Dopamine pickles any object; memoire writes it too (Dopamine can load it, with a warning
    that memoire's load will not) and its load refuses it, changing nothing."""
    src = filled(OutOfGraphReplayBuffer)
    src.opaque = Opaque()
    with caplog.at_level("WARNING"):
        src.save(str(tmp_path), 0)
    assert "opaque" in caplog.text and "will refuse" in caplog.text
    assert os.path.exists(checkpoint.generate_filename(str(tmp_path), "opaque", 0))
    target = filled(OutOfGraphReplayBuffer, steps=SC.steps[:11])
    target.opaque = "before"
    with pytest.raises(ProtocolError, match="opaque_ckpt.0.gz.*does not load"):
        target.load(str(tmp_path), 0)
    assert target.opaque == "before"
    assert_equivalent(target, filled(OutOfGraphReplayBuffer, steps=SC.steps[:11]))


def test_a_folder_holding_other_files_is_still_read_strictly(tmp_path):
    """Only the files of the loading buffer's own attributes are opened (a FIFO or a hostile
    pickle under another name is never touched), and those are checked: a hostile pickle, an
    object array, a gzip bomb or a lying header in an added attribute's file is refused with
    the buffer unchanged."""
    src = filled(OutOfGraphReplayBuffer)
    src.history = np.arange(6, dtype=np.int64)
    src.meta = {"k": [1, 2]}
    src.save(str(tmp_path), 0)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > {}".format(tmp_path / "pwned"),))

    # Other files: names Dopamine's layout would use for attributes this buffer does not have.
    for name in ("evil", "$store$_ghost", "sum_tree"):
        with open(checkpoint.generate_filename(str(tmp_path), name, 0), "wb") as f:
            f.write(gzip.compress(pickle.dumps(Evil())))
    os.mkfifo(checkpoint.generate_filename(str(tmp_path), "fifo", 0))
    target = OutOfGraphReplayBuffer(**SC.kwargs())
    target.history = np.zeros(1, np.int64)
    target.meta = None
    target.load(str(tmp_path), 0)
    assert_equivalent(target, src)
    np.testing.assert_array_equal(target.history, src.history)
    assert target.meta == {"k": [1, 2]}
    assert not (tmp_path / "pwned").exists()

    good = {n: h.read_payload(tmp_path, n) for n in ("history", "meta")}
    reference = filled(OutOfGraphReplayBuffer, steps=SC.steps[:11])

    def refused(name, payload, match):
        victim = filled(OutOfGraphReplayBuffer, steps=SC.steps[:11])
        victim.history = np.zeros(1, np.int64)
        victim.meta = "kept"
        h.write(tmp_path, name, payload)
        with pytest.raises(ProtocolError, match=match):
            victim.load(str(tmp_path), 0)
        assert_equivalent(victim, reference)
        assert victim.meta == "kept" and victim.history.tolist() == [0]
        h.write(tmp_path, name, good[name])

    refused("meta", pickle.dumps({"k": Evil()}), "meta_ckpt.*does not load")
    refused("meta", pickle.dumps([np.zeros(2, dtype=object)]), "meta_ckpt.*plain numeric")
    refused("meta", pickle.dumps(checkpoint.PickledSumTree()), "meta_ckpt.*does not load")
    refused("history", h.npy_header((4,), "|O"), "history_ckpt.*plain numeric")
    refused("history", h.npy_header((1 << 40,)), "history_ckpt.*more than a checkpoint")
    refused("history", pickle.dumps(np.arange(3)), "history_ckpt")  # not a .npy file
    budget = checkpoint.added_attribute_budget(reference)
    with open(h.path(tmp_path, "meta"), "wb") as f:
        f.write(h.gzip_bomb(budget + (1 << 20)))
    victim = filled(OutOfGraphReplayBuffer, steps=SC.steps[:11])
    victim.history, victim.meta = np.zeros(1, np.int64), "kept"
    with pytest.raises(ProtocolError, match="meta_ckpt.*inflates to more than"):
        victim.load(str(tmp_path), 0)
    assert victim.meta == "kept"
    assert not (tmp_path / "pwned").exists()


def test_a_public_name_that_is_not_an_identifier_is_refused_before_writing(tmp_path):
    buf = filled(OutOfGraphReplayBuffer)
    setattr(buf, "../escape", 1)
    with pytest.raises(ValueError, match="'../escape'.*identifier"):
        buf.save(str(tmp_path), 0)
    assert os.listdir(tmp_path) == []
