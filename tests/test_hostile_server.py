"""Hostile peers against a server (issue 14, items 4-7, non-finite values; docs/LIMITS.md).

Each attack is refused, counted in stats()["rejected"], leaves what the server stores
unchanged, and the server goes on serving an honest peer. Loopback only, OS-picked ports,
every loop bounded in count and time. Attacks whose failure would be a hang (a FIFO named as
a checkpoint) run against a server in a subprocess.
"""

import os
import selectors
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from memoire import ReplayMemory, ReplayMemoryClient, ReplayMemoryServer, codec
from memoire.codec import Msg
from memoire.remote import RemoteMemory, request
from memoire.server import COUNTER_MAX, default_stream_budgets
from memoire.transport import CurveKeys, RequestChannel, generate_keys

TEMPLATES = (np.zeros([4], np.float32), np.zeros([], np.int64), np.zeros([], np.float32),
             np.zeros([], np.float32), np.zeros([], np.float32), np.zeros([], np.float32),
             np.zeros([0], np.uint8))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def _episode(client, length=10, reward=1.0):
    client.new_episode()
    for k in range(length):
        client.add_entry(np.full(4, k, np.float32), k, reward, 0.5, 0.0)
    client.close_episode(terminal=True)


def _honest_episode_is_stored(srv, ep):
    """An honest actor's episode is stored (the server still serves)."""
    before = srv.rows_in
    with ReplayMemoryClient(None, ep["rep"], ep["pull"], mode="central", timeout=5) as c:
        _episode(c)
    assert srv.wait_rows_in(before + 10, timeout=10)


def _chunk(uuid, episode, index, n, flags=0, reward=0.0):
    """A CHUNK message of n rows (frames as bytes), as an actor would send it."""
    values = {"s": np.zeros((n, 4), np.float32), "a": np.zeros(n, np.int64),
              "r": np.full(n, reward, np.float32), "p": np.full(n, 0.5, np.float32),
              "v": np.zeros(n, np.float32), "i": np.zeros((n, 0), np.uint8),
              "init_w": np.ones(n, np.float32), "uuid": np.array(uuid, np.uint64),
              "episode": np.array(episode, np.int64), "index": np.array(index, np.int64),
              "multiplier": np.array(1.0, np.float32)}
    return [memoryview(f).tobytes() for f in codec.encode(Msg.CHUNK, values, flags=flags)]


class _Push:
    """A PUSH socket to `endpoint` (a peer that only sends), closed on exit."""

    def __init__(self, endpoint):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.linger = 0
        self.sock.sndtimeo = 5000
        self.sock.connect(endpoint)

    def __enter__(self):
        return self.sock

    def __exit__(self, *exc):
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def central():
    srv = ReplayMemoryServer(*TEMPLATES, 1000, None, seed=0, max_stream_bytes=64 << 10,
                             max_open_bytes=256 << 10, reply_cache_bytes=1 << 20,
                             max_batch=5000, max_counter_clients=4)
    ep = srv.start()
    yield srv, ep
    srv.close()


# ---- item 4: counters ------------------------------------------------------------------------

def _counter(channel, uuid, episodes, steps):
    return request(channel, Msg.COUNTER, {"uuid": uuid, "episodes": episodes, "steps": steps},
                   (Msg.COUNTER_REPLY,), "update_counter").values


def test_counters_out_of_range_are_refused_and_the_totals_stay_usable(central):
    srv, ep = central
    ctx = zmq.Context()
    ch = RequestChannel(ctx, ep["rep"], timeout=5, retries=0)
    try:
        assert _counter(ch, 1, 3, 30) == {"total_episodes": 3, "total_steps": 30}
        for episodes, steps in ((2 ** 62, 1), (1, 2 ** 63 - 1), (-1, 5), (COUNTER_MAX + 1, 0)):
            with pytest.raises(ValueError, match="must be in"):
                _counter(ch, 2, episodes, steps)
        assert srv.stats()["rejected"]["counter_range"] == 4
        # Unchanged, and every later counter update and stats() still work, for everyone.
        assert _counter(ch, 1, 4, 40) == {"total_episodes": 4, "total_steps": 40}
        with ReplayMemoryClient(None, ep["rep"], ep["pull"], timeout=5) as c:
            assert c.update_counter() == {"total_episodes": 4, "total_steps": 40}
        with RemoteMemory(ep["rep"], timeout=5) as rm:
            assert rm.stats()["total_steps"] == 40
        # Client uuids counted are bounded (max_counter_clients=4; two are known).
        assert _counter(ch, 3, 0, 0)["total_steps"] == 40
        assert _counter(ch, 4, 0, 0)["total_steps"] == 40
        with pytest.raises(RuntimeError, match="max_counter_clients"):
            _counter(ch, 5, 1, 1)
        assert srv.stats()["rejected"]["counter_clients"] == 1
        assert srv.stats()["counter_clients"] == 4 and srv.total_steps == 40
    finally:
        ch.close()
        ctx.term()


def test_counter_totals_saturate_instead_of_overflowing():
    with ReplayMemoryServer(*TEMPLATES, 10, None, max_counter_clients=2000) as srv:
        ep = srv.start()
        ctx = zmq.Context()
        ch = RequestChannel(ctx, ep["rep"], timeout=5, retries=0)
        try:
            for uuid in range(1100):  # 1100 * (2**53 - 1) > 2**63 - 1
                totals = _counter(ch, uuid, COUNTER_MAX, COUNTER_MAX)
            assert totals["total_steps"] == 2 ** 63 - 1 == srv.total_steps
            assert _counter(ch, 0, COUNTER_MAX, COUNTER_MAX)["total_episodes"] == 2 ** 63 - 1
            assert srv.stats()["total_episodes"] == 2 ** 63 - 1
        finally:
            ch.close()
            ctx.term()


# ---- item 6: unfinished episode streams ------------------------------------------------------

def test_a_flood_of_empty_chunks_under_one_sender_is_bounded(central):
    srv, ep = central
    n = 3000
    with _Push(ep["pull"]) as push:
        for k in range(n):
            push.send_multipart(_chunk(666, 1, k, 0))
        assert _wait(lambda: srv.stats().get("chunks", 0) >= n)
    s = srv.stats()
    assert s["rejected"]["stream_bytes"] == 1  # then the rest of the flood has lost its start
    assert s["rejected"]["out_of_order_chunk"] > 0
    assert s["open_stream_bytes"] <= srv.max_stream_bytes and s["memory_size"] == 0
    _honest_episode_is_stored(srv, ep)
    assert srv.stats()["memory_size"] == 10


def test_many_open_streams_are_bounded_in_bytes_and_the_largest_go_first(central):
    srv, ep = central
    rows = 500  # ~20 KB a stream: 100 of them would hold ~2 MB
    with _Push(ep["pull"]) as push:
        for uuid in range(100):
            push.send_multipart(_chunk(1000 + uuid, 1, 0, rows))
        assert _wait(lambda: srv.stats().get("chunks", 0) >= 100)
    s = srv.stats()
    assert s["open_stream_bytes"] <= srv.max_open_bytes == 256 << 10
    assert s["rejected"]["open_bytes"] > 50 and s["open_streams"] < 20
    assert s["memory_size"] == 0
    _honest_episode_is_stored(srv, ep)


def test_unfinished_streams_are_reaped_without_further_chunks():
    with ReplayMemoryServer(*TEMPLATES, 100, None, stream_timeout=0.3) as srv:
        ep = srv.start()
        with _Push(ep["pull"]) as push:
            push.send_multipart(_chunk(7, 1, 0, 5))
            assert _wait(lambda: srv.stats()["open_streams"] == 1)
        # No chunk comes any more: the pull worker's idle polls reap it.
        assert _wait(lambda: srv.stats()["open_streams"] == 0, timeout=15)
        assert srv.stats()["rejected"]["stale_episode"] == 1
        assert srv.stats()["open_stream_bytes"] == 0


def test_unfinished_streams_are_reaped_on_the_pyzmq_path_too():
    script = (
        "import sys, time\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from tests.test_hostile_server import _Push, _chunk, _wait, TEMPLATES\n"
        "from memoire import ReplayMemoryServer, transport\n"
        "assert not transport.native_libzmq()\n"
        "with ReplayMemoryServer(*TEMPLATES, 100, None, stream_timeout=0.3) as srv:\n"
        "    ep = srv.start()\n"
        "    with _Push(ep['pull']) as push:\n"
        "        push.send_multipart(_chunk(7, 1, 0, 5))\n"
        "        assert _wait(lambda: srv.stats()['open_streams'] == 1)\n"
        "    assert _wait(lambda: srv.stats()['open_streams'] == 0, timeout=15)\n"
        "    print(srv.stats()['rejected'])\n")
    out = subprocess.run([sys.executable, "-c", script, ROOT], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, MEMOIRE_NATIVE_ZMQ="0"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'stale_episode': 1" in out.stdout


def test_default_stream_budgets_follow_the_memory_size():
    with ReplayMemoryServer(*TEMPLATES, 10_000, None) as srv:
        row = 16 + 8 + 4 + 4 + 4 + 0 + 4  # s, a, r, p, v, i, init_w
        assert srv.max_stream_bytes == 10_000 * row + (32 << 20)
        assert srv.max_open_bytes == 64 << 20
        assert default_stream_budgets(srv._schema, 10 ** 9) == ((256 << 20) + (32 << 20),
                                                               4 << 30)
        with pytest.raises(ValueError, match="max_open_bytes"):
            srv.max_open_bytes = 0


# ---- item 7: reply cache and batch sizes -------------------------------------------------------

def _fill(rem, episodes=5, length=200):
    for _ in range(episodes):
        rem.new_episode()
        rem.add_entries(np.ones((length, 4), np.float32), np.zeros(length, np.int64),
                        np.ones(length, np.float32), np.full(length, 0.5, np.float32),
                        np.zeros(length, np.float32), np.zeros((length, 0), np.uint8),
                        np.ones(length, np.float32))
        rem.close_episode()


def test_reply_cache_is_bounded_in_bytes(central):
    srv, ep = central
    _fill(srv.rem)
    callers = [RemoteMemory(ep["rep"], timeout=10, retries=0) for _ in range(12)]
    try:
        for rm in callers:  # each reply ~ 4000 rows * 40+ bytes = ~170 KB: 12 are ~2 MB
            assert len(rm.sample(4000)) == 4000
        assert 0 < srv.stats()["reply_cache_bytes"] <= srv.reply_cache_bytes == 1 << 20
    finally:
        for rm in callers:
            rm.close()


def test_batch_size_of_a_remote_call_is_bounded(central):
    srv, ep = central
    _fill(srv.rem)
    size = srv.stats()["memory_size"]
    with RemoteMemory(ep["rep"], timeout=10, retries=0) as rm:
        for n in (5001, 200_000, 2 ** 62):
            with pytest.raises(ValueError, match="max_batch"):
                rm.sample(n)
        with pytest.raises(ValueError, match="max_batch"):
            rm.get_batch(10 ** 9)
        assert srv.stats()["rejected"]["batch_too_large"] == 4
        assert len(rm.sample(5000)) == 5000  # still serving, up to the bound
    assert srv.stats()["memory_size"] == size


def test_memoire_serve_takes_the_limits():
    from memoire import serve

    srv = serve.build_server(serve.serve_config(
        pub="tcp://127.0.0.1:*", max_step=100, max_batch=7, reply_cache_bytes=1000,
        max_stream_bytes=5000, max_open_bytes=9000, max_counter_clients=3,
        allow_nonfinite="1"))
    try:
        assert (srv.max_batch, srv.reply_cache_bytes, srv.max_counter_clients) == (7, 1000, 3)
        assert (srv.max_stream_bytes, srv.max_open_bytes) == (5000, 9000)
        assert srv.rem.allow_nonfinite
    finally:
        srv.close()


# ---- non-finite values -------------------------------------------------------------------------

def test_nonfinite_local_adds_are_refused_unless_allowed():
    rem = ReplayMemory(*TEMPLATES, 50)
    rem.new_episode()
    rem.add_entry(np.zeros(4, np.float32), 0, 1.0, 0.5, 0.0)
    for r, p, v, field in ((np.nan, 0.5, 0.0, "r"), (1.0, np.inf, 0.0, "p"),
                           (1.0, 0.5, -np.inf, "v")):
        with pytest.raises(ValueError, match=f"{field}: expected finite values"):
            rem.add_entry(np.zeros(4, np.float32), 0, r, p, v)
    rewards = np.ones(6, np.float32)
    rewards[4] = np.nan
    with pytest.raises(ValueError, match=r"r: expected finite values, got nan \(row 4"):
        rem.add_entries(np.zeros((6, 4), np.float32), np.zeros(6, np.int64), rewards,
                        np.full(6, 0.5, np.float32), np.zeros(6, np.float32),
                        np.zeros((6, 0), np.uint8), np.ones(6, np.float32))
    assert rem.size == 1 and rem.open_length == 1  # nothing of the refused adds stored
    rem.allow_nonfinite = True
    rem.add_entry(np.zeros(4, np.float32), 0, np.inf, 0.5, 0.0)
    assert rem.size == 2
    with pytest.raises(ValueError, match="init_w"):  # weights are never non-finite
        rem.add_entry(np.zeros(4, np.float32), 0, 1.0, 0.5, 0.0, init_w=np.nan)


def test_nonfinite_rewards_from_an_actor_are_refused_and_counted(central):
    srv, ep = central
    with ReplayMemoryClient(None, ep["rep"], ep["pull"], mode="central", chunk_size=3,
                            timeout=5) as c:
        _episode(c)
        assert srv.wait_rows_in(10, timeout=10)
        for bad in (np.nan, np.inf):
            _episode(c, reward=bad)
        assert _wait(lambda: srv.stats()["rejected"].get("nonfinite", 0) == 2)
        assert srv.stats()["memory_size"] == 10 and srv.rem.num_episode() == 1
        b = srv.sample(64)
        assert np.isfinite(b.prev[2]).all() and np.isfinite(b.prev[5]).all()
    with RemoteMemory(ep["rep"], timeout=5, retries=0) as rm:  # a learner's priorities
        weights = np.ones(len(b.id), np.float32)
        weights[3] = np.nan
        with pytest.raises(ValueError, match="finite"):
            rm.update_priorities(b.id, weights)
        assert srv.stats()["rejected"]["bad_priorities"] == 1
        assert np.isfinite(srv.rem.total_weight)
    _honest_episode_is_stored(srv, ep)


def test_nonfinite_caches_are_refused_and_counted():
    with ReplayMemoryServer(*TEMPLATES, 100, None, n_caches=4) as srv:
        srv.rem.cache_size = 8
        ep = srv.start()
        with ReplayMemoryClient(None, ep["rep"], ep["pull"], timeout=5) as c:
            c.rem.allow_nonfinite = True  # a peer that breaks the rule on its side
            for _ in range(2):
                c.rem.new_episode()
                for k in range(10):
                    c.rem.add_entry(np.zeros(4, np.float32), k, np.nan, 0.5, 0.0)
                c.rem.close_episode()
            assert c.push_cache() == 0
            assert _wait(lambda: srv.stats()["rejected"].get("nonfinite", 0) == 1)
        assert srv.stats()["caches_held"] == 0
        with ReplayMemoryClient(None, ep["rep"], ep["pull"], timeout=5) as c:
            for _ in range(2):
                c.rem.new_episode()
                for k in range(10):
                    c.rem.add_entry(np.zeros(4, np.float32), k, 1.0, 0.5, 0.0)
                c.rem.close_episode()
            assert c.push_cache() == 0
            assert np.isfinite(srv.get_batch(8, timeout=10).prev[2]).all()


def test_allow_nonfinite_stores_them():
    with ReplayMemoryServer(*TEMPLATES, 100, None, allow_nonfinite=True) as srv:
        ep = srv.start()
        assert srv.rem.allow_nonfinite
        with ReplayMemoryClient(None, ep["rep"], ep["pull"], mode="central", timeout=5) as c:
            _episode(c, reward=np.nan)
        assert srv.wait_rows_in(10, timeout=10)


# ---- item 5: remote save/load of a hosted buffer (a server process), CURVE ----------------------

class _BufferServer:
    """``python -m memoire.dopamine_compat.remote --serve circular`` in a subprocess; its
    endpoint is read from its first stdout line within `timeout` seconds."""

    def __init__(self, tmp_path, args=(), timeout=120.0):
        cmd = [sys.executable, "-m", "memoire.dopamine_compat.remote", "--serve", "circular",
               "--arg", "observation_shape=(4,)", "--arg", "stack_size=1",
               "--arg", "replay_capacity=100", "--arg", "batch_size=4"] + list(args)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.log = open(tmp_path / "server.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env, cwd=str(tmp_path))
        self.endpoint = None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while self.endpoint is None and time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("ENDPOINT "):
                self.endpoint = line.split()[1]
        sel.close()
        if self.endpoint is None:
            self.stop()
            pytest.fail(f"server did not start: {(tmp_path / 'server.log').read_text()[-3000:]}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self.proc.stdout.close()
        self.log.close()


def _add_rows(proxy, n=6):
    for k in range(n):
        proxy.add(np.full(4, k, np.float32), 0, 1.0, k == n - 1)


@pytest.mark.dopamine
def test_remote_checkpoints_are_confined_to_the_checkpoint_root(tmp_path):
    pytest.importorskip("gin")
    from memoire.dopamine_compat import remote

    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    server = _BufferServer(tmp_path, ["--checkpoint_root", str(root)])
    try:
        proxy = remote.RemoteOutOfGraphReplayBuffer(server.endpoint, timeout=10, retries=0)
        _add_rows(proxy)
        proxy.save("run1", 0)
        assert any(p.is_file() for p in (root / "run1").iterdir())
        proxy.save(str(root / "run2"), 0)  # an absolute path inside the root is a name too
        assert (root / "run2").is_dir()
        # Names that leave the root: refused, nothing written or deleted outside.
        (outside / "keep").write_text("x")
        for name in (str(outside), "../outside", "run1/../../outside", "/etc"):
            with pytest.raises(PermissionError, match="outside the server's checkpoint root"):
                proxy.save(name, 1)
        os.symlink(outside, root / "link")
        with pytest.raises(ValueError, match="not a folder"):
            proxy.save("link", 1)
        assert sorted(p.name for p in outside.iterdir()) == ["keep"]
        # A FIFO (a blocking open) in a checkpoint folder: refused at once, for save and load.
        (root / "fifo").mkdir()
        os.mkfifo(root / "fifo" / "$store$_observation_ckpt.0.gz")
        for call in (lambda: proxy.load("fifo", 0), lambda: proxy.save("fifo", 0)):
            with pytest.raises(ValueError, match="not a regular file"):
                call()
        # The server still serves, and its buffer is unchanged.
        assert int(proxy.add_count) == 6
        proxy.load("run1", 0)
        assert int(proxy.add_count) == 6
        proxy.close()
    finally:
        server.stop()


@pytest.mark.dopamine
def test_remote_checkpoints_can_be_turned_off(tmp_path):
    pytest.importorskip("gin")
    from memoire.dopamine_compat import remote

    server = _BufferServer(tmp_path, ["--checkpoint_root", "none"])
    try:
        with remote.RemoteOutOfGraphReplayBuffer(server.endpoint, timeout=10, retries=0) as proxy:
            with pytest.raises(PermissionError, match="no checkpoint root"):
                proxy.save("run1", 0)
            assert int(proxy.add_count) == 0
        assert list(tmp_path.glob("run1*")) == []
    finally:
        server.stop()


@pytest.mark.dopamine
def test_buffer_server_takes_curve_keys(tmp_path):
    pytest.importorskip("gin")
    from memoire.dopamine_compat import remote

    server_pub, server_secret = generate_keys(str(tmp_path / "server"), "server")
    _, good_secret = generate_keys(str(tmp_path / "authorized"), "learner")
    _, bad_secret = generate_keys(str(tmp_path / "strangers"), "stranger")
    server = _BufferServer(tmp_path, ["--curve_secret", server_secret,
                                      "--curve_authorized", str(tmp_path / "authorized"),
                                      "--max_batch", "8"])
    try:
        for keys in (None, CurveKeys(bad_secret, server_public_file=server_pub)):
            with pytest.raises(TimeoutError):
                remote.RemoteOutOfGraphReplayBuffer(server.endpoint, timeout=0.5, retries=0,
                                                    keys=keys)
        good = CurveKeys(good_secret, server_public_file=server_pub)
        with remote.RemoteOutOfGraphReplayBuffer(server.endpoint, timeout=10, retries=0,
                                                 keys=good) as proxy:
            _add_rows(proxy)
            assert int(proxy.add_count) == 6
            with pytest.raises(ValueError, match="max_batch"):
                proxy.sample_transition_batch(9)
            assert len(proxy.sample_transition_batch(8)[0]) == 8
    finally:
        server.stop()
