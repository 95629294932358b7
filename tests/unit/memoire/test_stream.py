"""Sampling streams (memoire.stream.SamplingStream, memoire.server.sampling_service): batches
bit for bit equal to in-process ones, credit bounding what is in flight, priority updates over
the stream, dead and restarted servers, hostile clients."""

import os
import time

import numpy as np
import pytest
import zmq
from _batches import assert_same_batch
from _waiting import wait_until

from memoire import ReplayMemory, _core, codec
from memoire.feed import Feed
from memoire.protocol import Msg
from memoire.server import ReplayMemoryServer
from memoire.stream import SamplingStream
from memoire.transport import native_libzmq

pytestmark = pytest.mark.skipif(
    not native_libzmq(), reason="needs the native message path (pyzmq's libzmq)"
)

FRAME = (12, 10)  # small Atari-like frames: uint8[12, 10]


def _templates():
    return (
        np.zeros(FRAME, np.uint8),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([2], np.int16),
    )


def _random_frames(rng, steps):
    return rng.integers(0, 255, (steps,) + FRAME).astype(np.uint8)


def _fill(rem, episodes=(40, 7, 60, 3, 25), seed=1, frames=_random_frames):
    """The same episodes (frames(rng, steps), random rewards, values and weights) into any
    memory."""
    rng = np.random.default_rng(seed)
    for k, steps in enumerate(episodes):
        rem.new_episode()
        rem.add_entries(
            frames(rng, steps),
            rng.integers(0, 6, steps),
            rng.normal(size=steps).astype(np.float32),
            rng.random(steps).astype(np.float32),
            rng.normal(size=steps).astype(np.float32),
            rng.integers(-9, 9, (steps, 2)).astype(np.int16),
            (rng.random(steps) + 0.1).astype(np.float32),
        )
        rem.close_episode(terminal=bool(k % 2))


def _configure(rem, frame_stack=4, multi_step=1, flags=None):
    rem.frame_stack = frame_stack
    rem.multi_step = multi_step
    rem.priority_exponent = 0.6
    if flags is not None:
        rem.cache_flags = flags


def _server(seed=7, max_step=150, **settings):
    srv = ReplayMemoryServer(*_templates(), max_step, pub_endpoint=None, seed=seed)
    _configure(srv.rem, **settings)
    _fill(srv.rem)
    return srv


# ---------------------------------------------------------------- batches equal in-process

SETTINGS = [
    dict(frame_stack=4, multi_step=1),  # Atari: 5 distinct rows per transition
    dict(frame_stack=3, multi_step=5),  # next does not overlap prev
    dict(frame_stack=1, multi_step=1),
    dict(
        frame_stack=2,
        multi_step=1,  # some stacks left out
        flags=[1, 0, 1, 0, 1, 0, 1, 0, 0, 1, 1, 1, 0, 0],
    ),
]


# (transport, shared memory, sampler threads per stream)
WAYS = [
    ("tcp", False, 1),
    ("ipc", False, 1),
    ("tcp", False, 2),
    ("ipc", False, 4),
    ("tcp", True, 1),
    ("ipc", True, 1),
    ("ipc", True, 2),
    ("tcp", True, 4),
]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("transport,shm,threads", WAYS)
def test_batches_equal_in_process_bit_for_bit(settings, transport, shm, threads, tmp_path):
    # The same contents and seed: the stream is the server memory's only sampler, so its
    # batches are the ones the local memory's get_batch draws, in the same order. With N > 1
    # sampler threads too: batch seq k is the stream's k-th draw (docs/STREAM.md), so this
    # pins the order of batches with 2 and 4 threads.
    local = ReplayMemory(*_templates(), 150)
    local.seed(7)
    _configure(local, **settings)
    _fill(local)
    with _server(seed=7, **settings) as srv:
        ep = srv.start_stream(
            "tcp://127.0.0.1:*" if transport == "tcp" else f"ipc://{tmp_path}/stream.ipc",
            threads=threads,
        )
        with SamplingStream(ep, 16, credit=5, depth=3, timeout=10, shared_memory=shm) as stream:
            assert stream.shared_memory == shm
            for _ in range(30):
                got, want = next(stream), local.get_batch(16)
                assert_same_batch(got, want)
                assert got.num_sampleable == local.num_sampleable
                assert got.total_weight == pytest.approx(local.total_weight, rel=1e-12)
        # Fewer bytes on the wire: distinct rows, not stacks
        assert srv.stats()["stream_batches"] >= 30


@pytest.mark.parametrize("shm", [True, False])
def test_a_stream_feeds_the_device_path_with_get_batchs_batches(shm, tmp_path):
    # SamplingStream(device=...): on one host the device ring copies straight from the server's
    # shared-memory slots (each goes back to the server once copied); over the socket from the
    # stream's own ring. The lent batches (JAX arrays on JAX's CPU device, through the host
    # stand-in) are the memory's draws in order, 64-bit parts as JAX holds them.
    jax = pytest.importorskip("jax")
    local = ReplayMemory(*_templates(), 150)
    local.seed(7)
    _configure(local)
    _fill(local)
    with _server(seed=7) as srv:
        ep = srv.start_stream(f"ipc://{tmp_path}/stream.ipc")
        with SamplingStream(
            ep, 16, credit=4, depth=3, timeout=10, shared_memory=shm, device="jax", device_slots=2
        ) as stream:
            assert stream.shared_memory == shm
            for _ in range(25):
                got, want = next(stream), local.get_batch(16)
                for x, y in zip(got.prev + got.next, want.prev + want.next):
                    assert (x is None) == (y is None)
                    if y is not None:
                        assert isinstance(x, jax.Array)
                        assert x.dtype == jax.dtypes.canonicalize_dtype(y.dtype)
                        np.testing.assert_array_equal(np.asarray(x), y.astype(x.dtype))
                np.testing.assert_array_equal(got.id, want.id)  # on the host, int64
                assert got.num_sampleable == local.num_sampleable
                stream.release()
            assert stream._feed.taken == 25


def _batch_key(b) -> bytes:
    """A batch's every array, as bytes: equal keys, equal batches."""
    parts = [x for x in b.prev + b.next if x is not None] + [b.weight, b.prob, b.done, b.id]
    return b"".join(np.ascontiguousarray(x).tobytes() for x in parts)


@pytest.mark.parametrize("connections,threads", [(2, 1), (3, 2)])
def test_connections_bring_the_memorys_draws_each_once(connections, threads):
    # Several connections are several streams of the one memory: together they draw the
    # memory's sequence (get_batch's for the same seed), and every batch arrives once, over
    # whichever connection drew it, in no set order across connections.
    settings = dict(frame_stack=4, multi_step=1)
    local = ReplayMemory(*_templates(), 150)
    local.seed(7)
    _configure(local, **settings)
    _fill(local)
    credit, depth, at_least, at_most = 3, 4, 60, 600
    with _server(seed=7, **settings) as srv:
        ep = srv.start_stream(threads=threads)
        with SamplingStream(
            ep, 16, credit=credit, depth=depth, shared_memory=False, connections=connections
        ) as stream:
            assert stream.connections == connections and not stream.shared_memory
            assert srv.stats()["sampling_streams"] == connections
            got = []  # (key, num_sampleable, total_weight): a batch holds its ring slot
            # Each connection has its own receiving thread, and each delivers: not necessarily
            # within the first 60 batches (one under AddressSanitizer once delivered none of
            # them while the other's thread took every free slot), so batches are taken until
            # both did, within a bound.
            while len(got) < at_least or not all(s.received > 0 for s in stream._sources):
                assert len(got) < at_most, [s.received for s in stream._sources]
                b = next(stream)
                got.append((_batch_key(b), b.num_sampleable, b.total_weight))
                ids = b.id.copy()
            # The threads go on receiving meanwhile (this once read the total before the
            # parts and saw 60 == 61 fail): counts only grow, so the total read after the parts
            # is at least their sum, and at least what was taken.
            parts = [source.received for source in stream._sources]
            assert stream.received >= sum(parts) >= len(got)
            stream.update_priorities(ids, np.full(16, 2.0, np.float32))
            wait_until(
                lambda: srv.stats().get("stream_priority_updates", 0) == 1,
                "srv.stats().get('stream_priority_updates', 0) == 1",
            )
        wait_until(
            lambda: srv.stats()["sampling_streams"] == 0, "srv.stats()['sampling_streams'] == 0"
        )  # every connection closed
    taken = len(got)
    drawn = [local.get_batch(16) for _ in range(taken + connections * (credit + depth + threads))]
    index = {_batch_key(b): i for i, b in enumerate(drawn)}
    positions = [index.get(key) for key, _, _ in got]
    assert None not in positions  # each one of the memory's draws...
    assert len(set(positions)) == taken  # ...and none twice
    for _, num_sampleable, total_weight in got:  # nothing written while they were drawn
        assert num_sampleable == local.num_sampleable
        assert total_weight == pytest.approx(local.total_weight, rel=1e-12)


def test_connections_are_checked_and_shared_memory_needs_one():
    with _server() as srv:
        ep = srv.start_stream()
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="connections: expected an int >= 1"):
                SamplingStream(ep, 4, connections=bad)
        with pytest.raises(ValueError, match=r"connections: expected <= depth \(2\)"):
            SamplingStream(ep, 4, depth=2, connections=3, shared_memory=False)
        assert srv.stats()["sampling_streams"] == 0  # nothing opened by the refusals
        with SamplingStream(ep, 4, connections=3, shared_memory=True) as stream:
            assert stream.shared_memory and stream.connections == 1
            next(stream)
            assert srv.stats()["sampling_streams"] == 1
            # The native feed takes a stream's sources only, over the socket, one thread each.
            with pytest.raises(ValueError, match="needs no feed"):
                _core.Feed(stream._sources, [], 4, 2, 1, 0)
        with SamplingStream(ep, 4, connections=2, shared_memory=False) as stream:
            with pytest.raises(ValueError, match="one thread per connection \\(2\\), got 1"):
                _core.Feed(stream._sources, [], 4, 2, 1, 0)
        with pytest.raises(ValueError, match="got an element of type int"):
            _core.Feed([stream._source, 3], [], 4, 2, 1, 0)
        with pytest.raises(ValueError, match="got an empty list"):
            _core.Feed([], [], 4, 2, 1, 0)


def _compressible_frames(frame):
    """Frames of shape `frame` that compress (runs of a few values), with some random ones,
    which a compressing memory stores raw: both kinds of stored row."""

    def frames(rng, steps):
        out = np.repeat(
            (rng.integers(0, 4, (steps, frame[0], 1)) * 60).astype(np.uint8), frame[1], axis=2
        )
        out[::5] = rng.integers(0, 255, out[::5].shape, dtype=np.uint8)
        return out

    return frames


@pytest.mark.parametrize("frame,batch,threads", [((12, 10), 16, 1), ((84, 84), 32, 2)])
def test_compressed_states_travel_as_blocks_and_stack_bit_for_bit(frame, batch, threads):
    # A memory that compresses its states sends a rows stream its LZ4 blocks as stored; the
    # learner decodes each distinct row once and stacks the batch get_batch draws. Atari-sized
    # batches (1.8 MB of stacks) are decoded and stacked half on the learner's helper thread.
    templates = (np.zeros(frame, np.uint8),) + _templates()[1:]
    local = ReplayMemory(*templates, 150)
    local.seed(7)
    _configure(local)
    _fill(local, seed=3, frames=_compressible_frames(frame))
    srv = ReplayMemoryServer(*templates, 150, pub_endpoint=None, seed=7, compress_states=True)
    with srv:
        _configure(srv.rem)
        _fill(srv.rem, seed=3, frames=_compressible_frames(frame))
        assert srv.rem.stored_state_bytes < local.stored_state_bytes / 2
        ep = srv.start_stream(threads=threads)
        with SamplingStream(ep, batch, credit=4, timeout=10, shared_memory=False) as stream:
            assert stream.compressed_rows
            for _ in range(20):
                assert_same_batch(next(stream), local.get_batch(batch))
        # Over shared memory the server writes decoded stacks: nothing to agree on.
        with SamplingStream(ep, batch, credit=4, timeout=10, shared_memory=True) as stream:
            assert not stream.compressed_rows
            next(stream)
    # A memory that does not compress sends rows as they are, to the same learner.
    with _server() as plain, SamplingStream(plain.start_stream(), 4, shared_memory=False) as s:
        assert not s.compressed_rows
        next(s)


def test_stream_is_a_feed_layout():
    # The same arrays (dtype, shape, None fields) as an in-process feed's.
    from memoire.feed import Feed

    with _server(flags=[1] * 7 + [0] * 7) as srv:
        local = ReplayMemory(*_templates(), 150)
        _configure(local, flags=[1] * 7 + [0] * 7)
        _fill(local)
        with SamplingStream(srv.start_stream(), 8) as stream, Feed(local, 8) as feed:
            a, b = next(stream), next(feed)
            assert [None if x is None else (x.dtype, x.shape) for x in a.prev + a.next] == [
                None if x is None else (x.dtype, x.shape) for x in b.prev + b.next
            ]
            with pytest.raises(ValueError, match="its own feed"):
                Feed(stream, 8)  # one consumer per connection


def test_two_endpoints_serve_side_by_side(tmp_path):
    # Each endpoint's loop has its own streams (ROUTER identities are per socket).
    with _server() as srv:
        tcp, ipc = srv.start_stream(), srv.start_stream(f"ipc://{tmp_path}/two.ipc")
        with SamplingStream(tcp, 4, credit=3) as a, SamplingStream(ipc, 4, credit=3) as b:
            for _ in range(30):
                next(a)
                next(b)
            assert srv.stats()["sampling_streams"] == 2


# ---------------------------------------------------------------- credit


@pytest.mark.parametrize("credit,depth,threads", [(1, 1, 1), (3, 2, 1), (8, 4, 1), (3, 2, 4)])
def test_credit_bounds_batches_in_flight(credit, depth, threads):
    # Rows in messages: whatever the server's sampler threads, batches sent never exceed those
    # the learner received plus its credit (counted by the server).
    with _server() as srv:
        ep = srv.start_stream(threads=threads)
        with SamplingStream(ep, 4, credit=credit, depth=depth, shared_memory=False) as stream:
            taken = 5
            for _ in range(taken):
                next(stream)
            # The ring refills (depth batches), then everything stops: nothing is taken.
            wait_until(lambda: stream.received == taken + depth, "the ring refilled")
            sent = _settled(srv, threads)  # final: the samplers wait for credit
            assert stream.received == taken + depth
            assert sent - stream.received <= credit
            assert sent <= taken + depth + credit
            # Taking more lets more through, still within the bound.
            for _ in range(3 * (credit + depth)):
                next(stream)
            assert srv.stats()["stream_batches"] <= 3 * (credit + depth) + taken + depth + credit


@pytest.mark.parametrize("credit,threads", [(1, 1), (3, 1), (8, 1), (1, 4), (3, 2), (8, 4)])
def test_shared_memory_slots_bound_batches_and_kept_batches_hold_one_each(credit, threads):
    # With any number of sampler threads the slots bound what was drawn: batches sent never
    # exceed those taken plus the credit (counted by the server).
    with _server() as srv:
        ep = srv.start_stream(threads=threads)
        with SamplingStream(ep, 4, credit=credit, shared_memory=True) as stream:
            assert stream.shared_memory
            taken = 5
            for _ in range(taken):
                next(stream)  # dropped at once: its slot goes back
            assert taken <= _settled(srv, threads) <= taken + credit
            # Each batch kept holds its slot (its arrays are views of it, never rewritten).
            kept = [next(stream) for _ in range(credit)]
            copies = [b.prev[0].copy() for b in kept]
            with pytest.raises(RuntimeError, match="holds all"):
                next(stream)
            # One slot back (not the oldest: any order) and the stream goes on through it,
            # the batches still kept unchanged.
            del kept[credit // 2], copies[credit // 2]
            for _ in range(3 * credit + 2):
                assert next(stream).prev[0].shape[0] == 4
            for b, c in zip(kept, copies):
                np.testing.assert_array_equal(b.prev[0], c)
            assert srv.stats()["stream_batches"] <= taken + 5 * credit + 2


def _settled(srv, threads, want=0):
    """The server's stream_batches once it drew at least `want` and every one of its `threads`
    sampler threads waits for its learner: then it draws nothing more until the learner
    moves, so the count is final (a server that would overshoot has done so)."""

    def waiting():
        s = srv.stats()
        return s.get("stream_batches", 0) >= want and s["stream_samplers_waiting"] == threads

    wait_until(waiting, f"{want} batches drawn and {threads} sampler(s) waiting for the learner")
    return srv.stats().get("stream_batches", 0)


@pytest.mark.parametrize("threads,ahead", [(1, None), (1, 2), (2, 1), (4, 3), (4, None)])
def test_shared_memory_keeps_only_ahead_batches_drawn_and_not_taken(threads, ahead):
    # Whatever the threads, the server draws at most `ahead` batches beyond those the learner
    # took (default: threads + 1), free slots or not; the slots stay the bound for batches
    # the learner holds.
    credit = 8
    k = threads + 1 if ahead is None else ahead
    with _server() as srv:
        ep = srv.start_stream(threads=threads)
        with SamplingStream(ep, 4, credit=credit, ahead=ahead, shared_memory=True) as stream:
            assert _settled(srv, threads, k) == k
            kept = [next(stream) for _ in range(3)]  # taken and held: 3 more drawn
            assert _settled(srv, threads, 3 + k) == 3 + k
            kept += [next(stream) for _ in range(credit - 3)]  # all 8 slots held
            assert _settled(srv, threads, credit) == credit
            with pytest.raises(RuntimeError, match="holds all"):
                next(stream)
            del kept[:2]  # 2 slots back, nothing untaken: 2 drawn (at most ahead)
            assert _settled(srv, threads, credit + min(2, k)) == credit + min(2, k)
            assert next(stream).prev[0].shape[0] == 4


def _batch_scheduled_threads():
    """This process's threads running as Linux's SCHED_BATCH (their ids)."""
    tids = set()
    for t in os.listdir("/proc/self/task"):
        try:
            if os.sched_getscheduler(int(t)) == os.SCHED_BATCH:
                tids.add(int(t))
        except OSError:  # a thread that ended meanwhile
            pass
    return tids


def test_background_samplers_run_as_batch_work_and_the_learner_does_not():
    # A server's stream samplers and a learner's feed and receiving threads run as SCHED_BATCH,
    # so that waking them never preempts the learner (core/batch_scheduling.h); the learner's
    # own thread keeps its policy, and the threads go with what they serve.
    before = _batch_scheduled_threads()
    local = ReplayMemory(*_templates(), 150)
    _configure(local)
    _fill(local)
    with _server() as srv:
        with SamplingStream(srv.start_stream(threads=3), 4, shared_memory=True) as shm:
            next(shm)
            # (A thread sets its own policy as it starts: counts are waited for, bounded.)
            wait_until(
                lambda: len(_batch_scheduled_threads() - before) == 3,
                "len(_batch_scheduled_threads() - before) == 3",
            )  # samplers
            with SamplingStream(srv.start_stream(threads=2), 4, shared_memory=False) as rows:
                next(rows)
                feed = Feed(local, 4, threads=2)
                next(feed)
                # + the rows stream's 2 server samplers and its receiving thread, + the
                # feed's 2 samplers
                wait_until(
                    lambda: len(_batch_scheduled_threads() - before) == 8,
                    "len(_batch_scheduled_threads() - before) == 8",
                )
                feed.close()
            wait_until(
                lambda: len(_batch_scheduled_threads() - before) == 3,
                "len(_batch_scheduled_threads() - before) == 3",
            )
    wait_until(lambda: _batch_scheduled_threads() <= before, "_batch_scheduled_threads() <= before")
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_ahead_is_checked_on_both_sides():
    with _server() as srv:
        ep = srv.start_stream()
        for bad in (0, 9, 1.5, True, "2"):
            with pytest.raises(ValueError, match="ahead"):
                SamplingStream(ep, 4, credit=8, ahead=bad, shared_memory=True)
        ctx = zmq.Context()
        peer = ctx.socket(zmq.DEALER)
        peer.linger = 0
        peer.connect(ep)
        try:
            n = srv.stats()["rejected"].get("stream_request", 0)
            reply = _ask(peer, _stream(dict(_SHM_OPEN, ahead=4)))  # more than its credit, 3
            assert reply.type == Msg.ERROR and "ahead must be an int in [1, credit=3]" in str(
                reply.values["reason"]
            )
            assert srv.stats()["rejected"]["stream_request"] == n + 1
            assert srv.stats()["sampling_streams"] == 0  # nothing opened
        finally:
            peer.close(0)
            ctx.term()


def _held_back_again(srv, threads):
    """Waits until the limiter has held the stream's samplers back `threads` more times from
    now: they tried to draw again and were refused, so the count of batches is final."""
    before = srv.stats().get("stream_rate_limited", 0)
    wait_until(
        lambda: srv.stats().get("stream_rate_limited", 0) >= before + threads,
        "the limiter to hold the samplers back again",
    )


@pytest.mark.parametrize("shm", [True, False])
@pytest.mark.parametrize("threads", [1, 4])
def test_the_servers_rate_limiter_holds_streams_in_its_band(threads, shm):
    from memoire.rate_limiter import SampleToInsertRatio

    # Band [36, 164] around 2 * 50: with I transitions inserted, at most 2 * I - 36 rows may
    # be sampled, in batches of 8.
    limiter = SampleToInsertRatio(2.0, 50, 64.0)
    srv = ReplayMemoryServer(*_templates(), 150, pub_endpoint=None, seed=7, rate_limiter=limiter)
    with srv:
        _configure(srv.rem)
        _fill(srv.rem)  # 135 transitions, stored directly: counted by hand
        limiter.inserted(135)
        ep = srv.start_stream(threads=threads)
        with SamplingStream(ep, 8, credit=8, depth=2, timeout=10, shared_memory=shm) as stream:
            for _ in range(29):  # (2 * 135 - 36) // 8
                next(stream)
            _held_back_again(srv, threads)  # a server that would overshoot has done so
            assert srv.stats()["stream_batches"] == 29
            assert limiter.counters()["samples"] == 29 * 8
            assert srv.stats()["stream_rate_limited"] > 0
            limiter.inserted(40)  # 80 more rows: 10 more batches
            for _ in range(10):
                next(stream)
            _held_back_again(srv, threads)
            assert srv.stats()["stream_batches"] == 39
            assert limiter.counters()["samples"] == 39 * 8


def test_a_stream_batch_the_limiters_band_can_never_allow_is_an_error_not_a_dead_worker():
    from memoire.rate_limiter import SampleToInsertRatio

    limiter = SampleToInsertRatio(1.0, 10, 4.0)  # a band 8 wide: a batch of 16 never fits
    srv = ReplayMemoryServer(*_templates(), 150, pub_endpoint=None, seed=7, rate_limiter=limiter)
    with srv:
        _configure(srv.rem)
        _fill(srv.rem)
        limiter.inserted(135)
        ep = srv.start_stream()
        for shm in (True, False):
            with SamplingStream(ep, 16, credit=1, depth=1, timeout=10, shared_memory=shm) as s:
                with pytest.raises(Exception, match="band"):
                    next(s)
            with SamplingStream(ep, 2, credit=1, depth=1, timeout=10, shared_memory=shm) as s:
                assert next(s).id.shape == (2,)  # the worker serves on


# ---------------------------------------------------------------- priorities


def test_priority_updates_land():
    with _server() as srv:
        credit, depth = 4, 2
        with SamplingStream(srv.start_stream(), 8, credit=credit, depth=depth) as stream:
            first = next(stream)
            zeroed = set(first.id.tolist())
            before = srv.rem.num_sampleable
            stream.update_priorities(first.id, np.zeros(8, np.float32))
            wait_until(
                lambda: srv.stats().get("stream_priority_updates", 0) == 1,
                "srv.stats().get('stream_priority_updates', 0) == 1",
            )
            assert srv.rem.num_sampleable == before - len(zeroed)
            # At most credit + depth batches were drawn before the update; none after it
            # holds a zeroed entry.
            for _ in range(credit + depth):
                next(stream)
            for _ in range(40):
                assert not zeroed & set(next(stream).id.tolist())
            with pytest.raises(ValueError, match="finite"):
                stream.update_priorities(first.id[:1], [np.nan])
            with pytest.raises(ValueError, match="ids"):
                stream.update_priorities(first.id[:2], [1.0])


@pytest.mark.parametrize("connections", [1, 2])
def test_a_priority_update_lands_while_the_learner_takes_nothing(connections):
    # The update leaves even when the receiving thread held the socket as it was posted and
    # then parked on the full ring: nothing is taken until the update is applied.
    with _server() as srv:
        with SamplingStream(
            srv.start_stream(),
            4,
            credit=2,
            depth=2,
            shared_memory=False,
            connections=connections,
        ) as stream:
            for k in range(1, 101):
                ids = next(stream).id.copy()  # a slot frees: the thread receives and stacks
                stream.update_priorities(ids, np.ones(4, np.float32))
                wait_until(
                    lambda: srv.stats().get("stream_priority_updates", 0) == k,
                    "srv.stats().get('stream_priority_updates', 0) == k",
                    timeout=5.0,
                )


# ---------------------------------------------------------------- dead and restarted servers


def test_dead_server_raises_timeout_not_hang():
    srv = _server()
    stream = SamplingStream(srv.start_stream(), 4, credit=2, depth=2, timeout=1.0)
    try:
        next(stream)
        srv.close()
        with pytest.raises(TimeoutError, match="no batch from the server"):
            for _ in range(2 + 2 + 3):  # what was in flight, then the silence
                next(stream)
    finally:
        stream.close()
        srv.close()


def test_nothing_listening_raises_timeout(tmp_path):
    with pytest.raises(TimeoutError, match="no answer"):
        SamplingStream(f"ipc://{tmp_path}/nobody.ipc", 4, timeout=0.3)


def test_restarted_server_is_reported(tmp_path):
    ep = f"ipc://{tmp_path}/restart.ipc"
    first = _server()
    first.start_stream(ep)
    stream = SamplingStream(ep, 4, credit=2, depth=2, timeout=5.0)
    try:
        next(stream)
        first.close()
        with _server() as second:
            second.start_stream(ep)
            with pytest.raises(RuntimeError, match="restarted"):
                for _ in range(2 + 2 + 3):
                    next(stream)
            assert second.stats()["rejected"].get("stream_unknown", 0) >= 1
    finally:
        stream.close()
        first.close()


@pytest.mark.parametrize("shm", [True, False])
@pytest.mark.parametrize("threads", [1, 4])
def test_draw_error_reaches_the_learner_and_the_stream_goes_on(threads, shm):
    with ReplayMemoryServer(*_templates(), 150, pub_endpoint=None, seed=1) as srv:
        _configure(srv.rem)
        ep = srv.start_stream(threads=threads)
        with SamplingStream(ep, 4, credit=2, depth=1, shared_memory=shm) as stream:
            with pytest.raises(RuntimeError, match="no sampleable entry"):
                next(stream)
            _fill(srv.rem)
            got = None
            for _ in range(50):  # the errors already in flight, then batches again
                try:
                    got = next(stream)
                    break
                except RuntimeError:
                    pass
            assert got is not None and got.prev[0].shape == (4, 4) + FRAME


# ---------------------------------------------------------------- hostile clients


def _ask(sock, frames, timeout_ms=5000):
    sock.send_multipart(frames)
    assert sock.poll(timeout_ms), "the server must answer every refused request"
    return codec.decode(sock.recv_multipart(), expect=(Msg.ERROR, Msg.STREAM, Msg.STREAM_BATCH))


def _stream(values):
    return codec.encode(Msg.STREAM, values)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_hostile_client_is_refused_counted_and_the_server_keeps_serving(threads):
    with _server() as srv:
        ep = srv.start_stream(threads=threads)
        ctx = zmq.Context()
        bad = ctx.socket(zmq.DEALER)
        bad.linger = 0
        bad.connect(ep)
        try:
            cases = [
                (_stream({"op": "credit", "credit": 1}), "stream_unknown"),
                (_stream({"op": "open", "batch_size": 4, "credit": 10**12}), "stream_credit"),
                (_stream({"op": "open", "batch_size": 4, "credit": -3}), "stream_credit"),
                (_stream({"op": "open", "batch_size": 4, "credit": True}), "stream_credit"),
                (_stream({"op": "open", "batch_size": 4, "credit": "8"}), "stream_credit"),
                (_stream({"op": "open", "batch_size": 10**9, "credit": 1}), "batch_too_large"),
                (_stream({"op": "open", "batch_size": 2.5, "credit": 1}), "stream_request"),
                (_stream({"op": "drain everything"}), "stream_request"),
                ([b"MMRW\x01\x00\x0c\x00garbage"], "malformed"),
                ([b"not a memoire message", b"x" * 100], "malformed"),
                (codec.encode(Msg.HELLO, {"uuid": 1}), "malformed"),
            ]
            for frames, reason in cases:
                before = srv.stats()["rejected"].get(reason, 0)
                reply = _ask(bad, frames)
                assert reply.type == Msg.ERROR, reason
                assert srv.stats()["rejected"].get(reason, 0) == before + 1, reason
            # An open stream: bad credit and bad priorities are refused, the stream stays.
            reply = _ask(bad, _stream({"op": "open", "batch_size": 4, "credit": 1}))
            assert reply.type == Msg.STREAM and reply.values["op"] == "layout"
            assert bad.poll(5000)  # the batch its credit of 1 brought
            batch = codec.decode(bad.recv_multipart(), expect=(Msg.STREAM_BATCH,))
            assert batch.values["index"].shape == (4, 5)  # stack 4 + 1: 5 window rows
            for values, reason in [
                ({"op": "credit", "credit": 10**15}, "stream_credit"),
                ({"op": "credit", "credit": -1}, "stream_credit"),
                (
                    {
                        "op": "priorities",
                        "ids": np.zeros(3, np.float64),
                        "weights": np.zeros(3, np.float32),
                    },
                    "bad_priorities",
                ),
                (
                    {
                        "op": "priorities",
                        "ids": np.zeros(3, np.int64),
                        "weights": np.full(3, np.nan, np.float32),
                    },
                    "bad_priorities",
                ),
            ]:
                before = srv.stats()["rejected"].get(reason, 0)
                assert _ask(bad, _stream(values)).type == Msg.ERROR, reason
                assert srv.stats()["rejected"].get(reason, 0) == before + 1, reason
            # A legitimate learner is served all along.
            with SamplingStream(ep, 8, credit=4) as good:
                for _ in range(20):
                    assert next(good).prev[0].shape == (8, 4) + FRAME
            assert srv.stats()["sampling_streams"] >= 1
        finally:
            bad.close(0)
            ctx.term()


# ---------------------------------------------------------------- shared memory


def _shm_files():
    import glob

    return set(glob.glob("/dev/shm/memoire-stream-*"))


_SHM_OPEN = {
    "op": "open",
    "batch_size": 4,
    "credit": 3,
    "shared_memory": True,
    "shm_ring": _core.STREAM_RING_VERSION,
}


class _RawRing:
    """A stream's ring (cpp/core/stream_ring.h) as a raw peer maps it: the learner's end
    (`notices`, `give_back`), or, with `server=True`, the server's (`publish`)."""

    def __init__(self, layout: dict):
        import mmap

        slots, slot_bytes = int(layout["shm_slots"]), int(layout["shm_slot_bytes"])
        self.off = _core.stream_ring_offsets(slots)
        self.slots = slots
        fd = os.open(layout["shm_path"], os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, self.off["bytes"] + slots * slot_bytes)
        finally:
            os.close(fd)
        self.tail = self.head = 0

    def _u32(self, name):
        return np.frombuffer(self.map, np.uint32, 1, self.off[name])

    def _i64(self, name, n):
        return np.frombuffer(self.map, np.int64, n, self.off[name])

    def notices(self, want, timeout=5.0):
        """[(seq, slot)] of the next `want` notices (fewer if they do not come in time)."""
        entries = self._i64("notices", 4 * self.slots).reshape(self.slots, 4)
        out, deadline = [], time.monotonic() + timeout
        while len(out) < want and time.monotonic() < deadline:
            if int(self._u32("notice_head")[0]) == self.tail:
                time.sleep(0.002)
                continue
            seq, slot, error_bytes, _ = (int(x) for x in entries[self.tail % self.slots])
            assert error_bytes == 0
            out.append((seq, slot))
            self.tail += 1
            self.took()
        return out

    def took(self):
        """Says so, as a learner does: the tail and an event (the server keeps `ahead`)."""
        self._u32("notice_tail")[0] = self.tail
        self._u32("learner_events")[0] += 1

    def give_back(self, slots):
        credits = self._i64("credits", self.slots)
        for slot in slots:
            credits[self.head % self.slots] = slot
            self.head += 1
        self._u32("credit_head")[0] = self.head
        self._u32("learner_events")[0] += 1

    def publish(self, seq, slot):
        entries = self._i64("notices", 4 * self.slots).reshape(self.slots, 4)
        entries[self.head % self.slots] = (seq, slot, 0, 0)
        self.head += 1
        self._u32("notice_head")[0] = self.head

    def close(self):
        self.map.close()


def test_a_killed_servers_unmapped_file_is_removed_by_the_next_server(tmp_path):
    # A server killed with SIGKILL before its learner mapped the file leaves the file's name
    # (its destructor never ran). The next shared-memory stream opened on this host removes
    # such orphans: a file at least a minute old whose creator pid no longer exists. Younger
    # files and files of live creators stay.
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that no process has now
    old = time.time() - 120
    orphan = f"/dev/shm/memoire-stream-{child.pid}-00000000deadbeef"
    young = f"/dev/shm/memoire-stream-{child.pid}-00000000cafef00d"
    alive = f"/dev/shm/memoire-stream-{os.getpid()}-00000000feedface"
    other = "/dev/shm/memoire-streamless-1-00000000"  # not one of ours: never touched
    try:
        for path in (orphan, young, alive, other):
            with open(path, "wb") as f:
                f.write(b"\0" * 4096)
        for path in (orphan, alive, other):
            os.utime(path, (old, old))
        with _server() as srv:
            with SamplingStream(srv.start_stream(), 4, credit=2, shared_memory=True) as stream:
                assert stream.shared_memory
                next(stream)
        assert not os.path.exists(orphan)
        assert os.path.exists(young) and os.path.exists(alive) and os.path.exists(other)
    finally:
        for path in (orphan, young, alive, other):
            if os.path.exists(path):
                os.unlink(path)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_shared_memory_leaves_no_file_and_bounds_credit_by_slots(threads):
    before = _shm_files()
    with _server() as srv:
        ep = srv.start_stream(threads=threads)
        with SamplingStream(ep, 4, credit=3, shared_memory=True) as stream:
            assert stream.shared_memory
            next(stream)
            # Mapped on both sides, the name is gone: a crash of either leaves nothing.
            assert _shm_files() - before == set()
        # A raw peer: its slots cap its credit (3 slots, 3 granted).
        ctx = zmq.Context()
        peer = ctx.socket(zmq.DEALER)
        peer.linger = 0
        peer.connect(ep)
        try:
            # One that does not speak the server's ring gets the rows in messages.
            reply = _ask(
                peer, _stream({"op": "open", "batch_size": 4, "credit": 3, "shared_memory": True})
            )
            assert "shm_path" not in reply.values
            for _ in range(3):  # the batches its credit brought
                assert peer.poll(5000)
                codec.decode(peer.recv_multipart(), expect=(Msg.STREAM_BATCH,))
            reply = _ask(peer, _stream(_SHM_OPEN))
            assert reply.values["shm_slots"] == 3
            ring = _RawRing(reply.values)
            got = ring.notices(3)  # what its credit brought: seq and slot through the ring
            assert [seq for seq, _ in got] == [0, 1, 2]
            assert {slot for _, slot in got} == {0, 1, 2}  # the peer holds every slot now
            assert not peer.poll(100)  # and nothing came over the socket
            # Slots go back through the ring only: a credit message naming any is refused.
            n = srv.stats()["rejected"].get("stream_credit", 0)
            bad = [
                {"credit": 4},  # no slots named
                {"credit": 1, "slots": np.array([1], np.int64)},  # a proper-looking one
            ]
            for k, extra in enumerate(bad):
                reply = _ask(peer, _stream({"op": "credit", **extra}))
                assert reply.type == Msg.ERROR
                assert srv.stats()["rejected"]["stream_credit"] == n + k + 1
            # A slot given back through the ring is written again, named in the next notice.
            ring.give_back([1])
            assert ring.notices(1) == [(3, 1)]
            # A slot given back twice: refused, counted, and the stream dropped.
            ring.give_back([0, 0])
            assert peer.poll(5000), "the server must say why it drops the stream"
            error = codec.decode(peer.recv_multipart(), expect=(Msg.ERROR,))
            assert "not the learner's to give back" in error.values["reason"]
            assert srv.stats()["rejected"]["stream_credit"] == n + 3
            reply = _ask(peer, _stream({"op": "credit", "credit": 0}))
            assert reply.type == Msg.ERROR and "no open stream" in reply.values["reason"]
            ring.close()
        finally:
            peer.close(0)
            ctx.term()
    # The server let go of the slots of the peer that never mapped them.
    assert _shm_files() - before == set()


def test_stream_threads_are_checked():
    with _server() as srv:
        for bad in (0, 65, 1.5, "2", True):
            with pytest.raises(ValueError, match="threads"):
                srv.start_stream(threads=bad)
        assert srv.stats()["sampling_streams"] == 0  # nothing started


# ---------------------------------------------------------------- a hostile server


def _fake_batch(u, index, extra=None):
    from memoire.protocol import describe_schema

    values = {
        "seq": np.int64(0),
        "num_sampleable": np.int64(5),
        "total_weight": np.float64(1),
        "weight": np.ones(2, np.float32),
        "prob": np.ones(2),
        "done": np.zeros(2, bool),
        "id": np.arange(2, dtype=np.int64),
        "index": np.asarray(index, np.int32),
    }
    for name, dtype, shape in describe_schema(_templates()):
        values["rows/" + name] = np.zeros((u,) + tuple(shape), dtype)
    values.update(extra or {})
    return codec.encode(Msg.STREAM_BATCH, values)


def _fake_zbatch(sizes, total):
    """A batch of 3 distinct rows whose states are LZ4 blocks of `sizes` (uint8[12, 10] rows:
    120 bytes raw) in `total` bytes of garbage."""
    values = codec.decode(_fake_batch(3, [[0, 1, 2], [0, 1, 2]])).values
    del values["rows/s"]
    values["zsizes/s"] = np.asarray(sizes, np.uint32)
    values["zrows/s"] = np.full(total, 0xF7, np.uint8)
    return codec.encode(Msg.STREAM_BATCH, values)


@pytest.mark.parametrize(
    "frames_of,match,compressed",
    [
        (lambda: _fake_batch(3, [[0, 1, 99], [0, 1, 2]]), "outside", False),  # index past the rows
        (lambda: _fake_batch(3, [[0, 1, -1], [0, 1, 2]]), "outside", False),
        (lambda: _fake_batch(3, [[0, 1, 2]]), "index", False),  # wrong shape
        (
            lambda: _fake_batch(3, [[0, 1, 2], [0, 1, 2]], {"weight": np.ones(2, np.float64)}),
            "weight",
            False,
        ),  # wrong dtype
        (lambda: [b"MMRW garbage"], "header", False),
        (lambda: _fake_batch(3, [[0, 1, 2], [0, 1, 2]], {"seq": np.int64(5)}), "came after", False),
        # Compressed states (the layout says so): blocks that do not add up or do not decode
        (lambda: _fake_zbatch([120, 120, 120], 359), "in all", True),
        (lambda: _fake_zbatch([0, 120, 120], 240), "compressed row 0", True),
        (lambda: _fake_zbatch([121, 120, 118], 359), "compressed row 0", True),
        (lambda: _fake_zbatch([7, 120, 120], 247), "compressed row", True),  # 7 bytes of garbage
        (
            lambda: _fake_batch(3, [[0, 1, 2], [0, 1, 2]]),
            "missing entry .zrows",
            True,
        ),  # raw rows instead
    ],
)
def test_learner_refuses_malformed_batches(frames_of, match, compressed, tmp_path):
    # A server that answers the open properly, then sends a bad batch: the learner raises
    # memoire.ProtocolError (a ValueError) naming it, and reads nothing out of bounds.
    from memoire.protocol import describe_schema

    ctx = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)
    fake.linger = 0
    ep = f"ipc://{tmp_path}/fake.ipc"
    fake.bind(ep)
    try:
        import threading

        def serve():
            assert fake.poll(5000)
            ident, *_ = fake.recv_multipart()
            fake.send_multipart(
                [
                    ident,
                    *codec.encode(
                        Msg.STREAM,
                        {
                            "op": "layout",
                            "schema": [
                                (f, d, np.asarray(s, np.int64))
                                for f, d, s in describe_schema(_templates())
                            ],
                            "frame_stack": 2,
                            "multi_step": 1,
                            "flags": np.ones(14, bool),
                            "batch_size": 2,
                            "max_credit": 64,
                            # The compressed cases' layout: states as LZ4 blocks.
                            **({"compressed_rows": True} if compressed else {}),
                        },
                    ),
                ]
            )
            fake.send_multipart([ident, *frames_of()])

        t = threading.Thread(target=serve)
        t.start()
        stream = SamplingStream(ep, 2, credit=1, depth=1, timeout=5, shared_memory=False)
        t.join()
        with stream, pytest.raises(ValueError, match=match):
            next(stream)
    finally:
        fake.close(0)
        ctx.term()


@pytest.mark.parametrize(
    "notices,keep,match",
    [
        ([(0, 5)], 0, "not the server's"),  # a slot outside the mapping's 2
        ([(0, 0), (1, 0)], 1, "not the server's"),  # slot 0 again, while the learner reads it
        ([(3, 1)], 0, "came after"),  # batches 0-2 missing
    ],
)
def test_learner_refuses_bad_shared_memory_notices(notices, keep, match, tmp_path):
    # A server that maps real slots and answers the open properly, then names slots it does
    # not have: the learner raises memoire.ProtocolError and hands out no view of them.
    import threading

    from memoire.protocol import describe_schema

    rem = ReplayMemory(*_templates(), 64)
    _configure(rem, frame_stack=2, flags=np.ones(14, bool))
    shm = _core.StreamShm(rem, 2, 2)
    ctx = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)
    fake.linger = 0
    ep = f"ipc://{tmp_path}/fake.ipc"
    fake.bind(ep)
    layout = {
        "op": "layout",
        "schema": [(f, d, np.asarray(s, np.int64)) for f, d, s in describe_schema(_templates())],
        "frame_stack": 2,
        "multi_step": 1,
        "flags": np.ones(14, bool),
        "batch_size": 2,
        "max_credit": 64,
        "shm_path": shm.path,
        "shm_slots": 2,
        "shm_slot_bytes": shm.slot_bytes,
    }

    ring = _RawRing(layout)  # the fake's end, mapped before the learner removes the name

    def serve():
        assert fake.poll(5000)
        ident, *_ = fake.recv_multipart()
        fake.send_multipart([ident, *codec.encode(Msg.STREAM, layout)])
        for seq, slot in notices:
            ring.publish(seq, slot)

    try:
        t = threading.Thread(target=serve)
        t.start()
        stream = SamplingStream(ep, 2, credit=2, timeout=5, shared_memory=True)
        t.join()
        with stream:
            assert stream.shared_memory
            kept = [next(stream) for _ in range(keep)]
            with pytest.raises(ValueError, match=match):
                next(stream)
            assert stream.received == keep
            del kept
    finally:
        ring.close()
        fake.close(0)
        ctx.term()


# ---------------------------------------------------------------- memoire serve --stream


def test_memoire_serve_stream_flag(tmp_path):
    import re
    import signal
    import subprocess
    import sys

    from _subprocess_env import subprocess_env

    from memoire import ReplayMemoryClient

    cmd = [
        sys.executable,
        "-c",
        "import sys, memoire.commands.serve as s; sys.exit(s.main(sys.argv[1:]))",
        "--state_shape",
        "4",
        "--frame_stack",
        "2",
        "--interval",
        "5",
        "--stream",
        f"ipc://{tmp_path}/serve.ipc",
        "--stream_threads",
        "2",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=subprocess_env(),  # the memoire under test, whatever the folder
        cwd=str(tmp_path),
    )
    try:
        pub, rep, pull = re.match(
            r"memoire serve: pub (\S+)  rep (\S+)  pull (\S+)", proc.stdout.readline()
        ).groups()
        ep = re.match(r"memoire serve: stream (\S+)", proc.stdout.readline()).group(1)
        with ReplayMemoryClient(pub, rep, pull, mode="central", timeout=5) as c:
            c.new_episode()
            for k in range(6):
                c.add_entry(np.full(4, k, np.float32), k, 1.0, 0.5, 0.0)
            c.close_episode()
        with SamplingStream(ep, 3, credit=2, timeout=5) as stream:
            batch = None
            for _ in range(200):  # until the episode is stored (draws fail before)
                try:
                    batch = next(stream)
                    break
                except RuntimeError:
                    time.sleep(0.02)
            assert batch is not None and batch.prev[0].shape == (3, 2, 4)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0


# ---------------------------------------------------------------- CURVE


def test_curve_stream_serves_key_holders_only(tmp_path):
    from memoire.transport import CurveKeys, generate_keys

    server_pub, server_secret = generate_keys(str(tmp_path / "server"), "server")
    _, good_secret = generate_keys(str(tmp_path / "authorized"), "learner")
    _, bad_secret = generate_keys(str(tmp_path / "strangers"), "stranger")
    keys = CurveKeys(server_secret, authorized_dir=str(tmp_path / "authorized"))
    srv = ReplayMemoryServer(*_templates(), 150, pub_endpoint=None, seed=7, keys=keys)
    with srv:
        _configure(srv.rem)
        _fill(srv.rem)
        ep = srv.start_stream()
        good = CurveKeys(good_secret, server_public_file=server_pub)
        with SamplingStream(ep, 4, credit=2, keys=good, shared_memory=False) as stream:
            assert next(stream).prev[0].shape == (4, 4) + FRAME
        for k in (CurveKeys(bad_secret, server_public_file=server_pub), None):
            with pytest.raises(TimeoutError):
                SamplingStream(ep, 4, keys=k, timeout=0.3)
