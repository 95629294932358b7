"""Hostile peers against a server (docs/LIMITS.md): counters, open episodes, replies, NaNs.

Each attack is refused, counted in stats()["rejected"], leaves what the server stores
unchanged, and the server goes on serving an honest peer. Loopback only, OS-picked ports,
every loop bounded in count and time. Attacks whose failure would be a hang (a FIFO named as
a checkpoint) run against a server in a subprocess.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import zmq
from _buffer_server import BufferServerProcess
from _subprocess_env import HELPERS, subprocess_env
from _waiting import wait_until

from memoire import ReplayMemory, ReplayMemoryClient, ReplayMemoryServer, codec
from memoire.codec import Msg
from memoire.remote import RemoteMemory, request
from memoire.server import default_stream_budgets
from memoire.server.central_service import COUNTER_MAX
from memoire.transport import CurveKeys, RequestChannel, generate_keys

TEMPLATES = (
    np.zeros([4], np.float32),
    np.zeros([], np.int64),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([0], np.uint8),
)


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
    values = {
        "s": np.zeros((n, 4), np.float32),
        "a": np.zeros(n, np.int64),
        "r": np.full(n, reward, np.float32),
        "p": np.full(n, 0.5, np.float32),
        "v": np.zeros(n, np.float32),
        "i": np.zeros((n, 0), np.uint8),
        "init_w": np.ones(n, np.float32),
        "uuid": np.array(uuid, np.uint64),
        "episode": np.array(episode, np.int64),
        "index": np.array(index, np.int64),
        "multiplier": np.array(1.0, np.float32),
    }
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
    srv = ReplayMemoryServer(
        *TEMPLATES,
        1000,
        None,
        seed=0,
        max_stream_bytes=64 << 10,
        max_open_bytes=256 << 10,
        reply_cache_bytes=1 << 20,
        max_batch=5000,
        max_counter_clients=4,
    )
    ep = srv.start()
    yield srv, ep
    srv.close()


# ---- counters ------------------------------------------------------------------------


def _counter(channel, uuid, episodes, steps):
    return request(
        channel,
        Msg.COUNTER,
        {"uuid": uuid, "episodes": episodes, "steps": steps},
        (Msg.COUNTER_REPLY,),
        "update_counter",
    ).values


def test_counters_out_of_range_are_refused_and_the_totals_stay_usable(central):
    srv, ep = central
    ctx = zmq.Context()
    ch = RequestChannel(ctx, ep["rep"], timeout=5, retries=0)
    try:
        assert _counter(ch, 1, 3, 30) == {"total_episodes": 3, "total_steps": 30}
        for episodes, steps in ((2**62, 1), (1, 2**63 - 1), (-1, 5), (COUNTER_MAX + 1, 0)):
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
            assert totals["total_steps"] == 2**63 - 1 == srv.total_steps
            assert _counter(ch, 0, COUNTER_MAX, COUNTER_MAX)["total_episodes"] == 2**63 - 1
            assert srv.stats()["total_episodes"] == 2**63 - 1
        finally:
            ch.close()
            ctx.term()


# ---- unfinished episode streams ------------------------------------------------------


def test_a_flood_of_empty_chunks_under_one_sender_is_bounded(central):
    srv, ep = central
    n = 3000
    with _Push(ep["pull"]) as push:
        for k in range(n):
            push.send_multipart(_chunk(666, 1, k, 0))
        wait_until(lambda: srv.stats().get("chunks", 0) >= n, "srv.stats().get('chunks', 0) >= n")
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
        wait_until(
            lambda: srv.stats().get("chunks", 0) >= 100, "srv.stats().get('chunks', 0) >= 100"
        )
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
            wait_until(lambda: srv.stats()["open_streams"] == 1, "srv.stats()['open_streams'] == 1")
        # No chunk comes any more: the pull worker's idle polls reap it.
        wait_until(
            lambda: srv.stats()["open_streams"] == 0, "srv.stats()['open_streams'] == 0", timeout=15
        )
        assert srv.stats()["rejected"]["stale_episode"] == 1
        assert srv.stats()["open_stream_bytes"] == 0


def test_unfinished_streams_are_reaped_on_the_pyzmq_path_too():
    script = (
        "import sys, time\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from test_server_hostile_peers import _Push, _chunk, TEMPLATES\n"
        "from _waiting import wait_until\n"
        "from memoire import ReplayMemoryServer, transport\n"
        "assert not transport.native_libzmq()\n"
        "with ReplayMemoryServer(*TEMPLATES, 100, None, stream_timeout=0.3) as srv:\n"
        "    ep = srv.start()\n"
        "    with _Push(ep['pull']) as push:\n"
        "        push.send_multipart(_chunk(7, 1, 0, 5))\n"
        "        wait_until(lambda: srv.stats()['open_streams'] == 1, 'an open stream')\n"
        "    wait_until(lambda: srv.stats()['open_streams'] == 0, 'the reaping', timeout=15)\n"
        "    print(srv.stats()['rejected'])\n"
    )
    tests = os.path.dirname(os.path.abspath(__file__))
    # cwd: `python -c` puts it first on sys.path; the checkout's root would shadow memoire.
    out = subprocess.run(
        [sys.executable, "-c", script, tests],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(HELPERS, MEMOIRE_NATIVE_ZMQ="0"),
        cwd=tests,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'stale_episode': 1" in out.stdout


def test_default_stream_budgets_follow_the_memory_size():
    with ReplayMemoryServer(*TEMPLATES, 10_000, None) as srv:
        row = 16 + 8 + 4 + 4 + 4 + 0 + 4  # s, a, r, p, v, i, init_w
        assert srv.max_stream_bytes == 10_000 * row + (32 << 20)
        assert srv.max_open_bytes == 64 << 20
        assert default_stream_budgets(srv._schema, 10**9) == ((256 << 20) + (32 << 20), 4 << 30)
        with pytest.raises(ValueError, match="max_open_bytes"):
            srv.max_open_bytes = 0


# ---- reply cache and batch sizes -------------------------------------------------------


def _fill(rem, episodes=5, length=200):
    for _ in range(episodes):
        rem.new_episode()
        rem.add_entries(
            np.ones((length, 4), np.float32),
            np.zeros(length, np.int64),
            np.ones(length, np.float32),
            np.full(length, 0.5, np.float32),
            np.zeros(length, np.float32),
            np.zeros((length, 0), np.uint8),
            np.ones(length, np.float32),
        )
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
        for n in (5001, 200_000, 2**62):
            with pytest.raises(ValueError, match="max_batch"):
                rm.sample(n)
        with pytest.raises(ValueError, match="max_batch"):
            rm.get_batch(10**9)
        assert srv.stats()["rejected"]["batch_too_large"] == 4
        assert len(rm.sample(5000)) == 5000  # still serving, up to the bound
    assert srv.stats()["memory_size"] == size


def test_memoire_serve_takes_the_limits():
    from memoire.commands import serve

    srv = serve.build_server(
        serve.serve_config(
            pub="tcp://127.0.0.1:*",
            max_step=100,
            max_batch=7,
            reply_cache_bytes=1000,
            max_stream_bytes=5000,
            max_open_bytes=9000,
            max_counter_clients=3,
            allow_nonfinite="1",
        )
    )
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
    for r, p, v, field in (
        (np.nan, 0.5, 0.0, "r"),
        (1.0, np.inf, 0.0, "p"),
        (1.0, 0.5, -np.inf, "v"),
    ):
        with pytest.raises(ValueError, match=f"{field}: expected finite values"):
            rem.add_entry(np.zeros(4, np.float32), 0, r, p, v)
    rewards = np.ones(6, np.float32)
    rewards[4] = np.nan
    with pytest.raises(ValueError, match=r"r: expected finite values, got nan \(row 4"):
        rem.add_entries(
            np.zeros((6, 4), np.float32),
            np.zeros(6, np.int64),
            rewards,
            np.full(6, 0.5, np.float32),
            np.zeros(6, np.float32),
            np.zeros((6, 0), np.uint8),
            np.ones(6, np.float32),
        )
    assert rem.size == 1 and rem.open_length == 1  # nothing of the refused adds stored
    rem.allow_nonfinite = True
    rem.add_entry(np.zeros(4, np.float32), 0, np.inf, 0.5, 0.0)
    assert rem.size == 2
    with pytest.raises(ValueError, match="init_w"):  # weights are never non-finite
        rem.add_entry(np.zeros(4, np.float32), 0, 1.0, 0.5, 0.0, init_w=np.nan)


def test_nonfinite_rewards_from_an_actor_are_refused_and_counted(central):
    srv, ep = central
    with ReplayMemoryClient(
        None, ep["rep"], ep["pull"], mode="central", chunk_size=3, timeout=5
    ) as c:
        _episode(c)
        assert srv.wait_rows_in(10, timeout=10)
        for bad in (np.nan, np.inf):
            _episode(c, reward=bad)
        wait_until(
            lambda: srv.stats()["rejected"].get("nonfinite", 0) == 2,
            "srv.stats()['rejected'].get('nonfinite', 0) == 2",
        )
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
            wait_until(
                lambda: srv.stats()["rejected"].get("nonfinite", 0) == 1,
                "srv.stats()['rejected'].get('nonfinite', 0) == 1",
            )
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


# ---- remote save/load of a hosted buffer (a server process), CURVE ----------------------


def _BufferServer(tmp_path, args=()):
    """A circular buffer server process (4-float observations, capacity 100) in `tmp_path`."""
    return BufferServerProcess(
        [
            "--buffer",
            "circular",
            "--arg",
            "observation_shape=(4,)",
            "--arg",
            "stack_size=1",
            "--arg",
            "replay_capacity=100",
            "--arg",
            "batch_size=4",
        ]
        + list(args),
        tmp_path / "server.log",
        cwd=tmp_path,
    )


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
    server = _BufferServer(
        tmp_path,
        [
            "--curve_secret",
            server_secret,
            "--curve_authorized",
            str(tmp_path / "authorized"),
            "--max_batch",
            "8",
        ],
    )
    try:
        for keys in (None, CurveKeys(bad_secret, server_public_file=server_pub)):
            with pytest.raises(TimeoutError):
                remote.RemoteOutOfGraphReplayBuffer(
                    server.endpoint, timeout=0.5, retries=0, keys=keys
                )
        good = CurveKeys(good_secret, server_public_file=server_pub)
        with remote.RemoteOutOfGraphReplayBuffer(
            server.endpoint, timeout=10, retries=0, keys=good
        ) as proxy:
            _add_rows(proxy)
            assert int(proxy.add_count) == 6
            with pytest.raises(ValueError, match="max_batch"):
                proxy.sample_transition_batch(9)
            assert len(proxy.sample_transition_batch(8)[0]) == 8
    finally:
        server.stop()


# ---- non-finite values sent to a hosted Dopamine buffer ------------------------------------------


def _rows(n, reward=1.0, start=0):
    """A bulk add of n rows (one episode) for a buffer of float32[4] observations."""
    obs = np.arange(start * 4, (start + n) * 4, dtype=np.float32).reshape(n, 4)
    rewards = np.full(n, reward, np.float32)
    terminals = (np.arange(n) == n - 1).astype(np.uint8)
    return obs, np.zeros(n, np.int32), rewards, terminals


def _buffer_state(proxy, prioritized):
    state = (int(proxy.add_count), sorted(proxy.episode_end_indices))
    if prioritized:
        state += (proxy.get_priority(np.arange(100, dtype=np.int32)).tolist(),)
    return state


@pytest.mark.dopamine
@pytest.mark.parametrize("kind", ["circular", "prioritized"])
def test_nonfinite_values_sent_to_a_buffer_server_are_refused_and_counted(kind):
    pytest.importorskip("gin")
    from memoire.dopamine_compat import buffer_server, remote

    prioritized = kind == "prioritized"
    server, endpoint = buffer_server.start_buffer_server(
        kind, observation_shape=(4,), stack_size=1, replay_capacity=100, batch_size=4
    )
    try:
        with remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=10, retries=0) as proxy:

            def add_batch(rows, priorities=None):
                if prioritized and priorities is None:
                    priorities = np.ones(len(rows[0]))
                proxy.add_batch(*rows, priorities=priorities)

            add_batch(_rows(6))
            before = _buffer_state(proxy, prioritized)
            refused = 0
            for bad in (np.nan, np.inf, -np.inf):
                obs, actions, rewards, terminals = _rows(5, start=10)
                rewards[2] = bad
                with pytest.raises(ValueError, match="add_batch: rewards holds a NaN"):
                    add_batch((obs, actions, rewards, terminals))
                refused += 1
            # The row-by-row path agents use: checked locally as Dopamine does (NaN passes),
            # refused by the server when the episode is sent.
            kw = {"priority": 1.0} if prioritized else {}
            proxy.add(np.zeros(4, np.float32), 0, 1.0, False, **kw)
            with pytest.raises(ValueError, match="rewards holds a NaN"):
                proxy.add(np.zeros(4, np.float32), 0, float("nan"), True, **kw)
            refused += 1
            if prioritized:
                with pytest.raises(ValueError, match="priorities holds a NaN"):
                    add_batch(_rows(5, start=10), priorities=[1.0, np.inf, 1, 1, 1])
                with pytest.raises(ValueError, match="set_priority: priorities holds a NaN"):
                    proxy.set_priority(np.array([0, 1], np.int32), np.array([0.5, np.nan]))
                refused += 2
            assert _buffer_state(proxy, prioritized) == before
            assert server.stats()["rejected"]["nonfinite"] == refused
            # Good batches after them are stored; the buffer samples.
            add_batch(_rows(5, start=20))
            assert int(proxy.add_count) == 11
            assert np.isfinite(proxy.sample_transition_batch(8)[2]).all()
    finally:
        server.close()


@pytest.mark.dopamine
def test_buffer_server_allow_nonfinite_stores_nan_rewards(tmp_path):
    pytest.importorskip("gin")
    from memoire.dopamine_compat import buffer_server, remote
    from memoire.remote import RemoteObject

    def nan_reward_is_stored(endpoint):
        with remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=10, retries=0) as proxy:
            obs, actions, rewards, terminals = _rows(5)
            rewards[1] = np.nan
            proxy.add_batch(obs, actions, rewards, terminals)
            assert int(proxy.add_count) == 5
            batch = proxy.sample_transition_batch(1, indices=np.array([1], np.int32))
            return bool(np.isnan(batch[2][0]))

    server, endpoint = buffer_server.start_buffer_server(
        "circular",
        observation_shape=(4,),
        stack_size=1,
        replay_capacity=100,
        batch_size=4,
        allow_nonfinite=True,
    )
    try:
        assert nan_reward_is_stored(endpoint)
        assert "nonfinite" not in server.stats()["rejected"]
    finally:
        server.close()
    # The command line's flag, bare or 1; 0 (the default) refuses.
    for args, stored in ((["--allow_nonfinite"], True), (["--allow_nonfinite", "0"], False)):
        process = _BufferServer(tmp_path, args)
        try:
            if stored:
                assert nan_reward_is_stored(process.endpoint)
            else:
                with pytest.raises(ValueError, match="rewards holds a NaN"):
                    nan_reward_is_stored(process.endpoint)
                host = RemoteObject(process.endpoint, "server", timeout=10, retries=0)
                assert host.call("stats")["rejected"]["nonfinite"] == 1
                host.close()
        finally:
            process.stop()


@pytest.mark.dopamine
def test_nonfinite_values_sent_to_a_jax_buffer_server_are_refused_and_counted():
    from dopamine.jax.replay_memory import elements

    from memoire.dopamine_compat import buffer_server, remote
    from memoire.dopamine_compat import jax_replay_buffer as jrb

    buffer = jrb.ReplayBuffer(
        jrb.TransitionAccumulator(1, 1, 0.9),
        jrb.PrioritizedSamplingDistribution(0, max_capacity=50),
        batch_size=4,
        max_capacity=50,
    )
    server = ReplayMemoryServer(*TEMPLATES, 10, None)
    try:
        endpoint = server.start()["rep"]
        buffer_server.serve_buffer(server, buffer)  # the server's own rule: non-finite refused
        with remote.RemoteReplayBuffer(endpoint, timeout=10, retries=0) as proxy:

            def episode(reward=1.0, priority=1.0, length=4):
                for k in range(length):
                    proxy.add(
                        elements.TransitionElement(
                            np.full(3, k, np.uint8), 0, reward if k == 1 else 1.0, k == length - 1
                        ),
                        priority=priority if k == 2 else None,
                    )

            episode()
            before = (proxy.add_count, len(proxy))
            with pytest.raises(ValueError, match="add_many: rewards holds a NaN"):
                episode(reward=float("nan"))
            with pytest.raises(ValueError, match="add_many: priorities holds a NaN"):
                episode(priority=float("inf"))
            with pytest.raises(ValueError, match="update: priorities holds a NaN"):
                proxy.update(np.array([0]), priorities=np.array([np.nan]))
            assert (proxy.add_count, len(proxy)) == before
            assert server.stats()["rejected"]["nonfinite"] == 3
            episode()  # a good episode after them is stored; None priorities still pass
            assert proxy.add_count > before[0]
            proxy.sample(4)
    finally:
        server.close()
