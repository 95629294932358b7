"""The ZeroMQ transport of distributed training: chunks in, parameters out, backpressure."""

import multiprocessing as mp
import threading
import time

import numpy as np
import pytest

pytest.importorskip("zmq")
pytest.importorskip("gin")

from memoire.experiments import distributed as dist  # noqa: E402
from memoire.experiments import distributed_zmq as dz  # noqa: E402


def _chunk(n, start=0, end_at=None):
    obs = (start + np.arange(n, dtype=np.float32))[:, None].repeat(4, 1)
    end = np.zeros(n, bool)
    if end_at is not None:
        end[end_at] = True
    term = end.copy()
    return dist.Chunk(obs, np.arange(n, dtype=np.int32), np.ones(n, np.float32), term, end,
                      np.array([[float(n), float(n), 1.0]] * int(end.sum())).reshape(-1, 3))


@pytest.fixture
def transport():
    cfg = dist.DistributedConfig(num_actors=2, queue_chunks=2, transport="zmq",
                                 experience_endpoint="auto", param_endpoint="auto")
    t = dz.make_zmq_transport(cfg, mp.get_context("spawn"))
    yield t
    t.shutdown([])


def test_chunks_arrive_in_order_with_their_actor(transport):
    sink, params, should_stop, close = transport.actor_args[0][0].open()
    try:
        assert sink.add_chunk(0, _chunk(5, 0))
        assert sink.add_chunk(0, _chunk(3, 5, end_at=2))
        a = transport.source.get_chunk(timeout=5)
        b = transport.source.get_chunk(timeout=5)
    finally:
        close()
    assert a[0] == 0 and b[0] == 0
    np.testing.assert_array_equal(a[1].observation[:, 0], np.arange(5))
    np.testing.assert_array_equal(b[1].observation[:, 0], 5 + np.arange(3))
    assert b[1].episode_end.tolist() == [False, False, True]
    assert b[1].episodes.shape == (1, 3)
    assert transport.source.get_chunk(timeout=0.1) is None


def test_full_inbox_refuses_until_the_learner_drains(transport):
    sink, _, _, close = transport.actor_args[0][0].open()
    stop = threading.Event()
    sink._stop = stop.is_set  # bounded: the test stops the retry loop itself
    try:
        assert sink.add_chunk(1, _chunk(2))
        assert sink.add_chunk(1, _chunk(2))
        done = []
        t = threading.Thread(target=lambda: done.append(sink.add_chunk(1, _chunk(2))))
        t.start()
        deadline = time.monotonic() + 10
        while transport.source.refused == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert transport.source.refused >= 1 and not done  # inbox of 2 is full: it waits
        assert transport.source.get_chunk(timeout=5) is not None
        t.join(timeout=10)
        assert done == [True]
    finally:
        stop.set()
        close()


def test_malformed_chunk_is_refused_with_value_error(transport):
    sink, _, _, close = transport.actor_args[1][0].open()
    try:
        bad = _chunk(3)
        bad.terminal = np.array([True, False, False])  # terminal without episode end
        with pytest.raises(ValueError, match="terminal"):
            sink.add_chunk(1, bad)
        assert transport.source.received == 0
        assert sink.add_chunk(1, _chunk(3))  # the server lives on
    finally:
        close()


def test_parameters_reach_actors_newest_first(transport):
    _, params, _, close = transport.actor_args[0][0].open()
    try:
        got = None
        deadline = time.monotonic() + 10
        version = 0
        while got is None and time.monotonic() < deadline:  # PUB/SUB joins asynchronously
            version += 1
            transport.publisher.publish(version, b"weights-%d" % version)
            time.sleep(0.05)
            got = params.latest()
        assert got is not None and got[1] == b"weights-%d" % got[0]
        transport.publisher.publish(1000, b"a")
        transport.publisher.publish(1001, b"b" * 100_000)
        deadline = time.monotonic() + 10
        newest = None
        while (newest is None or newest[0] != 1001) and time.monotonic() < deadline:
            newest = params.latest() or newest
            time.sleep(0.01)
        assert newest == (1001, b"b" * 100_000)
    finally:
        close()
