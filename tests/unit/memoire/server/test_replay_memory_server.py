"""In-process tests of the server and client: settings handshake, version errors, RPC hosting,
CURVE, pub/sub of large payloads, close() of running workers, the logfile."""

import threading
import time

import numpy as np
import pytest
import zmq
from _waiting import wait_until

from memoire import ReplayMemoryClient, ReplayMemoryServer, codec
from memoire.codec import Msg
from memoire.remote import RemoteMemory, RemoteObject
from memoire.transport import CurveKeys, RequestChannel, bind_address, generate_keys

TEMPLATES = (
    np.zeros([4], np.float32),
    np.zeros([], np.int64),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([0], np.uint8),
)


@pytest.fixture
def server():
    srv = ReplayMemoryServer(*TEMPLATES, 1000, "tcp://127.0.0.1:*", n_caches=4, seed=0)
    srv.rem.cache_size = 8
    ep = srv.start()
    yield srv, ep
    srv.close()


def _fill(rem, episodes=2, length=10):
    for _e in range(episodes):
        rem.new_episode()
        for k in range(length):
            rem.add_entry(np.full(4, k, np.float32), k, float(k == length - 1), 0.5, 0.0)
        rem.close_episode()


def test_handshake_copies_schema_and_settings(server):
    srv, ep = server
    srv.rem.frame_stack = 2
    srv.rem.multi_step = 3
    srv.rem.discount_factor = 0.9
    srv.rem.cache_flags = [1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0]
    with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"], max_step=500) as c:
        assert c.rem.max_step == 500 and c.rem.frame_stack == 2 and c.rem.multi_step == 3
        assert np.allclose(c.rem.discount_factor, 0.9) and c.rem.cache_size == 8
        assert (
            list(c.rem.cache_flags)
            == [True, True, True] + [False] * 4 + [True, False, True] + [False] * 4
        )
        assert c.rem.state_buf.shape == (4,) and c.rem.action_buf.dtype == np.int64
        _fill(c.rem)
        assert c.push_cache() == 0
        b = srv.get_batch(8, timeout=5)
        assert b.prev[0].shape == (8, 2, 4) and b.prev[3] is None and b.next[1] is None
        assert b.next[2].shape == (8, 2)
        # the server's normaliser comes with the batch
        assert (b.num_sampleable == c.rem.num_sampleable).all()
        assert np.allclose(b.prob, b.weight / c.rem.total_weight)


def test_cache_rows_are_used_once_unless_reuse(server):
    srv, ep = server
    with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"]) as c:
        _fill(c.rem)
        assert c.push_cache() == 0 and c.push_cache() == 0
        b = srv.get_batch(12, timeout=5)
        assert len(b) == 12
        with pytest.raises(RuntimeError, match="4 unused row"):
            srv.get_batch(5, timeout=0.2)
        srv.rem.reuse_cache = True  # the ring is kept: same cache layout
        assert len(srv.get_batch(50)) == 50


def test_wrong_version_client_gets_a_clear_error(server):
    srv, ep = server
    ctx = zmq.Context()
    req = ctx.socket(zmq.REQ)
    req.linger = 0
    req.connect(ep["rep"])
    req.send_multipart(codec.encode(Msg.HELLO, {"uuid": 1}, version=2))
    assert req.poll(5000)
    reply = codec.decode(req.recv_multipart())
    assert (
        reply.type == Msg.ERROR
        and "version" in reply["reason"]
        and "speaks version 1" in reply["reason"]
    )
    req.close()
    ctx.term()
    assert srv.stats()["rejected"]["version"] == 1


def test_client_handshake_timeout_is_bounded():
    # Bounded in attempts (the error counts them), not timed: tests never assert on time.
    with pytest.raises(TimeoutError, match="2 attempt"):
        ReplayMemoryClient(None, "tcp://127.0.0.1:9", "tcp://127.0.0.1:9", timeout=0.2, retries=1)


class Toy:
    def __init__(self):
        self.items = []

    def add(self, x, label="", **extra):
        self.items.append((np.asarray(x).copy(), label))
        return len(self.items)

    def get(self, k):
        x, label = self.items[k]
        return {"x": x, "label": label, "pair": (k, None)}

    def fail(self):
        raise IndexError("no such thing")

    def secret(self):
        return "never"


def test_rpc_hosts_a_toy_object(server):
    srv, ep = server
    toy = Toy()
    srv.host("toy", toy, methods=("add", "get", "fail"))
    with RemoteObject(ep["rep"], "toy") as remote:
        assert remote.call("add", np.arange(6).reshape(2, 3), label="a") == 1
        assert remote.add([1.5, 2.5]) == 2
        got = remote.get(0)
        assert got["label"] == "a" and got["pair"] == (0, None)
        assert got["x"].dtype == np.int64 and got["x"].shape == (2, 3)
        with pytest.raises(IndexError, match="no such thing"):
            remote.fail()
        with pytest.raises(AttributeError, match="no remote method 'secret'"):
            remote.secret()
        with pytest.raises(ValueError, match="cannot travel"):
            remote.add(object())
    with pytest.raises(ValueError, match="not a public method"):
        srv.host("bad", toy, methods=("_private",))
    assert len(toy.items) == 2


def test_remote_learner_in_central_mode(server):
    srv, ep = server
    with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"], mode="central", chunk_size=3) as c:
        for _ in range(2):
            c.new_episode()
            for k in range(10):
                c.add_entry(np.full(4, k, np.float32), k, 1.0, 0.5, 0.0)
            c.close_episode(terminal=True)
        with pytest.raises(ValueError, match=r"expected float32\[4\]"):
            c.new_episode()
            c.add_entry(np.zeros(3), 0, 1.0, 0.5, 0.0)
    wait_until(lambda: srv.rem.num_episode() >= 2, "the server to store both episodes")
    with RemoteMemory(ep["rep"]) as rm:
        b = rm.sample(16)
        assert b.prev[0].shape == (16, 1, 4) and b.num_sampleable == 18
        assert rm.update_priorities(b.id, np.zeros(16)) > 0
        assert rm.stats()["episodes_in"] == 2


def test_pub_sub_carries_large_payloads(server):
    srv, ep = server
    payload = np.random.default_rng(0).bytes(8 << 20)  # 8 MiB, no fixed buffer
    with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"]) as c:
        stop = threading.Event()

        def publish():
            while not stop.is_set():
                srv.pub_bytes("params", payload)
                srv.pub_bytes("paramsX", b"other")  # a prefix match must not leak through
                time.sleep(0.02)

        t = threading.Thread(target=publish)
        t.start()
        try:
            assert c.sub_bytes("params", timeout=10) == payload
            with pytest.raises(TimeoutError):
                c.sub_bytes("nobody", timeout=0.2)
        finally:
            stop.set()
            t.join()


def test_close_stops_workers_and_keeps_the_logfile(tmp_path):
    srv = ReplayMemoryServer(*TEMPLATES, 100, "tcp://127.0.0.1:*", n_caches=2)
    ep = srv.start()
    extra = threading.Thread(target=srv.rep_worker_main, args=("tcp://127.0.0.1:*", "Bind"))
    extra.start()
    srv.set_logfile(str(tmp_path / "log.txt"), "w")
    with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"], input_uuid=0xAB) as c:
        assert c.write_log("line one") == 0
        c.update_counter()  # REP answered after the log went through the same server
        wait_until(lambda: srv.stats().get("logs", 0) >= 1, "the server to take the log line")
    srv.close()
    extra.join(5)
    assert not extra.is_alive()
    line = (tmp_path / "log.txt").read_text()
    assert line.endswith(",000000ab,line one\n")
    with pytest.raises(RuntimeError, match="closed"):
        srv.pub_bytes("x", b"y")


def test_bind_defaults_to_loopback():
    assert bind_address("tcp://*:5555") == "tcp://127.0.0.1:5555"
    assert bind_address("tcp://*:0") == "tcp://127.0.0.1:*"
    assert bind_address("tcp://*:*", "0.0.0.0") == "tcp://0.0.0.0:*"
    assert bind_address("tcp://10.1.2.3:7") == "tcp://10.1.2.3:7"
    with pytest.raises(ValueError, match="tcp://host:port"):
        bind_address("tcp://nohost")


def test_a_request_that_cannot_be_sent_times_out_instead_of_blocking():
    # A REQ socket without a pipe (here ZMQ_IMMEDIATE with no peer; in the wild a peer that
    # refuses the CURVE handshake) blocks in send: the channel bounds the send by its timeout.
    ctx = zmq.Context()
    probe = ctx.socket(zmq.REP)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close(0)  # a port nobody listens on any more
    channel = RequestChannel(ctx, f"tcp://127.0.0.1:{port}", timeout=0.2, retries=1)
    opened = []

    def open_without_pipe():
        sock = ctx.socket(zmq.REQ)
        sock.linger = 0
        sock.immediate = 1
        sock.connect(channel.endpoint)
        opened.append(sock)
        return sock

    channel._open = open_without_pipe
    try:
        with pytest.raises(TimeoutError, match="2 attempt"):
            channel.request(codec.encode(Msg.HELLO, {"uuid": 1}))
        assert len(opened) == 2 and all(s.closed for s in opened)
    finally:
        channel.close()
        ctx.term()


def test_curve_refuses_peers_without_the_key(tmp_path):
    server_pub, server_secret = generate_keys(str(tmp_path / "server"), "server")
    _, good_secret = generate_keys(str(tmp_path / "authorized"), "actor")
    _, bad_secret = generate_keys(str(tmp_path / "strangers"), "stranger")
    keys = CurveKeys(server_secret, authorized_dir=str(tmp_path / "authorized"))
    with ReplayMemoryServer(*TEMPLATES, 100, "tcp://127.0.0.1:*", n_caches=2, keys=keys) as srv:
        srv.rem.cache_size = 4
        ep = srv.start()
        good = CurveKeys(good_secret, server_public_file=server_pub)
        with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"], keys=good, timeout=5) as c:
            _fill(c.rem)
            assert c.push_cache() == 0
            assert srv.get_batch(4, timeout=5).prev[0].shape == (4, 1, 4)
        # A stranger's key, and no key at all: nothing in...
        bad = CurveKeys(bad_secret, server_public_file=server_pub)
        for k in (bad, None):
            with pytest.raises(TimeoutError):
                ReplayMemoryClient(None, ep["rep"], ep["pull"], keys=k, timeout=0.3, retries=0)
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.linger = 0
        push.sndtimeo = 300
        push.connect(ep["pull"])
        try:  # queued locally at best: the CURVE handshake never completes
            push.send_multipart(codec.encode(Msg.LOG, {"uuid": 1, "message": "intruder"}))
        except zmq.Again:
            pass
        # ...and nothing out: a plain subscriber receives none of the published bytes.
        sub = ctx.socket(zmq.SUB)
        sub.linger = 0
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(ep["pub"])
        for _ in range(20):
            srv.pub_bytes("params", b"secret")
            time.sleep(0.01)
        assert not sub.poll(300)
        push.close()
        sub.close()
        ctx.term()
        assert srv.stats().get("logs", 0) == 0 and srv.total_caches == 1


def test_get_batch_out_is_filled_in_place_or_replaced_when_it_no_longer_fits(server):
    srv, ep = server
    with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"]) as c:
        _fill(c.rem)
        for _ in range(4):
            assert c.push_cache() == 0
        first = srv.get_batch(6, timeout=5)  # part of a cache: copied rows, writeable
        again = srv.get_batch(6, timeout=5, out=first)
        assert again.prev[0] is first.prev[0] and again.uuid is first.uuid
        assert (again.uuid == c.uuid).all() and (again.num_sampleable == c.rem.num_sampleable).all()
        # A wrong dtype (checked natively) or a wrong size: fresh arrays, the old ones untouched.
        again.weight = np.zeros(6, np.float64)
        kept = again.prev[0].copy()
        fresh = srv.get_batch(6, timeout=5, out=again)
        assert fresh.prev[0] is not again.prev[0] and fresh.weight.dtype == np.float32
        np.testing.assert_array_equal(again.prev[0], kept)
        smaller = srv.get_batch(4, timeout=5, out=fresh)
        assert len(smaller) == 4 and smaller.prev[0] is not fresh.prev[0]


def test_a_batch_of_one_whole_cache_is_lent_without_a_copy(server):
    srv, ep = server
    with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"]) as c:
        _fill(c.rem)
        for _ in range(3):
            assert c.push_cache() == 0
        whole = srv.get_batch(8, timeout=5)  # cache_size rows: the first cache as it came
        assert not whole.prev[0].flags.writeable and not whole.weight.flags.writeable
        assert whole.uuid.flags.writeable and (whole.uuid == c.uuid).all()
        np.testing.assert_allclose(whole.prob, whole.weight / c.rem.total_weight, rtol=1e-5)
        live = ~whole.done  # rows of the stored episodes, in order: s_t+1 follows s_t
        assert (whole.next[0][live, 0] == whole.prev[0][live, 0] + 1).all()
        part = srv.get_batch(4, timeout=5)  # part of a cache: copied (in a random order)
        assert part.prev[0].flags.writeable
        own = srv.get_batch(8, timeout=5)  # 4 rows of the second cache and 4 of the third
        assert len(own) == 8
        assert own.prev[0].flags.writeable


def test_a_cache_of_another_layout_is_rejected_and_the_held_caches_stay(server):
    srv, ep = server
    with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"]) as c:
        _fill(c.rem)
        assert c.push_cache() == 0
        srv.get_batch(1, timeout=5)  # the first cache is held
        prev, nxt, w, p, d, i = c.rem._sample(7)  # 7 rows where the server expects 8
        values = {
            f"{side}/{f}": x
            for side, xs in (("prev", prev), ("next", nxt))
            for f, x in zip(("s", "a", "r", "p", "v", "q", "i"), xs)
            if x is not None
        }
        values.update(
            {
                "weight": w,
                "prob": p,
                "done": d,
                "id": i,
                "uuid": np.array(1, np.uint64),
                "num_sampleable": np.array(1, np.int64),
                "total_weight": np.array(1.0),
            }
        )
        assert c._send(codec.encode(Msg.CACHE, values))
        wait_until(
            lambda: srv.stats()["rejected"].get("malformed", 0) >= 1,
            "the server to count the malformed cache",
        )
        stats = srv.stats()
        assert stats["rejected"]["malformed"] == 1
        assert stats["caches"] == 1 and stats["caches_held"] == 1
        assert len(srv.get_batch(7)) == 7  # the rest of the first cache


def test_get_batch_waits_for_a_cache_pushed_meanwhile(server):
    srv, ep = server
    with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"]) as c:
        _fill(c.rem)
        pusher = threading.Timer(0.2, c.push_cache)
        pusher.start()
        try:
            b = srv.get_batch(8, timeout=30)
        finally:
            pusher.join()
        assert len(b) == 8 and (b.uuid == c.uuid).all()


def test_settings_changed_while_the_worker_waits_take_effect_for_the_next_cache(server):
    # The PULL worker reads the layout per message, so a change made while it waits (as it
    # is once the previous cache is taken) shapes the next cache: no state to wait for.
    srv, ep = server
    for cache_size in (4, 6, 3):
        srv.rem.cache_size = cache_size
        with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"]) as c:
            _fill(c.rem)
            assert c.push_cache() == 0
            b = srv.get_batch(cache_size, timeout=10)
            assert b.weight.shape == (cache_size,) and (b.uuid == c.uuid).all()


NATIVE_OFF = """
import numpy as np
from memoire import ReplayMemoryClient, ReplayMemoryServer, transport
T = (np.zeros([4], np.float32), np.zeros([], np.int64), np.zeros([], np.float32),
     np.zeros([], np.float32), np.zeros([], np.float32), np.zeros([], np.float32),
     np.zeros([0], np.uint8))
with ReplayMemoryServer(*T, 100, None, n_caches=2) as srv:
    srv.rem.cache_size = 8
    ep = srv.start()
    with ReplayMemoryClient(None, ep["rep"], ep["pull"]) as c:
        c.rem.new_episode()
        c.rem.add_entries(np.ones((10, 4), np.float32), np.zeros(10, np.int64),
                          np.ones(10, np.float32), np.ones(10, np.float32),
                          np.zeros(10, np.float32), np.zeros((10, 0), np.uint8),
                          np.ones(10, np.float32))
        c.rem.close_episode()
        assert c.push_cache() == 0
        b = srv.get_batch(8, timeout=10)
        assert (b.prev[0] == 1).all() and (b.uuid == c.uuid).all()
print("native", transport.native_libzmq())
"""


@pytest.mark.parametrize("setting", ["0", "1"])
def test_caches_travel_with_and_without_the_native_paths(setting, tmp_path):
    import os
    import subprocess
    import sys

    import memoire

    here = os.path.dirname(os.path.dirname(os.path.abspath(memoire.__file__)))  # this memoire
    env = dict(
        os.environ,
        MEMOIRE_NATIVE_ZMQ=setting,
        PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
    )
    out = subprocess.run(
        [sys.executable, "-c", NATIVE_OFF],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    # On Linux with pyzmq's wheel (libzmq as a shared library) the native path is found.
    assert f"native {setting == '1'}" in out.stdout


def test_native_cache_header_equals_the_encoded_one(server):
    from memoire.client import cache_message

    srv, ep = server
    srv.rem.frame_stack = 2
    srv.rem.cache_flags = [1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1]
    with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"]) as c:
        _fill(c.rem)
        assert c._cache_header() == bytes(cache_message(c.rem, c.uuid)[0])
        c.rem.cache_size = 5  # a local change makes a new header
        assert c._cache_header() == bytes(cache_message(c.rem, c.uuid)[0])


def test_a_closed_server_removes_its_ipc_socket_files_and_only_its_own(tmp_path):
    """libzmq leaves a named ipc:// endpoint's file behind when its socket closes; the server
    removes each it bound (pub, rep, pull, stream), and leaves a file another socket bound
    at one of those paths since (it replaced the server's)."""
    folder = tmp_path / "sockets"
    folder.mkdir()
    srv = ReplayMemoryServer(*TEMPLATES, 100, f"ipc://{folder}/pub", n_caches=2)
    srv.start(f"ipc://{folder}/rep", f"ipc://{folder}/pull")
    srv.start_stream(f"ipc://{folder}/stream")
    assert sorted(p.name for p in folder.iterdir()) == ["pub", "pull", "rep", "stream"]
    # Another process's socket now at the rep path (binding replaces the file).
    ctx = zmq.Context()
    other = ctx.socket(zmq.REP)
    try:
        other.bind(f"ipc://{folder}/rep")
        srv.close()
        assert sorted(p.name for p in folder.iterdir()) == ["rep"]
    finally:
        other.close(linger=0)
        ctx.term()
    srv.close()  # idempotent
    assert [p.name for p in folder.iterdir()] == ["rep"]
