"""Dopamine-compatible buffers on a memoire server: 2 actor processes add through proxies, a
learner-side proxy samples and sets priorities; results equal a local buffer fed the same
stream. Loopback only, OS-chosen ports, bounded waits."""

import multiprocessing as mp

import numpy as np
import pytest

from memoire import ReplayMemoryServer
from memoire.dopamine_compat import buffer_server, remote
from memoire.dopamine_compat.circular_replay_buffer import OutOfGraphReplayBuffer
from memoire.dopamine_compat.prioritized_replay_buffer import OutOfGraphPrioritizedReplayBuffer

CTX = mp.get_context("spawn")
OBS = (5, 3)


def _server():
    t = [
        np.zeros([4], np.uint8),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([0], np.uint8),
    ]
    srv = ReplayMemoryServer(*t, 64, None)
    return srv, srv.start()


def _make(prioritized):
    cls = OutOfGraphPrioritizedReplayBuffer if prioritized else OutOfGraphReplayBuffer
    return cls(OBS, 4, 200, 8, update_horizon=3, gamma=0.9, seed=0)


def _episodes(actor):
    """Deterministic episodes of one actor: (obs, action, reward, terminal, priority) rows."""
    rng = np.random.default_rng(actor)
    out = []
    for e in range(3):
        n = 7 + 3 * e + actor
        rows = [
            (
                rng.integers(0, 255, OBS).astype(np.uint8),
                int(rng.integers(0, 4)),
                float(rng.normal()),
                k == n - 1,
                float(rng.uniform(0.1, 2)),
            )
            for k in range(n)
        ]
        out.append(rows)
    return out


def _actor(endpoint, actor, prioritized, done):
    rb = remote.RemoteOutOfGraphReplayBuffer(endpoint, "replay", flush_rows=5, timeout=20)
    for episode in _episodes(actor):
        for obs, a, r, t, p in episode:
            if prioritized:
                rb.add(obs, a, r, t, priority=p)
            else:
                rb.add(obs, a, r, t)
    rb.close()
    done.set()


def _feed_local(buffer, order, prioritized):
    for actor in order:
        for episode in _episodes(actor):
            for obs, a, r, t, p in episode:
                if prioritized:
                    buffer.add(obs, a, r, t, priority=p)
                else:
                    buffer.add(obs, a, r, t)


def _run_actor(endpoint, actor, prioritized):
    done = CTX.Event()
    p = CTX.Process(target=_actor, args=(endpoint, actor, prioritized, done))
    p.start()
    assert done.wait(60), "actor did not finish"
    p.join(10)
    assert p.exitcode == 0


@pytest.mark.slow
@pytest.mark.parametrize("prioritized", [False, True])
def test_two_actors_then_learner_matches_local(prioritized):
    srv, ep = _server()
    try:
        served = _make(prioritized)
        buffer_server.serve_buffer(srv, served, "replay")
        # Two actor processes, one after the other, so the stream order is known.
        _run_actor(ep["rep"], 0, prioritized)
        _run_actor(ep["rep"], 1, prioritized)
        local = _make(prioritized)
        _feed_local(local, (0, 1), prioritized)
        rb = remote.RemoteOutOfGraphReplayBuffer(ep["rep"], "replay", timeout=10)
        assert int(rb.add_count) == int(local.add_count) > 0
        assert isinstance(rb.add_count, np.ndarray)
        # The served buffer's arguments (public), and Dopamine's attributes made of them.
        assert rb.arguments() == local.arguments()
        for name in (
            "observation_shape",
            "stack_size",
            "replay_capacity",
            "batch_size",
            "update_horizon",
            "gamma",
            "observation_dtype",
            "extra_storage_types",
            "state_shape",
        ):
            assert getattr(rb, "_" + name) == getattr(local, "_" + name), name
        np.testing.assert_array_equal(
            rb._cumulative_discount_vector, local._cumulative_discount_vector
        )
        assert rb.cursor() == local.cursor() and rb.is_full() == local.is_full()
        assert rb.is_empty() == local.is_empty()
        assert rb.episode_end_indices == local.episode_end_indices
        np.testing.assert_array_equal(rb.invalid_range, local.invalid_range)
        valid = [i for i in range(200) if local.is_valid_transition(i)]
        assert [rb.is_valid_transition(i) for i in range(200)] == [
            local.is_valid_transition(i) for i in range(200)
        ]
        idx = valid[:8]
        got = rb.sample_transition_batch(8, idx)
        want = local.sample_transition_batch(8, idx)
        assert len(got) == len(want)
        for g, w, e in zip(got, want, rb.get_transition_elements(8)):
            assert g.dtype == w.dtype and g.shape == w.shape == tuple(e.shape), e.name
            np.testing.assert_array_equal(g, w, err_msg=e.name)
        sampled = rb.sample_transition_batch()
        assert sampled[0].shape == (8,) + OBS + (4,)
        assert all(local.is_valid_transition(int(i)) for i in sampled[7])
        if prioritized:
            np.testing.assert_allclose(
                rb.get_priority(np.array(idx, np.int32)),
                local.get_priority(np.array(idx, np.int32)),
            )
            rb.set_priority(np.array(idx[:3], np.int32), np.array([5.0, 6.0, 7.0]))
            np.testing.assert_allclose(
                served.get_priority(np.array(idx[:3], np.int32)), [5.0, 6.0, 7.0]
            )
            assert rb.sum_tree.max_recorded_priority == served.sum_tree.max_recorded_priority
        rb.close()
    finally:
        srv.close()


def test_concurrent_actors_all_rows_arrive():
    srv, ep = _server()
    try:
        served = _make(False)
        buffer_server.serve_buffer(srv, served, "replay")
        dones = [CTX.Event() for _ in range(2)]
        procs = [
            CTX.Process(target=_actor, args=(ep["rep"], a, False, d)) for a, d in enumerate(dones)
        ]
        for p in procs:
            p.start()
        for d in dones:
            assert d.wait(60)
        for p in procs:
            p.join(10)
        local = _make(False)
        _feed_local(local, (0, 1), False)
        rb = remote.RemoteOutOfGraphReplayBuffer(ep["rep"], "replay", timeout=10)
        assert int(rb.add_count) == int(local.add_count)
        assert len(rb.episode_end_indices) == 6
        rb.close()
    finally:
        srv.close()


def test_bad_calls_raise_as_local():
    srv, ep = _server()
    try:
        buffer_server.serve_buffer(srv, _make(True), "replay")
        local = _make(True)
        rb = remote.RemoteOutOfGraphReplayBuffer(ep["rep"], "replay", timeout=10)
        obs = np.zeros(OBS, np.uint8)
        for call in (
            lambda b: b.add(np.zeros((2, 2), np.uint8), 0, 0.0, False, priority=1.0),
            lambda b: b.add(obs, 0, 0.0, False, 7, priority=1.0),
            lambda b: b.sample_transition_batch(8),
        ):
            with pytest.raises(Exception) as want:
                call(local)
            with pytest.raises(want.type):
                call(rb)
        assert int(rb.add_count) == 0  # nothing was added by the failed calls
        for k in range(12):
            rb.add(obs, 0, 0.0, k == 11, priority=1.0)
            local.add(obs, 0, 0.0, k == 11, priority=1.0)
        with pytest.raises(AssertionError):
            local.sample_transition_batch(8, [4, 5])
        with pytest.raises(AssertionError):
            rb.sample_transition_batch(8, [4, 5])
        rb.close()
    finally:
        srv.close()


@pytest.mark.dopamine
def test_serve_rejects_unknown_objects():
    srv, _ = _server()
    try:
        with pytest.raises(TypeError):
            buffer_server.serve_buffer(srv, object(), "x")
    finally:
        srv.close()


@pytest.mark.dopamine
def test_jax_buffer_remote_prefetch_batches_match_their_keys_and_updates_land():
    import threading

    from dopamine.jax.replay_memory import elements

    from memoire.dopamine_compat import jax_replay_buffer as jrb

    def threads():
        return [t for t in threading.enumerate() if t.name == "memoire-remote-prefetch"]

    def make():
        return jrb.ReplayBuffer(
            jrb.TransitionAccumulator(2, 1, 0.9),
            jrb.PrioritizedSamplingDistribution(seed=0, max_capacity=100),
            batch_size=8,
            max_capacity=100,
        )

    depth = 3
    srv, ep = _server()
    try:
        served, local = make(), make()
        buffer_server.serve_buffer(srv, served, "jax")
        with pytest.raises(ValueError, match="prefetch_depth"):
            remote.RemoteReplayBuffer(ep["rep"], "jax", prefetch_depth=-1)
        rb = remote.RemoteReplayBuffer(ep["rep"], "jax", timeout=10, prefetch_depth=depth)
        rng = np.random.default_rng(5)
        for k in range(40):
            t = elements.TransitionElement(
                rng.integers(0, 9, (3, 2)).astype(np.uint8), k % 3, float(k), k % 10 == 9, False
            )
            rb.add(t, priority=1.0)
            local.add(t, priority=1.0)
        assert not threads()  # started by the first default-size sample
        for _ in range(5):  # each prefetched batch is the one its keys name
            batch, meta = rb.sample(with_sample_metadata=True)
            want = local.get_elements(np.asarray(meta.keys))
            np.testing.assert_array_equal(np.asarray(batch.state), np.asarray(want.state))
            np.testing.assert_array_equal(np.asarray(batch.reward), np.asarray(want.reward))
        assert len(threads()) == 1
        assert isinstance(rb.sample(), elements.ReplayElement)
        assert rb.sample(size=3).state.shape[0] == 3  # another size: a synchronous call
        target = int(np.asarray(meta.keys)[0])
        others = np.setdiff1d(np.arange(len(served)), [target])
        rb.update(np.array([target]), priorities=np.array([0.0]))
        later = [np.asarray(rb.sample(with_sample_metadata=True)[1].keys) for _ in range(40)]
        assert not any(target in k for k in later[depth:])
        assert np.isin(np.concatenate(later[depth:]), others).all()
        rb.close()
        assert not threads()
    finally:
        srv.close()


@pytest.mark.dopamine
def test_jax_buffer_remote_matches_local():
    from dopamine.jax.replay_memory import elements

    from memoire.dopamine_compat import jax_replay_buffer as jrb

    def make():
        return jrb.ReplayBuffer(
            jrb.TransitionAccumulator(2, 2, 0.9),
            jrb.PrioritizedSamplingDistribution(seed=0, max_capacity=100),
            batch_size=4,
            max_capacity=100,
        )

    srv, ep = _server()
    try:
        served, local = make(), make()
        buffer_server.serve_buffer(srv, served, "jax")
        rb = remote.RemoteReplayBuffer(ep["rep"], "jax", flush_rows=4, timeout=10)
        rng = np.random.default_rng(3)
        for k in range(30):
            t = elements.TransitionElement(
                rng.integers(0, 9, (3, 2)).astype(np.uint8), k % 3, float(k), k % 10 == 9, False
            )
            rb.add(t, priority=float(k % 4 + 1))
            local.add(t, priority=float(k % 4 + 1))
        assert rb.add_count == local.add_count and len(rb) == len(local)
        with pytest.raises(TypeError):
            rb.add(t)
        batch = rb.sample()
        assert isinstance(batch, elements.ReplayElement)
        assert batch.state.shape == (4, 3, 2, 2) and batch.state.dtype == np.uint8
        batch, meta = rb.sample(with_sample_metadata=True)
        keys = np.asarray(meta.keys)
        want = local.get_elements(keys)
        np.testing.assert_array_equal(np.asarray(batch.state), np.asarray(want.state))
        np.testing.assert_array_equal(np.asarray(batch.reward), np.asarray(want.reward))
        rb.update(keys, priorities=np.full(len(keys), 9.0))
        assert rb.max_recorded_priority == served.max_recorded_priority
        rb.close()
    finally:
        srv.close()


def test_remote_buffers_answer_priorities_as_the_served_buffer_does():
    """A tracker's probe reads priorities through a proxy (one ``priorities`` call): those of
    the served TF and JAX prioritized buffers, None for uniform ones, so TensorBoard shows
    priorities for remote runs too."""
    elements = pytest.importorskip("dopamine.jax.replay_memory.elements")

    from memoire.dopamine_compat import jax_replay_buffer as jrb
    from memoire.experiments.trackers import ReplayProbe

    def jax_buffer(prioritized):
        dist = (
            jrb.PrioritizedSamplingDistribution(seed=0, max_capacity=50)
            if prioritized
            else jrb.UniformSamplingDistribution(seed=0)
        )
        return jrb.ReplayBuffer(
            jrb.TransitionAccumulator(1, 1, 0.9), dist, batch_size=4, max_capacity=50
        )

    def probe(memory):
        return ReplayProbe(type("Agent", (), {"_replay": memory})()).priorities()

    srv, ep = _server()
    proxies = []
    try:
        for prioritized in (False, True):
            served = _make(prioritized)
            buffer_server.serve_buffer(srv, served, f"tf{prioritized}")
            rb = remote.RemoteOutOfGraphReplayBuffer(ep["rep"], f"tf{prioritized}", timeout=10)
            proxies.append(rb)
            for obs, a, r, t, p in _episodes(0)[0]:
                rb.add(obs, a, r, t, **({"priority": p} if prioritized else {}))
            if prioritized:
                rb.set_priority(np.array([3, 5], np.int32), np.array([7.0, 0.25]))
                got = probe(rb)
                np.testing.assert_array_equal(got, served.stored_priorities())
                assert got.shape == (min(int(served.add_count), 200),) and got[5] == 0.25
            else:
                assert probe(rb) is None

            served = jax_buffer(prioritized)
            buffer_server.serve_buffer(srv, served, f"jax{prioritized}")
            rb = remote.RemoteReplayBuffer(ep["rep"], f"jax{prioritized}", timeout=10)
            proxies.append(rb)
            for k in range(12):
                t = elements.TransitionElement(np.full((2,), k, np.uint8), 0, 1.0, k == 11)
                rb.add(t, **({"priority": float(k % 3 + 1)} if prioritized else {}))
            if prioritized:
                rb.update(np.array([2, 4]), priorities=np.array([9.0, 0.5]))
                got = probe(rb)
                np.testing.assert_array_equal(got, served.priorities(served.keys()))
                assert len(got) == len(served) and got[2] == 9.0 and got[4] == 0.5
            else:
                assert probe(rb) is None
    finally:
        for rb in proxies:
            rb.close()
        srv.close()
