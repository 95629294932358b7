"""Central mode's native ingest (_core.ChunkIngest, used by ReplayMemoryServer): stored contents
equal a local memory fed the same episodes, stream rules counted by reason, malformed chunks
rejected with the memory unchanged, frames released once their stream is gone."""

import time

import numpy as np
import pytest
import zmq
from _waiting import wait_until

from memoire import ReplayMemory, ReplayMemoryClient, ReplayMemoryServer, _core, codec
from memoire.codec import Msg
from memoire.protocol import CHUNK_LAST, CHUNK_TERMINAL, CHUNK_UPDATE_VALUE, CHUNK_UPDATE_WEIGHT

TEMPLATES = (
    np.zeros([2, 3], np.uint8),
    np.zeros([], np.int64),
    np.zeros([2], np.float32),
    np.zeros([], np.float32),
    np.zeros([2], np.float32),
    np.zeros([2], np.float32),
    np.zeros([1], np.int16),
)
CLOSE = CHUNK_LAST | CHUNK_TERMINAL | CHUNK_UPDATE_VALUE | CHUNK_UPDATE_WEIGHT
STAGED, COMMITTED, REJECTED = 1, 2, 3


def rows(rng, n):
    """s, a, r, p, v, i, init_w of n entries."""
    return (
        rng.integers(0, 255, (n, 2, 3)).astype(np.uint8),
        rng.integers(0, 4, n),
        rng.normal(size=(n, 2)).astype(np.float32),
        np.full(n, 0.5, np.float32),
        rng.normal(size=(n, 2)).astype(np.float32),
        rng.integers(-9, 9, (n, 1)).astype(np.int16),
        rng.uniform(0.5, 2.0, n).astype(np.float32),
    )


def chunk(uuid, episode, index, r, flags=0, multiplier=1.0):
    values = dict(zip(("s", "a", "r", "p", "v", "i", "init_w"), r))
    values.update(
        {
            "uuid": np.array(uuid, np.uint64),
            "episode": np.array(episode, np.int64),
            "index": np.array(index, np.int64),
            "multiplier": np.array(multiplier, np.float32),
        }
    )
    return [
        memoryview(f).tobytes() if not isinstance(f, bytes) else f
        for f in codec.encode(Msg.CHUNK, values, flags=flags)
    ]


def split(r, at):
    return tuple(x[:at] for x in r), tuple(x[at:] for x in r)


def assert_same_memory(a, b):
    assert (a.size, a.num_episode(), a.num_sampleable) == (
        b.size,
        b.num_episode(),
        b.num_sampleable,
    )
    assert a.total_weight == pytest.approx(b.total_weight, rel=1e-12)
    a.seed(5)
    b.seed(5)
    x, y = a.get_batch(64), b.get_batch(64)
    for u, v in zip(x.prev + x.next, y.prev + y.next):
        np.testing.assert_array_equal(u, v)
    np.testing.assert_array_equal(x.weight, y.weight)
    np.testing.assert_array_equal(x.id, y.id)


def test_interleaved_streams_store_what_a_local_memory_stores():
    rng = np.random.default_rng(0)
    mem, local = ReplayMemory(*TEMPLATES, 200), ReplayMemory(*TEMPLATES, 200)
    ingest = _core.ChunkIngest(mem)
    e1, e2, e3 = rows(rng, 9), rows(rng, 5), rows(rng, 12)
    (e1a, e1b), (e3a, e3b) = split(e1, 4), split(e3, 7)
    got = [
        ingest.ingest(chunk(1, 1, 0, e1a)),
        ingest.ingest(chunk(2, 1, 0, e2, CLOSE, 0.5)),
        ingest.ingest(chunk(3, 4, 0, e3a)),
        ingest.ingest(chunk(1, 1, 1, e1b, CLOSE)),
        ingest.ingest(chunk(3, 4, 1, e3b, CHUNK_LAST | CHUNK_UPDATE_VALUE)),
    ]
    assert [g[:2] for g in got] == [
        (STAGED, 4),
        (COMMITTED, 5),
        (STAGED, 7),
        (COMMITTED, 9),
        (COMMITTED, 12),
    ]
    for ep, kw in (
        (e2, dict(episodic_weight_multiplier=0.5)),
        (e1, {}),
        (e3, dict(do_update_weight=False, terminal=False)),
    ):
        local.new_episode()
        local.add_entries(*ep)
        local.close_episode(**kw)
    assert_same_memory(mem, local)
    c = ingest.counters()
    assert c["chunks"] == 5 and c["open_streams"] == 0 and c["rejected"] == {}
    assert c["frames_held"] == 0


def test_stream_rules_are_counted_by_reason():
    rng = np.random.default_rng(1)
    mem = ReplayMemory(*TEMPLATES, 30)
    ingest = _core.ChunkIngest(mem, max_open_episodes=2, open_episode_timeout=5.0)
    r = rows(rng, 3)
    assert ingest.ingest(chunk(1, 1, 1, r), now=0.0)[:3:2] == (REJECTED, "out_of_order_chunk")
    assert ingest.ingest(chunk(1, 1, 0, r), now=0.0)[0] == STAGED
    assert ingest.ingest(chunk(1, 2, 0, r), now=0.0)[0] == STAGED  # abandons episode 1
    assert ingest.ingest(chunk(2, 1, 0, r), now=1.0)[0] == STAGED
    assert ingest.ingest(chunk(3, 1, 0, r), now=2.0)[0] == STAGED  # drops actor 1 (limit)
    assert ingest.counters()["frames_held"] == 2
    assert ingest.ingest(chunk(4, 1, 0, r), now=20.0)[0] == STAGED  # reaps actors 2 and 3
    out = ingest.ingest(chunk(4, 1, 1, rows(rng, 28), CLOSE), now=20.0)
    assert out[:3] == (REJECTED, 0, "episode_too_long") and "episode 1" in out[4]
    c = ingest.counters()
    assert c["rejected"] == {
        "out_of_order_chunk": 1,
        "abandoned_episode": 1,
        "stream_limit": 1,
        "stale_episode": 2,
        "episode_too_long": 1,
    }
    assert c["open_streams"] == 0 and c["frames_held"] == 0 and mem.size == 0


def test_malformed_and_bad_chunks_change_nothing():
    rng = np.random.default_rng(2)
    mem, local = ReplayMemory(*TEMPLATES, 40), ReplayMemory(*TEMPLATES, 40)
    ingest = _core.ChunkIngest(mem, max_message_bytes=1 << 16)
    for k in range(4):  # a full ring: a bad episode stored would evict
        ep = rows(rng, 10)
        assert ingest.ingest(chunk(9, k, 0, ep, CLOSE))[0] == COMMITTED
        local.new_episode()
        local.add_entries(*ep)
        local.close_episode()
    good = chunk(1, 1, 0, rows(rng, 3), CLOSE)
    bad_dtype = dict(zip(("s", "a", "r", "p", "v", "i", "init_w"), rows(rng, 3)))
    bad_dtype["a"] = bad_dtype["a"].astype(np.int32)
    nan = rows(rng, 3)
    nan[6][1] = np.nan
    cases = {
        "malformed": [
            good[:1] + good[2:],
            [good[0][:40]] + good[1:],
            good[:-1] + [b"\0" * 3],
            [good[0]] + [b""] * (len(good) - 1),
            chunk(1, 1, 0, rows(rng, 2000), CLOSE),
        ],  # over max_message_bytes
        "nonfinite": [chunk(1, 2, 0, nan, CLOSE), chunk(1, 3, 0, rows(rng, 3), CLOSE, np.inf)],
        "bad_episode": [chunk(1, 4, 0, rows(rng, 3), CLOSE, -1.0)],
    }
    for reason, messages in cases.items():
        for frames in messages:
            out = ingest.ingest(frames)
            assert out[0] == REJECTED and out[2] == reason, out
    assert ingest.ingest([b"not a header"]) is None  # not a chunk: the caller's business
    assert ingest.ingest(codec.encode(Msg.LOG, {"uuid": 1, "message": "hi"})) is None
    assert ingest.counters()["rejected"] == {"malformed": 5, "nonfinite": 2, "bad_episode": 1}
    assert_same_memory(mem, local)
    assert not mem.episode_open and ingest.counters()["frames_held"] == 0
    assert ingest.ingest(good)[0] == COMMITTED


def test_options_are_checked():
    mem = ReplayMemory(*TEMPLATES, 10)
    with pytest.raises(ValueError, match="max_open_episodes"):
        _core.ChunkIngest(mem, max_open_episodes=0)
    ingest = _core.ChunkIngest(mem)
    with pytest.raises(ValueError, match="open_episode_timeout"):
        ingest.open_episode_timeout = 0.0
    assert ingest.open_episode_timeout == 600.0


def test_the_open_episode_budgets_keep_their_older_names():
    # max_streams, stream_timeout and max_stream_bytes: the server's arguments and properties,
    # and the Dopamine faces' chunk_ingest, take the older spellings too.
    with ReplayMemoryServer(
        *TEMPLATES, 100, None, max_streams=7, stream_timeout=9.0, max_stream_bytes=12345
    ) as srv:
        assert (srv.max_open_episodes, srv.open_episode_timeout, srv.max_episode_bytes) == (
            7,
            9.0,
            12345,
        )
        srv.max_streams = 3
        assert srv.max_open_episodes == 3 and srv.max_streams == 3
    with pytest.raises(TypeError, match="no_such_budget"):
        ReplayMemoryServer(*TEMPLATES, 100, None, no_such_budget=1)
    from memoire.dopamine_compat import OutOfGraphReplayBuffer

    tf = OutOfGraphReplayBuffer((2,), 1, replay_capacity=16, batch_size=2)
    ingest = tf.chunk_ingest(max_streams=5, stream_timeout=4.0)
    assert (ingest.max_open_episodes, ingest.open_episode_timeout) == (5, 4.0)
    with pytest.raises(TypeError, match="given twice"):
        tf.chunk_ingest(max_streams=5, max_open_episodes=5)


def test_server_counts_rejected_chunks_and_keeps_serving():
    rng = np.random.default_rng(3)
    with ReplayMemoryServer(*TEMPLATES, 100, None, seed=1) as srv:
        ep = srv.start()
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(ep["pull"])
        good = chunk(5, 1, 0, rows(rng, 4), CLOSE)
        push.send_multipart(chunk(5, 1, 3, rows(rng, 4)))  # out of order
        push.send_multipart(good[:1] + good[1:][::-1])  # frames swapped: malformed
        push.send_multipart(good)
        with ReplayMemoryClient(
            None, ep["rep"], ep["pull"], mode="central", chunk_size=2, timeout=5
        ) as c:
            c.new_episode()
            c.add_entries(*rows(rng, 3))
            c.new_episode()  # abandons the open episode (2 chunks already sent)
            c.add_entries(*rows(rng, 5))
            c.close_episode()
            assert srv.wait_rows_in(9, timeout=10)
        wait_until(lambda: srv.stats()["rejected_total"] >= 3, "3 chunks rejected")
        s = srv.stats()
        assert s["rejected"] == {"out_of_order_chunk": 1, "malformed": 1, "abandoned_episode": 1}
        assert s["episodes_in"] == 2 and s["steps_in"] == 9 and s["memory_size"] == 9
        assert s["chunks"] == 1 + 1 + 1 + 3 and s["open_streams"] == 0
        srv.max_open_episodes = 3
        assert srv.max_open_episodes == 3
        push.close()
        ctx.term()


def test_native_receive_takes_chunks_and_hands_back_other_messages():
    from memoire import transport

    if not transport.native_libzmq():  # turned off by MEMOIRE_NATIVE_ZMQ=0: attach anyway
        path = transport._loaded_libzmq()  # Linux, pyzmq's wheel: libzmq is a shared library
        assert path is not None and _core.attach_libzmq(path) is None
    rng = np.random.default_rng(4)
    mem, local = ReplayMemory(*TEMPLATES, 100), ReplayMemory(*TEMPLATES, 100)
    ingest = _core.ChunkIngest(mem)
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.linger = push.linger = 0
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    try:
        e1 = rows(rng, 6)
        a, b = split(e1, 4)
        push.send_multipart(chunk(1, 1, 0, a))
        push.send_multipart(chunk(1, 1, 2, b, CLOSE))  # skips index 1: the episode is dropped
        push.send_multipart(chunk(2, 1, 0, e1, CLOSE))
        push.send_multipart(codec.encode(Msg.LOG, {"uuid": 2, "message": "hi"}))
        push.send_multipart(chunk(2, 2, 0, e1, CLOSE))  # after the log: the next call's
        got, deadline = [], time.monotonic() + 10
        while sum(g[0] for g in got) < 2 and time.monotonic() < deadline:
            got.append(ingest.receive(pull.underlying, 100))
        episodes, stored, rejected, other = (
            sum(g[0] for g in got),
            sum(g[1] for g in got),
            [r for g in got for r in g[2]],
            [g[3] for g in got if g[3] is not None],
        )
        assert (episodes, stored) == (2, 12)
        assert [r[0] for r in rejected] == ["out_of_order_chunk"] and "episode 1" in rejected[0][2]
        assert len(other) == 1 and codec.decode(other[0]).values["message"] == "hi"
        assert not other[0][0].flags.writeable
        for _ in range(2):
            local.new_episode()
            local.add_entries(*e1)
            local.close_episode()
        assert_same_memory(mem, local)
        assert ingest.counters()["frames_held"] == 0
        assert ingest.receive(pull.underlying, 0) == (0, 0, [], None)  # nothing queued
    finally:
        push.close()
        pull.close()
        ctx.term()


def test_one_server_takes_caches_and_chunks_mixed():
    rng = np.random.default_rng(5)
    with ReplayMemoryServer(*TEMPLATES, 200, None, n_caches=8, seed=2) as srv:
        srv.rem.cache_size = 4
        ep = srv.start()
        with (
            ReplayMemoryClient(None, ep["rep"], ep["pull"], timeout=5) as cache_actor,
            ReplayMemoryClient(
                None, ep["rep"], ep["pull"], mode="central", chunk_size=3, timeout=5
            ) as central_actor,
        ):
            cache_actor.rem.new_episode()
            cache_actor.rem.add_entries(*rows(rng, 10))
            cache_actor.rem.close_episode()
            for _k in range(6):  # the worker's native receive switches with the traffic
                assert cache_actor.push_cache() == 0
                central_actor.new_episode()
                central_actor.add_entries(*rows(rng, 5))
                central_actor.close_episode()
            assert srv.wait_rows_in(30, timeout=10)
            wait_until(lambda: srv.total_caches >= 6, "6 caches")
        s = srv.stats()
        assert s["caches"] == 6 and s["episodes_in"] == 6 and s["memory_size"] == 30
        assert s["rejected_total"] == 0 and s["open_streams"] == 0
        assert len(srv.get_batch(4)) == 4 and len(srv.sample(4)) == 4
