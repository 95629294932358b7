"""Differential tests: memoire's JAX ReplayBuffer against Dopamine 4.1.2's on the same streams."""

import numpy as np
import pytest

pytest.importorskip("dopamine.jax.replay_memory.replay_buffer")

from dopamine.jax.replay_memory import accumulator, elements, replay_buffer, samplers  # noqa: E402

from memoire.dopamine_compat import jax_replay_buffer as mj  # noqa: E402

FIELDS = ("state", "action", "reward", "next_state", "is_terminal", "episode_end")


def make_dopamine(stack, horizon, gamma, cap, prio, seed=0, exponent=0.5):
    acc = accumulator.TransitionAccumulator(stack_size=stack, update_horizon=horizon, gamma=gamma)
    dist = (
        samplers.PrioritizedSamplingDistribution(seed, max_capacity=cap, priority_exponent=exponent)
        if prio
        else samplers.UniformSamplingDistribution(seed)
    )
    return replay_buffer.ReplayBuffer(acc, dist, batch_size=8, max_capacity=cap)


def make_memoire(stack, horizon, gamma, cap, prio, seed=0, exponent=0.5, fix=False):
    acc = mj.TransitionAccumulator(stack, horizon, gamma, fix_terminal_duplicates=fix)
    dist = (
        mj.PrioritizedSamplingDistribution(seed, max_capacity=cap, priority_exponent=exponent)
        if prio
        else mj.UniformSamplingDistribution(seed)
    )
    return mj.ReplayBuffer(acc, dist, batch_size=8, max_capacity=cap)


def stream(rng, n, shape=(3, 2), p_term=0.08, p_trunc=0.05):
    for _ in range(n):
        term = bool(rng.random() < p_term)
        end = term or bool(rng.random() < p_trunc)
        yield elements.TransitionElement(
            rng.integers(0, 255, size=shape, dtype=np.uint8),
            int(rng.integers(4)),
            float(rng.normal()),
            term,
            end,
        )


def assert_same_batch(a, b):
    for f in FIELDS:
        x, y = np.asarray(getattr(a, f)), np.asarray(getattr(b, f))
        assert x.dtype == y.dtype, (f, x.dtype, y.dtype)
        assert x.shape == y.shape, (f, x.shape, y.shape)
        np.testing.assert_array_equal(x, y, err_msg=f)


def assert_same_contents(d, m):
    keys = list(d._memory.keys())
    assert keys == m.keys().tolist()
    if not keys:
        return
    want = [d._memory[k].unpack() if d._compress else d._memory[k] for k in keys]
    got = m.get_elements(np.asarray(keys))
    for f in FIELDS:
        x = np.stack([np.asarray(getattr(e, f)) for e in want])
        y = getattr(got, f)
        assert x.dtype == y.dtype and x.shape == y.shape, (f, x.dtype, y.dtype, x.shape, y.shape)
        np.testing.assert_array_equal(x, y, err_msg=f)


CASES = [(s, n, g) for s in (1, 4) for n in (1, 3) for g in (0.9, 0.99)]


@pytest.mark.parametrize("stack,horizon,gamma", CASES)
@pytest.mark.parametrize("prio", [False, True], ids=["uniform", "prioritized"])
def test_same_elements_keys_samples_and_priorities(stack, horizon, gamma, prio):
    cap = 37  # small and not a power of two: evictions happen, Dopamine's tree works
    rng = np.random.default_rng(stack * 100 + horizon * 10 + int(prio))
    d = make_dopamine(stack, horizon, gamma, cap, prio)
    m = make_memoire(stack, horizon, gamma, cap, prio)
    for t, step in enumerate(stream(rng, 400)):
        kw = {"priority": float(rng.random() * 2)} if prio else {}
        d.add(step, **kw)
        m.add(step, **kw)
        assert d.add_count == m.add_count
        if t % 9 == 0 and d.add_count:
            bd, md = d.sample(size=5, with_sample_metadata=True)
            bm, mm = m.sample(size=5, with_sample_metadata=True)
            assert type(mm) is type(md)
            np.testing.assert_array_equal(md.keys, mm.keys)
            assert mm.keys.dtype == md.keys.dtype
            assert_same_batch(bd, bm)
            if prio:
                np.testing.assert_array_equal(md.probabilities, mm.probabilities)
                new = rng.random(5) * 3
                d.update(md.keys, priorities=new)
                m.update(mm.keys, priorities=new)
        if t % 50 == 0:
            assert_same_contents(d, m)
    assert d.add_count > cap  # evictions happened
    assert_same_contents(d, m)
    if prio:
        assert m.max_recorded_priority == d._sampling_distribution._sum_tree.max_recorded_priority
        assert m._sampling_distribution._sum_tree.max_recorded_priority == m.max_recorded_priority
        np.testing.assert_array_equal(
            d._sampling_distribution._sum_tree._nodes,
            m._sampling_distribution.to_state_dict()["sum_tree"]["nodes"],
        )
        keys = m.keys()
        np.testing.assert_array_equal(
            m.priorities(keys),
            d._sampling_distribution._sum_tree.get(
                np.array([d._sampling_distribution._index_by_key[k] for k in keys])
            ),
        )


def test_dopamine_quirks_are_kept():
    # Horizon 1: the terminal step's reward is dropped; episode_end mirrors is_terminal.
    m = make_memoire(1, 1, 0.9, 10, False)
    obs = [np.full((2,), i, np.uint8) for i in range(3)]
    m.add(elements.TransitionElement(obs[0], 0, 1.0, False))
    m.add(elements.TransitionElement(obs[1], 1, 2.0, False))
    m.add(elements.TransitionElement(obs[2], 2, 4.0, True))
    b = m.get_elements(m.keys())
    np.testing.assert_array_equal(b.reward, [1.0, 2.0])
    np.testing.assert_array_equal(b.is_terminal, [False, True])
    np.testing.assert_array_equal(b.episode_end, b.is_terminal)
    # Stack 4: a terminal step repeats the transition with more zero frames (dopamine#228).
    rng = np.random.default_rng(0)
    d = make_dopamine(4, 1, 0.9, 50, False)
    m = make_memoire(4, 1, 0.9, 50, False)
    f = make_memoire(4, 1, 0.9, 50, False, fix=True)
    steps = [
        elements.TransitionElement(rng.integers(1, 255, (2,), np.uint8), k, 1.0, k == 7)
        for k in range(8)
    ]
    for s in steps:
        d.add(s), m.add(s), f.add(s)
    assert_same_contents(d, m)
    last = m.get_elements(m.keys()[-4:])
    assert np.all(last.action == 6) and np.all(last.is_terminal)
    assert [int((x == 0).all(axis=0).sum()) for x in last.state] == [0, 1, 2, 3]
    # The fix yields it once, with all of its frames.
    assert f.add_count == m.add_count - 3
    fixed = f.get_elements(f.keys()[-1:])
    np.testing.assert_array_equal(fixed.state, last.state[:1])
    np.testing.assert_array_equal(fixed.next_state, last.next_state[:1])


def test_fix_with_horizon_keeps_full_stacks():
    rng = np.random.default_rng(3)
    d = make_dopamine(4, 3, 0.9, 100, False)
    f = make_memoire(4, 3, 0.9, 100, False, fix=True)
    steps = [
        elements.TransitionElement(rng.integers(1, 255, (2,), np.uint8), k, float(k), k == 9)
        for k in range(10)
    ]
    for s in steps:
        d.add(s), f.add(s)
    want = [d._memory[k].unpack() for k in d._memory]
    got = f.get_elements(f.keys())
    # Dopamine's elements with distinct (action, reward); the fix keeps each once.
    seen = {}
    for e in want:
        seen.setdefault((int(e.action), float(e.reward)), e)
    assert sorted(seen) == sorted(zip(got.action.tolist(), got.reward.tolist()))
    # No zero frame inside an episode that has 4 frames before the state's end.
    for k in range(len(got.action)):
        if got.action[k] >= 3:
            assert (got.state[k] != 0).all()


def test_sample_and_add_errors_change_nothing():
    m = make_memoire(1, 1, 0.9, 10, True)
    with pytest.raises(ValueError, match="No samples"):
        m.sample()
    o = np.zeros((2, 2), np.uint8)
    for _k in range(4):
        m.add(elements.TransitionElement(o, 1, 1.0, False), priority=1.0)
    count = m.add_count
    with pytest.raises(ValueError, match="observation"):
        m.add(elements.TransitionElement(np.zeros((3,), np.uint8), 1, 1.0, False), priority=1.0)
    with pytest.raises(ValueError, match="observation"):
        m.add(elements.TransitionElement(np.zeros((2, 2), np.float32), 1, 1.0, False), priority=1.0)
    with pytest.raises(TypeError, match="priority"):
        m.add(elements.TransitionElement(o, 1, 1.0, False))
    with pytest.raises(ValueError, match="priority"):
        m.add(elements.TransitionElement(o, 1, 1.0, False), priority=-1.0)
    assert m.add_count == count
    with pytest.raises(ValueError, match="size"):
        m.sample(0)
    keys = m.keys()
    before = m.priorities(keys)
    with pytest.raises(KeyError):
        m.update(np.array([keys[0], 999], np.int32), priorities=np.array([2.0, 2.0]))
    with pytest.raises(ValueError, match="priorities"):
        m.update(keys, priorities=np.full(len(keys), -1.0))
    with pytest.raises(ValueError, match="priorities"):
        m.update(keys, priorities=np.ones(len(keys) + 1))
    np.testing.assert_array_equal(m.priorities(keys), before)
    m.update(int(keys[0]), priorities=4.0)  # a single key works (Dopamine's asserts reject it)
    assert m.priorities(keys[:1])[0] == 2.0  # 4 ** 0.5
    with pytest.raises(KeyError):
        m.get_elements([12345])


def test_power_of_two_capacity_does_not_crash_where_dopamine_does():
    d = make_dopamine(1, 1, 0.9, 4, True)
    m = make_memoire(1, 1, 0.9, 4, True)
    steps = list(stream(np.random.default_rng(0), 30, p_term=0.0, p_trunc=0.0))
    with pytest.raises(IndexError):
        for s in steps:
            d.add(s, priority=1.0)
    for s in steps:
        m.add(s, priority=1.0)
    assert len(m) == 4 and m.sample(3).state.shape == (3, 3, 2, 1)


def test_clear():
    rng = np.random.default_rng(5)
    d = make_dopamine(4, 3, 0.9, 30, True)
    m = make_memoire(4, 3, 0.9, 30, True)
    for s in stream(rng, 60):
        d.add(s, priority=2.0), m.add(s, priority=2.0)
    d.clear(), m.clear()
    assert m.add_count == 0 and len(m) == 0
    assert m.max_recorded_priority == d._sampling_distribution._sum_tree.max_recorded_priority
    for s in stream(rng, 80):
        d.add(s, priority=1.0), m.add(s, priority=1.0)
    assert_same_contents(d, m)
    np.testing.assert_array_equal(
        d.sample(with_sample_metadata=True)[1].keys, m.sample(with_sample_metadata=True)[1].keys
    )


@pytest.mark.parametrize("prio", [False, True], ids=["uniform", "prioritized"])
@pytest.mark.parametrize("compress", [True, False])
def test_save_load_round_trip_and_cross_load(tmp_path, prio, compress):
    rng = np.random.default_rng(11)
    d = make_dopamine(4, 3, 0.9, 37, prio)
    m = make_memoire(4, 3, 0.9, 37, prio)
    d._compress = m._compress = compress
    for s in stream(rng, 205):
        kw = {"priority": float(rng.random() * 2)} if prio else {}
        d.add(s, **kw), m.add(s, **kw)
    d.save(str(tmp_path / "d"), 3)
    m.save(str(tmp_path / "m"), 3)
    m_from_d = make_memoire(4, 3, 0.9, 37, prio, seed=9)
    m_from_d._compress = compress
    m_from_d.load(str(tmp_path / "d"), 3)
    d_from_m = make_dopamine(4, 3, 0.9, 37, prio, seed=9)
    d_from_m._compress = compress
    d_from_m.load(str(tmp_path / "m"), 3)
    m_from_m = make_memoire(4, 3, 0.9, 37, prio, seed=9)
    m_from_m._compress = compress
    m_from_m.load(str(tmp_path / "m"), 3)
    for other in (m_from_d, m_from_m):
        assert_same_contents(d, other)
    assert_same_contents(d_from_m, m)
    # All five continue identically: same accumulator window, sampler maps, tree and rng.
    bufs = [d, d_from_m, m, m_from_d, m_from_m]
    # Upstream, not memoire: Dopamine's own prioritized buffer restores its sum tree as a
    # read-only array, and under numpy 2 (the current stack) its next add fails (sum_tree.py's
    # np.add.at; numpy 1.26's wrote into it regardless). Asserted as it is, so this goes once
    # Dopamine fixes it; the four others go on (memoire's buffers load writable trees).
    numpy2 = np.lib.NumpyVersion(np.__version__) >= "2.0.0"
    if prio and numpy2 and not d_from_m._sampling_distribution._sum_tree._nodes.flags.writeable:
        with pytest.raises(ValueError, match="read-only"):
            d_from_m.add(next(iter(stream(np.random.default_rng(0), 1))), priority=1.5)
        bufs.remove(d_from_m)
    for s in stream(rng, 60):
        for b in bufs:
            b.add(s, **({"priority": 1.5} if prio else {}))
    outs = [b.sample(with_sample_metadata=True) for b in bufs]
    for batch, meta in outs[1:]:
        np.testing.assert_array_equal(meta.keys, outs[0][1].keys)
        assert_same_batch(outs[0][0], batch)
        if prio:
            np.testing.assert_array_equal(meta.probabilities, outs[0][1].probabilities)


def test_load_rejects_malformed_state_without_change():
    rng = np.random.default_rng(1)
    m = make_memoire(1, 1, 0.9, 20, False)
    for s in stream(rng, 30):
        m.add(s)
    state = m.to_state_dict()
    before = m.get_elements(m.keys())
    bad = dict(
        state, memory=dict(state["memory"], values=[[1, 2, 3]] * len(state["memory"]["keys"]))
    )
    with pytest.raises(ValueError, match="6 leaves"):
        m.from_state_dict(bad)
    bad = dict(state, add_count=state["add_count"] + 5)
    with pytest.raises(ValueError, match="consecutive keys"):
        m.from_state_dict(bad)
    bad = dict(state, memory=dict(state["memory"], treedef=b"cos\nsystem\n(S'false'\ntR."))
    m.from_state_dict(bad)  # a hostile pickle is never unpickled
    assert_same_batch(before, m.get_elements(m.keys()))


def test_agent_facing_isinstance_and_private_read():
    m = make_memoire(1, 1, 0.9, 10, True)
    dist = m._sampling_distribution
    assert isinstance(dist, samplers.PrioritizedSamplingDistribution)
    assert dist._sum_tree.max_recorded_priority == 1.0
    m.add(elements.TransitionElement(np.zeros(2, np.uint8), 0, 0.0, False), priority=9.0)
    m.add(elements.TransitionElement(np.zeros(2, np.uint8), 0, 0.0, False), priority=9.0)
    assert dist._sum_tree.max_recorded_priority == 3.0 == m.max_recorded_priority  # 9 ** 0.5
    u = make_memoire(1, 1, 0.9, 10, False)
    assert not isinstance(u._sampling_distribution, samplers.PrioritizedSamplingDistribution)
    assert isinstance(u._sampling_distribution, samplers.UniformSamplingDistribution)


def test_from_dopamine_converts_settings_and_contents():
    rng = np.random.default_rng(4)
    d = make_dopamine(4, 3, 0.95, 37, True)
    twin = make_dopamine(4, 3, 0.95, 37, True)
    for s in stream(rng, 90):
        d.add(s, priority=1.0), twin.add(s, priority=1.0)
    m = mj.ReplayBuffer.from_dopamine(d)
    assert_same_contents(twin, m)
    for s in stream(rng, 40):
        twin.add(s, priority=0.5), m.add(s, priority=0.5)
    np.testing.assert_array_equal(
        twin.sample(with_sample_metadata=True)[1].keys, m.sample(with_sample_metadata=True)[1].keys
    )


def test_frames_are_stored_once():
    m = make_memoire(4, 1, 0.99, 1000, False)
    for s in stream(np.random.default_rng(0), 3000, shape=(8, 8), p_term=0.002, p_trunc=0.0):
        m.add(s)
    # Dopamine holds 2 * stack frames per element; memoire about one.
    assert m.frame_capacity < 1.1 * 1000


def _columns(steps):
    return (
        np.stack([s.observation for s in steps]),
        np.asarray([s.action for s in steps]),
        np.asarray([s.reward for s in steps]),
        np.asarray([s.is_terminal for s in steps]),
        np.asarray([s.episode_end for s in steps]),
    )


@pytest.mark.parametrize("stack,horizon", [(1, 1), (4, 3)])
@pytest.mark.parametrize("prio", [False, True], ids=["uniform", "prioritized"])
def test_add_batch_equals_single_adds(stack, horizon, prio):
    cap = 37
    rng = np.random.default_rng(7 + stack + int(prio))
    one = make_memoire(stack, horizon, 0.95, cap, prio)
    bulk = make_memoire(stack, horizon, 0.95, cap, prio)
    steps = list(stream(rng, 300))
    pri = rng.random(len(steps)) * 2
    pri[::11] = 0.0
    start = 0
    for k in (1, 7, 0, 64, 3, 100, 125):  # chunks of assorted sizes, empty included
        chunk = steps[start : start + k]
        before = one.add_count
        emitted_one = []
        for j, s in enumerate(chunk):
            a = one.add_count
            one.add(s, priority=float(pri[start + j])) if prio else one.add(s)
            emitted_one.append(one.add_count - a)
        emitted = bulk.add_batch(
            *_columns(chunk)
            if chunk
            else (np.zeros((0, 3, 2), np.uint8), np.zeros(0, np.int64), [], [], []),
            priorities=pri[start : start + k] if prio else None,
        )
        assert emitted.tolist() == emitted_one and one.add_count - before == emitted.sum()
        assert bulk.add_count == one.add_count
        start += k
    assert start == len(steps) and one.add_count > cap
    np.testing.assert_array_equal(one.keys(), bulk.keys())
    assert_same_batch(one.get_elements(one.keys()), bulk.get_elements(bulk.keys()))
    np.testing.assert_array_equal(one.priorities(one.keys()), bulk.priorities(bulk.keys()))
    assert one.max_recorded_priority == bulk.max_recorded_priority
    # Same sampler state: the same draws give the same batches.
    b1, m1 = one.sample(size=9, with_sample_metadata=True)
    b2, m2 = bulk.sample(size=9, with_sample_metadata=True)
    np.testing.assert_array_equal(m1.keys, m2.keys)
    assert_same_batch(b1, b2)
    # The accumulator's partial trajectory is the same too.
    assert str(one.to_state_dict()["transition_accumulator"]["trajectory"]) == str(
        bulk.to_state_dict()["transition_accumulator"]["trajectory"]
    )


def test_add_batch_rejects_bad_input_without_change():
    m = make_memoire(1, 1, 0.9, 20, True)
    obs, act, rew, term, end = _columns(list(stream(np.random.default_rng(0), 5)))
    m.add_batch(obs, act, rew, term, end, priorities=1.0)
    state = str(m.to_state_dict())
    with pytest.raises(ValueError, match="priorities"):
        m.add_batch(obs, act, rew, term, end, priorities=[1.0, 1.0, -1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="one length"):
        m.add_batch(obs[:4], act, rew, term, end, priorities=1.0)
    with pytest.raises(ValueError, match="observations"):
        m.add_batch(np.zeros((5, 4, 2), np.uint8), act, rew, term, end, priorities=1.0)
    with pytest.raises(ValueError, match="is_terminal and episode_end"):
        m.add_batch(obs, act, rew, term[:2], end, priorities=1.0)
    assert str(m.to_state_dict()) == state


def test_sample_count_counts_drawn_transitions():
    m = make_memoire(1, 1, 0.9, 20, False)
    assert m.sample_count == 0
    for s in stream(np.random.default_rng(1), 30):
        m.add(s)
    m.sample()
    m.sample(size=3)
    m.get_elements(m.keys()[:2])  # a read, not a draw
    assert m.sample_count == 8 + 3
    with pytest.raises(ValueError):
        m.sample(size=0)
    assert m.sample_count == 11


def test_saving_a_step_again_replaces_it(tmp_path):
    """A run killed between the replay checkpoint and Dopamine's sentinel resumes at the same
    iteration and saves it again: the new checkpoint must replace the stale one (orbax alone
    would keep the first)."""
    from dopamine.jax.replay_memory import elements

    def filled(n):
        buf = mj.ReplayBuffer(
            mj.TransitionAccumulator(1, 1, 0.99),
            mj.UniformSamplingDistribution(0),
            batch_size=4,
            max_capacity=100,
        )
        for t in range(n):
            buf.add(
                elements.TransitionElement(
                    np.full((4,), t, np.float32), 0, 1.0, t == n - 1, t == n - 1
                )
            )
        return buf

    filled(10).save(str(tmp_path), 3)
    filled(25).save(str(tmp_path), 3)  # a fresh buffer, as in the resumed process
    back = filled(0)
    back.load(str(tmp_path), 3)
    assert back.add_count == filled(25).add_count


@pytest.mark.parametrize("start", [0, 5, 40], ids=["zero", "below_capacity", "past_capacity"])
@pytest.mark.parametrize("prio", [False, True], ids=["uniform", "prioritized"])
def test_add_count_assigned_as_dopamine_reads_it(start, prio):
    """Dopamine's add_count is a plain attribute (its agent tests set 0 to keep an agent from
    training): assigned while nothing is stored it is the next key, and evictions follow the
    count as in Dopamine (past max_capacity each add evicts the oldest). Keys, elements,
    samples and tree leaves stay equal to Dopamine's buffer given the same assignment."""
    cap = 37
    rng = np.random.default_rng(start)
    d = make_dopamine(2, 3, 0.9, cap, prio)
    m = make_memoire(2, 3, 0.9, cap, prio)
    steps = list(stream(rng, 120))
    for b in (d, m):
        b.add(steps[0], **({"priority": 1.0} if prio else {}))  # a partial trajectory only
        assert b.add_count == 0
        b.add_count = start
        assert b.add_count == start
    for t, step in enumerate(steps[1:]):
        kw = {"priority": float(rng.random() * 2)} if prio else {}
        d.add(step, **kw)
        m.add(step, **kw)
        assert d.add_count == m.add_count
        if t % 10 == 9:
            assert_same_contents(d, m)
            if len(d._memory):
                bd, md = d.sample(size=5, with_sample_metadata=True)
                bm, mm = m.sample(size=5, with_sample_metadata=True)
                np.testing.assert_array_equal(md.keys, mm.keys)
                assert_same_batch(bd, bm)
    assert_same_contents(d, m)
    if prio:
        leaves = np.arange(64, dtype=np.int32)
        np.testing.assert_array_equal(
            m._sampling_distribution._sum_tree.get(leaves),
            d._sampling_distribution._sum_tree.get(leaves),
        )
    if start > cap:  # each add evicted the oldest element, the one just added (Dopamine's rule)
        assert len(m) == len(d._memory) == 0
    else:  # stored elements keep their keys: another count would give two elements one key
        with pytest.raises(ValueError, match="add_count can change only while none is"):
            m.add_count = 0
    before = m.keys()
    m.add_count = m.add_count  # its own value: a no-op, as in Dopamine
    np.testing.assert_array_equal(m.keys(), before)
    m.clear()
    d.clear()
    for b in (d, m):
        b.add_count = 3
    for step in steps[:9]:
        kw = {"priority": 1.0} if prio else {}
        d.add(step, **kw)
        m.add(step, **kw)
    assert_same_contents(d, m)
    for bad in (-1, 2**40, 1.5, True):
        with pytest.raises(ValueError, match="add_count: expected an integer"):
            make_memoire(1, 1, 0.9, 10, prio).add_count = bad


def test_sum_tree_get_reads_dopamines_leaves_by_sampler_index():
    """``_sampling_distribution._sum_tree.get`` (what Dopamine's Rainbow tests read) returns
    the leaves Dopamine's tree holds at the same indices: ints and arrays, after evictions
    (which move the last index's leaf) and updates; 0 past the stored elements."""
    cap = 11
    rng = np.random.default_rng(4)
    d = make_dopamine(1, 1, 0.9, cap, True, exponent=1.0)
    m = make_memoire(1, 1, 0.9, cap, True, exponent=1.0)
    md, mm = d._sampling_distribution._sum_tree, m._sampling_distribution._sum_tree
    for t, step in enumerate(stream(rng, 60)):
        p = float(rng.integers(1, 9))
        d.add(step, priority=p)
        m.add(step, priority=p)
        if t % 7 == 6 and len(d._memory):
            keys = np.array(list(d._memory.keys())[:3])
            d.update(keys, priorities=np.array([0.5, 3.0, 7.0]))
            m.update(keys, priorities=np.array([0.5, 3.0, 7.0]))
        every = np.arange(16, dtype=np.int32)
        np.testing.assert_array_equal(mm.get(every), md.get(every))
        assert mm.get(3) == md.get(3) and isinstance(mm.get(3), float)
        np.testing.assert_array_equal(
            mm.get(every[2:5].reshape(3, 1)), md.get(every[2:5]).reshape(3, 1)
        )
    assert mm.root == md.root
    for bad in (-1, 16):
        with pytest.raises(IndexError, match="outside"):
            mm.get(bad)
    with pytest.raises(IndexError, match="integers"):
        mm.get(np.array([0.5]))
