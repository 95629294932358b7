"""Compressed states (ReplayMemory's compress_states): every read path returns the bytes that
were added, bit for bit (batches, feeds, sampling streams, caches, checkpoints), across ring
wrap-around and eviction; memory follows what the states compress to; bad values are
refused."""

import numpy as np
import pytest
import zmq
from _batches import assert_same_batch
from _waiting import wait_until

from memoire import ReplayMemory, ReplayMemoryServer
from memoire.checkpoint_io import CheckpointError
from memoire.transport import native_libzmq

FRAME = (24, 20)  # small Atari-like frames
MAX_STEP = 150
# 17 episodes, 590 entries: the 150-slot ring wraps about four times, evicting as it goes.
EPISODES = (40, 7, 60, 3, 25, 50, 33, 12, 70, 18, 41, 9, 55, 30, 64, 21, 52)


def _templates(frame=FRAME):
    return (
        np.zeros(frame, np.uint8),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([2], np.int16),
    )


def _frames(rng, steps, noise, frame=FRAME):
    """Atari-like frames (a flat background, a band, a moving block); with `noise`, every third
    frame is random bytes (stored raw: it does not compress)."""
    f = np.full((steps,) + frame, 40, np.uint8)
    f[:, frame[0] - 4 : frame[0] - 2, :] = 120
    for k in range(steps):
        r, c = rng.integers(0, frame[0] - 4), rng.integers(0, frame[1] - 4)
        f[k, r : r + 4, c : c + 4] = rng.integers(150, 255)
        if noise and k % 3 == 0:
            f[k] = rng.integers(0, 256, frame, dtype=np.uint8)
    return f


def _fill(rem, episodes=EPISODES, seed=1, noise=True, frame=FRAME):
    """The same episodes into any memory."""
    rng = np.random.default_rng(seed)
    for k, steps in enumerate(episodes):
        rem.new_episode()
        rem.add_entries(
            _frames(rng, steps, noise, frame),
            rng.integers(0, 6, steps),
            rng.normal(size=steps).astype(np.float32),
            rng.random(steps).astype(np.float32),
            rng.normal(size=steps).astype(np.float32),
            rng.integers(-9, 9, (steps, 2)).astype(np.int16),
            (rng.random(steps) + 0.1).astype(np.float32),
        )
        rem.close_episode(terminal=bool(k % 2))


def _configure(rem, frame_stack=4, multi_step=1, flags=None, max_episode=0):
    rem.frame_stack = frame_stack
    rem.multi_step = multi_step
    rem.priority_exponent = 0.6
    rem.max_episode = max_episode
    if flags is not None:
        rem.cache_flags = flags


def _pair(seed=7, **settings):
    """A compressed memory and a raw one, the same settings, contents and generator state."""
    out = []
    for compress in (True, False):
        rem = ReplayMemory(*_templates(), MAX_STEP, compress_states=compress)
        rem.seed(seed)
        _configure(rem, **settings)
        _fill(rem)
        out.append(rem)
    return out


SETTINGS = [
    dict(frame_stack=4, multi_step=1),  # Atari: overlapping stacks
    dict(frame_stack=3, multi_step=5),  # next does not overlap prev
    dict(frame_stack=1, multi_step=1),
    dict(frame_stack=2, multi_step=1, flags=[1, 0, 1, 0, 1, 0, 1, 0, 0, 1, 1, 1, 0, 0]),
    dict(frame_stack=4, multi_step=2, flags=[0] * 7 + [1] * 7),  # next only
    dict(frame_stack=4, multi_step=1, max_episode=3),  # evicted by episode count
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_compressed_and_raw_memories_sample_the_same_batches(settings):
    packed, raw = _pair(**settings)
    assert packed.compress_states and not raw.compress_states
    assert packed.size == raw.size and packed.num_sampleable == raw.num_sampleable
    assert packed.total_added == sum(EPISODES)  # the ring wrapped: most entries were evicted
    for batch_size in (1, 16, 200):  # 200: the copy is split across two threads
        for _ in range(5):
            assert_same_batch(packed.get_batch(batch_size), raw.get_batch(batch_size))
    # Priority updates keep them in step; then more episodes evict and overwrite slots.
    b = raw.get_batch(32)
    assert_same_batch(packed.get_batch(32), b)  # (both generators step)
    w = np.linspace(0.1, 3, 32).astype(np.float32)
    assert packed.update_weights(b.id, w) == raw.update_weights(b.id, w)
    _fill(packed, episodes=(33, 61, 5), seed=9)
    _fill(raw, episodes=(33, 61, 5), seed=9)
    for _ in range(5):
        assert_same_batch(packed.get_batch(64), raw.get_batch(64))


def test_an_open_episode_discarded_and_rewritten_reads_back_exactly():
    packed, raw = _pair()
    rng = np.random.default_rng(3)
    frames, rows = _frames(rng, 30, False), _rows(rng, 30)
    for rem in (packed, raw):
        rem.new_episode()
        rem.add_entries(frames, *rows)
    with_open = packed.stored_state_bytes
    for rem in (packed, raw):
        rem.new_episode()  # discards the 30 entries; their positions are written again
    assert packed.stored_state_bytes < with_open  # their blocks were freed
    _fill(packed, episodes=(20,), seed=4)
    _fill(raw, episodes=(20,), seed=4)
    assert packed.size == raw.size
    for _ in range(5):
        assert_same_batch(packed.get_batch(16), raw.get_batch(16))


def _rows(rng, steps):
    return (
        rng.integers(0, 6, steps),
        rng.normal(size=steps).astype(np.float32),
        rng.random(steps).astype(np.float32),
        rng.normal(size=steps).astype(np.float32),
        rng.integers(-9, 9, (steps, 2)).astype(np.int16),
        np.ones(steps, np.float32),
    )


def test_single_adds_and_odd_state_dtypes_round_trip():
    # add_entry one row at a time; float32 states of an odd size; a state of no bytes.
    for template in (np.zeros([5, 3], np.float32), np.zeros([0], np.uint8)):
        rems = [
            ReplayMemory(template, *_templates()[1:], 40, compress_states=c) for c in (True, False)
        ]
        rng = np.random.default_rng(0)
        for rem in rems:
            rem.seed(1)
            rem.frame_stack = 2
        for e in range(6):
            rows = [
                np.round(rng.normal(size=template.shape), 1).astype(template.dtype)
                for _ in range(9)
            ]
            for rem in rems:
                rem.new_episode()
                for k, s in enumerate(rows):
                    rem.add_entry(s, k, 0.5, 0.1, 0.2, np.array([k, e], np.int16))
                rem.close_episode()
        for _ in range(5):
            assert_same_batch(rems[0].get_batch(8), rems[1].get_batch(8))


def test_random_frames_are_stored_raw_and_read_back():
    packed, raw = (ReplayMemory(*_templates(), MAX_STEP, compress_states=c) for c in (True, False))
    rng = np.random.default_rng(5)
    noise = rng.integers(0, 256, (60,) + FRAME, dtype=np.uint8)
    for rem in (packed, raw):
        rem.seed(2)
        rem.frame_stack = 4
        rem.new_episode()
        rem.add_entries(noise, *_rows(np.random.default_rng(6), 60))
        rem.close_episode()
    # Incompressible: each kept as is, no byte more.
    assert packed.stored_state_bytes == raw.stored_state_bytes == noise.nbytes
    for _ in range(5):
        b = packed.get_batch(16)
        assert_same_batch(b, raw.get_batch(16))
        np.testing.assert_array_equal(b.prev[0][:, -1], noise[b.id])


def test_compressible_frames_take_less_memory_and_eviction_frees_it():
    raw_frame = int(np.prod(FRAME))
    packed = ReplayMemory(*_templates(), MAX_STEP, compress_states=True)
    raw = ReplayMemory(*_templates(), MAX_STEP)
    for rem in (packed, raw):
        _fill(rem, episodes=(40, 60, 45), noise=False)
    assert raw.stored_state_bytes == raw.size * raw_frame
    assert 0 < packed.stored_state_bytes < raw.stored_state_bytes / 4
    # The columns hold no states: the memory reports less than the raw one by the states.
    assert packed.memory_bytes < raw.memory_bytes
    full = packed.stored_state_bytes
    packed.max_episode = 1  # evicts the two oldest episodes
    assert packed.size == 45 and 0 < packed.stored_state_bytes < full * 0.6
    assert "compress_states=1" in packed.info()


def test_feed_batches_of_a_compressed_memory_equal_the_raw_ones():
    from memoire.feed import Feed

    packed, raw = _pair()
    with Feed(packed, 8, threads=1) as a, Feed(raw, 8, threads=1) as b:
        for _ in range(10):
            assert_same_batch(next(a), next(b))


def test_checkpoints_hold_raw_states_and_load_into_either_kind(tmp_path):
    packed, raw = _pair()
    raw.uuid = packed.uuid
    packed.save(tmp_path / "packed")
    raw.save(tmp_path / "raw")
    # The same file whichever memory wrote it (the format does not change).
    assert (tmp_path / "packed").read_bytes() == (tmp_path / "raw").read_bytes()
    for compress in (True, False):
        back = ReplayMemory(*_templates(), MAX_STEP, compress_states=compress)
        back.load(tmp_path / "packed")
        assert back.compress_states == compress and back.size == packed.size
        if compress:
            assert back.stored_state_bytes == packed.stored_state_bytes
        for _ in range(3):
            assert_same_batch(back.get_batch(16), raw.get_batch(16))
        raw.load(tmp_path / "raw")  # rewinds raw's generator for the next round
    # A damaged state section is refused and the compressed memory is unchanged.
    data = bytearray((tmp_path / "packed").read_bytes())
    # The state section follows the header (680 + 8 bytes), the settings (2 float32 + 8) and
    # the episodes (9 bytes each + 8).
    data[680 + 8 + 16 + 9 * packed.num_episode() + 8 + 100] ^= 0x01
    (tmp_path / "bad").write_bytes(bytes(data))
    target = ReplayMemory(*_templates(), MAX_STEP, compress_states=True)
    _fill(target, episodes=(30,), seed=8)
    before = target.stored_state_bytes
    target.seed(3)
    want = target.get_batch(8)
    with pytest.raises(CheckpointError, match="field s section fails its checksum"):
        target.load(tmp_path / "bad")
    assert target.stored_state_bytes == before and target.size == 30
    target.seed(3)
    assert_same_batch(target.get_batch(8), want)


def test_bad_values_are_refused():
    for bad in ("lz4", 1, None, 0.0):
        with pytest.raises(ValueError, match="compress_states: expected True or False"):
            ReplayMemory(*_templates(), MAX_STEP, compress_states=bad)
    rem = ReplayMemory(*_templates(), MAX_STEP, compress_states=np.bool_(True))
    assert rem.compress_states
    with pytest.raises(AttributeError):
        rem.compress_states = False  # fixed for the memory's life
    assert rem.compress_states
    # The older constructor takes it too.
    assert ReplayMemory(16, 1, 1, 1, 1, 100, compress_states=True).compress_states
    legacy = ReplayMemory(
        state_size=16,
        action_size=1,
        reward_size=1,
        prob_size=1,
        value_size=1,
        capacity=100,
        compress_states=True,
    )
    assert legacy.compress_states and legacy.state_size == 16
    with pytest.raises(ValueError, match="compress_states"):
        ReplayMemoryServer(*_templates(), MAX_STEP, pub_endpoint=None, compress_states="yes")


needs_native = pytest.mark.skipif(
    not native_libzmq(), reason="needs the native message path (pyzmq's libzmq)"
)


@needs_native
@pytest.mark.parametrize("shm", [False, True])
def test_sampling_stream_of_a_compressed_server_equals_in_process_batches(shm):
    from memoire.stream import SamplingStream

    local = ReplayMemory(*_templates(), MAX_STEP)
    local.seed(7)
    _configure(local)
    _fill(local)
    srv = ReplayMemoryServer(
        *_templates(), MAX_STEP, pub_endpoint=None, seed=7, compress_states=True
    )
    with srv:
        assert srv.rem.compress_states
        _configure(srv.rem)
        _fill(srv.rem)
        assert 0 < srv.stats()["stored_state_bytes"] == srv.rem.stored_state_bytes
        with SamplingStream(srv.start_stream(), 16, credit=4, timeout=10, shared_memory=shm) as s:
            for _ in range(20):
                assert_same_batch(next(s), local.get_batch(16))


@needs_native
def test_caches_of_a_compressed_memory_equal_the_raw_ones():
    # _push_cache samples into one block and sends it: the frames must be the same bytes.
    packed, raw = _pair()
    ctx = zmq.Context()
    try:
        pull = ctx.socket(zmq.PULL)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push = ctx.socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{port}")
        pull.rcvtimeo = 5000
        got = []
        for rem in (packed, raw, packed, raw):
            assert rem._push_cache(push.underlying, b"header", 12, 5, 5000)
            got.append(pull.recv_multipart())
        assert got[0] == got[1] and got[2] == got[3] and got[0] != got[2]
        assert len(got[0][1]) == 12 * 4 * int(np.prod(FRAME))  # prev s: [12, 4, 24, 20]
    finally:
        ctx.destroy(linger=0)


@pytest.mark.parametrize(
    "flags,expected",
    [([], False), (["--compress_states"], True), (["--compress_states", "0"], False)],
)
def test_memoire_serve_compress_states_flag(flags, expected):
    from memoire.commands import serve

    args = ["--max_step", "100", "--n_caches", "2", "--state_shape", "8,8"] + flags
    srv = serve.build_server(serve._config(serve.build_parser().parse_args(args)))
    try:
        assert srv.rem.compress_states == expected
    finally:
        srv.close()


def test_sampling_while_another_thread_adds_reads_whole_frames():
    # Each frame carries its entry's position (its id) in its first 8 bytes: a sampled stack
    # must hold exactly positions id-3 .. id, whatever the adder (encoding outside the lock,
    # evicting) was doing meanwhile.
    import threading

    rem = ReplayMemory(*_templates(), MAX_STEP, compress_states=True)
    rem.frame_stack = 4
    rng = np.random.default_rng(0)
    pos = [0]

    def add_episode():
        steps = int(rng.integers(5, 40))
        f = _frames(rng, steps, noise=True)
        ids = np.arange(pos[0], pos[0] + steps, dtype=np.int64)
        f.reshape(steps, -1)[:, :8] = ids[:, None].view(np.uint8)
        rem.new_episode()
        rem.add_entries(f, *_rows(rng, steps))
        rem.close_episode()
        pos[0] += steps

    stop = threading.Event()

    def adder_loop():
        while not stop.is_set() and pos[0] < 20000:
            add_episode()

    while rem.num_sampleable == 0:
        add_episode()
    adder = threading.Thread(target=adder_loop)
    adder.start()
    try:
        for _ in range(300):
            b = rem.get_batch(16)
            stacks = b.prev[0].reshape(16, 4, -1)[:, :, :8].copy().view(np.int64)[..., 0]
            np.testing.assert_array_equal(stacks, b.id[:, None] + np.arange(-3, 1))
    finally:
        stop.set()
        adder.join(timeout=60)
    assert not adder.is_alive()


def test_episodes_streamed_by_actors_into_a_compressed_server_sample_as_added():
    # Central mode: chunks from a client go through the native ingest into the compressed
    # memory; batches equal those of a raw memory that added the same episodes.
    from memoire import ReplayMemoryClient

    rng = np.random.default_rng(2)
    episodes = []
    for steps in (30, 12, 45):
        frames = _frames(rng, steps, noise=True)
        episodes.append([(frames[k], k % 4, 0.5 * k, 0.25, 0.1, np.array([k, 0], np.int16))
                         for k in range(steps)])  # fmt: skip
    local = ReplayMemory(*_templates(), MAX_STEP)
    local.seed(7)
    local.frame_stack = 4
    for ep in episodes:
        local.new_episode()
        for row in ep:
            local.add_entry(*row)
        local.close_episode()
    with ReplayMemoryServer(*_templates(), MAX_STEP, "tcp://127.0.0.1:*", seed=7,
                            compress_states=True) as srv:  # fmt: skip
        srv.rem.frame_stack = 4
        ep = srv.start()
        with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"], mode="central") as c:
            for rows in episodes:
                c.new_episode()
                for row in rows:
                    c.add_entry(*row)
                c.close_episode()
            assert srv.wait_rows_in(sum(len(e) for e in episodes), timeout=10)
        wait_until(lambda: srv.rem.num_episode() >= 3, "3 episodes stored")
        assert srv.rem.size == local.size
        for _ in range(5):
            assert_same_batch(srv.rem.get_batch(16), local.get_batch(16))
