"""The services a ReplayMemoryServer is composed of, each on its own: the remote-call host
(also standalone, with no memory), the cache service, the central service over a given chunk
ingest, the client counters and the shared plumbing (logfile, counters)."""

import threading

import numpy as np
import pytest
import zmq

from memoire import _core, codec
from memoire.client import cache_message
from memoire.memory import ReplayMemory
from memoire.protocol import (
    CHUNK_LAST,
    CHUNK_TERMINAL,
    CHUNK_UPDATE_VALUE,
    CHUNK_UPDATE_WEIGHT,
    Msg,
)
from memoire.remote import RemoteObject
from memoire.server import RpcServer
from memoire.server.cache_service import CacheService
from memoire.server.central_service import COUNTER_MAX, CentralService, ClientCounters
from memoire.server.rpc_host import RpcHost
from memoire.server.workers import Logfile, Stats
from memoire.transport import RequestChannel, publication


def _memory(max_step=64, cache_size=4, seed=0):
    rem = ReplayMemory(
        np.zeros([3], np.float32),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([0], np.uint8),
        max_step,
    )
    rem.cache_size = cache_size
    rem.seed(seed)
    return rem


def _schema(rem):
    from memoire.protocol import describe_schema

    return describe_schema(
        (
            rem.state_buf,
            rem.action_buf,
            rem.reward_buf,
            rem.prob_buf,
            rem.value_buf,
            rem.qvest_buf,
            rem.info_buf,
        )
    )


def _fill(rem, n=10):
    rem.new_episode()
    for k in range(n):
        rem.add_entry(np.full(3, k, np.float32), k, 1.0, 0.5, 0.0, np.zeros(0, np.uint8))
    rem.close_episode()


# ---- the remote-call host ------------------------------------------------------------------


class _Counter:
    def __init__(self):
        self.n = 0

    def add(self, k):
        self.n += int(k)
        return self.n

    def fail(self):
        raise IndexError("no such slot")


def test_a_standalone_rpc_server_hosts_objects_with_no_memory():
    with RpcServer() as server:
        assert not hasattr(server, "rem")
        counter = _Counter()
        server.host("counter", counter, methods=("add", "fail"))
        endpoint = server.start()
        assert endpoint.startswith("tcp://127.0.0.1:")
        with RemoteObject(endpoint, "counter", timeout=10, retries=0) as proxy:
            assert proxy.add(2) == 2 and proxy.call("add", 3) == 5
            with pytest.raises(IndexError, match="no such slot"):
                proxy.fail()
            with pytest.raises(AttributeError, match="no remote method"):
                proxy.call("n")
        with RemoteObject(endpoint, "server", timeout=10, retries=0) as host:
            assert host.call("stats")["calls"] == 2  # the adds; a failed call is not counted
        assert counter.n == 5
    with pytest.raises(ValueError, match="not a public method"):
        RpcServer().host("x", counter, methods=("_private",))


def test_rpc_server_answers_only_calls_and_survives_garbage():
    with RpcServer() as server:
        endpoint = server.start()
        ctx = zmq.Context()
        sock = ctx.socket(zmq.REQ)
        sock.rcvtimeo = 10000
        sock.connect(endpoint)
        try:
            sock.send_multipart([b"garbage"])
            reply = codec.decode(sock.recv_multipart())
            assert reply.type == Msg.ERROR and reply["error"] == "ProtocolError"
            sock.send_multipart(codec.encode(Msg.HELLO, {"uuid": 1}))  # no handshake here
            assert codec.decode(sock.recv_multipart()).type == Msg.ERROR
        finally:
            sock.close(0)
            ctx.term()
        assert server.stats()["rejected"]["malformed"] == 2


def test_a_retried_call_runs_once_and_replies_are_bounded_in_bytes():
    stats = Stats()
    host = RpcHost(stats, reply_cache_bytes=4096, max_batch=8)
    counter = _Counter()
    host.host("c", counter, methods=("add",))

    def call(caller, seq, k=1):
        values = {
            "object": "c",
            "method": "add",
            "args": (k,),
            "kwargs": {},
            "caller": caller,
            "seq": seq,
        }
        return codec.decode(host.handle_call(codec.decode(codec.encode(Msg.CALL, values))))

    assert call(7, 1)["result"] == 1
    assert call(7, 1)["result"] == 1 and counter.n == 1  # the retry is answered from the cache
    assert call(7, 2)["result"] == 2 and counter.n == 2
    for caller in range(100):  # many callers: the oldest replies go
        call(1000 + caller, 1)
    assert 0 < host.reply_bytes <= 4096
    assert stats.counts["calls"] == 102


def test_check_batch_and_check_finite_count_what_they_refuse():
    stats = Stats()
    host = RpcHost(stats, max_batch=8)
    assert host.check_batch(8) == 8
    with pytest.raises(ValueError, match="max_batch"):
        host.check_batch(9, "sample")
    with pytest.raises(ValueError, match=">= 1"):
        host.check_batch(0)
    host.check_finite("add", rewards=np.ones(3), ids=np.arange(3), none=None)
    with pytest.raises(ValueError, match="rewards holds a NaN"):
        host.check_finite("add", rewards=np.array([1.0, np.inf]))
    assert stats.rejected == {"batch_too_large": 1, "nonfinite": 1}
    with pytest.raises(ValueError, match="max_batch: expected >= 1"):
        RpcHost(stats, max_batch=0)


# ---- the cache service ---------------------------------------------------------------------


def test_cache_service_holds_caches_and_relays_them_out_after_a_settings_change():
    source = _memory(seed=1)
    _fill(source)
    settings = _memory()  # the server's memory: its settings lay the ring out
    stats = Stats()
    caches = CacheService(
        _schema(settings),
        settings,
        n_caches=2,
        seed=3,
        max_message_bytes=1 << 20,
        stats=stats,
        closing=threading.Event(),
    )
    for _ in range(3):
        caches.insert(cache_message(source, uuid=42))
    assert caches.held == 2 and stats.counts["caches"] == 3  # the newest two are kept
    batch = caches.get_batch(8)
    assert batch.prev[0].shape == (8, 1, 3) and set(batch.uuid.tolist()) == {42}
    assert stats.counts["rows_sampled"] == 8
    with pytest.raises(RuntimeError, match="push_cache"):
        caches.get_batch(1)  # every row used once
    settings.cache_size = 2  # caches of the old layout no longer fit: the held ones go
    caches.insert(cache_message(source, uuid=42))  # 4 rows: refused by the new layout
    assert stats.rejected["malformed"] == 1 and caches.held == 0
    source.cache_size = 2
    caches.insert(cache_message(source, uuid=42))
    assert caches.held == 1 and caches.get_batch(2).weight.shape == (2,)
    caches.close()


# ---- the central service over a given chunk ingest -----------------------------------------


class _CountingIngest:
    """A chunk ingest handed to the service (as one over another store would be): a real one,
    whose calls are counted."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if callable(attr):
            self.calls.append(name)
        return attr


def _chunk(rows, index, flags, uuid=5, episode=1):
    values = {
        "s": np.zeros((rows, 3), np.float32),
        "a": np.arange(rows, dtype=np.int64),
        "r": np.ones(rows, np.float32),
        "p": np.full(rows, 0.5, np.float32),
        "v": np.zeros(rows, np.float32),
        "i": np.zeros((rows, 0), np.uint8),
        "init_w": np.ones(rows, np.float32),
        "uuid": np.array(uuid, np.uint64),
        "episode": np.array(episode, np.int64),
        "index": np.array(index, np.int64),
        "multiplier": np.array(1.0, np.float32),
    }
    return codec.encode(Msg.CHUNK, values, flags=flags)


def test_central_service_stores_episodes_through_the_ingest_it_is_given():
    memory = _memory()
    ingest = _CountingIngest(_core.ChunkIngest(memory))
    stats = Stats()
    central = CentralService(ingest, memory, stats, threading.Event())
    assert not central.take(codec.encode(Msg.LOG, {"uuid": 1, "message": "hi"}))
    assert central.take(_chunk(3, 0, 0))
    assert central.rows_in == 0 and memory.size == 0  # staged until the episode closes
    last = CHUNK_LAST | CHUNK_TERMINAL | CHUNK_UPDATE_VALUE | CHUNK_UPDATE_WEIGHT
    assert central.take(_chunk(2, 1, last))
    assert central.wait_rows_in(5, timeout=0) and memory.size == 5
    assert central.take(_chunk(2, 5, 0, uuid=6))  # out of order: rejected, counted natively
    counters = central.counters()
    assert counters["chunks"] == 3 and counters["rejected"] == {"out_of_order_chunk": 1}
    assert counters["memory_size"] == 5 and counters["memory_episodes"] == 1
    batch = central.sample(4)
    assert len(batch) == 4 and stats.counts["rows_sampled"] == 4
    assert central.update_priorities(batch.id, np.full(4, 2.0, np.float32)) == 4
    central.reap()
    assert ingest.calls.count("ingest") == 4 and "reap" in ingest.calls


# ---- the client counters -------------------------------------------------------------------


def _counter(uuid, episodes, steps):
    return codec.decode(
        codec.encode(Msg.COUNTER, {"uuid": uuid, "episodes": episodes, "steps": steps})
    )


def test_client_counters_count_a_retried_report_once_and_bound_clients():
    stats = Stats()
    counters = ClientCounters(stats, max_clients=2)
    assert codec.decode(counters.handle(_counter(1, 2, 20)))["total_steps"] == 20
    assert codec.decode(counters.handle(_counter(1, 2, 20)))["total_steps"] == 20  # retried
    assert codec.decode(counters.handle(_counter(2, 1, 5)))["total_episodes"] == 3
    refused = codec.decode(counters.handle(_counter(3, 1, 1)))
    assert refused.type == Msg.ERROR and "at most 2 clients" in refused["reason"]
    refused = codec.decode(counters.handle(_counter(1, COUNTER_MAX + 1, 0)))
    assert refused.type == Msg.ERROR
    assert counters.totals() == (3, 25) and counters.clients == 2
    assert stats.rejected == {"counter_clients": 1, "counter_range": 1}


# ---- the shared plumbing -------------------------------------------------------------------


def test_logfile_writes_one_escaped_line_per_message(tmp_path):
    log = Logfile()
    log.write(1, "before opening: dropped")
    log.open(str(tmp_path / "log.txt"), "w")
    log.write(0xAB, "two\nlines \\ here")
    log.close()
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith(",000000ab,two\\nlines \\\\ here")
    with pytest.raises(ValueError, match="mode"):
        log.open(str(tmp_path / "x"), "r")


def test_a_request_channel_reaches_the_standalone_host():
    # The client side of remote calls is the same for both servers.
    with RpcServer(max_batch=4) as server:
        server.host("c", _Counter(), methods=("add",))
        endpoint = server.start()
        ctx = zmq.Context()
        channel = RequestChannel(ctx, endpoint, timeout=10, retries=0)
        try:
            frames = channel.request(
                codec.encode(Msg.CALL, {"object": "c", "method": "add", "args": (4,), "kwargs": {}})
            )
            assert codec.decode(frames)["result"] == 4
        finally:
            channel.close()
            ctx.term()
        assert server.max_batch == 4 and server.endpoints["rep"] == [endpoint]


def test_a_standalone_rpc_server_may_publish_too():
    with RpcServer(pub_endpoint="tcp://127.0.0.1:*") as server:
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        try:
            sub.connect(server.pub_endpoint)
            sub.setsockopt(zmq.SUBSCRIBE, b"params")
            got = None
            for _ in range(100):  # a subscription takes a moment to reach the publisher
                server.pub_bytes("params", b"v1")
                if sub.poll(100):
                    got = publication(sub.recv_multipart(), 1 << 20)
                    break
            assert got == (b"params", b"v1")
        finally:
            sub.close(0)
            ctx.term()
    with pytest.raises(RuntimeError, match="no PUB socket"):
        RpcServer().pub_bytes("params", b"x")
