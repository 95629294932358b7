"""ReplayMemory.save / load: a round trip samples the same batches; truncated, altered, foreign
and wrong-shaped files are refused with CheckpointError and leave the memory unchanged.

"Unchanged" is checked byte for byte: a memory saved before and after a refused load gives the
same file (the format has no timestamps and zeroed padding), which covers every stored entry,
weight, setting, counter and the generator's state.
"""

import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memoire import ProtocolError, ReplayMemory
from memoire.checkpoint_io import CheckpointError

# Offsets in the version-1 header (cpp/core/replay_memory_checkpoint.cc, struct Header).
HEADER = 680
OFF = dict(
    version=8,
    byte_order=12,
    max_step=16,
    fields=24,
    reward_elems=528,
    head=536,
    open_start=544,
    tail=552,
    num_episode=560,
    rng=576,
    priority_exponent=608,
    frame_stack=632,
    multi_step=636,
    max_episode=648,
    open=656,
    cache_flags=664,
)


def _memory(max_step=300, state=(6, 5), dtype=np.uint8):
    return ReplayMemory(
        np.zeros(state, dtype),
        np.zeros([], np.int64),
        np.zeros([2], np.float32),
        np.zeros([], np.float32),
        np.zeros([2], np.float32),
        np.zeros([2], np.float32),
        np.zeros([3], np.int16),
        max_step,
    )


def _fill(m, episodes, seed=0, open_rows=0):
    """Random episodes (lengths 3..40) and, with open_rows, an open episode left open."""
    rng = np.random.default_rng(seed)
    shape = m.state_buf.shape
    for e in range(episodes + (1 if open_rows else 0)):
        n = open_rows if e == episodes else int(rng.integers(3, 40))
        m.new_episode()
        m.add_entries(
            rng.integers(0, 255, (n, *shape)).astype(m.state_buf.dtype),
            rng.integers(0, 6, n),
            rng.random((n, 2), np.float32),
            rng.random(n, np.float32),
            rng.random((n, 2), np.float32),
            rng.integers(-9, 9, (n, 3)).astype(np.int16),
            rng.random(n, np.float32) + 0.1,
        )
        if e < episodes:
            m.close_episode(terminal=bool(e % 2))
    return m


def _configured(**kw):
    m = _memory(**kw)
    m.frame_stack, m.multi_step, m.priority_exponent, m.mix_lambda = 3, 2, 0.7, 0.8
    m.discount_factor = [0.9, 0.5]
    m.max_episode = 40
    m.seed(11)
    # Wraps the ring several times, so eviction and wrapped runs are both saved.
    _fill(m, 60, open_rows=7)
    b = m.get_batch(16)
    m.update_weights(b.id, np.linspace(0.0, 3.0, 16, dtype=np.float32))
    return m


def _saved_bytes(m, path):
    m.save(path)
    return path.read_bytes()


def _assert_same_batches(a, b, n=5, batch=24):
    for _ in range(n):
        x, y = a.get_batch(batch), b.get_batch(batch)
        for u, v in zip(x.prev + x.next, y.prev + y.next):
            assert (u is None and v is None) or np.array_equal(u, v)
        for name in ("weight", "prob", "done", "id"):
            assert np.array_equal(getattr(x, name), getattr(y, name)), name


def test_round_trip_restores_everything_and_samples_the_same_batches(tmp_path):
    m = _configured()
    path = tmp_path / "memory.ckpt"
    m.save(path)
    assert os.listdir(tmp_path) == ["memory.ckpt"]  # no temporary file left
    fresh = _memory()
    fresh.load(path)
    for name in (
        "size",
        "num_sampleable",
        "total_weight",
        "total_added",
        "episode_open",
        "open_length",
        "uuid",
        "frame_stack",
        "multi_step",
        "priority_exponent",
        "mix_lambda",
        "max_episode",
        "cache_size",
        "allow_nonfinite",
    ):
        assert getattr(fresh, name) == getattr(m, name), name
    assert fresh.num_episode() == m.num_episode()
    np.testing.assert_array_equal(fresh.discount_factor, m.discount_factor)
    np.testing.assert_array_equal(fresh.cache_flags, m.cache_flags)
    # The generator's state was saved: the next batches are the same without reseeding ...
    _assert_same_batches(m, fresh)
    # ... and after the same seed.
    m.seed(5)
    fresh.seed(5)
    _assert_same_batches(m, fresh)
    # Both go on alike: the open episode closes the same, evictions and weights agree.
    for mem in (m, fresh):
        mem.close_episode(0.5)
        _fill(mem, 5, seed=3)
    assert fresh.total_weight == m.total_weight and fresh.size == m.size
    _assert_same_batches(m, fresh)
    assert _saved_bytes(m, tmp_path / "a") == _saved_bytes(fresh, tmp_path / "b")


def test_empty_and_open_only_memories_round_trip(tmp_path):
    empty = _memory()
    empty.save(tmp_path / "empty")
    loaded = _configured()
    loaded.load(tmp_path / "empty")
    assert loaded.size == 0 and loaded.num_episode() == 0 and not loaded.episode_open
    assert loaded.frame_stack == 1  # the saved settings, not the loading memory's
    with pytest.raises(RuntimeError, match="no sampleable entry"):
        loaded.get_batch(1)
    assert _saved_bytes(loaded, tmp_path / "again") == (tmp_path / "empty").read_bytes()

    open_only = _fill(_memory(), 0, open_rows=9)
    open_only.save(tmp_path / "open")
    back = _memory()
    back.load(tmp_path / "open")
    assert back.episode_open and back.open_length == 9 and back.num_episode() == 0
    back.close_episode()
    open_only.close_episode()
    open_only.seed(1)
    back.seed(1)
    _assert_same_batches(open_only, back)


def test_load_replaces_a_memory_that_already_holds_data(tmp_path):
    src = _configured()
    src.save(tmp_path / "src")
    dst = _fill(_memory(), 30, seed=9, open_rows=4)
    dst.load(tmp_path / "src")
    assert _saved_bytes(dst, tmp_path / "dst") == (tmp_path / "src").read_bytes()


def _refused(m, path, match):
    """Loads `path` into `m`, expecting CheckpointError matching `match` and `m` unchanged."""
    before = _saved_bytes(m, path.parent / "before")
    with pytest.raises(CheckpointError, match=match) as e:
        m.load(path)
    assert str(path) in str(e.value)
    assert isinstance(e.value, ProtocolError) and isinstance(e.value, ValueError)
    assert _saved_bytes(m, path.parent / "after") == before
    return e.value


@pytest.fixture
def saved(tmp_path):
    """(path, bytes) of a checkpoint of _configured(), and a different memory to load into."""
    path = tmp_path / "good"
    data = _saved_bytes(_configured(), path)
    return path, data, _fill(_memory(), 12, seed=4, open_rows=2)


def test_truncated_files_are_refused_and_the_memory_is_unchanged(saved, tmp_path):
    path, data, m = saved
    bad = tmp_path / "bad"
    for cut in (0, 5, 8, HEADER - 1, HEADER + 8, HEADER + 30, len(data) // 2, len(data) - 1):
        bad.write_bytes(data[:cut])
        _refused(m, bad, "truncated|not a memoire ReplayMemory checkpoint")
    bad.write_bytes(data + b"\0")
    _refused(m, bad, "expected %d bytes" % len(data))


def test_bit_flips_anywhere_are_refused_and_the_memory_is_unchanged(saved, tmp_path):
    path, data, m = saved
    bad = tmp_path / "bad"
    rng = np.random.default_rng(0)
    spots = sorted(
        {0, 9, 13, 17, 30, 540, 600, HEADER + 3, len(data) - 3}
        | set(rng.integers(0, len(data), 25).tolist())
    )
    for at in spots:
        flipped = bytearray(data)
        flipped[at] ^= 1 << int(rng.integers(8))
        bad.write_bytes(bytes(flipped))
        _refused(m, bad, "checksum|magic|version|byte order|expected")


def test_files_of_another_memory_are_refused_naming_what_was_expected(tmp_path):
    src = _fill(_memory(), 5)
    path = tmp_path / "src"
    src.save(path)
    _refused(_memory(max_step=301), path, r"expected max_step=301 \(this memory's\), got 300")
    _refused(_memory(state=(6, 4)), path, r"field s: expected uint8\[6,4\].*got uint8\[6,5\]")
    _refused(_memory(dtype=np.float32), path, r"field s: expected float32\[6,5\].*got uint8")


def test_not_a_checkpoint_missing_and_special_files(tmp_path):
    m = _fill(_memory(), 3)
    junk = tmp_path / "junk"
    junk.write_bytes(os.urandom(4096))
    _refused(m, junk, "not a memoire ReplayMemory checkpoint")
    dopamine_like = tmp_path / "x.npy"
    np.save(dopamine_like, np.zeros(1000))
    _refused(m, dopamine_like, "magic")
    with pytest.raises(FileNotFoundError):
        m.load(tmp_path / "missing")
    os.mkfifo(tmp_path / "fifo")
    _refused(m, tmp_path / "fifo", "not a regular file")  # refused at once, never blocks
    m.save(tmp_path / "real")
    os.symlink(tmp_path / "real", tmp_path / "link")
    _refused(m, tmp_path / "link", "symlink")


def _with_header(data, **fields):
    """`data` with header fields replaced (name=(struct format, value)) and the header's
    checksum recomputed: a file altered by someone who knows the format."""
    out = bytearray(data)
    for name, (fmt, value) in fields.items():
        at = OFF[name] if not name.startswith("field_") else OFF["fields"] + int(name[6:])
        struct.pack_into("<" + fmt, out, at, *(value if isinstance(value, tuple) else (value,)))
    checksum = ReplayMemory._checkpoint_checksum(bytes(out[:HEADER]), 0)
    struct.pack_into("<Q", out, HEADER, checksum)
    return bytes(out)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(version=("I", 2)), "version 2; this memoire reads version 1"),
        (dict(byte_order=("I", 0x04030201)), "another byte order"),
        (dict(tail=("q", 2**62 + 1)), "tail <= 2\\*\\*62"),
        (dict(head=("q", -1)), "0 <= head"),
        (dict(head=("q", 0), open_start=("q", 2**40), tail=("q", 2**40 + 5)), "at most max_step"),
        (dict(num_episode=("q", 2**60)), "episodes for"),
        (dict(num_episode=("q", -3)), "episodes for"),
        (dict(open=("B", 7)), "expected open 0 or 1"),
        (dict(rng=("4Q", (0, 0, 0, 0))), "generator state"),
        (dict(reward_elems=("q", 2**40)), "reward elements"),
        (dict(field_4=("I", 40)), r"field s: expected uint8\[6,5\].*invalid dtype or shape"),
        (dict(frame_stack=("i", 0)), "settings: frame_stack"),
        (dict(multi_step=("i", 400)), "settings: "),
        (dict(priority_exponent=("d", float("nan"))), "settings: priority_exponent"),
        (dict(max_episode=("q", 2)), "at most max_episode=2"),
        (dict(cache_flags=("B", 2)), "flags of 0 or 1"),
    ],
)
def test_headers_that_lie_are_refused_before_anything_is_allocated(saved, tmp_path, fields, match):
    path, data, m = saved
    bad = tmp_path / "bad"
    bad.write_bytes(_with_header(data, **fields))
    _refused(m, bad, match)


def test_inconsistent_sections_are_refused_even_with_good_checksums(tmp_path):
    """Episodes whose lengths do not add up, and negative weights, with every checksum right."""
    m = _fill(_memory(), 2, seed=1)
    data = _saved_bytes(m, tmp_path / "good")
    n, episodes = m.size, m.num_episode()
    start = HEADER + 8 + (2 * 2 * 4 + 8)  # the settings section: 2 x float32[2] + checksum

    def with_section(data, offset, body, section):
        out = bytearray(data)
        out[offset : offset + len(body)] = body
        struct.pack_into(
            "<Q", out, offset + len(body), ReplayMemory._checkpoint_checksum(bytes(body), section)
        )
        return bytes(out)

    lengths = np.frombuffer(data, np.int64, episodes, start).copy()
    terminated = data[start + 8 * episodes : start + 9 * episodes]
    for bad_lengths in (
        [lengths[0] + lengths[1], 0],
        [lengths[0] - 1, lengths[1]],
        [-5, lengths[0] + lengths[1] + 5],
    ):
        body = np.asarray(bad_lengths, np.int64).tobytes() + terminated
        (tmp_path / "bad").write_bytes(with_section(data, start, body, 2))
        _refused(_memory(), tmp_path / "bad", "episode|summing to")
    weights_at = len(data) - 8 - 4 * n
    body = np.full(n, -1.0, np.float32).tobytes()
    (tmp_path / "bad").write_bytes(with_section(data, weights_at, body, 10))
    _refused(_memory(), tmp_path / "bad", "weights: expected finite values >= 0")


def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    m = _fill(_memory(), 4)
    path = tmp_path / "ckpt"
    old = _saved_bytes(m, path)
    _fill(m, 3, seed=2)

    def fail(fd):
        os.write(fd, b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(m, "_save_fd", fail)
    with pytest.raises(OSError, match="No space"):
        m.save(path)
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["ckpt"]
    with pytest.raises(FileNotFoundError):
        _memory().save(tmp_path / "no_such_folder" / "ckpt")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=6),
    st.booleans(),
)
def test_mutated_checkpoints_load_consistently_or_are_refused(tmp_path, edits, fix_header):
    """Random byte edits, with the header's checksum recomputed or not: either a CheckpointError
    and the memory unchanged, or (edits that change nothing) a memory that samples."""
    src = _fill(_memory(max_step=120), 6, seed=2, open_rows=3)
    data = bytearray(_saved_bytes(src, tmp_path / "src"))
    for at, value in edits:
        data[at % len(data)] = value
    if fix_header:
        struct.pack_into(
            "<Q", data, HEADER, ReplayMemory._checkpoint_checksum(bytes(data[:HEADER]), 0)
        )
    (tmp_path / "mutated").write_bytes(bytes(data))
    m = _fill(_memory(max_step=120), 2, seed=8)
    before = _saved_bytes(m, tmp_path / "before")
    try:
        m.load(tmp_path / "mutated")
    except CheckpointError:
        assert _saved_bytes(m, tmp_path / "after") == before
    else:
        assert m.size == src.size  # a header edit may change settings, never the contents
        if m.num_sampleable:
            m.get_batch(8)


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_an_empty_large_memory_and_a_small_checkpoint_loaded_into_it_stay_small(tmp_path):
    """Storage and per-slot bookkeeping take memory only where entries are: an empty
    1,000,000-entry Atari memory (6.8 GB reserved) holds its sum tree, and loading 2,000
    entries into it adds what they hold (the staging memory's pages move in)."""

    def atari(max_step):
        return ReplayMemory(
            np.zeros([84, 84], np.uint8),
            np.zeros([], np.int64),
            np.zeros([], np.float32),
            np.zeros([], np.float32),
            np.zeros([], np.float32),
            np.zeros([], np.float32),
            np.zeros([0], np.uint8),
            max_step,
        )

    small = atari(2000)
    small.new_episode()
    frames = np.random.default_rng(0).integers(0, 256, (2000, 84, 84), dtype=np.uint8)
    small.add_entries(
        frames,
        np.zeros(2000, np.int64),
        np.zeros(2000, np.float32),
        np.zeros(2000, np.float32),
        np.zeros(2000, np.float32),
        np.zeros((2000, 0), np.uint8),
        np.ones(2000, np.float32),
    )
    small.close_episode()
    small.save(tmp_path / "small")
    # The same entries, saved by a 1,000,000-entry memory (max_step must match to load).
    before = _rss_mib()
    big = atari(1_000_000)
    empty = _rss_mib() - before
    assert big.memory_bytes > 6_000_000_000 and empty < 40, empty
    big.new_episode()
    big.add_entries(
        frames,
        np.zeros(2000, np.int64),
        np.zeros(2000, np.float32),
        np.zeros(2000, np.float32),
        np.zeros(2000, np.float32),
        np.zeros((2000, 0), np.uint8),
        np.ones(2000, np.float32),
    )
    big.close_episode()
    big.save(tmp_path / "big")
    del big
    before = _rss_mib()
    loaded = atari(1_000_000)
    loaded.load(tmp_path / "big")
    grown = _rss_mib() - before
    assert loaded.size == 2000 and grown < 40 + 2000 * 84 * 84 / 2**20 + 40, grown
