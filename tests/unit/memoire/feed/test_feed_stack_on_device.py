"""memoire.feed.Feed(stack_on_device=True): distinct frames travel once, stacks are assembled on
the device (JAX's CPU device here), and the batches equal the host-stacked ones bit for bit.

Three feeds with the same seed and one thread draw the same keys (the same generator calls):
host batches (device=None), device batches stacked on the host, device batches stacked on the
device. Every field of every batch must agree.
"""

import gc

import numpy as np
import pytest

from memoire import _core
from memoire.feed import Feed

jax = pytest.importorskip("jax")
try:
    from memoire.dopamine_compat import jax_replay_buffer as jrb
except ImportError:  # a core-only install
    jrb = None

pytestmark = [
    pytest.mark.dopamine,
    pytest.mark.skipif(jrb is None, reason="needs dopamine-rl"),
]

FIELDS = ("state", "action", "reward", "next_state", "is_terminal", "episode_end")


def _buffer(
    *,
    stack,
    horizon=1,
    prioritized=False,
    capacity=60,
    steps=500,
    episode_len=(1, 14),
    obs_shape=(7, 5),
    fix_terminal_duplicates=False,
    seed=0,
):
    """A JAX-face buffer fed random frames in episodes of random length (random ends:
    terminal or truncated), `steps` steps into `capacity` elements so that the element ring
    and the frame ring wrap around several times."""
    rng = np.random.default_rng(seed)
    acc = jrb.TransitionAccumulator(
        stack_size=stack,
        update_horizon=horizon,
        gamma=0.9,
        fix_terminal_duplicates=fix_terminal_duplicates,
    )
    dist = (
        jrb.PrioritizedSamplingDistribution(seed=0, max_capacity=capacity)
        if prioritized
        else jrb.UniformSamplingDistribution(seed=0)
    )
    buf = jrb.ReplayBuffer(acc, dist, batch_size=16, max_capacity=capacity)
    left = int(rng.integers(*episode_len))
    for _ in range(steps):
        left -= 1
        end = left == 0
        terminal = end and bool(rng.integers(2))
        kw = {"priority": float(rng.uniform(0.1, 5.0))} if prioritized else {}
        buf.add(
            jrb.TransitionElement(
                rng.integers(0, 256, obs_shape, dtype=np.uint8),
                int(rng.integers(18)),
                float(rng.normal()),
                terminal,
                end and not terminal,
            ),
            **kw,
        )
        if end:
            left = int(rng.integers(*episode_len))
    return buf


def _draws(buf, n_batches, batch_size, **kw):
    """n_batches (batch, metadata) pairs as numpy, from a fresh feed (seed 3, one thread)."""
    out = []
    with Feed(buf, batch_size, depth=3, threads=1, seed=3, with_sample_metadata=True, **kw) as feed:
        for _ in range(n_batches):
            batch, meta = next(feed)
            # copies: host batches are views of a slot, which must go back to the feed
            out.append(
                (
                    {f: np.array(getattr(batch, f)) for f in FIELDS},
                    {
                        k: np.array(getattr(meta, k))
                        for k in ("keys", "probabilities")
                        if hasattr(meta, k)
                    },
                    {f: type(getattr(batch, f)) for f in FIELDS},
                )
            )
            del batch, meta
    return out


def _assert_same_batches(buf, batch_size=16, n_batches=12):
    host = _draws(buf, n_batches, batch_size)
    stacked_host = _draws(buf, n_batches, batch_size, device="jax")
    on_device = _draws(buf, n_batches, batch_size, device="jax", stack_on_device=True)
    zero_frames = terminals = 0
    for (h, hm, _), (d, dm, _), (s, sm, sd) in zip(host, stacked_host, on_device):
        terminals += int(h["is_terminal"].sum())
        for k in hm:  # same draws
            np.testing.assert_array_equal(sm[k], hm[k])
            np.testing.assert_array_equal(dm[k], hm[k])
        for f in FIELDS:
            assert issubclass(sd[f], jax.Array)
            assert s[f].dtype == d[f].dtype and s[f].shape == d[f].shape, f
            np.testing.assert_array_equal(s[f], d[f], err_msg=f)  # bit for bit
            # and the host batch, in the dtype the device holds (float64 -> float32 without x64)
            np.testing.assert_array_equal(s[f], h[f].astype(s[f].dtype), err_msg=f)
        assert s["state"].shape == (batch_size, *buf._obs_shape, buf._stack_size)
        zero_frames += int(np.sum(~s["state"].any(axis=(1, 2))))
    return zero_frames, terminals


@pytest.mark.parametrize("stack", [1, 4])
@pytest.mark.parametrize("horizon", [1, 3])
@pytest.mark.parametrize("prioritized", [False, True])
def test_stacked_on_device_equals_host_stacked(stack, horizon, prioritized):
    buf = _buffer(stack=stack, horizon=horizon, prioritized=prioritized)
    zero_frames, terminals = _assert_same_batches(buf)
    assert terminals > 0  # terminal transitions were among the draws
    if stack > 1:  # short episodes: stacks reaching before an episode's start were drawn
        assert zero_frames > 0


def test_terminal_duplicates_fixed_and_batch_larger_than_store():
    # Terminal tails emitted once, and a batch of 64 from 30 elements (keys repeat: shared
    # frames deduplicated across the batch).
    buf = _buffer(stack=4, horizon=2, capacity=30, steps=200, fix_terminal_duplicates=True)
    _assert_same_batches(buf, batch_size=64, n_batches=5)


def test_atari_shaped_frames_move_fewer_bytes():
    # Long episodes, 84x84 frames, stack 4: a batch carries about 5 distinct frames per
    # transition instead of 8.
    buf = _buffer(stack=4, capacity=3000, steps=3000, episode_len=(400, 800), obs_shape=(84, 84))
    with Feed(buf, 32, depth=2, seed=1, device="jax") as plain:
        next(plain)
        plain_bytes = plain.last_transfer_bytes
    with Feed(buf, 32, depth=2, seed=1, device="jax", stack_on_device=True) as feed:
        next(feed)
        stacked_bytes = feed.last_transfer_bytes
    frame = 84 * 84
    # Action and reward as JAX holds them (x64 off: 32-bit, narrowed on the way), two bools.
    small = 32 * (4 + 4 + 1 + 1)
    assert plain_bytes == 2 * 32 * 4 * frame + small
    # 5 distinct frames per transition (fewer where stacks share frames or start an episode),
    # padded to a multiple of 8 frames, plus the index int32[32, 2, 4].
    assert stacked_bytes <= (5 * 32 + 8) * frame + 32 * 2 * 4 * 4 + small
    assert stacked_bytes < 0.7 * plain_bytes
    _assert_same_batches(buf, batch_size=32, n_batches=3)


def test_several_sampler_threads_each_batch_is_its_keys_elements():
    # Two sampler threads fill slots concurrently (batch order then varies): every batch is
    # still exactly the stored elements of its keys.
    buf = _buffer(stack=4, horizon=3, prioritized=True)
    with Feed(
        buf,
        16,
        depth=4,
        threads=2,
        seed=9,
        device="jax",
        stack_on_device=True,
        with_sample_metadata=True,
    ) as feed:
        for _ in range(10):
            batch, meta = next(feed)
            ref = buf.get_elements(meta.keys)
            for f in FIELDS:
                got = np.asarray(getattr(batch, f))
                np.testing.assert_array_equal(got, getattr(ref, f).astype(got.dtype), err_msg=f)


def test_native_distinct_layout():
    # The slot as the sampler threads fill it: counts (distinct, padded), zero padding, index
    # into the distinct frames, and the stacks it stands for equal SampleGather's.
    buf = _buffer(stack=4, horizon=2)
    n, granule = 16, 8
    cap = _core.Feed.distinct_frames_capacity(n, 4, granule)
    assert cap == 128
    _, action, _, _, _, _ = buf._empty_batch(n)
    templates = [
        np.empty(n, np.int32),
        np.empty(n, np.float64),
        np.empty((cap, *buf._obs_shape), np.uint8),
        np.empty((n, 2, 4), np.int32),
        np.empty(2, np.int32),
        action,
        np.empty(n, np.float64),
        np.empty(n, np.bool_),
        np.empty(n, np.bool_),
    ]
    native = _core.Feed(buf._store, templates, n, 2, 1, 5, granule)
    plain = _core.Feed(buf._store, [templates[0], templates[1], *buf._empty_batch(n)], n, 2, 1, 5)
    try:
        for _ in range(4):
            keys, probs, frames, index, counts, *rest = native.take()
            pkeys, pprobs, state, paction, preward, next_state, pterm, pend = plain.take()
            distinct, padded = int(counts[0]), int(counts[1])
            assert 0 < distinct <= padded <= cap and padded % granule == 0
            assert padded - distinct < granule
            assert not frames[distinct:padded].any()
            assert index.min() >= 0 and index.max() < distinct
            # every distinct frame is used
            assert len(np.unique(index)) == distinct
            np.testing.assert_array_equal(keys, pkeys)
            np.testing.assert_array_equal(probs, pprobs)
            np.testing.assert_array_equal(np.moveaxis(frames[index[:, 0]], 1, -1), state)
            np.testing.assert_array_equal(np.moveaxis(frames[index[:, 1]], 1, -1), next_state)
            for a, b in zip(rest, (paction, preward, pterm, pend)):
                np.testing.assert_array_equal(a, b)
            del keys, probs, frames, index, counts, rest, state, next_state
    finally:
        native.close()
        plain.close()


def test_bad_settings_raise():
    buf = _buffer(stack=1, steps=20)
    with pytest.raises(ValueError, match="stack_on_device"):
        Feed(buf, 8, stack_on_device=True)  # no device
    with pytest.raises(ValueError, match="frames_granule"):
        _core.Feed(buf._store, [], 8, 2, 1, 0, -1)


def test_start_feed_stack_on_device():
    buf = _buffer(stack=4, steps=100)
    feed = buf.start_feed(2, seed=4, device="jax", stack_on_device=True)
    batch = buf.sample()
    assert isinstance(batch.state, jax.Array) and batch.state.shape == (16, 7, 5, 4)
    # uncommitted, as device_put(numpy) makes it: a jitted step does not compile a variant
    assert not batch.state.committed and not batch.reward.committed
    assert feed.last_transfer_bytes > 0
    buf.stop_feed()
    device = jax.devices()[0]
    with Feed(buf, 16, depth=2, device=device, stack_on_device=True) as on:
        batch = next(on)
        assert batch.state.committed and batch.state.devices() == {device}


# ---- DLPack: host batches are zero-copy to other frameworks ----


def test_host_batch_views_go_through_dlpack_without_a_copy():
    import jax.dlpack

    buf = _buffer(stack=4, steps=200)
    with Feed(buf, 16, depth=2, threads=1, seed=2) as feed:
        batch = next(feed)
        view = np.from_dlpack(batch.state)
        assert np.shares_memory(view, batch.state)
        on_cpu = jax.dlpack.from_dlpack(batch.state)  # JAX's CPU device aliases 64-byte aligned
        assert on_cpu.unsafe_buffer_pointer() == batch.state.ctypes.data
        kept = np.array(batch.state)
        del batch, view
        # The JAX array holds the slot: the feed goes on with the other slot and never
        # overwrites this one.
        for _ in range(6):
            next(feed)
        np.testing.assert_array_equal(np.asarray(on_cpu), kept)
        del on_cpu
        gc.collect()
        for _ in range(4):  # both slots cycle again
            next(feed)


@pytest.mark.slow
def test_agent_prefetch_stack_on_device():
    gin = pytest.importorskip("gin")
    from memoire.dopamine_compat import jax_agents

    gin.clear_config()
    gin.parse_config(["ReplayBuffer.batch_size = 8", "ReplayBuffer.max_capacity = 100"])
    try:
        agent = jax_agents.MemoireJaxDQNAgent(
            num_actions=2,
            observation_shape=(4, 1),
            stack_size=2,
            seed=0,
            prefetch_depth=2,
            prefetch_stack_on_device=True,
        )
        replay = agent._replay
        for i in range(20):
            replay.add(
                jrb.TransitionElement(np.full((4, 1), i, np.float32), i % 2, 1.0, False, False)
            )
        batch = replay.sample()
        assert isinstance(batch.state, jax.Array) and batch.state.shape == (8, 4, 1, 2)
        # element k's state stack is observations (k - 1, k), zeros before the first
        state = np.asarray(batch.state)
        first = state[:, 0, 0, 1]
        np.testing.assert_array_equal(state[:, 0, 0, 0], np.maximum(first - 1, 0))
        assert replay._feed.last_transfer_bytes < 8 * 2 * 2 * 4 * 4 + 8 * 64
        replay.stop_feed()
        with pytest.raises(ValueError, match="stack_on_device"):
            jax_agents.MemoireJaxDQNAgent(
                num_actions=2,
                observation_shape=(4, 1),
                stack_size=2,
                seed=0,
                prefetch_depth=2,
                prefetch_to_device=False,
                prefetch_stack_on_device=True,
            )
    finally:
        gin.clear_config()
