"""The feed's device path (``Feed(..., device=...)``: a ring of device slots a native copy
thread fills, handed out through DLPack) tested without a GPU: the host stand-in for the copy
engine (memcpy into host "device" slots, DLPack kDLCPU) runs the same ring, ownership and
ordering code as the CUDA engine, consumed by numpy (``np.from_dlpack``) and JAX's CPU device.
The CUDA engine itself is exercised on a GPU machine by benchmarks/device_gpu_feed.sh.
"""

import gc
import textwrap

import numpy as np
import pytest
from _feed_buffers import dopamine, jax_buffer
from _subprocess_env import assert_clean_exit, run_script

from memoire import ReplayMemory, _core, _cuda
from memoire.feed import Feed

try:
    from memoire.dopamine_compat import circular_replay_buffer as crb
    from memoire.dopamine_compat import jax_replay_buffer as jrb
except ImportError:
    crb = jrb = None

FIELDS = ("state", "action", "reward", "next_state", "is_terminal", "episode_end")


def _jax_buffer(n=60, **kw):
    """A stack-4 buffer of (5, 3) observations in episodes of 17 steps (tests/_feed_buffers)."""
    return jax_buffer(n, stack=4, obs_shape=(5, 3), batch_size=8, capacity=200, episode=17, **kw)


def _held(feed):
    return feed._holder[-1].held


# ---- same batches as the host feed ----


@dopamine
@pytest.mark.parametrize("prioritized", [False, True])
def test_numpy_consumer_gets_the_host_feeds_batches_zero_copy(prioritized):
    buf = _jax_buffer(prioritized=prioritized)
    with (
        Feed(buf, seed=5, with_sample_metadata=True) as host,
        Feed(buf, seed=5, device="cpu", dlpack=True, with_sample_metadata=True) as dev,
    ):
        for _ in range(30):
            (h, hm), (d, dm) = next(host), next(dev)
            for name in FIELDS:
                a = getattr(d, name)
                assert isinstance(a, _core.DeviceArray)
                assert a.__dlpack_device__() == (1, 0)
                view = np.from_dlpack(a)
                assert view.ctypes.data == a.pointer  # the slot itself, not a copy
                np.testing.assert_array_equal(view, getattr(h, name))
                assert view.dtype == getattr(h, name).dtype
            np.testing.assert_array_equal(dm.keys, hm.keys)  # metadata stays on the host
            assert isinstance(dm.keys, np.ndarray)
        assert dev.last_transfer_bytes == sum(getattr(h, n).nbytes for n in FIELDS)


@dopamine
def test_jax_cpu_consumer_gets_the_host_feeds_batches_zero_copy():
    jax = pytest.importorskip("jax")
    buf = _jax_buffer()
    with Feed(buf, seed=9) as host, Feed(buf, seed=9, device="jax") as dev:
        for _ in range(30):
            h, d = next(host), next(dev)
            for name in FIELDS:
                a = getattr(d, name)
                assert isinstance(a, jax.Array)
                np.testing.assert_array_equal(np.asarray(a), getattr(h, name))
        assert dev.device_slots == 3
        # Zero-copy: the JAX array's buffer is the device slot's memory.
        native = dev._holder[-1]
        raw = native.take()
        pointer = raw[2].pointer
        arr = jax.dlpack.from_dlpack(raw[2])
        assert arr.unsafe_buffer_pointer() == pointer


@dopamine
def test_stack_on_device_through_the_ring_equals_host_stacks():
    pytest.importorskip("jax")
    buf = _jax_buffer(80)
    with (
        Feed(buf, seed=2) as host,
        Feed(buf, seed=2, device="jax", stack_on_device=True) as dev,
    ):
        for _ in range(20):
            h, d = next(host), next(dev)
            for name in FIELDS:
                np.testing.assert_array_equal(np.asarray(getattr(d, name)), getattr(h, name))
            # Only the distinct frames travel: fewer bytes than the stacks.
            assert dev.last_transfer_bytes < sum(getattr(h, n).nbytes for n in FIELDS)


def _memory(seed):
    rem = ReplayMemory(
        np.zeros([2], np.uint8),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([1], np.int64),
        100,
    )
    rem.seed(seed)
    rem.frame_stack = 2
    rem.new_episode()
    n = 40
    pos = np.arange(n)
    rem.add_entries(
        np.stack([pos % 251, pos % 7], 1).astype(np.uint8),
        pos.astype(np.float32),
        np.ones(n, np.float32),
        np.zeros(n, np.float32),
        np.zeros(n, np.float32),
        pos[:, None].astype(np.int64),
        np.linspace(1, 2, n).astype(np.float32),
    )
    rem.close_episode()
    return rem


def test_replay_memory_batches_through_the_ring_equal_get_batch():
    sync, fed = _memory(7), _memory(7)
    with Feed(fed, 6, depth=2, device="cpu", dlpack=True) as feed:
        for _ in range(20):
            want, got = sync.get_batch(6), next(feed)
            for w, g in zip(want.prev + want.next, got.prev + got.next):
                assert (w is None) == (g is None)
                if w is not None:
                    np.testing.assert_array_equal(np.from_dlpack(g), w)
            for name in ("weight", "prob", "done"):
                np.testing.assert_array_equal(
                    np.from_dlpack(getattr(got, name)), getattr(want, name)
                )
            np.testing.assert_array_equal(got.id, want.id)  # ids stay on the host
            assert isinstance(got.id, np.ndarray)


@dopamine
def test_tf_face_batches_through_the_ring_equal_the_host_feed():
    def buffer():
        b = crb.OutOfGraphReplayBuffer((3, 2), 2, 50, 4, seed=3)
        for i in range(30):
            b.add(np.full((3, 2), i, np.uint8), i % 2, float(i), i % 9 == 8)
        return b

    with Feed(buffer(), depth=2) as host, Feed(buffer(), depth=2, device="cpu", dlpack=True) as dev:
        for _ in range(10):
            h, d = next(host), next(dev)
            assert len(h) == len(d)
            for i, (a, b) in enumerate(zip(h, d)):
                got = b if i == 7 else np.from_dlpack(b)  # indices stay on the host
                np.testing.assert_array_equal(got, a)


# ---- JAX on CUDA: one import per batch, split on the device (run here on JAX's CPU) ----


@pytest.fixture
def split_on_cpu(monkeypatch):
    """Feeds made in the test take the split path (_JaxSplit) on JAX's CPU device too."""
    jax = pytest.importorskip("jax")
    import memoire.feed as feed_module

    monkeypatch.setattr(feed_module, "_SPLIT_PLATFORMS", ("gpu", "cuda", "cpu"))
    return jax


def test_split_replay_memory_batches_equal_get_batch_and_hold_no_slot(split_on_cpu):
    jax = split_on_cpu
    sync, fed = _memory(7), _memory(7)
    kept = []
    with Feed(fed, 6, depth=2, device="jax", device_slots=2) as feed:
        assert feed._split is not None
        for _ in range(20):
            want, got = sync.get_batch(6), next(feed)
            kept.append((want, got))  # held batches do not hold device slots
            # The slot of the block whose split may still run, at most (one stays free for
            # the copy thread): 20 batches held do not stall the feed (the per-part path
            # raises "held" at the third).
            assert _held(feed) <= 1
            assert isinstance(got.id, np.ndarray)  # ids stay on the host
        assert feed.last_transfer_bytes > 0
    for want, got in kept:  # still equal after close
        for w, g in zip(want.prev + want.next, got.prev + got.next):
            assert (w is None) == (g is None)
            if w is not None:
                assert isinstance(g, jax.Array)
                np.testing.assert_array_equal(np.asarray(g), w)
        for name in ("weight", "done", "id"):
            np.testing.assert_array_equal(np.asarray(getattr(got, name)), getattr(want, name))
        # float64 arrives as JAX holds it (float32 with x64 off, as device_put gives it)
        prob = np.asarray(got.prob)
        assert prob.dtype == jax.dtypes.canonicalize_dtype(np.float64)
        np.testing.assert_allclose(prob, want.prob, rtol=1e-6)


def test_split_turns_64_bit_parts_into_what_jax_holds():
    jax = pytest.importorskip("jax")
    from memoire.feed import _jax_dtype, _split_fn

    if jax.config.jax_enable_x64:
        pytest.skip("x64 on: 64-bit parts stay 64-bit")
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal(200).astype(np.float32)
    ulp = np.spacing(f32).astype(np.float64)
    values = np.concatenate(
        [
            rng.standard_normal(300) * 10.0 ** rng.integers(-37, 38, 300),
            f32.astype(np.float64) + ulp / 2,  # ties: to even
            f32.astype(np.float64) + ulp / 2 * (1 + 2**-20),  # just above a tie
            f32.astype(np.float64) - ulp / 2 * (1 + 2**-20),
            [0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, 3.5e38, -1e300, 3.4028235e38, 1e-300],
            [np.finfo(np.float32).max * (1 + 2**-25), 1.2e-38, -(2.0**-126)],
        ]
    )
    ints = np.array([0, 1, -1, 2**31 - 1, -(2**31), 2**40 + 5, -(2**40) - 7], np.int64)
    raw = np.concatenate([values.view(np.uint8), ints.view(np.uint8)])
    layout = ((0, 0, (len(values),), "<f8"), (1, values.nbytes, (len(ints),), "<i8"))
    got_f, got_i = _split_fn(layout)(raw)
    assert got_f.dtype == _jax_dtype(np.dtype(np.float64)) == np.float32
    with np.errstate(over="ignore"):
        want = values.astype(np.float32)
    np.testing.assert_array_equal(np.asarray(got_f), want)
    np.testing.assert_array_equal(np.signbit(np.asarray(got_f)), np.signbit(want))
    assert np.isnan(
        np.asarray(_split_fn(((0, 0, (1,), "<f8"),))(np.array([np.nan]).view(np.uint8))[0])
    )
    np.testing.assert_array_equal(np.asarray(got_i), ints.astype(np.int32))  # the low word


@dopamine
@pytest.mark.parametrize("prioritized", [False, True])
def test_split_jax_face_batches_equal_the_host_feed(split_on_cpu, prioritized):
    jax = split_on_cpu
    buf = _jax_buffer(prioritized=prioritized)
    with (
        Feed(buf, seed=9, with_sample_metadata=True) as host,
        Feed(buf, seed=9, device="jax", with_sample_metadata=True, device_slots=1) as dev,
    ):
        for _ in range(12):
            (h, hm), (d, dm) = next(host), next(dev)
            for name in FIELDS:
                a = getattr(d, name)
                assert isinstance(a, jax.Array) and not a.committed
                np.testing.assert_array_equal(np.asarray(a), getattr(h, name))
            np.testing.assert_array_equal(dm.keys, hm.keys)
        assert dev._split is not None and _held(dev) <= 1
        native = dev._holder[-1]
    assert native.held == 0  # close waits for the splits and lets go of the blocks


@dopamine
def test_split_stack_on_device_equals_host_stacks(split_on_cpu):
    buf = _jax_buffer(80)
    with (
        Feed(buf, seed=2) as host,
        Feed(buf, seed=2, device="jax", stack_on_device=True) as dev,
    ):
        for _ in range(10):
            h, d = next(host), next(dev)
            for name in FIELDS:
                np.testing.assert_array_equal(np.asarray(getattr(d, name)), getattr(h, name))


# ---- ownership ----


@dopamine
def test_slots_come_back_when_the_arrays_are_dropped():
    jax = pytest.importorskip("jax")
    buf = _jax_buffer()
    with Feed(buf, seed=1, device="jax", with_sample_metadata=True) as feed:
        a = next(feed)
        b = next(feed)
        assert _held(feed) == 2
        del a
        gc.collect()
        assert _held(feed) == 1
        state = b[0].state  # one array of the batch keeps its slot
        del b
        gc.collect()
        assert _held(feed) == 1
        del state
        assert _held(feed) == 0
        assert isinstance(next(feed)[0].state, jax.Array)
    with Feed(buf, seed=1, device="cpu", dlpack=True) as feed:
        batch = next(feed)
        views = [np.from_dlpack(getattr(batch, n)) for n in FIELDS]
        del batch
        assert _held(feed) == 1  # numpy's views hold the DLPack tensors
        del views
        assert _held(feed) == 0
        # An exported capsule nobody consumed gives its slot back when it is freed.
        batch = next(feed)
        capsule = batch.state.__dlpack__()
        versioned = batch.state.__dlpack__(max_version=(1, 0))
        del batch
        assert _held(feed) == 1
        del capsule, versioned
        assert _held(feed) == 0


@dopamine
def test_holding_every_device_slot_raises_and_dropping_feeds_again():
    buf = _jax_buffer()
    with Feed(buf, device="jax", device_slots=2) as feed:
        held = [next(feed), next(feed)]
        with pytest.raises(RuntimeError, match="held"):
            next(feed)
        del held
        assert next(feed).state.shape[0] == 8


@dopamine
def test_close_with_arrays_alive_is_clean_and_they_stay_valid():
    pytest.importorskip("jax")
    buf = _jax_buffer()
    feed = Feed(buf, seed=3, device="jax")
    host = Feed(buf, seed=3)
    kept = [next(feed) for _ in range(3)]
    want = [next(host) for _ in range(3)]
    feed.close()
    host.close()
    feed.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        next(feed)
    for k, w in zip(kept, want):
        np.testing.assert_array_equal(np.asarray(k.state), w.state)
    del feed
    gc.collect()
    for k, w in zip(kept, want):  # the ring is gone from Python; its slots live on
        np.testing.assert_array_equal(np.asarray(k.next_state), w.next_state)


@dopamine
def test_interpreter_exit_with_device_arrays_alive_is_clean(tmp_path):
    script = textwrap.dedent("""
        import numpy as np, jax
        from memoire.dopamine_compat import jax_replay_buffer as jrb
        from memoire.feed import Feed
        acc = jrb.TransitionAccumulator(stack_size=1, update_horizon=1, gamma=0.99)
        buf = jrb.ReplayBuffer(acc, jrb.UniformSamplingDistribution(seed=0), batch_size=8,
                               max_capacity=100)
        for i in range(20):
            buf.add(jrb.TransitionElement(np.zeros(3), 0, 0.0, False, False))
        feed = Feed(buf, device="jax", depth=2)
        kept = [next(feed) for _ in range(3)]
        other = Feed(buf, device="cpu", dlpack=True)
        views = np.from_dlpack(next(other).state)
        cycle = [Feed(buf, device="jax"), None]
        cycle[1] = cycle
        jax_batch = next(cycle[0])
        print("OK", flush=True)
    """)
    assert_clean_exit(run_script(script, tmp_path))


# ---- the DLPack protocol's checks ----


@dopamine
def test_dlpack_refuses_another_device_and_a_copy():
    buf = _jax_buffer()
    with Feed(buf, device="cpu", dlpack=True) as feed:
        a = next(feed).state
        with pytest.raises(BufferError, match="device"):
            a.__dlpack__(dl_device=(2, 0))
        with pytest.raises(BufferError, match="copy"):
            a.__dlpack__(copy=True)
        assert a.shape == (8, 5, 3, 4) and a.dtype == np.uint8 and a.nbytes == 8 * 5 * 3 * 4


# ---- settings and the CUDA loader ----


@dopamine
@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(device_slots=0), ValueError, "device_slots"),
        (dict(device="cuda:x"), ValueError, "device"),
        (dict(dlpack=True), ValueError, "dlpack"),
        (dict(device="cpu", dlpack=True, stack_on_device=True), ValueError, "stack_on_device"),
    ],
)
def test_bad_device_settings_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        Feed(_jax_buffer(), **kwargs)


def test_cuda_loader_names_what_it_found():
    with pytest.raises(RuntimeError) as e:
        _core.CudaRuntime(["/nonexistent/libcudart.so.99"])
    assert "no libcudart" in str(e.value) and "/nonexistent/libcudart.so.99" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(RuntimeError, match="lacks cudaMalloc"):
        _core.CudaRuntime(["libm.so.6"])


def test_cuda_loader_candidates_put_the_override_first(monkeypatch):
    monkeypatch.setenv("MEMOIRE_CUDART", "/opt/x/libcudart.so.12")
    found = _cuda.candidates()
    assert found[0] == "/opt/x/libcudart.so.12"
    assert "libcudart.so.12" in found and "libcudart.so.13" in found


def test_a_cuda_device_without_a_usable_runtime_is_one_clear_error():
    try:
        _cuda.runtime()
    except RuntimeError as e:
        expected = str(e)
    else:
        pytest.skip("a CUDA runtime and device are present")
    assert expected.startswith("CUDA runtime") and "\n" not in expected
    memory = _memory(0)
    with pytest.raises(RuntimeError) as e:
        Feed(memory, 4, device="cuda:0", dlpack=True)
    assert str(e.value) == expected


def test_a_torch_device_without_torch_names_pytorch():
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("PyTorch is installed")
    with pytest.raises(ImportError, match="PyTorch"):
        Feed(_memory(0), 4, device="cuda")
