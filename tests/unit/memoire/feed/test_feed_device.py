"""The feed's device path (``Feed(..., device=...)``: a ring of device slots a native copy
thread fills, handed out through DLPack) tested without a GPU: the host stand-in for the copy
engine (memcpy into host "device" slots, DLPack kDLCPU) runs the same ring, ownership and
ordering code as the CUDA engine, consumed by numpy (``np.from_dlpack``) and JAX's CPU device.
The CUDA engine itself is exercised on a GPU machine by benchmarks/device_gpu_feed.sh.
"""

import functools
import gc
import sys
import textwrap
import types

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
    """A stack-4 buffer of (5, 3) observations in episodes of 17 steps (tests/helpers/_feed_buffers)."""
    return jax_buffer(n, stack=4, obs_shape=(5, 3), batch_size=8, capacity=200, episode=17, **kw)


def _held(feed):
    """Device slots lent to the learner or not yet given back."""
    return feed._ring.held


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
            dev.release()
        assert dev.device_slots == 3
        # Zero-copy: the JAX array's buffer is the device slot's memory.
        d = next(dev)
        raw = dev._ring.views(dev._last_slot)
        assert d.state.unsafe_buffer_pointer() == raw[2].pointer


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


# ---- lent slots: imported once, given back when what read them is done ----


def _wide_memory(seed):
    """A memory whose state and action templates are 64-bit (float64[2], int64): values JAX
    with x64 off holds as 32-bit, among them float32's edge cases."""
    rem = ReplayMemory(
        np.zeros([2], np.float64),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([0], np.uint8),
        200,
    )
    rem.seed(seed)
    f32 = np.float32(1.7)
    ulp = float(np.spacing(f32))
    edges = [
        0.0, -0.0, 1e300, -1e300, np.inf, -np.inf, np.nan, 3.4028235677973366e38,
        3.4028235e38 * (1 + 2**-25), 1e-300, 1.2e-38, float(f32) + ulp / 2,
        float(f32) + ulp / 2 * (1 + 2**-20), -(2.0**-126), 2.5, -7.25,
    ]  # fmt: skip
    states = np.stack([np.tile(edges, 4), np.arange(64) * 1.1], 1)
    actions = np.tile(np.array([0, 1, -1, 2**31 - 1, -(2**31), 2**40 + 5, -(2**40) - 7, 3]), 8)
    n = len(states)
    rem.new_episode()
    rem.add_entries(
        states,
        actions.astype(np.int64),
        np.ones(n, np.float32),
        np.ones(n, np.float32),
        np.zeros(n, np.float32),
        np.zeros((n, 0), np.uint8),
        np.ones(n, np.float32),
    )
    rem.close_episode()
    return rem


def test_jax_batches_arrive_in_jax_dtypes_equal_to_get_batch():
    # 64-bit parts are narrowed by the copy thread to what JAX holds with x64 off (float64 as
    # numpy's astype(float32) rounds it, to +-inf past float32's range; integers to their low
    # word): a jitted step converts nothing on entry.
    jax = pytest.importorskip("jax")
    if jax.config.jax_enable_x64:
        pytest.skip("x64 on: 64-bit parts stay 64-bit")
    sync, fed = _wide_memory(5), _wide_memory(5)
    with Feed(fed, 16, depth=2, device="jax") as feed:
        for _ in range(30):
            want, got = sync.get_batch(16), next(feed)
            for w, g in zip(want.prev + want.next, got.prev + got.next):
                assert (w is None) == (g is None)
                if w is None:
                    continue
                assert isinstance(g, jax.Array)
                assert g.dtype == jax.dtypes.canonicalize_dtype(w.dtype)
                with np.errstate(over="ignore"):
                    expected = w.astype(g.dtype)
                np.testing.assert_array_equal(np.asarray(g), expected)
                np.testing.assert_array_equal(np.signbit(np.asarray(g)), np.signbit(expected))
            np.testing.assert_array_equal(np.asarray(got.prob), want.prob.astype(np.float32))
            np.testing.assert_array_equal(got.id, want.id)  # ids stay on the host, int64
            assert got.id.dtype == np.int64 and isinstance(got.id, np.ndarray)
            feed.release()


@dopamine
@pytest.mark.parametrize("prioritized", [False, True])
def test_lent_jax_face_batches_are_the_slots_arrays_imported_once(prioritized):
    jax = pytest.importorskip("jax")
    buf = _jax_buffer(prioritized=prioritized)
    seen = {}  # slot -> the element handed out for it
    with (
        Feed(buf, seed=9, with_sample_metadata=True) as host,
        Feed(buf, seed=9, device="jax", with_sample_metadata=True) as dev,
    ):
        for _ in range(12):
            (h, hm), (d, dm) = next(host), next(dev)
            for name in FIELDS:
                a = getattr(d, name)
                assert isinstance(a, jax.Array) and not a.committed
                np.testing.assert_array_equal(np.asarray(a), getattr(h, name))
            np.testing.assert_array_equal(dm.keys, hm.keys)
            slot = dev._last_slot
            assert seen.setdefault(slot, d) is d  # the same arrays each time round
            dev.release()
        assert len(seen) == dev.device_slots


def _slow_sum(jax, seconds):
    """A jitted step that reads the batch's state only after sleeping ``seconds`` on the host
    (a callback it depends on): a slot given back too early is rewritten meanwhile, and the
    sum then differs from the batch's."""
    import jax.numpy as jnp

    def pause(x):
        import time

        time.sleep(seconds)
        return np.zeros((), np.int32)

    def step(state):
        zero = jax.pure_callback(pause, jax.ShapeDtypeStruct((), np.int32), state[0, 0])
        return jnp.sum(state.astype(np.int32) + zero)

    return jax.jit(step)


@dopamine
@pytest.mark.parametrize("release", [True, False])
def test_a_slot_is_never_rewritten_while_a_step_that_reads_it_is_pending(release):
    # The learner runs ahead of slow steps: with release(after=out) the slot goes back once
    # out is ready; without release, its arrays are deleted and JAX frees them (giving the
    # slot back) once the pending step is done. Either way every delayed read sees its batch.
    jax = pytest.importorskip("jax")
    buf = _jax_buffer(80)
    step = _slow_sum(jax, 0.05)
    with Feed(buf, seed=4) as host:
        want = [int(next(host).state.astype(np.int64).sum()) for _ in range(8)]
    outs = []
    with Feed(buf, seed=4, device="jax", device_slots=3) as feed:
        for _ in range(8):
            batch = next(feed)
            outs.append(step(batch.state))
            if release:
                feed.release(after=outs[-1])
        got = [int(o) for o in outs]
    assert got == want


@dopamine
def test_a_release_after_an_array_the_next_step_donates_still_waits_for_its_step():
    # Parameters passed back into the next step (donated) are deleted when that step is
    # dispatched: the batch goes back once a later release's marker is ready (that later step
    # consumed them, so the earlier one is done).
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    buf = _jax_buffer(80)

    def pause(x):
        import time

        time.sleep(0.03)
        return np.zeros((), np.int32)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(acc, state):
        zero = jax.pure_callback(pause, jax.ShapeDtypeStruct((), np.int32), state[0, 0])
        return acc + jnp.sum(state.astype(np.int32) + zero)

    with Feed(buf, seed=6) as host:
        want = int(sum(next(host).state.astype(np.int64).sum() for _ in range(10)))
    acc = jnp.zeros((), np.int32)
    with Feed(buf, seed=6, device="jax", device_slots=3) as feed:
        for _ in range(10):
            acc = step(acc, next(feed).state)
            feed.release(after=acc)  # the next step donates it
        assert int(acc) == want
        assert feed._lender.dropped == 0


@dopamine
def test_a_batch_never_released_is_deleted_at_the_next_take():
    pytest.importorskip("jax")
    buf = _jax_buffer()
    with Feed(buf, seed=1, device="jax") as feed:
        first = next(feed)
        second = next(feed)
        assert first.state.is_deleted()  # given back: using it raises
        assert feed._lender.dropped == 1
        with pytest.raises(RuntimeError, match="deleted"):
            np.asarray(first.state)
        assert not second.state.is_deleted()
        for _ in range(3 * feed.device_slots):  # the slots come back and are imported again
            assert next(feed).state.shape[0] == 8
        feed.release()
        assert feed.release() is None  # nothing lent: a no-op


@dopamine
def test_dlpack_batches_go_back_at_the_next_take():
    buf = _jax_buffer()
    with Feed(buf, seed=1, device="cpu", dlpack=True) as feed:
        a = next(feed)
        assert _held(feed) == 1
        views = [np.from_dlpack(getattr(a, n)) for n in FIELDS]
        b = next(feed)
        assert _held(feed) == 1  # a's slot went back, views or not: batches are lent
        assert b.state.slot != a.state.slot or feed.device_slots == 1
        # An exported capsule nobody consumed frees its export, nothing else.
        capsule = b.state.__dlpack__()
        versioned = b.state.__dlpack__(max_version=(1, 0))
        del capsule, versioned, views
        feed.release()
        assert _held(feed) == 0


@dopamine
def test_close_with_arrays_alive_is_clean_and_their_memory_stays():
    pytest.importorskip("jax")
    buf = _jax_buffer()
    feed = Feed(buf, seed=3, device="jax")
    host = Feed(buf, seed=3)
    kept, want = next(feed), next(host)
    feed.close()
    host.close()
    feed.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        next(feed)
    np.testing.assert_array_equal(np.asarray(kept.state), want.state)
    del feed
    gc.collect()
    # The ring is gone from Python; the slot's memory lives while its arrays do.
    np.testing.assert_array_equal(np.asarray(kept.next_state), want.next_state)


@pytest.mark.slow
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


def test_cuda_on_a_pytorch_without_cuda_is_the_runtime_error_line(monkeypatch):
    """device="cuda" (no index) on a CPU-only PyTorch: the one RuntimeError line "cuda:0" gives,
    not PyTorch's AssertionError from torch.cuda.current_device()."""
    try:
        _cuda.runtime()
    except RuntimeError as e:
        expected = str(e)
    else:
        pytest.skip("a CUDA runtime and device are present")
    try:
        import torch
    except ImportError:
        # A stand-in with what a CPU-only PyTorch answers (torch 2.x, +cpu wheels).
        torch = types.ModuleType("torch")

        def current_device():
            raise AssertionError("Torch not compiled with CUDA enabled")

        torch.cuda = types.SimpleNamespace(
            is_available=lambda: False, current_device=current_device
        )
        monkeypatch.setitem(sys.modules, "torch", torch)
    if torch.cuda.is_available():
        pytest.skip("this PyTorch sees a CUDA device")
    with pytest.raises(RuntimeError) as e:
        Feed(_memory(0), 4, device="cuda")
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
