"""A quick check of the feed's device path on this machine's accelerator (or its CPU stand-in).

Each check prints PASS/FAIL/SKIP with its reason and the script goes on after a failure; the exit
status is the number of failures. Needs memoire, numpy and JAX; PyTorch and CuPy checks run where
they import. Run by benchmarks/device_gpu_feed.sh before the benchmark:

    python benchmarks/gpu_feed_smoke.py [--batch 32]

Checks: the CUDA runtime loads (or, without one, names what it found); device batches equal the
host feed's for the same seed (twin memories), in JAX's dtypes; sums computed asynchronously on
the device from 300 batches equal the host's, with each batch released after its sum (a slot
reused before the learner's work on it ran would differ), and the same with a step made slow
on purpose (a host callback it waits for) while the learner runs ahead; a batch never released
is deleted and its slot comes back; the same through PyTorch (given back at the next take,
after the consumer's stream) and CuPy; a step captured as a CUDA graph per slot reads each
slot's next batch; error paths; then (last: they close a feed with arrays alive) the memory of
arrays alive stays valid after close.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu_feed import fields, make_memory  # noqa: E402

from memoire import _core, _cuda  # noqa: E402
from memoire.feed import Feed  # noqa: E402

RESULTS = []
faulthandler.enable(all_threads=True)  # a crash prints every thread's Python stack


def check(name):
    def wrap(fn):
        def run(*a):
            try:
                note = fn(*a)
            except _Skip as e:
                RESULTS.append((name, "SKIP"))
                print(f"SKIP {name}: {e}", flush=True)
                return
            except Exception:  # noqa: BLE001 - report and go on
                RESULTS.append((name, "FAIL"))
                print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
                return
            RESULTS.append((name, "PASS"))
            print(f"PASS {name}{': ' + note if note else ''}", flush=True)
            # What the check left to the garbage collector goes now: a crash there names it.
            print(f"  (collecting after: {name})", flush=True)
            gc.collect()

        return run

    return wrap


class _Skip(Exception):
    pass


def host_sum(b, wrap=True):
    """3 * sum(state) + sum(next_state) of a host batch (modulo 2**32 with wrap)."""
    if wrap:
        u = np.uint32
        return int(b.prev[0].sum(dtype=u) * u(3) + b.next[0].sum(dtype=u))
    return int(b.prev[0].astype(np.int64).sum() * 3 + b.next[0].astype(np.int64).sum())


def cuda_ok():
    try:
        rt = _cuda.runtime()
    except RuntimeError:
        return False
    return rt is not None


@check("CUDA runtime loads (or names what it found)")
def runtime_loads():
    try:
        rt = _cuda.runtime()
    except RuntimeError as e:
        assert "\n" not in str(e) and str(e).startswith("CUDA runtime"), str(e)
        return f"no usable runtime here: {e}"
    return f"{rt.path}, version {rt.version}, {rt.device_count} device(s)"


def jax_target():
    import jax

    return jax.devices()[0]


@check("JAX: device batches equal host batches for the same seed")
def jax_equal(batch, n):
    import jax

    dev = jax_target()
    with (
        Feed(make_memory(n, 5), batch, depth=3, seed=0) as host,
        Feed(make_memory(n, 5), batch, depth=3, device=dev) as feed,
    ):
        for _ in range(20):
            h, d = fields(next(host)), fields(next(feed))
            for a, b in zip(h, d):
                assert isinstance(b, jax.Array) and b.devices() == {dev}, type(b)
                assert b.dtype == jax.dtypes.canonicalize_dtype(a.dtype), (b.dtype, a.dtype)
                np.testing.assert_array_equal(np.asarray(b), a.astype(b.dtype))
            feed.release()
        pinned = feed._ring.pinned
        if dev.platform != "cpu":
            assert pinned == 3, f"{pinned} of 3 host slots page-locked"
        return f"{dev}, {feed.last_transfer_bytes} bytes per batch, {pinned} host slots pinned"


@check("JAX: async device sums over 300 batches equal the host's (no slot reused early)")
def jax_async(batch, n):
    import jax
    import jax.numpy as jnp

    @jax.jit
    def total(s, s2):
        # Enough work per batch that the GPU runs behind the learner's thread.
        x = s.astype(jnp.float32)
        for _ in range(4):
            x = jnp.tanh(x * 1.0001)
        u = jnp.uint32  # sums wrap modulo 2**32 on both sides
        return jnp.sum(s.astype(u), dtype=u) * u(3) + jnp.sum(s2.astype(u), dtype=u), jnp.sum(x)

    sums = []
    with Feed(make_memory(n, 6), batch, depth=3, device=jax_target()) as feed:
        for _ in range(300):
            b = next(feed)
            sums.append(total(b.prev[0], b.next[0])[0])
            feed.release(after=sums[-1])
            del b
        assert feed._lender.dropped == 0
    got = np.array([int(s) for s in sums])
    want = []
    with Feed(make_memory(n, 6), batch, depth=3) as host:
        for _ in range(300):
            b = next(host)
            want.append(host_sum(b))
    bad = int((got != np.array(want)).sum())
    assert bad == 0, f"{bad} of 300 batches differ"


@check("JAX: a slow step's delayed reads see their batches, released or not")
def jax_slow(batch, n):
    import jax
    import jax.numpy as jnp

    def pause(x):
        import time

        time.sleep(0.02)
        return np.zeros((), np.uint32)

    @jax.jit
    def total(s, s2):
        # The sums read the slot only after the host callback returns: a slot rewritten
        # meanwhile (given back too early) would give another sum.
        z = jax.pure_callback(pause, jax.ShapeDtypeStruct((), np.uint32), s[0, 0, 0, 0])
        u = jnp.uint32
        return jnp.sum(s.astype(u) + z, dtype=u) * u(3) + jnp.sum(s2.astype(u), dtype=u)

    with Feed(make_memory(n, 6), batch, depth=3) as host:
        want = [host_sum(next(host)) for _ in range(24)]
    for release in (True, False):
        sums = []
        with Feed(make_memory(n, 6), batch, depth=3, device=jax_target()) as feed:
            for _ in range(24):
                b = next(feed)
                sums.append(total(b.prev[0], b.next[0]))
                if release:
                    feed.release(after=sums[-1])
            dropped = feed._lender.dropped
        got = [int(x) for x in sums]
        bad = sum(g != w for g, w in zip(got, want))
        assert bad == 0, f"release={release}: {bad} of 24 batches differ"
        assert dropped == (0 if release else 23), dropped


@check("JAX: close with a batch alive keeps its memory valid")
def jax_close(batch, n):
    import jax

    feed = Feed(make_memory(n, 7), batch, depth=2, device=jax_target(), device_slots=2)
    with Feed(make_memory(n, 7), batch, depth=2) as host:
        try:
            kept = fields(next(feed))
            want = [x.copy() for x in fields(next(host))]
        finally:
            feed.close()
    jax.block_until_ready(kept)
    for x, y in zip(kept, want):
        np.testing.assert_array_equal(np.asarray(x), y.astype(x.dtype))


@check("PyTorch: a batch goes back at the next take; close with tensors alive")
def torch_slots(batch, n):
    try:
        import torch
    except ImportError:
        raise _Skip("torch does not import") from None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    feed = Feed(make_memory(n, 7), batch, depth=2, device=device, device_slots=2)
    try:
        for _ in range(5):
            next(feed)
            assert feed._ring.held == 1, feed._ring.held  # the previous one went back
        kept = fields(next(feed))
        want = [x.cpu().numpy().copy() for x in kept]
    finally:
        feed.close()
    for x, w in zip(kept, want):  # still valid after close
        np.testing.assert_array_equal(x.cpu().numpy(), w)
    del kept
    gc.collect()
    return device


@check("PyTorch: a step captured as a CUDA graph per slot reads each slot's batches")
def torch_graphs(batch, n):
    try:
        import torch
    except ImportError:
        raise _Skip("torch does not import") from None
    if not torch.cuda.is_available():
        raise _Skip("CUDA graphs need a CUDA device")
    out = torch.zeros((), dtype=torch.int64, device="cuda")

    def step(s, s2):  # writes its result into `out`, a static tensor
        out.copy_(s.long().sum() * 3 + s2.long().sum())

    with Feed(make_memory(n, 6), batch, depth=3, device="cuda", device_slots=3) as feed:
        graphs = {}
        side = torch.cuda.Stream()
        while len(graphs) < feed.device_slots:  # one graph per slot, on the slot's tensors
            b = next(feed)
            if feed.last_slot in graphs:
                continue
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step(b.prev[0], b.next[0])  # warm-up, as torch.cuda.graph wants
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step(b.prev[0], b.next[0])
            graphs[feed.last_slot] = g
        got = []
        for _ in range(60):
            next(feed)
            graphs[feed.last_slot].replay()
            got.append(out.clone())
        taken = feed.taken
    got = [int(x) for x in got]
    with Feed(make_memory(n, 6), batch, depth=3) as host:
        want = [host_sum(next(host), wrap=False) for _ in range(taken)][-60:]
    bad = sum(g != w for g, w in zip(got, want))
    assert bad == 0, f"{bad} of 60 replays differ"


@check("PyTorch: device batches equal host batches; async sums over 300 batches")
def torch_checks(batch, n):
    try:
        import torch
    except ImportError:
        raise _Skip("torch does not import") from None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with (
        Feed(make_memory(n, 5), batch, depth=3) as host,
        Feed(make_memory(n, 5), batch, depth=3, device=device) as feed,
    ):
        for _ in range(20):
            h, d = fields(next(host)), fields(next(feed))
            for a, b in zip(h, d):
                assert isinstance(b, torch.Tensor) and b.device.type == device, b
                np.testing.assert_array_equal(b.cpu().numpy(), a)
    sums = []
    with Feed(make_memory(n, 6), batch, depth=3, device=device) as feed:
        for _ in range(300):
            b = next(feed)  # gives the previous batch back, after the work queued on it
            x = b.prev[0].float()
            for _ in range(4):
                x = torch.tanh(x * 1.0001)
            sums.append(b.prev[0].long().sum() * 3 + b.next[0].long().sum() + 0 * x.sum().long())
            del b, x
    got = [int(s) for s in sums]
    with Feed(make_memory(n, 6), batch, depth=3) as host:
        want = []
        for _ in range(300):
            b = next(host)
            want.append(host_sum(b, wrap=False))
    bad = sum(g != w for g, w in zip(got, want))
    assert bad == 0, f"{bad} of 300 batches differ"
    return device


@check("CuPy: DLPack arrays (dlpack=True) equal host batches")
def cupy_checks(batch, n):
    if not cuda_ok():
        raise _Skip("no CUDA runtime")
    try:
        import cupy
    except ImportError:
        raise _Skip("cupy does not import") from None
    with (
        Feed(make_memory(n, 5), batch, depth=3) as host,
        Feed(make_memory(n, 5), batch, depth=3, device="cuda:0", dlpack=True) as feed,
    ):
        for _ in range(10):
            h, d = fields(next(host)), fields(next(feed))
            for a, b in zip(h, d):
                assert b.__dlpack_device__() == (2, 0)
                np.testing.assert_array_equal(cupy.asnumpy(cupy.from_dlpack(b)), a)


@check("error paths: a device out of range, a bad runtime path")
def errors(batch, n):
    try:
        _core.CudaRuntime(["/nonexistent/libcudart.so.99"])
    except RuntimeError as e:
        assert "/nonexistent/libcudart.so.99" in str(e)
    else:
        raise AssertionError("a missing library loaded")
    if not cuda_ok():
        try:
            Feed(make_memory(2000, 1), batch, device="cuda:0", dlpack=True)
        except RuntimeError as e:
            return f"no runtime: {e}"
        raise AssertionError("a CUDA feed without a runtime")
    count = _cuda.runtime().device_count
    try:
        Feed(make_memory(2000, 1), batch, device=f"cuda:{count}", dlpack=True)
    except ValueError as e:
        assert "device" in str(e), str(e)
        return str(e)
    raise AssertionError("a device out of range was accepted")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--fill", type=int, default=3000)
    args = ap.parse_args(argv)
    runtime_loads()
    # The checks that end a feed with arrays alive last: a crash there hides nothing else.
    checks = (jax_equal, jax_async, jax_slow, torch_checks, torch_graphs, cupy_checks, errors)
    for fn in (*checks, jax_close, torch_slots):
        fn(args.batch, args.fill)
    failed = sum(r == "FAIL" for _, r in RESULTS)
    print(
        f"smoke: {len(RESULTS)} checks, {failed} failed, "
        f"{sum(r == 'SKIP' for _, r in RESULTS)} skipped",
        flush=True,
    )
    return failed


if __name__ == "__main__":
    sys.exit(main())
