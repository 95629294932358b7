"""memoire.ReplayMemory: API, settings, bad input, eviction, sampling rules and batch contents.

Entries in these tests encode where they are: the state holds the entry's absolute position
(its id) and the info field holds its episode number, so a batch can be checked exactly.
"""

import collections
import math

import numpy as np
import pytest

import memoire

FLOAT = np.float32


def make(max_step=100, reward_shape=(), seed=0):
    """A memory whose state is int64[1] (the entry's position) and info int64[1] (its episode)."""
    rem = memoire.ReplayMemory(
        np.zeros([1], np.int64),
        np.zeros([], FLOAT),
        np.zeros(reward_shape, FLOAT),
        np.zeros([], FLOAT),
        np.zeros(reward_shape, FLOAT),
        np.zeros(reward_shape, FLOAT),
        np.zeros([1], np.int64),
        max_step,
    )
    rem.seed(seed)
    return rem


class Model:
    """Which entries a memory holds: closed episodes as [start, length, terminal], oldest first."""

    def __init__(self, rem):
        self.rem = rem
        self.episodes = collections.deque()
        self.tail = 0
        self.next_episode = 0

    def add_episode(self, length, init_w=None, terminal=True, **close_kwargs):
        rem = self.rem
        rshape = rem.reward_buf.shape
        pos = np.arange(self.tail, self.tail + length, dtype=np.int64)
        w = np.ones(length, FLOAT) if init_w is None else np.asarray(init_w, FLOAT)
        rem.new_episode()
        rem.add_entries(
            pos[:, None],
            pos.astype(FLOAT),
            np.ones((length,) + rshape, FLOAT),
            np.zeros(length, FLOAT),
            np.zeros((length,) + rshape, FLOAT),
            np.full((length, 1), self.next_episode, np.int64),
            w,
        )
        rem.close_episode(terminal=terminal, **close_kwargs)
        self.episodes.append([self.tail, length, terminal, self.next_episode, w])
        self.tail += length
        self.next_episode += 1
        self.evict()

    def evict(self):
        rem = self.rem
        while self.episodes and self.tail - self.episodes[0][0] > rem.max_step:
            self.episodes.popleft()
        while rem.max_episode and len(self.episodes) > rem.max_episode:
            self.episodes.popleft()

    @property
    def size(self):
        return self.tail - self.episodes[0][0] if self.episodes else 0

    def sampleable(self):
        fs, ms = self.rem.frame_stack, self.rem.multi_step
        out = set()
        for start, length, _, _, w in self.episodes:
            for k in range(fs - 1, length - ms):
                if w[k] > 0:
                    out.add(start + k)
        return out

    def check(self):
        assert self.rem.num_episode() == len(self.episodes)
        assert self.rem.size == self.size
        assert self.rem.num_sampleable == len(self.sampleable())


def snapshot(rem):
    """Counts and one batch drawn with a fixed seed: equal snapshots mean an unchanged memory."""
    counts = (
        rem.num_episode(),
        rem.size,
        rem.num_sampleable,
        rem.total_weight,
        rem.episode_open,
        rem.open_length,
        rem.total_added,
    )
    if rem.num_sampleable == 0:
        return counts, None
    rem.seed(1234)
    b = rem.get_batch(16)
    rem.seed(0)
    arrays = [None if x is None else x.tolist() for x in b.prev + b.next]
    return counts, (b.id.tolist(), b.weight.tolist(), b.prob.tolist(), b.done.tolist(), arrays)


# ------------------------------------------------------------------ constructors and properties


def test_memoire_api_constructor_and_read_only_properties():
    rem = memoire.ReplayMemory(
        np.zeros([3, 2], np.uint8),
        np.zeros([2], np.int32),
        np.zeros([2], FLOAT),
        np.zeros([], FLOAT),
        np.zeros([2], FLOAT),
        np.zeros([2], FLOAT),
        np.zeros([5], np.int16),
        max_step=13,
    )
    for name, shape, dtype in [
        ("state_buf", (3, 2), np.uint8),
        ("action_buf", (2,), np.int32),
        ("reward_buf", (2,), FLOAT),
        ("prob_buf", (), FLOAT),
        ("value_buf", (2,), FLOAT),
        ("qvest_buf", (2,), FLOAT),
        ("info_buf", (5,), np.int16),
    ]:
        buf = getattr(rem, name)
        assert buf.shape == shape and buf.dtype == dtype, name
        assert np.all(buf == 0), name
        with pytest.raises(AttributeError):
            setattr(rem, name, buf)
    assert rem.entry_size == 6 + 8 + 8 + 4 + 8 + 8 + 10
    assert rem.max_step == 13 and rem.capacity == 13
    with pytest.raises(AttributeError):
        rem.max_step = 5
    with pytest.raises(AttributeError):
        rem.entry_size = 5
    assert rem.memory_bytes >= 13 * rem.entry_size
    assert isinstance(rem.uuid, int)
    assert (rem.state_size, rem.action_size, rem.reward_size, rem.prob_size, rem.value_size) == (
        6,
        2,
        2,
        1,
        2,
    )


def test_older_constructor_positional_and_keyword():
    for rem in (
        memoire.ReplayMemory(4, 2, 3, 1, 3, 100),
        memoire.ReplayMemory(
            state_size=4, action_size=2, reward_size=3, prob_size=1, value_size=3, capacity=100
        ),
    ):
        assert rem.state_buf.dtype == np.uint8 and rem.state_buf.shape == (4,)
        assert rem.action_buf.dtype == FLOAT and rem.action_buf.shape == (2,)
        assert rem.reward_buf.shape == (3,) and rem.value_buf.shape == (3,)
        assert rem.prob_buf.shape == () and rem.info_buf.shape == (0,)
        assert rem.capacity == 100 and rem.entry_size == 4 + 8 + 12 + 4 + 12 + 12
        # The older API's add_entry(s, a, r, p, v, init_w).
        rem.new_episode()
        rem.add_entry(
            np.arange(4, dtype=np.uint8),
            np.zeros(2, FLOAT),
            np.ones(3, FLOAT),
            0.5,
            np.zeros(3, FLOAT),
            2.0,
        )
        rem.add_entry(
            np.arange(4, dtype=np.uint8),
            np.zeros(2, FLOAT),
            np.ones(3, FLOAT),
            0.5,
            np.zeros(3, FLOAT),
            2.0,
        )
        rem.close_episode()
        assert rem.num_episode() == 1
        b = rem.get_batch(3)
        np.testing.assert_array_equal(b.weight, [2.0, 2.0, 2.0])
        np.testing.assert_array_equal(b.prev[0][:, 0], np.tile(np.arange(4), (3, 1)))
        np.testing.assert_array_equal(b.prev[3][:, 0], [0.5] * 3)


@pytest.mark.parametrize("prob_size", [0, 1, 3])
def test_older_constructor_any_prob_size(prob_size):
    # The older constructor leaves prob_size free: 0 (no prob), 1 (a scalar, the memoire API's
    # layout) or a vector.
    rem = memoire.ReplayMemory(4, 2, 1, prob_size, 1, 20)
    assert rem.prob_size == prob_size
    assert rem.prob_buf.shape == (() if prob_size == 1 else (prob_size,))
    assert rem.entry_size == 4 + 8 + 4 + 4 * prob_size + 4 + 4
    p = np.arange(prob_size, dtype=FLOAT) if prob_size != 1 else 0.25
    rem.new_episode()
    for k in range(3):
        rem.add_entry(
            np.full(4, k, np.uint8),
            np.zeros(2, FLOAT),
            np.ones(1, FLOAT),
            p,
            np.zeros(1, FLOAT),
            1.0,
        )
    rem.close_episode()
    b = rem.get_batch(4)
    assert b.prev[3].shape == (4, 1) + rem.prob_buf.shape
    np.testing.assert_array_equal(b.prev[3], np.broadcast_to(np.asarray(p, FLOAT), b.prev[3].shape))
    with pytest.raises(ValueError):  # a prob of another size is rejected
        rem.new_episode()
        rem.add_entry(
            np.zeros(4, np.uint8),
            np.zeros(2, FLOAT),
            np.ones(1, FLOAT),
            np.zeros(prob_size + 2, FLOAT),
            np.zeros(1, FLOAT),
            1.0,
        )


def test_uuids_differ():
    assert len({make(10).uuid for _ in range(8)}) == 8


@pytest.mark.parametrize(
    "templates, match",
    [
        (dict(r=np.zeros([2], np.int32)), "reward_buf"),
        (dict(p=np.zeros([2], FLOAT)), "prob_buf"),
        (dict(v=np.zeros([3], FLOAT)), "value_buf"),
        (dict(q=np.zeros([2], np.float64)), "qvest_buf"),
        (dict(s=np.zeros([2], np.complex64)), "state_buf"),
        (dict(s="not an array"), "state_buf"),
        (
            dict(s=np.float32),
            r"^state_buf: expected an array template \(`np.zeros\(shape, dtype\)`\), "
            r"got the type numpy.float32$",
        ),
        (dict(r=np.dtype(FLOAT)), "^reward_buf: expected an array template .* got the dtype"),
    ],
)
def test_bad_templates_raise(templates, match):
    t = dict(
        s=np.zeros([2], np.uint8),
        a=np.zeros([], FLOAT),
        r=np.zeros([2], FLOAT),
        p=np.zeros([], FLOAT),
        v=np.zeros([2], FLOAT),
        q=np.zeros([2], FLOAT),
        i=np.zeros([0], np.uint8),
    )
    t.update(templates)
    with pytest.raises(ValueError, match=match):
        memoire.ReplayMemory(*t.values(), 10)


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="max_step"):
        make(0)
    with pytest.raises(ValueError, match="prob_size"):
        memoire.ReplayMemory(4, 1, 1, -1, 1, 10)
    with pytest.raises(ValueError, match="value_size"):
        memoire.ReplayMemory(4, 1, 2, 1, 1, 10)


def test_settings_defaults():
    rem = make(50, reward_shape=(2,))
    assert rem.priority_exponent == 0.0
    assert rem.priority_epsilon == pytest.approx(1e-6)
    assert rem.mix_lambda == pytest.approx(0.95) and rem.td_lambda == pytest.approx(0.95)
    assert rem.frame_stack == 1 and rem.multi_step == 1
    assert rem.cache_size == 128 and rem.max_episode == 0 and rem.reuse_cache is False
    np.testing.assert_allclose(rem.discount_factor, [0.99, 0.99])
    np.testing.assert_array_equal(rem.reward_coeff, [1.0, 1.0])
    np.testing.assert_array_equal(rem.rwd_coeff, [1.0, 1.0])
    assert rem.cache_flags.dtype == bool and rem.cache_flags.shape == (14,)
    assert rem.cache_flags.all()


# (name, a valid value, its read-back, invalid values)
SETTINGS = [
    ("priority_exponent", 0.6, 0.6, [-0.1, math.nan, math.inf]),
    ("priority_epsilon", 0.01, 0.01, [-1e-3, math.nan]),
    ("mix_lambda", 0.5, 0.5, [-0.1, 1.1, math.nan]),
    ("td_lambda", 0.25, 0.25, [2.0]),
    ("frame_stack", 4, 4, [0, -1, 2000, 50]),  # 50 + multi_step > max_step
    ("multi_step", 3, 3, [0, -2, 50]),
    ("cache_size", 7, 7, [0, -1]),
    ("max_episode", 9, 9, [-1]),
    (
        "discount_factor",
        [0.9, 0.5],
        [0.9, 0.5],
        [[0.9, 0.5, 0.1], 1.5, -0.1, math.nan, [0.9, math.nan]],
    ),
    ("discount_factor", 0.7, [0.7, 0.7], []),
    ("reward_coeff", [1.0, -2.0], [1.0, -2.0], [[1.0, 2.0, 3.0], math.nan, math.inf]),
    ("rwd_coeff", 3.0, [3.0, 3.0], [[math.inf, 1.0]]),
    ("cache_flags", [True] * 7 + [False] * 7, [True] * 7 + [False] * 7, [[True] * 13, [True] * 15]),
]


@pytest.mark.parametrize(
    "name, good, readback, bads", SETTINGS, ids=[s[0] + str(k) for k, s in enumerate(SETTINGS)]
)
def test_settings_read_write_and_reject(name, good, readback, bads):
    rem = make(50, reward_shape=(2,))
    model = Model(rem)
    model.add_episode(20)
    setattr(rem, name, good)
    np.testing.assert_allclose(
        np.asarray(getattr(rem, name), np.float64), np.asarray(readback, np.float64), rtol=1e-6
    )
    others = {n: np.asarray(getattr(rem, n)).tolist() for n, *_ in SETTINGS}
    before = snapshot(rem)
    for bad in bads:
        with pytest.raises(
            ValueError,
            match=name.replace("td_lambda", "mix_lambda")
            .replace("rwd_coeff", "reward_coeff")
            .split("_")[0],
        ):
            setattr(rem, name, bad)
        np.testing.assert_allclose(
            np.asarray(getattr(rem, name), np.float64), np.asarray(readback, np.float64), rtol=1e-6
        )
        assert {n: np.asarray(getattr(rem, n)).tolist() for n, *_ in SETTINGS} == others
        assert snapshot(rem) == before


def test_reuse_cache_round_trips():
    rem = make(10)
    rem.reuse_cache = True
    assert rem.reuse_cache is True
    rem.reuse_cache = False
    assert rem.reuse_cache is False


# ------------------------------------------------------------------ episodes


def add(rem, pos, ep=0, w=1.0, r=1.0, v=0.0):
    rem.add_entry(np.array([pos], np.int64), float(pos), r, 0.0, v, np.array([ep], np.int64), w)


def test_episode_lifecycle_counts(capsys):
    rem = make(20)
    assert rem.num_episode() == 0 and rem.size == 0 and not rem.episode_open
    rem.new_episode()
    assert rem.episode_open and rem.num_episode() == 0
    for k in range(5):
        add(rem, k)
    assert rem.num_episode() == 0 and rem.size == 5 and rem.open_length == 5
    assert rem.num_sampleable == 0  # an open episode is never sampled
    # A second new_episode discards the open entries.
    rem.new_episode()
    assert rem.size == 0 and rem.open_length == 0 and rem.total_added == 0
    for k in range(4):
        add(rem, k)
    rem.close_episode()
    assert rem.num_episode() == 1 and rem.size == 4 and not rem.episode_open
    assert rem.num_sampleable == 3 and rem.total_added == 4
    assert len(rem) == 4
    rem.print_info()
    out = capsys.readouterr().out
    assert "max_step=20" in out and "episodes=1" in out and "stored=4" in out
    assert "ReplayMemory(max_step=20, episodes=1, stored=4, sampleable=3)" == repr(rem)


def test_add_entry_casts_same_kind_values():
    rem = make(10)
    rem.new_episode()
    rem.add_entry([7], 1, 2, 3, 4, [5], 1)  # Python ints into int64 and float32
    rem.add_entry(np.array([8], np.int32), np.float64(1.5), 2, 3, 4, np.array([5], np.uint8))
    rem.close_episode()
    b = rem.get_batch(1)
    assert b.id[0] == 0 and b.prev[0][0, 0, 0] == 7 and b.next[0][0, 0, 0] == 8
    assert b.prev[1][0, 0] == 1.0 and b.next[1][0, 0] == 1.5


BAD_ADDS = [
    (
        "wrong state shape",
        lambda rem: rem.add_entry(
            np.zeros([2], np.int64), 0.0, 0.0, 0.0, 0.0, np.zeros([1], np.int64)
        ),
        ValueError,
        "s:",
    ),
    (
        "wrong reward shape",
        lambda rem: rem.add_entry(
            np.zeros([1], np.int64), 0.0, [0.0, 1.0], 0.0, 0.0, np.zeros([1], np.int64)
        ),
        ValueError,
        "r:",
    ),
    (
        "float state into int64",
        lambda rem: rem.add_entry(
            np.zeros([1], np.float64), 0.0, 0.0, 0.0, 0.0, np.zeros([1], np.int64)
        ),
        ValueError,
        "same_kind",
    ),
    (
        "complex reward",
        lambda rem: rem.add_entry(
            np.zeros([1], np.int64), 0.0, 1j, 0.0, 0.0, np.zeros([1], np.int64)
        ),
        ValueError,
        "r:",
    ),
    (
        "string action",
        lambda rem: rem.add_entry(
            np.zeros([1], np.int64), "x", 0.0, 0.0, 0.0, np.zeros([1], np.int64)
        ),
        ValueError,
        "a:",
    ),
    ("nan init_w", lambda rem: add(rem, 99, w=math.nan), ValueError, "init_w"),
    ("negative init_w", lambda rem: add(rem, 99, w=-1.0), ValueError, "init_w"),
    ("inf init_w", lambda rem: add(rem, 99, w=math.inf), ValueError, "init_w"),
    (
        "add_entries lengths differ",
        lambda rem: rem.add_entries(
            np.zeros([3, 1], np.int64),
            np.zeros(2, FLOAT),
            np.zeros(3, FLOAT),
            np.zeros(3, FLOAT),
            np.zeros(3, FLOAT),
            np.zeros([3, 1], np.int64),
            np.ones(3, FLOAT),
        ),
        ValueError,
        "a:",
    ),
    (
        "add_entries one nan weight",
        lambda rem: rem.add_entries(
            np.zeros([3, 1], np.int64),
            np.zeros(3, FLOAT),
            np.zeros(3, FLOAT),
            np.zeros(3, FLOAT),
            np.zeros(3, FLOAT),
            np.zeros([3, 1], np.int64),
            np.array([1, math.nan, 1], FLOAT),
        ),
        ValueError,
        "init_w",
    ),
    (
        "add_entries weight count",
        lambda rem: rem.add_entries(
            np.zeros([3, 1], np.int64),
            np.zeros(3, FLOAT),
            np.zeros(3, FLOAT),
            np.zeros(3, FLOAT),
            np.zeros(3, FLOAT),
            np.zeros([3, 1], np.int64),
            np.ones(2, FLOAT),
        ),
        ValueError,
        "init_w",
    ),
    ("negative multiplier", lambda rem: rem.close_episode(-1.0), ValueError, "multiplier"),
    ("nan multiplier", lambda rem: rem.close_episode(math.nan), ValueError, "multiplier"),
]


@pytest.mark.parametrize("what, call, exc, match", BAD_ADDS, ids=[b[0] for b in BAD_ADDS])
def test_bad_input_in_open_episode_changes_nothing(what, call, exc, match):
    rem = make(30)
    model = Model(rem)
    model.add_episode(10)
    model.add_episode(6)
    rem.new_episode()
    for k in range(3):
        add(rem, 16 + k, ep=2)
    before = snapshot(rem)
    with pytest.raises(exc, match=match):
        call(rem)
    assert snapshot(rem) == before
    # The open episode goes on as if nothing happened.
    add(rem, 19, ep=2)
    rem.close_episode()
    assert rem.num_episode() == 3 and rem.size == 20


def test_wrong_state_errors_change_nothing():
    rem = make(30)
    Model(rem).add_episode(10)
    before = snapshot(rem)
    with pytest.raises(RuntimeError, match="new_episode"):
        add(rem, 10)  # no open episode
    with pytest.raises(RuntimeError, match="no open episode"):
        rem.close_episode()  # the episode was closed already
    with pytest.raises(ValueError, match="batch_size"):
        rem.get_batch(0)
    with pytest.raises(ValueError, match="batch_size"):
        rem.get_batch(-3)
    assert snapshot(rem) == before
    rem.new_episode()
    opened = snapshot(rem)
    with pytest.raises(RuntimeError, match="no entries"):
        rem.close_episode()
    assert snapshot(rem) == opened and rem.episode_open


def test_sampling_an_empty_memory_raises():
    rem = make(10)
    with pytest.raises(RuntimeError, match="no sampleable entry"):
        rem.get_batch(4)
    rem.new_episode()
    add(rem, 0)
    rem.close_episode()  # one entry: nothing has a next entry
    assert rem.num_episode() == 1 and rem.num_sampleable == 0
    with pytest.raises(RuntimeError, match="no sampleable entry"):
        rem.get_batch(4)


# ------------------------------------------------------------------ eviction


@pytest.mark.parametrize("capacity", [7, 13, 100])
def test_eviction_of_oldest_episodes_at_max_step(capacity):
    rem = make(capacity)
    model = Model(rem)
    rng = np.random.default_rng(capacity)
    for _ in range(60):
        model.add_episode(int(rng.integers(1, capacity + 1)))
        model.check()
        if rem.num_sampleable:
            ids = rem.get_batch(64).id
            assert set(ids.tolist()) <= model.sampleable()


@pytest.mark.parametrize("capacity", [7, 13, 100])
def test_eviction_at_max_episode(capacity):
    rem = make(capacity)
    rem.max_episode = 3
    model = Model(rem)
    for k in range(40):
        model.add_episode(1 + k % 3)
        model.check()
        assert rem.num_episode() <= 3
    rem.max_episode = 0  # no limit: the ring alone decides
    for _ in range(20):
        model.add_episode(2)
        model.check()


def test_lowering_max_episode_evicts_at_once():
    rem = make(100)
    model = Model(rem)
    for _ in range(6):
        model.add_episode(4)
    rem.max_episode = 2
    model.evict()
    model.check()
    assert rem.num_episode() == 2 and rem.size == 8


def test_open_episode_evicts_as_it_grows():
    rem = make(13)
    model = Model(rem)
    for _ in range(3):
        model.add_episode(4)  # 12 of 13 slots
    rem.new_episode()
    add(rem, 12, ep=3)
    assert rem.num_episode() == 3 and rem.size == 13
    add(rem, 13, ep=3)  # needs a slot: the oldest episode goes
    assert rem.num_episode() == 2 and rem.size == 10
    rem.close_episode()
    assert rem.num_episode() == 3


def test_episode_longer_than_memory_raises_capacity_error():
    rem = make(7)
    model = Model(rem)
    model.add_episode(3)
    rem.new_episode()
    for k in range(7):
        add(rem, 3 + k, ep=1)
    before = snapshot(rem)
    with pytest.raises(memoire.CapacityError, match="max_step=7"):
        add(rem, 10, ep=1)
    assert issubclass(memoire.CapacityError, ValueError)
    assert snapshot(rem) == before and rem.open_length == 7
    rem.close_episode()  # exactly max_step entries is fine
    assert rem.num_episode() == 1 and rem.size == 7 and rem.num_sampleable == 6
    rem.new_episode()
    with pytest.raises(memoire.CapacityError):
        rem.add_entries(
            np.zeros([8, 1], np.int64),
            np.zeros(8, FLOAT),
            np.zeros(8, FLOAT),
            np.zeros(8, FLOAT),
            np.zeros(8, FLOAT),
            np.zeros([8, 1], np.int64),
            np.ones(8, FLOAT),
        )
    assert rem.open_length == 0 and rem.num_episode() == 1  # nothing was added or evicted


# ------------------------------------------------------------------ sampling rules


@pytest.mark.parametrize("capacity", [13, 100])
def test_unsampleable_entries_are_never_sampled(capacity):
    rem = make(capacity)
    rem.frame_stack = 3
    rem.multi_step = 2
    model = Model(rem)
    rng = np.random.default_rng(5)
    for _ in range(30):
        length = int(rng.integers(1, 9))
        w = rng.choice([0.0, 1.0, 2.5], size=length, p=[0.3, 0.4, 0.3]).astype(FLOAT)
        model.add_episode(length, init_w=w)
        model.check()
        good = model.sampleable()
        if not good:
            with pytest.raises(RuntimeError):
                rem.get_batch(8)
            continue
        ids = set(rem.get_batch(400).id.tolist())
        assert ids <= good
        assert ids == good  # 400 stratified draws over <= 13 entries reach every one


def test_changing_frame_stack_and_multi_step_rederives_sampleable():
    rem = make(100)
    model = Model(rem)
    for length in (3, 5, 8):
        model.add_episode(length)
    for fs, ms in [(1, 1), (3, 1), (1, 4), (4, 3), (2, 2), (1, 1)]:
        rem.frame_stack, rem.multi_step = fs, ms
        model.check()
        assert set(rem.get_batch(300).id.tolist()) == model.sampleable()


def test_same_seed_same_batches_different_seed_differs():
    def run(seed):
        rem = make(50, seed=seed)
        model = Model(rem)
        for k in range(8):
            model.add_episode(5 + k, init_w=np.linspace(0.1, 2, 5 + k))
        return [rem.get_batch(32) for _ in range(5)]

    a, b, c = run(7), run(7), run(8)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.id, y.id)
        np.testing.assert_array_equal(x.prev[0], y.prev[0])
        np.testing.assert_array_equal(x.weight, y.weight)
    assert any((x.id != z.id).any() for x, z in zip(a, c))


def test_seed_resets_the_stream():
    rem = make(50)
    Model(rem).add_episode(30)
    rem.seed(3)
    first = rem.get_batch(16).id
    rem.seed(3)
    np.testing.assert_array_equal(rem.get_batch(16).id, first)


def test_update_weights_skips_stale_ids():
    rem = make(13)
    rem.frame_stack = 2
    model = Model(rem)
    model.add_episode(6)  # ids 0..5, sampleable 1..4
    model.add_episode(6)  # ids 6..11, sampleable 7..10
    assert rem.update_weights([1, 2, 7], [0.0, 3.0, 5.0]) == 3
    assert rem.num_sampleable == 7
    assert rem.total_weight == pytest.approx((3 + 1 + 1) + (5 + 1 + 1 + 1))
    ids = set(rem.get_batch(200).id.tolist())
    assert 1 not in ids and {2, 7} <= ids
    # Not sampleable (first of a stack, last entry), negative, future, open: skipped.
    assert rem.update_weights([0, 5, 6, 11, -1, 12, 999], np.ones(7)) == 0
    rem.new_episode()
    add(rem, 12, ep=2)
    assert rem.update_weights([12], [1.0]) == 0
    rem.close_episode()
    model.episodes.append([12, 1, True, 2, np.ones(1, FLOAT)])
    model.tail = 13
    model.add_episode(6)  # ids 13..18: evicts the episode of ids 0..5
    assert rem.update_weights([2, 3, 8, 14], [9.0, 9.0, 9.0, 9.0]) == 2  # 2, 3 are stale
    assert rem.update_weights([8], [1.0]) == 1  # a stale id never lands in a reused slot
    with pytest.raises(ValueError, match="weights"):
        rem.update_weights([8, 9], [1.0, math.nan])
    with pytest.raises(ValueError, match="one length"):
        rem.update_weights([8, 9], [1.0])
    b = rem.get_batch(500)
    assert set(b.id.tolist()) <= model.sampleable()
    np.testing.assert_array_equal(b.weight[b.id == 14], 9.0)


def test_weight_overflowing_float32_is_not_sampled_as_infinite():
    rem = make(20)
    rem.new_episode()
    for k in range(4):
        add(rem, k, w=3e38)
    rem.close_episode(episodic_weight_multiplier=10.0)  # 3e39 does not fit a float32
    assert math.isfinite(rem.total_weight)
    rem.new_episode()
    for k in range(4):
        add(rem, 4 + k, ep=1)
    rem.close_episode()
    b = rem.get_batch(64)
    assert np.isfinite(b.weight).all() and np.isfinite(b.prob).all()
    assert set(b.id.tolist()) <= {0, 1, 2, 4, 5, 6}


# ------------------------------------------------------------------ batch contents


@pytest.mark.parametrize(
    "capacity, fs, ms", [(13, 1, 1), (13, 4, 1), (13, 3, 2), (7, 2, 3), (100, 4, 3)]
)
def test_batch_stacks_encode_positions_across_ring_wrap(capacity, fs, ms):
    rem = make(capacity)
    rem.frame_stack, rem.multi_step = fs, ms
    model = Model(rem)
    rng = np.random.default_rng(capacity * 10 + fs)
    wrapped = False
    for _ in range(25):
        model.add_episode(int(rng.integers(1, capacity // 2 + 2)), terminal=bool(rng.integers(2)))
        wrapped |= model.tail > capacity
        if not model.sampleable():
            continue
        b = rem.get_batch(64)
        ids = b.id
        ep_of = {}
        for start, length, terminal, ep, _ in model.episodes:
            for p in range(start, start + length):
                ep_of[p] = (ep, start + length - 1, terminal)
        offsets = np.arange(fs) - (fs - 1)
        prev_s = b.prev[0][:, :, 0]
        next_s = b.next[0][:, :, 0]
        np.testing.assert_array_equal(prev_s, ids[:, None] + offsets)
        np.testing.assert_array_equal(next_s, prev_s + ms)
        np.testing.assert_array_equal(b.prev[1], prev_s.astype(FLOAT))  # action = position
        eps = np.array([ep_of[p][0] for p in ids])
        np.testing.assert_array_equal(b.prev[6][:, :, 0], np.repeat(eps[:, None], fs, 1))
        np.testing.assert_array_equal(b.next[6][:, :, 0], np.repeat(eps[:, None], fs, 1))
        done = np.array([ids[k] + ms == ep_of[p][1] and ep_of[p][2] for k, p in enumerate(ids)])
        np.testing.assert_array_equal(b.done, done)
        for name in ("prev", "next"):
            for arr, field in zip(getattr(b, name), ("s", "a", "r", "p", "v", "q", "i")):
                assert arr.shape[:2] == (64, fs), field
    assert wrapped


def test_batch_shapes_dtypes_and_cache_flags():
    rem = memoire.ReplayMemory(
        np.zeros([3, 2], np.uint8),
        np.zeros([2], np.int32),
        np.zeros([2], FLOAT),
        np.zeros([], FLOAT),
        np.zeros([2], FLOAT),
        np.zeros([2], FLOAT),
        np.zeros([5], np.int16),
        max_step=13,
    )
    rem.frame_stack = 2
    rem.new_episode()
    for k in range(5):
        rem.add_entry(
            np.full([3, 2], k, np.uint8), [k, -k], [1, 2], 0.5, [0, 0], np.full([5], k, np.int16)
        )
    rem.close_episode()
    b = rem.get_batch(6)
    prev, nxt, weight = b  # the seed's (prev, next, weight)
    assert len(b) == 6 and weight.dtype == FLOAT and b.prob.dtype == np.float64
    assert b.done.dtype == bool and b.id.dtype == np.int64
    for arr, tmpl in zip(
        prev,
        (
            rem.state_buf,
            rem.action_buf,
            rem.reward_buf,
            rem.prob_buf,
            rem.value_buf,
            rem.qvest_buf,
            rem.info_buf,
        ),
    ):
        assert arr.dtype == tmpl.dtype and arr.shape == (6, 2) + tmpl.shape
    np.testing.assert_array_equal(nxt[1][:, -1, 0], b.id + 1)
    np.testing.assert_allclose(b.prob, 1 / 3)
    iw = b.importance_weights(0.5, rem.num_sampleable)
    assert iw.dtype == FLOAT and iw.max() == pytest.approx(1.0)
    flags = np.ones(14, bool)
    flags[[0, 6, 7 + 2]] = False
    rem.cache_flags = flags
    b = rem.get_batch(4)
    assert b.prev[0] is None and b.prev[6] is None and b.next[2] is None
    assert b.prev[1] is not None and b.next[0] is not None


_FORK_SCRIPT = """
import os, sys, time
import numpy as np
import memoire

f32 = np.float32
rem = memoire.ReplayMemory(
    np.zeros((64, 64), np.uint8), *(np.zeros([], f32) for _ in range(5)),
    np.zeros([1], np.int64), 2000)
rem.frame_stack = 4
n = 1000
rem.new_episode()
rem.add_entries(
    np.repeat((np.arange(n) % 256).astype(np.uint8), 64 * 64).reshape(n, 64, 64),
    *(np.zeros(n, f32) for _ in range(4)), np.zeros((n, 1), np.int64),
    np.r_[np.zeros(3), np.ones(n - 3)].astype(f32))  # no stack reaches before the start
rem.close_episode()

def check(batch):  # 64 * 4 * 4096 * 2 bytes of stacks: the helper copies half
    frames = batch.prev[0].reshape(64, 4, -1)
    assert np.all(frames == frames[:, :, :1])  # each frame one entry's
    assert np.all(np.diff(frames[:, :, 0].astype(int), axis=1) % 256 == 1)  # consecutive

check(rem.get_batch(64))
pid = os.fork()
if pid == 0:
    code = 1
    try:
        check(rem.get_batch(64)); check(rem.get_batch(64)); code = 0
    finally:
        os._exit(code)
deadline = time.monotonic() + 60
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        sys.exit("the forked child's sample hung")
    time.sleep(0.05)
if os.waitstatus_to_exitcode(status) != 0:
    sys.exit("the forked child's batches were wrong")
check(rem.get_batch(64))  # the parent's helper still serves
"""


def test_large_batches_sample_after_a_fork(tmp_path):
    # A batch over 512 KiB is copied with the memory's parked helper thread. A forked child
    # (an actor started with fork after the parent sampled) has no such thread: it must start
    # its own, not wait forever on its parent's. Frames are their entry's position mod 256.
    # In a fresh interpreter: this process has other libraries' threads, which fork upsets.
    import subprocess
    import sys

    r = subprocess.run(  # away from the source tree, which has no built extension
        [sys.executable, "-c", _FORK_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
