"""The prefetching feed behind memoire's TF-face out-of-graph buffers (``prefetch_depth``).

With ``prefetch_depth > 0``, ``sample_transition_batch()`` at the default batch size takes the
next batch of a :class:`memoire.feed.Feed`; Dopamine's WrappedReplayBuffer (TF agents) calls it
through tf.numpy_function, so the agents train from the feed. Distributions are compared with
chi-square tests on fixed seeds (deterministic with one sampler thread and no concurrent adds).
"""

import gc
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from _subprocess_env import HELPERS, assert_clean_exit, run_script, subprocess_env
from _waiting import memoire_threads, wait_until

stats = pytest.importorskip("scipy.stats")
from memoire.dopamine_compat import circular_replay_buffer as crb  # noqa: E402
from memoire.dopamine_compat import prioritized_replay_buffer as prb  # noqa: E402

pytestmark = pytest.mark.dopamine
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
P_MIN = 1e-3  # chi-square p-value below which two samples are called different


def _filled(cls=crb.OutOfGraphReplayBuffer, n=30, *, capacity=40, batch_size=16, **kw):
    """A stack-2 buffer of ``n`` adds whose observation k is all k (slot s holds the
    observation written there: stack_size - 1 padding zeros come first)."""
    buf = cls(
        observation_shape=(2, 2),
        stack_size=2,
        replay_capacity=capacity,
        batch_size=batch_size,
        seed=kw.pop("seed", 5),
        **kw,
    )
    extra = (1.0,) if cls is prb.OutOfGraphPrioritizedReplayBuffer else ()
    for i in range(n):
        buf.add(np.full((2, 2), i % 251, np.uint8), i % 2, float(i), i == 12, *extra)
    return buf


def _counts(index_batches, n):
    return np.bincount(np.concatenate(index_batches).astype(np.int64), minlength=n)


def _same_distribution(a, b):
    table = np.stack([a, b])
    table = table[:, table.sum(axis=0) > 0]
    return stats.chi2_contingency(table)[1]


def _feed_threads():
    return memoire_threads("memoire-feed")


def _check_batch(buf, batch):
    """The batch is the stored transitions of its own indices."""
    indices = batch[7]
    assert buf.is_valid_transitions(indices).all()
    np.testing.assert_array_equal(batch[0][:, 0, 0, -1], buf._store["observation"][indices, 0, 0])
    np.testing.assert_array_equal(batch[1], buf._store["action"][indices])


# ---- distribution ----


def test_uniform_feed_matches_synchronous_distribution():
    sync = _filled(seed=5)
    fed = _filled(seed=5, prefetch_depth=4, prefetch_threads=2)
    inline = [sync.sample_transition_batch()[7].copy() for _ in range(400)]
    drawn = []
    for _ in range(400):
        batch = fed.sample_transition_batch()
        assert isinstance(batch, tuple) and len(batch) == len(fed.get_transition_elements())
        for array, element in zip(batch, fed.get_transition_elements()):
            assert array.shape == element.shape and array.dtype == np.dtype(element.type)
        _check_batch(fed, batch)
        drawn.append(batch[7].copy())
    assert fed._feed is not None and fed._feed.depth == 4 and fed._feed.threads == 2
    a, b = _counts(drawn, 40), _counts(inline, 40)
    assert a.sum() == b.sum() == 400 * 16
    assert _same_distribution(a, b) > P_MIN
    valid = np.flatnonzero(sync.is_valid_transitions(np.arange(40)))
    assert set(np.flatnonzero(a)) == set(valid)
    assert stats.chisquare(a[valid])[1] > P_MIN  # and uniform over the valid slots
    assert fed.sample_count == 400 * 16
    fed.stop_prefetch()


def test_default_is_synchronous_and_explicit_indices_or_sizes_bypass_the_feed():
    sync = _filled(seed=9)
    same = _filled(seed=9)
    # prefetch_depth 0: the same seed gives the same batches (the synchronous order, Dopamine's draws).
    for _ in range(5):
        for x, y in zip(sync.sample_transition_batch(), same.sample_transition_batch()):
            np.testing.assert_array_equal(x, y)
    assert "_feed" not in sync.__dict__
    fed = _filled(seed=9, prefetch_depth=2)
    batch = fed.sample_transition_batch(indices=[3, 4, 5] + [6] * 13)
    np.testing.assert_array_equal(batch[7][:3], [3, 4, 5])
    assert fed.sample_transition_batch(batch_size=5)[0].shape[0] == 5
    assert "_feed" not in fed.__dict__  # neither started the feed
    assert fed.sample_transition_batch(batch_size=16)[0].shape[0] == 16
    assert fed._feed.taken == 1


def test_prioritized_feed_draws_in_proportion_and_returns_the_batch_priorities():
    buf = _filled(prb.OutOfGraphPrioritizedReplayBuffer, seed=3, prefetch_depth=3)
    valid = np.flatnonzero(buf.is_valid_transitions(np.arange(40)))
    priorities = np.zeros(40)
    priorities[valid] = np.arange(1, len(valid) + 1)
    buf.set_priority(np.arange(40, dtype=np.int32), priorities)
    drawn, probs = [], []
    for _ in range(300):
        batch = buf.sample_transition_batch()
        _check_batch(buf, batch)
        drawn.append(batch[7].copy())
        probs.append(batch[-1].copy())
    a = _counts(drawn, 40)
    expected = priorities[valid] / priorities.sum()
    assert stats.chisquare(a[valid], expected * a.sum())[1] > P_MIN
    assert a[priorities == 0].sum() == 0
    # sampling_probabilities are the drawn slots' priorities (as Dopamine's, float32).
    np.testing.assert_array_equal(
        np.concatenate(probs), priorities[np.concatenate(drawn)].astype(np.float32)
    )


def test_priority_updates_land_within_depth_batches():
    depth = 3
    buf = _filled(prb.OutOfGraphPrioritizedReplayBuffer, seed=2, prefetch_depth=depth)
    for _ in range(5):
        buf.sample_transition_batch()
    target = int(buf.sample_transition_batch()[7][0])
    buf.set_priority(np.array([target], np.int32), np.array([0.0]))
    later = [buf.sample_transition_batch()[7].copy() for _ in range(depth + 200)]
    assert not any((k == target).any() for k in later[depth:])
    # The other way: a dominant priority dominates once the stale batches are out.
    other = next(int(i) for i in later[-1] if i != target)
    buf.set_priority(np.array([other], np.int32), np.array([1e6]))
    later = [buf.sample_transition_batch()[7].copy() for _ in range(depth + 20)]
    assert all((k == other).mean() > 0.9 for k in later[depth:])


# ---- contents change: load, add_count, seed ----


def test_load_picks_up_the_checkpoints_contents(tmp_path):
    src = _filled(n=30, seed=1)
    src.save(str(tmp_path), 0)
    buf = crb.OutOfGraphReplayBuffer(
        observation_shape=(2, 2),
        stack_size=2,
        replay_capacity=40,
        batch_size=16,
        seed=1,
        prefetch_depth=4,
    )
    for _ in range(30):
        buf.add(np.full((2, 2), 200, np.uint8), 1, 0.0, False)
    assert (buf.sample_transition_batch()[0][..., -1] == 200).all()
    old = buf._feed
    buf.load(str(tmp_path), 0)
    assert old._closed and "_feed" not in buf.__dict__
    for _ in range(20):  # no batch from before the load
        batch = buf.sample_transition_batch()
        assert (batch[0][..., -1] < 30).all()
        _check_batch(buf, batch)
    # Saving with a feed running works too, and writes the same contents.
    buf.save(str(tmp_path), 1)
    again = _filled(n=0, seed=1)
    again.load(str(tmp_path), 1)
    np.testing.assert_array_equal(again._store["observation"], src._store["observation"])


def test_seed_restarts_a_single_thread_feed_deterministically():
    buf = _filled(seed=0, prefetch_depth=3)
    buf.sample_transition_batch()
    buf.seed(42)
    first = [buf.sample_transition_batch()[7].copy() for _ in range(10)]
    buf.seed(42)
    second = [buf.sample_transition_batch()[7].copy() for _ in range(10)]
    np.testing.assert_array_equal(first, second)


# ---- errors ----


def test_sampling_an_empty_buffer_raises_dopamines_error_then_feeds_once_filled():
    sync = _filled(n=1, seed=0)
    fed = _filled(n=1, seed=0, prefetch_depth=2)
    with pytest.raises(RuntimeError) as expected:
        sync.sample_transition_batch()
    with pytest.raises(RuntimeError) as got:
        fed.sample_transition_batch()
    assert str(got.value) == str(expected.value)
    assert "Cannot sample a batch" in str(got.value)
    for i in range(1, 30):
        fed.add(np.full((2, 2), i, np.uint8), 0, 0.0, False)
    for _ in range(2):  # at most depth errors drawn before the adds
        try:
            fed.sample_transition_batch()
            break
        except RuntimeError:
            pass
    _check_batch(fed, fed.sample_transition_batch())


def test_all_priorities_zero_raises_the_synchronous_error():
    buf = _filled(prb.OutOfGraphPrioritizedReplayBuffer, seed=0, prefetch_depth=2)
    sync = _filled(prb.OutOfGraphPrioritizedReplayBuffer, seed=0)
    for b in (buf, sync):
        b.set_priority(np.arange(40, dtype=np.int32), np.zeros(40))
    with pytest.raises(Exception) as expected:
        sync.sample_transition_batch()
    with pytest.raises(type(expected.value), match=str(expected.value)):
        buf.sample_transition_batch()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(prefetch_depth=-1), "prefetch_depth"),
        (dict(prefetch_depth=1.5), "prefetch_depth"),
        (dict(prefetch_depth=True), "prefetch_depth"),
        (dict(prefetch_depth=2, prefetch_threads=3), "prefetch_threads"),
        (dict(prefetch_depth=2, prefetch_threads=0), "prefetch_threads"),
    ],
)
def test_bad_prefetch_settings_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _filled(n=0, **kwargs)


def test_a_subclass_drawing_its_own_indices_refuses_the_feed():
    class OwnIndices(crb.OutOfGraphReplayBuffer):
        def sample_index_batch(self, batch_size):
            return [5] * batch_size

    with pytest.raises(ValueError, match="sample_index_batch"):
        _filled(OwnIndices, n=0, prefetch_depth=2)
    assert _filled(OwnIndices, n=30).sample_transition_batch()[7].tolist() == [5] * 16


# ---- shutdown ----


def test_stop_prefetch_and_garbage_collection_stop_the_sampler_threads():
    # Counts the feed's own threads (named memoire-feed), not the process's: other threads
    # come and go. stop_prefetch joins them, but a joined thread stays listed in /proc for a
    # moment after the join returns (this test once counted one too many): wait for the count.
    gc.collect()  # feeds of earlier tests' buffers
    wait_until(lambda: _feed_threads() == 0, "earlier tests' feed threads to exit")
    buf = _filled(seed=0, prefetch_depth=4, prefetch_threads=3)
    kept = buf.sample_transition_batch()
    assert _feed_threads() == 3
    buf.stop_prefetch()
    wait_until(lambda: _feed_threads() == 0, "stop_prefetch's joined threads to leave /proc")
    copy = [np.array(a) for a in kept]
    for a, c in zip(kept, copy):  # a batch handed out stays valid
        np.testing.assert_array_equal(a, c)
    buf.sample_transition_batch()  # the next default sample starts a new feed
    assert _feed_threads() == 3
    del buf, kept
    gc.collect()  # the buffer and its feed reference each other
    wait_until(lambda: _feed_threads() == 0, "the collected feed's threads to exit")


def test_interpreter_exit_with_a_running_feed_is_clean(tmp_path):
    script = textwrap.dedent("""
        import numpy as np
        from memoire.dopamine_compat import prioritized_replay_buffer as prb
        buf = prb.OutOfGraphPrioritizedReplayBuffer(
            observation_shape=(3,), stack_size=1, replay_capacity=100, batch_size=8,
            prefetch_depth=4, prefetch_threads=2)
        for i in range(50):
            buf.add(np.zeros(3, np.uint8), 0, 0.0, False, 1.0)
        held = [buf.sample_transition_batch() for _ in range(3)]
        print("OK", flush=True)
    """)
    assert_clean_exit(run_script(script, tmp_path))


# ---- gin and Dopamine's TF agents ----


def _run_agent(gin_file, steps):
    env = dict(subprocess_env(HELPERS), TF_CPP_MIN_LOG_LEVEL="3")
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "tests", "helpers", "_tf_agent_run.py"),
            os.path.join(ROOT, "configs", gin_file),
            str(steps),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.slow
@pytest.mark.parametrize("gin_file", ["dqn_cartpole_tf_feed.gin", "rainbow_cartpole_tf_feed.gin"])
def test_tf_agent_trains_from_the_feed_with_one_gin_line(gin_file):
    pytest.importorskip("dopamine.tf.agents.dqn.dqn_agent")
    pytest.importorskip("gym")
    r = _run_agent(gin_file, 900)
    # min_replay_history 500, a train op every 4 steps: ~100 in-graph samples, each one batch
    # taken from the feed (the last sess.run of the transition is one more).
    assert r["feed"] == {"depth": 4, "threads": 1}
    assert r["feed_taken"] >= 90
    assert r["sample_count"] == 128 * r["feed_taken"]
    assert r["batch_shapes"]["state"] == [128, 4, 1, 1]
    assert r["batch_indices_valid"]
    assert r["weights_changed"]
    assert r["reloaded"] and r["reloaded_add_count"] == r["add_count"]
    if "rainbow" in gin_file:
        assert r["distinct_priorities"] > 10  # tf_set_priority reached the buffer


# ---- remote buffers: sample requests in flight over the network ----


def _served(cls=crb.OutOfGraphReplayBuffer, n=30, **kw):
    """(server, endpoint, the served buffer) on loopback, an OS-chosen port."""
    from memoire.dopamine_compat import buffer_server
    from memoire.server import RpcServer

    buf = _filled(cls, n, **kw)
    server = RpcServer()
    endpoint = server.start("tcp://127.0.0.1:*")
    buffer_server.serve_buffer(server, buf, "replay")
    return server, endpoint, buf


def _prefetch_threads():
    import threading

    return [t for t in threading.enumerate() if t.name == "memoire-remote-prefetch"]


@pytest.mark.parametrize("served_feed", [0, 2])
def test_remote_prefetch_matches_synchronous_distribution(served_feed):
    from memoire.dopamine_compat import remote

    # served_feed: the hosted buffer's own prefetch_depth (its server samples from a feed).
    server, endpoint, buf = _served(seed=4, prefetch_depth=served_feed)
    try:
        sync = remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=10)
        fed = remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=10, prefetch_depth=3)
        inline = [sync.sample_transition_batch()[7].copy() for _ in range(200)]
        drawn = []
        for _ in range(200):
            batch = fed.sample_transition_batch()
            _check_batch(buf, batch)
            drawn.append(batch[7].copy())
        assert fed._prefetcher.taken == 200 and fed._prefetcher.depth == 3
        assert _same_distribution(_counts(drawn, 40), _counts(inline, 40)) > P_MIN
        # Explicit indices and other sizes stay synchronous calls.
        np.testing.assert_array_equal(fed.sample_transition_batch(3, [5, 6, 7])[7], [5, 6, 7])
        assert fed.sample_transition_batch(batch_size=4)[0].shape[0] == 4
        assert fed._prefetcher.taken == 200
        assert len(_prefetch_threads()) == 1
        fed.close()
        sync.close()
        assert not _prefetch_threads()
    finally:
        server.close()


def test_remote_prefetch_priority_updates_land_within_depth():
    from memoire.dopamine_compat import remote

    depth = 3
    server, endpoint, buf = _served(prb.OutOfGraphPrioritizedReplayBuffer, seed=6)
    try:
        rb = remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=10, prefetch_depth=depth)
        target = int(rb.sample_transition_batch()[7][0])
        rb.set_priority(np.array([target], np.int32), np.array([0.0]))
        later = [rb.sample_transition_batch()[7].copy() for _ in range(depth + 60)]
        assert not any((k == target).any() for k in later[depth:])
        other = next(int(i) for i in later[-1] if i != target)
        rb.set_priority(np.array([other], np.int32), np.array([1e6]))
        later = [rb.sample_transition_batch()[7].copy() for _ in range(depth + 10)]
        assert all((k == other).mean() > 0.9 for k in later[depth:])
        rb.close()
    finally:
        server.close()


def test_remote_prefetch_errors_reach_the_caller_and_load_drops_requested_batches(tmp_path):
    from memoire.dopamine_compat import buffer_server, remote
    from memoire.server import RpcServer

    buf = _filled(n=1, seed=0)
    server = RpcServer()
    endpoint = server.start("tcp://127.0.0.1:*")
    buffer_server.serve_buffer(server, buf, "replay", checkpoint_root=str(tmp_path))
    try:
        sync = remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=10)
        with pytest.raises(RuntimeError) as expected:
            sync.sample_transition_batch()
        sync.close()
        rb = remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=10, prefetch_depth=2)
        with pytest.raises(RuntimeError) as got:
            rb.sample_transition_batch()
        assert str(got.value) == str(expected.value)
        assert "Cannot sample a batch" in str(got.value)
        # A checkpoint of other contents, loaded through the proxy: no batch from before.
        src = _filled(n=30, seed=1)
        src.save(str(tmp_path), 0)
        rb.load(str(tmp_path), 0)
        assert rb._prefetcher is None and not _prefetch_threads()
        for _ in range(5):
            _check_batch(buf, rb.sample_transition_batch())
        rb.close()
        rb.close()  # idempotent
    finally:
        server.close()


def test_remote_prefetch_depth_is_checked_and_gin_configurable():
    gin = pytest.importorskip("gin")
    from memoire.dopamine_compat import gin_registry, remote

    server, endpoint, _ = _served(seed=0)
    try:
        with pytest.raises(ValueError, match="prefetch_depth"):
            remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=10, prefetch_depth=-1)
        gin.clear_config()
        gin.parse_config(
            [
                f"MemoireRemoteOutOfGraphReplayBuffer.endpoint = '{endpoint}'",
                "MemoireRemoteOutOfGraphReplayBuffer.prefetch_depth = 2",
            ]
        )
        rb = gin_registry.MemoireRemoteOutOfGraphReplayBuffer()
        rb.sample_transition_batch()
        assert rb._prefetcher.depth == 2
        rb.close()
    finally:
        gin.clear_config()
        server.close()


def test_remote_prefetch_raises_timeout_when_the_server_goes_silent():
    from memoire.dopamine_compat import remote

    server, endpoint, _ = _served(seed=0)
    rb = remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=0.5, retries=0, prefetch_depth=2)
    try:
        rb.sample_transition_batch()
        server.close()
        with pytest.raises(TimeoutError):
            for _ in range(3):  # at most depth batches were requested before the server left
                rb.sample_transition_batch()
    finally:
        rb.close()
        server.close()
    assert not _prefetch_threads()
