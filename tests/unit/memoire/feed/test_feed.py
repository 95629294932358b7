"""memoire.feed.Feed: the prefetching feed over the JAX and TF faces and ReplayMemory (CPU).

Distributions are checked with chi-square tests on fixed seeds (deterministic, so never flaky):
the feed draws with the core's generator, the synchronous path with numpy's, so the streams
differ and only the distributions can agree.
"""

import os
import textwrap

import numpy as np
import pytest
from _feed_buffers import dopamine, jax_buffer
from _subprocess_env import assert_clean_exit, run_script

from memoire import ReplayMemory
from memoire.bench.memory import proc_status
from memoire.feed import Feed

try:  # the Dopamine faces (and scipy, which JAX brings); a core-only install has neither
    import scipy.stats as stats

    from memoire.dopamine_compat import circular_replay_buffer as crb
    from memoire.dopamine_compat import jax_replay_buffer as jrb
except ImportError:
    stats = crb = jrb = None


P_MIN = 1e-3  # chi-square p-value below which two samples are called different


def _counts(keys, n):
    return np.bincount(np.concatenate(keys).astype(np.int64), minlength=n)


def _same_distribution(a, b):
    table = np.stack([a, b])
    table = table[:, table.sum(axis=0) > 0]
    return stats.chi2_contingency(table)[1]


# ---- distribution ----


@dopamine
def test_uniform_jax_feed_matches_inline_distribution():
    buf = jax_buffer(20)
    inline = [buf.sample(with_sample_metadata=True)[1].keys for _ in range(400)]
    with Feed(buf, depth=4, threads=2, seed=1, with_sample_metadata=True) as feed:
        fed = []
        for _ in range(400):
            batch, meta = next(feed)
            # The batch is the elements of its keys: observation of key k is all k.
            np.testing.assert_array_equal(batch.state[:, 0, 0, 0], meta.keys)
            np.testing.assert_array_equal(batch.reward, meta.keys.astype(np.float64))
            fed.append(meta.keys.copy())
    a, b = _counts(fed, 20), _counts(inline, 20)
    assert a.sum() == b.sum() == 400 * 32
    assert _same_distribution(a, b) > P_MIN
    assert stats.chisquare(a)[1] > P_MIN  # and uniform


@dopamine
def test_prioritized_jax_feed_draws_in_proportion_to_priorities():
    buf = jax_buffer(16, prioritized=True)
    priorities = np.arange(1, 17, dtype=np.float64)
    buf.update(np.arange(16), priorities=priorities)
    inline = [buf.sample(with_sample_metadata=True)[1].keys for _ in range(300)]
    with Feed(buf, seed=3, with_sample_metadata=True) as feed:
        fed, probs = [], []
        for _ in range(300):
            _, meta = next(feed)
            fed.append(meta.keys.copy())
            probs.append(meta.probabilities.copy())
    a = _counts(fed, 16)
    expected = priorities / priorities.sum()
    assert stats.chisquare(a, expected * a.sum())[1] > P_MIN
    assert _same_distribution(a, _counts(inline, 16)) > P_MIN
    # Probabilities are the keys' leaf / total, as the synchronous metadata.
    np.testing.assert_allclose(np.concatenate(probs), expected[np.concatenate(fed)])


@dopamine
def test_tf_face_feed_matches_inline_distribution():
    buf = crb.OutOfGraphReplayBuffer(
        observation_shape=(2, 2), stack_size=2, replay_capacity=40, batch_size=16, seed=5
    )
    for i in range(30):
        buf.add(np.full((2, 2), i, np.uint8), i % 2, float(i), i == 12)
    inline = [buf.sample_transition_batch()[7].copy() for _ in range(400)]
    with Feed(buf, depth=3) as feed:
        fed = []
        for _ in range(400):
            batch = next(feed)
            assert len(batch) == len(buf.get_transition_elements())
            fed.append(batch[7].copy())
            assert buf.is_valid_transitions(batch[7]).all()
    assert _same_distribution(_counts(fed, 40), _counts(inline, 40)) > P_MIN


@dopamine
def test_single_thread_feed_is_deterministic_and_device_batches_match_host():
    jax = pytest.importorskip("jax")
    buf = jax_buffer(50)
    with Feed(buf, threads=1, seed=11) as host, Feed(buf, threads=1, seed=11, device="jax") as dev:
        for _ in range(20):
            h, d = next(host), next(dev)
            assert isinstance(d.state, jax.Array)
            np.testing.assert_array_equal(np.asarray(d.state), h.state)
            np.testing.assert_array_equal(np.asarray(d.action), h.action)


@dopamine
def test_batches_stay_consistent_while_another_thread_adds_and_evicts():
    """Each batch is drawn and gathered under one lock: with adds (and evictions, capacity 300)
    running in another thread, every element is still the one its key names."""
    import threading

    buf = jax_buffer(50, capacity=300)

    def adder():
        for i in range(51, 3000):
            buf.add(
                jrb.TransitionElement(
                    np.full((4, 4), i % 251, np.uint8), i % 3, float(i), False, False
                )
            )

    t = threading.Thread(target=adder)
    with Feed(buf, depth=4, threads=2, seed=4, with_sample_metadata=True) as feed:
        t.start()
        try:
            for _ in range(500):
                batch, meta = next(feed)
                np.testing.assert_array_equal(batch.state[:, 0, 0, 0], meta.keys % 251)
                np.testing.assert_array_equal(batch.next_state[:, 0, 0, 0], (meta.keys + 1) % 251)
                np.testing.assert_array_equal(batch.reward, meta.keys.astype(np.float64))
        finally:
            t.join()
    assert len(buf) == 300


@dopamine
@pytest.mark.parametrize("prioritized", [False, True])
def test_sampler_threads_gather_in_parallel_what_the_serial_gather_gives(prioritized):
    """The JAX face's sampler threads draw and gather under a shared hold of the store's lock,
    at the same time: with 4 threads on a stack-4 buffer of 21 x 17 frames, every batch equals
    the serial gather (``get_elements``) of the keys it drew, and thread t draws what a
    1-thread feed seeded ``seed + t`` draws (each batch is among their first draws)."""
    buf = jax_buffer(400, stack=4, obs_shape=(21, 17), episode=37, prioritized=prioritized)
    fields = ("state", "action", "reward", "next_state", "is_terminal", "episode_end")
    keys_seen = set()
    with Feed(buf, 64, depth=8, threads=4, seed=3, with_sample_metadata=True) as feed:
        for _ in range(200):
            batch, meta = next(feed)
            ref = buf.get_elements(meta.keys)
            for f in fields:
                np.testing.assert_array_equal(getattr(batch, f), getattr(ref, f), err_msg=f)
            keys_seen.add(tuple(meta.keys))
    serial = set()
    for t in range(4):  # none of the 4 threads drew more than the 200 taken + 8 in the ring
        with Feed(buf, 64, depth=1, threads=1, seed=3 + t, with_sample_metadata=True) as one:
            serial.update(tuple(next(one)[1].keys) for _ in range(208))
    assert keys_seen <= serial


# ---- prioritized updates land ----


@dopamine
def test_priority_updates_reach_batches_within_depth():
    depth = 3
    buf = jax_buffer(30, prioritized=True)
    with Feed(buf, depth=depth, seed=2, with_sample_metadata=True) as feed:
        for _ in range(5):
            next(feed)
        buf.update(np.array([5]), priorities=np.array([0.0]))
        later = [next(feed)[1].keys.copy() for _ in range(depth + 200)]
        assert not any((k == 5).any() for k in later[depth:])
        # And the other way: a large priority dominates once the stale batches are out.
        buf.update(np.array([7]), priorities=np.array([1e6]))
        later = [next(feed)[1].keys.copy() for _ in range(depth + 20)]
        assert all((k == 7).mean() > 0.9 for k in later[depth:])


@dopamine
def test_priority_updates_reach_device_batches_within_depth_plus_device_slots():
    pytest.importorskip("jax")
    depth = 2
    buf = jax_buffer(30, prioritized=True)
    with Feed(buf, depth=depth, seed=2, device="jax", with_sample_metadata=True) as feed:
        next(feed)
        bound = depth + feed.device_slots
        buf.update(np.array([9]), priorities=np.array([0.0]))
        later = [np.asarray(next(feed)[1].keys).copy() for _ in range(bound + 100)]
        assert not any((k == 9).any() for k in later[bound:])


# ---- errors ----


@dopamine
def test_empty_jax_buffer_raises_the_synchronous_error():
    acc = jrb.TransitionAccumulator(stack_size=1, update_horizon=1, gamma=0.99)
    buf = jrb.ReplayBuffer(
        acc, jrb.UniformSamplingDistribution(seed=0), batch_size=4, max_capacity=10
    )
    with pytest.raises(ValueError) as sync:
        buf.sample()
    with Feed(buf) as feed:
        with pytest.raises(ValueError) as fed:  # no store yet
            next(feed)
        assert str(fed.value) == str(sync.value)
        _ = [buf.add(jrb.TransitionElement(np.zeros(1), 0, 0.0, False, False)) for _ in range(3)]
        assert next(feed).state.shape == (4, 1, 1)
        buf.clear()
        # Batches drawn before the clear may still come (at most depth), then the error.
        with pytest.raises(ValueError, match="No samples in replay buffer!"):
            for _ in range(feed.depth + 1):
                next(feed)
        # The feed goes on: a refilled buffer feeds again (after at most depth stale errors).
        _ = [buf.add(jrb.TransitionElement(np.ones(1), 0, 0.0, False, False)) for _ in range(3)]
        for _ in range(feed.depth):
            try:
                batch = next(feed)
                break
            except ValueError:
                pass
        else:
            batch = next(feed)
        np.testing.assert_array_equal(batch.state, np.ones((4, 1, 1)))


@dopamine
def test_tf_face_feed_raises_dopamines_error():
    buf = crb.OutOfGraphReplayBuffer(
        observation_shape=(2,), stack_size=4, replay_capacity=40, batch_size=8, seed=0
    )
    buf.add(np.zeros(2, np.uint8), 0, 0.0, False)
    with pytest.raises(RuntimeError) as sync:
        buf.sample_transition_batch()
    with Feed(buf) as feed, pytest.raises(RuntimeError) as fed:
        next(feed)
    assert str(fed.value) == str(sync.value)
    assert "Cannot sample a batch" in str(fed.value)


@dopamine
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(depth=0), "depth"),
        (dict(depth=2, threads=3), "threads"),
        (dict(threads=0), "threads"),
        (dict(batch_size=0), "batch_size"),
        (dict(seed=-1), "seed"),
        (dict(device="gpu"), "device"),
    ],
)
def test_bad_settings_raise_value_error(kwargs, match):
    buf = jax_buffer(4)
    with pytest.raises(ValueError, match=match):
        Feed(buf, **kwargs)


def test_unknown_buffer_raises_type_error():
    with pytest.raises(TypeError, match="buffer"):
        Feed(object(), 4)


# ---- lifetime ----


@dopamine
def test_batches_stay_valid_after_close_and_take_after_close_raises():
    buf = jax_buffer(10)
    feed = Feed(buf, depth=2, seed=0)
    held = [next(feed), next(feed)]
    copies = [np.array(b.state) for b in held]
    feed.close()
    feed.close()  # idempotent
    for b, c in zip(held, copies):
        np.testing.assert_array_equal(b.state, c)
    with pytest.raises(RuntimeError, match="closed"):
        next(feed)


@dopamine
def test_holding_every_slot_raises_instead_of_hanging():
    buf = jax_buffer(10)
    with Feed(buf, depth=2) as feed:
        held = [next(feed), next(feed)]
        with pytest.raises(RuntimeError, match="held"):
            next(feed)
        del held
        assert next(feed).state.shape[0] == 32  # released slots feed again


@pytest.mark.slow
@dopamine
def test_interpreter_exit_with_open_feeds_and_batches_outstanding_is_clean(tmp_path):
    script = textwrap.dedent("""
        import numpy as np
        from memoire.dopamine_compat import jax_replay_buffer as jrb
        from memoire.feed import Feed
        acc = jrb.TransitionAccumulator(stack_size=1, update_horizon=1, gamma=0.99)
        buf = jrb.ReplayBuffer(acc, jrb.UniformSamplingDistribution(seed=0), batch_size=8,
                               max_capacity=100)
        for i in range(20):
            buf.add(jrb.TransitionElement(np.zeros(3), 0, 0.0, False, False))
        feeds = [Feed(buf, depth=4, threads=t) for t in (1, 2, 4)]
        held = [next(f) for f in feeds for _ in range(2)]
        cycle = [Feed(buf, depth=3, threads=3)]
        cycle.append(cycle)  # unreachable only through the garbage collector
        next(cycle[0])
        jax_feed = Feed(buf, device="jax")
        kept = next(jax_feed)
        print("OK", flush=True)
    """)
    assert_clean_exit(run_script(script, tmp_path))


@dopamine
def test_many_thousand_batches_do_not_grow_memory():
    buf = jax_buffer(200, obs_shape=(16, 16))
    with Feed(buf, depth=4, threads=2, with_sample_metadata=True) as feed:
        for _ in range(2000):
            next(feed)
        before = proc_status("VmRSS")
        for _ in range(20000):
            batch, meta = next(feed)
        after = proc_status("VmRSS")
        assert feed.taken == 22000
    # A leak of one batch's arrays (8 KiB of state) per take would be 160 MB here.
    assert after - before < 8 * 2**20, (before, after)


# ---- the Dopamine agents ----


@pytest.mark.slow
@dopamine
def test_jax_agent_trains_from_the_feed_with_gin(tmp_path):
    gin = pytest.importorskip("gin")
    from memoire.dopamine_compat import jax_agents
    from memoire.experiments import runner as runner_lib

    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
    gin.clear_config()
    runner_lib.load_gin(
        [os.path.join(root, "configs", "dqn_cartpole_jax_feed.gin")],
        [
            "Runner.num_iterations = 1",
            "Runner.training_steps = 300",
            "Runner.evaluation_steps = 20",
            "ReplayBuffer.max_capacity = 1000",
            "ReplayBuffer.batch_size = 32",
            "JaxDQNAgent.min_replay_history = 100",
            "JaxDQNAgent.seed = 7",
        ],
    )
    try:
        runner = runner_lib.create_runner(
            str(tmp_path), create_agent=jax_agents.create_memoire_agent
        )
        agent = runner._agent
        replay = agent._replay
        assert replay._feed is not None and replay._feed.depth == 4
        runner.run_experiment()
        # Training steps every 4 env steps past min_replay_history, each one batch of 32.
        assert replay._feed.taken >= 40
        assert replay.sample_count == 32 * replay._feed.taken
        # Each step gave its lent batch back once its parameters were ready: no batch had to
        # be deleted to get its slot back.
        assert replay._feed._lender.dropped == 0
    finally:
        gin.clear_config()


@pytest.mark.slow
@dopamine
def test_agent_default_keeps_synchronous_sampling():
    gin = pytest.importorskip("gin")
    from memoire.dopamine_compat import jax_agents

    gin.clear_config()
    with pytest.raises(ValueError, match="prefetch_depth"):
        jax_agents.MemoireJaxDQNAgent(num_actions=2, prefetch_depth=-1)
    gin.parse_config(["ReplayBuffer.batch_size = 8", "ReplayBuffer.max_capacity = 100"])
    try:
        agent = jax_agents.MemoireJaxDQNAgent(
            num_actions=2, observation_shape=(4, 1), stack_size=1, seed=0
        )
        assert agent._replay._feed is None
        fed = jax_agents.MemoireJaxDQNAgent(
            num_actions=2,
            observation_shape=(4, 1),
            stack_size=1,
            seed=0,
            prefetch_depth=2,
            prefetch_to_device=False,
        )
        assert fed._replay._feed.depth == 2
        fed._replay.stop_feed()
        assert fed._replay._feed is None
    finally:
        gin.clear_config()


# ---- memoire's ReplayMemory (core only) ----


def _memory(weights):
    """A memory with one closed episode of len(weights) + 1 entries; entry k (state [k]) has
    init weight weights[k] (the last entry is never sampleable with multi_step 1)."""
    rem = ReplayMemory(
        np.zeros([1], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([1], np.int64),
        100,
    )
    rem.seed(0)
    n = len(weights) + 1
    pos = np.arange(n, dtype=np.int64)
    rem.new_episode()
    rem.add_entries(
        pos[:, None],
        pos.astype(np.float32),
        np.ones(n, np.float32),
        np.zeros(n, np.float32),
        np.zeros(n, np.float32),
        pos[:, None],
        np.append(np.asarray(weights, np.float32), 1).astype(np.float32),
    )
    rem.close_episode(do_update_value=False, do_update_weight=False)
    return rem


# Chi-square critical value at p = 0.001 for 9 degrees of freedom (10 categories).
CHI2_9_P001 = 27.877


def test_replay_memory_feed_draws_in_proportion_to_weight():
    weights = np.arange(1, 11, dtype=np.float64)
    rem = _memory(weights)
    counts = np.zeros(10)
    with Feed(rem, 64, depth=3, threads=2) as feed:
        for _ in range(300):
            batch = next(feed)
            # Each draw is its entry: state [k] (frame_stack 1), id k, prob w_k / total.
            k = batch.prev[0][:, 0, 0]
            np.testing.assert_array_equal(batch.id, k)
            np.testing.assert_allclose(batch.prob, weights[k] / weights.sum())
            counts += np.bincount(k, minlength=10)
    expected = weights / weights.sum() * counts.sum()
    assert ((counts - expected) ** 2 / expected).sum() < CHI2_9_P001


def test_replay_memory_feed_sees_weight_updates_and_frame_stack_changes():
    rem = _memory(np.ones(10))
    depth = 2
    with Feed(rem, 16, depth=depth) as feed:
        b = next(feed)
        assert b.prev[0].shape == (16, 1, 1)
        assert rem.update_weights(np.array([4], np.int64), np.array([0.0], np.float32)) == 1
        later = [next(feed).id.copy() for _ in range(depth + 100)]
        assert not any((ids == 4).any() for ids in later[depth:])
        rem.frame_stack = 2  # resizes the outputs: the feed sizes a new ring
        shapes = [next(feed).prev[0].shape for _ in range(depth + 3)]
        assert shapes[-1] == (16, 2, 1)


def test_replay_memory_feed_raises_the_synchronous_error_and_cache_flags_give_none():
    rem = ReplayMemory(
        np.zeros([2], np.uint8),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([0], np.uint8),
        50,
    )
    with pytest.raises(RuntimeError) as sync:
        rem.get_batch(4)
    with Feed(rem, 4) as feed, pytest.raises(RuntimeError) as fed:
        next(feed)
    assert type(fed.value) is type(sync.value) and str(fed.value) == str(sync.value)
    flags = np.ones(14, bool)
    flags[1] = False  # prev action
    rem.cache_flags = flags
    rem.new_episode()
    for _ in range(5):
        rem.add_entry(np.zeros(2, np.uint8), 0.0, 1.0, 0.0, 0.0, np.zeros(0, np.uint8))
    rem.close_episode()
    with Feed(rem, 4) as feed:
        b = next(feed)
        assert b.prev[1] is None and b.next[1] is not None
        assert b.prev[0].shape == (4, 1, 2)


def test_replay_memory_feed_needs_a_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        Feed(_memory(np.ones(3)))


def test_a_replay_memory_source_draws_with_the_memorys_seed_not_the_feeds():
    """docs/FEED.md, `seed`: with a ReplayMemory source the batches follow ``rem.seed(n)``
    (the memory's generator), whatever ``Feed(seed=...)`` says."""

    def states(rem_seed, feed_seed):
        rem = _memory([1.0] * 50)
        rem.seed(rem_seed)
        with Feed(rem, batch_size=8, depth=2, threads=1, seed=feed_seed) as feed:
            return [next(feed).prev[0].copy() for _ in range(5)]

    same_memory_seed = states(3, 0), states(3, 12345)
    assert all(np.array_equal(a, b) for a, b in zip(*same_memory_seed))
    other_memory_seed = states(4, 0)
    assert not all(np.array_equal(a, b) for a, b in zip(same_memory_seed[0], other_memory_seed))
