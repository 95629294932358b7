"""The one experience path: episodes streamed as chunks (memoire.experience.ChunkStream) and
stored whole by the native ingest into every store: Dopamine's TF circular and prioritized
buffers and the JAX buffer give the same contents as the same steps added directly."""

import numpy as np
import pytest

from memoire.dopamine_compat import OutOfGraphPrioritizedReplayBuffer, OutOfGraphReplayBuffer
from memoire.experience import ChunkStream

STACK, CAP = 2, 64


def episodes(seed, count=4, shape=(3, 2)):
    """[(observations uint8[n, *shape], actions int32[n], rewards float32[n], terminated)]."""
    rng = np.random.default_rng(seed)
    out = []
    for e in range(count):
        n = int(rng.integers(1, 12))
        out.append(
            (
                rng.integers(0, 255, (n, *shape), dtype=np.uint8),
                rng.integers(0, 4, n).astype(np.int32),
                rng.normal(size=n).astype(np.float32),
                bool(e % 2),
            )
        )
    return out


def copying_sender(ingest, results):
    """A `send` that hands the ingest a copy of the frames (as a socket does)."""

    def send(frames):
        results.append(ingest.ingest([bytes(memoryview(f)) for f in frames]))
        return True

    return send


def stream(ingest, eps, chunk_rows=3, uuid=7, info=True):
    results = []
    s = ChunkStream(
        ingest.row_spec, copying_sender(ingest, results), chunk_rows=chunk_rows, uuid=uuid
    )
    names = [name for name, _, _ in ingest.row_spec]
    for obs, act, rew, term in eps:
        for i in range(len(rew)):
            row = dict(zip(names, (obs[i], act[i], rew[i], term and i == len(rew) - 1)))
            assert s.add(row)
        assert s.end_episode(term, info=(float(rew.sum()), len(rew), term) if info else None)
    return results


def tf_buffer(cls):
    return cls((3, 2), STACK, replay_capacity=CAP, batch_size=4, update_horizon=2)


@pytest.mark.parametrize("cls", [OutOfGraphReplayBuffer, OutOfGraphPrioritizedReplayBuffer])
def test_tf_buffer_ingest_equals_add_batch(cls):
    eps = episodes(0)
    direct, fed = tf_buffer(cls), tf_buffer(cls)
    if cls is OutOfGraphPrioritizedReplayBuffer:
        for b in (direct, fed):
            b.sum_tree.max_recorded_priority = 2.5
    for obs, act, rew, term in eps:
        n = len(rew)
        terms = np.zeros(n, np.uint8)
        terms[-1] = term
        ends = np.zeros(n, bool)
        ends[-1] = True
        kw = {}
        if cls is OutOfGraphPrioritizedReplayBuffer:
            kw["priorities"] = np.full(n, direct.sum_tree.max_recorded_priority)
        direct.add_batch(obs, act, rew, terms, episode_ends=ends, **kw)
    ingest = fed.chunk_ingest()
    results = stream(ingest, eps)
    assert [r[0] for r in results].count(2) == len(eps)  # every episode committed
    assert fed.add_count == direct.add_count
    for name in direct._store:
        np.testing.assert_array_equal(fed._store[name], direct._store[name], err_msg=name)
    valid = [i for i in range(CAP) if direct.is_valid_transition(i)]
    for a, b in zip(
        fed.sample_transition_batch(len(valid), np.array(valid)),
        direct.sample_transition_batch(len(valid), np.array(valid)),
    ):
        np.testing.assert_array_equal(a, b)
    if cls is OutOfGraphPrioritizedReplayBuffer:
        np.testing.assert_array_equal(
            fed.get_priority(np.array(valid, np.int32)),
            direct.get_priority(np.array(valid, np.int32)),
        )


def jax_buffer(prioritized):
    mj = pytest.importorskip("memoire.dopamine_compat.jax_replay_buffer")  # needs dopamine-rl
    acc = mj.TransitionAccumulator(STACK, 2, 0.9)
    dist = (
        mj.PrioritizedSamplingDistribution(0, max_capacity=CAP, priority_exponent=0.5)
        if prioritized
        else mj.UniformSamplingDistribution(0)
    )
    return mj.ReplayBuffer(acc, dist, batch_size=4, max_capacity=CAP)


@pytest.mark.dopamine
@pytest.mark.parametrize("prioritized", [False, True])
def test_jax_buffer_ingest_equals_add_batch(prioritized):
    eps = episodes(1)
    direct, fed = jax_buffer(prioritized), jax_buffer(prioritized)
    for obs, act, rew, term in eps:
        n = len(rew)
        terms = np.zeros(n, bool)
        terms[-1] = term
        ends = np.zeros(n, bool)
        ends[-1] = True
        direct.add_batch(
            obs, act, rew.astype(np.float64), terms, ends, priorities=0.8 if prioritized else None
        )
    ingest = fed.chunk_ingest(eps[0][0][0], eps[0][1][0])
    fed.set_ingest_priority(ingest, 0.8)
    stream(ingest, [(o, a, r.astype(np.float64), t) for o, a, r, t in eps])
    assert fed.add_count == direct.add_count > 0
    np.testing.assert_array_equal(fed.keys(), direct.keys())
    a, b = fed.get_elements(fed.keys()), direct.get_elements(direct.keys())
    for field in ("state", "action", "reward", "next_state", "is_terminal", "episode_end"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    if prioritized:
        np.testing.assert_array_equal(fed.priorities(fed.keys()), direct.priorities(direct.keys()))
        assert fed.max_recorded_priority == direct.max_recorded_priority


def test_interleaved_actors_store_whole_episodes_in_commit_order():
    """Chunks of two actors arrive interleaved; each episode still lands contiguously."""
    eps_a, eps_b = episodes(2, count=2), episodes(3, count=2)
    fed = tf_buffer(OutOfGraphReplayBuffer)
    ingest = fed.chunk_ingest()
    results = []
    streams = [
        ChunkStream(ingest.row_spec, copying_sender(ingest, results), chunk_rows=2, uuid=u)
        for u in (1, 2)
    ]
    order = []  # (actor, episode) in commit order
    pending = [list(eps_a), list(eps_b)]
    rows = [0, 0]
    while any(pending):
        for k in (0, 1):
            if not pending[k]:
                continue
            obs, act, rew, term = pending[k][0]
            i = rows[k]
            streams[k].add(
                {
                    "observation": obs[i],
                    "action": act[i],
                    "reward": rew[i],
                    "terminal": term and i == len(rew) - 1,
                }
            )
            rows[k] += 1
            if rows[k] == len(rew):
                streams[k].end_episode(term)
                order.append(pending[k].pop(0))
                rows[k] = 0
    direct = tf_buffer(OutOfGraphReplayBuffer)
    for obs, act, rew, term in order:
        terms = np.zeros(len(rew), np.uint8)
        terms[-1] = term
        ends = np.zeros(len(rew), bool)
        ends[-1] = True
        direct.add_batch(obs, act, rew, terms, episode_ends=ends)
    for name in direct._store:
        np.testing.assert_array_equal(fed._store[name], direct._store[name], err_msg=name)


def test_committed_records_carry_the_actors_info():
    fed = tf_buffer(OutOfGraphReplayBuffer)
    ingest = fed.chunk_ingest()
    eps = episodes(4, count=3)
    stream(ingest, eps, uuid=11)
    records, dropped = ingest.take_committed()
    assert dropped == 0
    assert [(u, e, r) for u, e, r, _ in records] == [
        (11, k, len(ep[2])) for k, ep in enumerate(eps)
    ]
    for (_, _, _, info), (_, _, rew, term) in zip(records, eps):
        assert info == pytest.approx((float(rew.sum()), len(rew), float(term)))
    assert ingest.take_committed() == ([], 0)


def test_bad_chunks_are_refused_and_change_nothing():
    fed = tf_buffer(OutOfGraphReplayBuffer)
    ingest = fed.chunk_ingest()
    eps = episodes(5, count=1)
    obs, act, rew, term = eps[0]
    # a non-finite reward: the episode is dropped whole
    bad = rew.copy()
    bad[0] = np.nan
    results = stream(ingest, [(obs, act, bad, term)], info=False)
    assert results[-1][0] == 3 and results[-1][2] == "nonfinite"
    # a non-finite info value: the chunk is malformed
    results = stream(ingest, [(obs, act, rew, term)], uuid=8, info=False)
    assert results[-1][0] == 2  # without info it is stored
    before = {k: v.copy() for k, v in fed._store.items()}
    count = fed.add_count
    s = ChunkStream(ingest.row_spec, copying_sender(ingest, got := []), uuid=9)
    s.add({"observation": obs[0], "action": act[0], "reward": rew[0], "terminal": False})
    s.end_episode(False, info=(np.inf, 1, 0))
    assert got[-1][0] == 3 and got[-1][2] == "malformed"
    # another layout (float32 observations): malformed
    spec = [(n, np.float32 if n == "observation" else d, sh) for n, d, sh in ingest.row_spec]
    s = ChunkStream(spec, copying_sender(ingest, got), uuid=10)
    s.add(
        {
            "observation": obs[0].astype(np.float32),
            "action": act[0],
            "reward": 1.0,
            "terminal": False,
        }
    )
    s.end_episode(False)
    assert got[-1][0] == 3 and got[-1][2] == "malformed"
    assert fed.add_count == count
    for name in before:
        np.testing.assert_array_equal(fed._store[name], before[name])
    assert ingest.counters()["rejected"] == {"nonfinite": 1, "malformed": 2}


def test_chunk_stream_checks_rows():
    ingest = tf_buffer(OutOfGraphReplayBuffer).chunk_ingest()
    s = ChunkStream(ingest.row_spec, lambda frames: True)
    with pytest.raises(ValueError, match="observation: expected uint8\\[3, 2\\]"):
        s.add({"observation": np.zeros(3), "action": 0, "reward": 0.0, "terminal": False})
    with pytest.raises(ValueError, match="expected the columns"):
        s.add({"observation": np.zeros((3, 2))})
    with pytest.raises(ValueError, match="chunk_rows"):
        ChunkStream(ingest.row_spec, lambda frames: True, chunk_rows=0)


@pytest.mark.parametrize("hold_full", [False, True])
def test_rows_added_at_once_store_what_rows_added_one_by_one_store(hold_full):
    # ChunkStream.add_rows (whole chunks of the caller's arrays sent as they are, the rest
    # staged) and hold_full (a full chunk waits for the episode's end, so no empty last chunk)
    # store the same episodes as add() one row at a time.
    eps = episodes(3)
    one, many = tf_buffer(OutOfGraphReplayBuffer), tf_buffer(OutOfGraphReplayBuffer)
    stream(one.chunk_ingest(), eps, chunk_rows=3, info=False)
    ingest = many.chunk_ingest()
    sent = []
    s = ChunkStream(
        ingest.row_spec, copying_sender(ingest, sent), chunk_rows=3, uuid=7, hold_full=hold_full
    )
    for obs, act, rew, term in eps:
        terminal = np.zeros(len(rew), bool)
        terminal[-1] = term
        assert s.add_rows({"observation": obs, "action": act, "reward": rew, "terminal": terminal})
        assert s.end_episode(term)
    assert [r[0] for r in sent].count(2) == len(eps)  # every episode committed
    assert many.add_count == one.add_count
    for name in one._store:
        np.testing.assert_array_equal(many._store[name], one._store[name])
    rows = sum(len(e[2]) for e in eps)
    chunks = sum(-(-len(e[2]) // 3) for e in eps)  # ceil: no empty closing chunk when held
    assert s.rows_sent == rows and len(sent) >= chunks
    if hold_full:
        assert len(sent) == chunks
    with pytest.raises(ValueError, match="expected the columns"):
        s.add_rows({"observation": eps[0][0]})


@pytest.mark.dopamine
def test_jax_ingest_checks_layout_and_priority():
    buf = jax_buffer(True)
    ingest = buf.chunk_ingest(np.zeros((3, 2), np.uint8), np.int32(0))
    with pytest.raises(ValueError, match="priority"):
        buf.set_ingest_priority(ingest, -1.0)
    with pytest.raises(ValueError, match="observation: expected 6 bytes"):
        from memoire import _core

        _core.ChunkIngest(
            buf._store,
            observation_dtype=np.float32,
            observation_shape=[3, 2],
            action_dtype=np.int32,
            action_shape=[],
        )
    with pytest.raises(RuntimeError, match="priority"):
        tf_buffer(OutOfGraphReplayBuffer).chunk_ingest().priority = 1.0
