"""Two or three hosts on this machine (network namespaces joined by veth links of a set rate,
tests/helpers/_netns.py): a learner apart from its server across a real link, encrypted, and a
partition it survives.

- The hosts go, whatever the test body did.
- A sampling stream's rows across a 1 Gbit/s link, CURVE-encrypted, are bit for bit the
  batches an in-process get_batch draws (raw and compressed states), and they did cross the
  link (its byte counters).
- A distributed learner bound on its host's address takes the run's keys by itself (the
  launchers' default, ``curve = 'auto'``): its actor on another host gets through encrypted
  (a capture on the link never sees the actor's bytes in clear, where a run without keys
  does), and a plain peer on a third host is refused and counted.
- The link goes down for PARTITION_S seconds and comes back: the actor's queue waits (bounded:
  neither it nor the server grows), the server drops the one open episode its peer_timeout
  covers and nothing else (counted), the learner takes batches again on the same stream, and
  each side says so in one line.

Every host and address is the helper's own (10.231.k.x inside its namespaces). Without root (or
iproute2) the tests skip, saying why. What runs on a host is tests/helpers/_link_peers.py; the longer
measurements are benchmarks/bench_link.py's.
"""

import logging
import os
import shutil

import _netns
import numpy as np
import pytest
from _link_peers import Peer, templates
from _netns import TestHosts, namespaces, unavailable
from _subprocess_env import subprocess_env
from _waiting import wait_until

from memoire import ReplayMemory, _core, transport
from memoire.experience import ChunkStream, keepalive_frames, log_returned
from memoire.experiments.slurm_launcher import KEYS_ENV, _encode_keys

GBIT = 1e9
PARTITION_S = 10.0  # the 10-30 s, at its short end
PEER_TIMEOUT_S = 2.0  # the server's, small so the test stays short


@pytest.fixture
def hosts_ok():
    reason = unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def keys(tmp_path):
    """CURVE certificates for a server and its one authorized client (tests/helpers/_link_peers.py's
    layout)."""
    folder = tmp_path / "keys"
    transport.generate_keys(str(folder), "server")
    transport.generate_keys(str(folder / "authorized"), "client")
    for name in ("client.key", "client.key_secret"):
        shutil.copy(folder / "authorized" / name, folder / name)
    os.remove(folder / "authorized" / "client.key_secret")
    return str(folder)


def _peer(hosts, host, role, **args) -> Peer:
    return Peer(hosts, host, role, args, subprocess_env())


def _ready(peer: Peer, timeout: float = 60.0) -> dict:
    wait_until(lambda: peer.ready is not None or peer.proc.poll() is not None, peer.role, timeout)
    assert peer.ready is not None, f"{peer.role} failed:\n{peer.stderr()}"
    return peer.ready


def _wait(predicate, what: str, timeout: float, *peers: Peer):
    """wait_until, whose failure shows what the peers wrote on stderr."""
    got = wait_until(predicate, what, timeout, fail=False)
    if not got:
        said = "\n".join(f"--- {p.role} ({p.status}):\n{p.stderr()}" for p in peers)
        raise AssertionError(f"waited {timeout:g} s for {what}; it never happened\n{said}")
    return got


def _tell(peer: Peer, word: str) -> None:
    peer.proc.stdin.write(word + "\n")
    peer.proc.stdin.flush()


# ---------------------------------------------------------------------------------------------
# The helper


def test_the_hosts_go_even_when_the_test_body_fails(hosts_ok):
    made = []
    with pytest.raises(RuntimeError, match="the body failed"):
        with TestHosts(("a", "b", "c"), rate=GBIT) as hosts:
            made = list(hosts.netns.values())
            assert set(made) <= set(namespaces())
            sleeper = hosts.popen("b", ["sleep", "600"])
            out = hosts.run("c", ["ip", "-o", "-4", "addr", "show", "dev", "link0"], timeout=10)
            assert hosts.address("c") in out.stdout
            raise RuntimeError("the body failed")
    assert made and not set(made) & set(namespaces())
    assert sleeper.poll() is not None  # stopped, not left running


def test_without_root_the_tests_say_why(monkeypatch):
    monkeypatch.setattr(_netns.os, "geteuid", lambda: 1000)
    assert "need root" in _netns._why_unavailable()


def test_the_helper_refuses_what_it_cannot_make():
    for names in (("a",), ("a", "b", "c", "d"), ("a", "a"), ("a", "B")):
        with pytest.raises(ValueError):
            TestHosts(names)
    with pytest.raises(ValueError, match="rate"):
        TestHosts(("a", "b"), rate=0)


# ---------------------------------------------------------------------------------------------
# Rows across the link


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "compressed"])
def test_rows_cross_the_link_bit_for_bit(hosts_ok, keys, compress):
    # The server's memory and the learner's local one hold the same entries and seed: the
    # stream is the server memory's only sampler, so its batches are get_batch's, in order.
    common = dict(capacity=1000, fill=1000, seed=5, compress=compress, keys=keys)
    batches = 40
    with TestHosts(("server", "learner"), rate=GBIT) as hosts:
        server = _peer(hosts, "server", "server", bind=hosts.address("server"), **common)
        stream = _ready(server)["stream"]
        assert stream.startswith(f"tcp://{hosts.address('server')}:")
        before = hosts.link_bytes("learner", "server")
        learner = _peer(
            hosts, "learner", "learner", stream=stream, compare=True, batches=batches, **common
        )
        seen = _ready(learner)
        assert seen == {"shared_memory": False, "compressed_rows": compress}
        learner.proc.wait(120)
        assert learner.done is not None, learner.stderr()
        assert learner.done["equal"] == batches
        crossed = hosts.link_bytes("learner", "server")["rx"] - before["rx"]
        server.stop()
    # Each batch's distinct rows came over the link: at least 5 frames a transition raw (4 +
    # 1 of the next stack shared), a fraction of that compressed.
    frame = 84 * 84
    least = batches * 32 * frame * (1 if not compress else 0.05)
    assert crossed > least, (crossed, least)


# ---------------------------------------------------------------------------------------------
# Keys by default across hosts


def _capture_run(hosts, curve: str, with_stranger: bool) -> tuple:
    """A distributed learner on host "learner" (its sockets as the launchers bind them, with
    `curve`), an actor on host "actor" sending chunks that carry a marker, a capture on the
    learner's end of the actor's link, and with `with_stranger` a plain peer on host
    "stranger". Returns the last words of the learner, the capture and the stranger (None
    without one)."""
    env = {KEYS_ENV: _encode_keys(*transport.run_keys())}  # as `memoire train` hands them
    sniff = _peer(hosts, "learner", "sniff", device=hosts.device("learner", "actor"))
    _ready(sniff)
    learner = Peer(
        hosts,
        "learner",
        "dist_learner",
        {"host": hosts.address("learner", "actor"), "curve": curve},
        subprocess_env(**env),
    )
    ends = _ready(learner)
    assert ends["encrypted"] is (curve != "off")
    stranger = None
    if with_stranger:
        stranger = _peer(hosts, "stranger", "plain", **ends)
        _ready(stranger)
    actor = Peer(hosts, "actor", "dist_actor", ends, subprocess_env(**env))
    _ready(actor)
    peers = [p for p in (sniff, learner, actor, stranger) if p is not None]
    _wait(
        lambda: learner.status.get("chunks", 0) >= 5 and actor.status.get("parameters", 0) > 0,
        "chunks at the learner and parameters at the actor",
        60,
        *peers,
    )
    if stranger is not None:
        _wait(lambda: learner.status.get("refused", 0) >= 2, "the plain peer refused", 30, *peers)
    acted = actor.stop()
    assert acted["parameters"] > 0, acted  # publications reach the run's actor
    strange = None if stranger is None else stranger.stop()
    return learner.stop(), sniff.stop(), strange


def test_a_learner_beyond_loopback_keys_itself_and_refuses_a_plain_peer(hosts_ok):
    with TestHosts(("learner", "actor", "stranger"), rate=GBIT) as hosts:
        said, seen, strange = _capture_run(hosts, "auto", with_stranger=True)
    everything = (said, seen, strange)
    assert said["encrypted"] and said["chunks"] >= 5, everything
    assert said["strangers"] == 0, everything  # nothing of the plain peer's got in...
    assert strange["queued"] > 0 and strange["received"] == 0, everything  # ...or out
    assert said["refused"] >= 2, everything  # its handshakes (again at each reconnect)
    assert seen["frames"] > 0 and not seen["marker"], everything  # never the actor in clear


def test_without_keys_the_capture_reads_the_actor(hosts_ok):
    # The control of the test above: the same run with --insecure, where the capture does see
    # the marker (so not seeing it there means encryption, not a blind capture).
    with TestHosts(("learner", "actor"), rate=GBIT) as hosts:
        said, seen, _ = _capture_run(hosts, "off", with_stranger=False)
    assert not said["encrypted"] and said["chunks"] >= 5
    assert seen["marker"]


# ---------------------------------------------------------------------------------------------
# A partition


def test_a_partition_is_survived_and_only_the_open_episode_is_lost(hosts_ok, keys):
    with TestHosts(("server", "learner"), rate=GBIT) as hosts:
        server = _peer(
            hosts,
            "server",
            "server",
            bind=hosts.address("server"),
            capacity=2000,
            fill=2000,  # every page of the store written: what grows later is queues
            seed=3,
            peer_timeout=PEER_TIMEOUT_S,
            keys=keys,
        )
        eps = _ready(server)
        actor = _peer(
            hosts,
            "learner",
            "actor",
            rep=eps["rep"],
            pull=eps["pull"],
            keys=keys,
            timeout=6 * PARTITION_S,  # its pushes wait out the partition: nothing abandoned
            keepalive=PEER_TIMEOUT_S / 4,
            step_s=0.001,
            chunk=10,
        )
        learner = _peer(hosts, "learner", "learner", stream=eps["stream"], timeout=2.0, keys=keys)
        _ready(actor), _ready(learner)
        wait_until(
            lambda: (
                learner.status.get("batches", 0) >= 20 and server.status.get("episodes_in", 0) >= 3
            ),
            "batches at the learner and episodes at the server",
            60,
        )
        # The actor stops in the middle of an episode, so that the server holds one open when
        # the link goes: the episode its peer_timeout must drop.
        _tell(actor, "hold")
        wait_until(
            lambda: actor.status.get("held") is not None and server.status.get("open_streams") == 1,
            "an open episode at the server",
            30,
        )
        server_rss, actor_rss = server.status["rss_max_mib"], actor.status["rss_mib"]
        hosts.set_link("learner", False)
        _tell(actor, "go")  # it goes on, into its queue, until the queue is full
        wait_until(
            lambda: (
                server.status["rejected"].get("peer_lost", 0) == 1
                and learner.status.get("timeouts", 0) >= 1
            ),
            "the server dropping the open episode, and the learner's timeouts",
            30,
        )
        taken = learner.status["batches"]
        stored = server.status["episodes_in"]
        # The partition lasts PARTITION_S in all: a duration, not a state to wait for.
        wait_until(lambda: hosts.partitioned_for("learner") >= PARTITION_S, "the partition", 60)
        hosts.set_link("learner", True)
        wait_until(
            lambda: (
                learner.status.get("batches", 0) >= taken + 20
                and server.status.get("episodes_in", 0) >= stored + 3
            ),
            "batches and episodes again after the partition",
            120,
        )
        _tell(actor, "stop")
        acted = wait_until(lambda: actor.done, "the actor's last episode", 60)
        # Everything it closed is stored, but the one episode the server dropped.
        wait_until(
            lambda: server.status["episodes_in"] == acted["closed"] - 1,
            f"the server storing {acted['closed'] - 1} of the actor's {acted['closed']} "
            f"episodes (it has {server.status['episodes_in']})",
            60,
        )
        served = server.status
        lines = {peer.role: peer.log for peer in (server, actor, learner)}
        learned = learner.stop()
        actor.stop()
        server.stop()
    rejected = served["rejected"]
    assert rejected.get("peer_lost") == 1  # the one open episode, counted
    # Its chunks still in the actor's queue then came after, and were dropped too; nothing
    # else was refused.
    assert set(rejected) <= {"peer_lost", "out_of_order_chunk"}
    assert acted["abandoned"] == 0 and acted["longest_wait_s"] > PEER_TIMEOUT_S
    # Bounded: the actor waited instead of piling episodes up, and the server held nothing
    # more than before (its store was full before the partition).
    assert acted["rss_mib"] - actor_rss < 32, (acted["rss_mib"], actor_rss)
    assert served["rss_max_mib"] - server_rss < 32, (served["rss_max_mib"], server_rss)
    assert learned["timeouts"] >= 1 and learned["batches"] >= taken + 20
    # One line each, saying what was lost and that it is back.
    back = [line for line in lines["server"] if " back after " in line]
    assert len(back) == 1 and "lost to peer_timeout" in back[0], lines["server"]
    assert not any("out_of_order_chunk" in line for line in lines["server"])
    again = [line for line in lines["learner"] if "batches again after" in line]
    assert len(again) == 1 and "lost none" in again[0], lines["learner"]
    stalled = [line for line in lines["actor"] if "took nothing for" in line]
    assert len(stalled) == 1 and "nothing dropped here" in stalled[0], lines["actor"]


# ---------------------------------------------------------------------------------------------
# The server's line, without hosts


def test_an_actor_back_after_its_episode_was_dropped_is_reported_once(caplog):
    # The ingest's own clock (`now`): an actor silent past peer_timeout loses its open episode,
    # and its next word (the rest of that episode, still on its way) reports it back, in one
    # line; that rest is dropped without a line, and its next episode is stored.
    memory = ReplayMemory(*templates(), 1000)
    ingest = _core.ChunkIngest(memory, peer_timeout=1.0)
    sent = []
    stream = ChunkStream(
        ingest.row_spec, lambda f: sent.append([memoryview(x).tobytes() for x in f]) or True, 5
    )
    row = {
        "s": np.zeros((84, 84), np.uint8),
        "a": 0,
        "r": np.float32(0),
        "p": np.float32(0.5),
        "v": np.float32(0),
        "i": np.zeros(0, np.uint8),
        "init_w": np.float32(1),
    }
    for _ in range(15):  # chunks 0, 1, 2 of episode 0
        stream.add(row)
    stream.end_episode(True)  # chunk 3, the last
    assert [ingest.ingest(f, now=0.0)[0] for f in sent[:2]] == [1, 1]  # staged
    now = 0.0
    while not ingest.counters()["rejected"].get("peer_lost"):
        now += 0.25
        assert now < 10, "the open episode was never dropped"
        ingest.listen(now=now)
    logger = logging.getLogger("test_netns_link")
    assert log_returned(logger, ingest) == 0  # gone, not back yet
    late = [ingest.ingest(f, now=now + 5.0) for f in sent[2:]]
    assert [(outcome, reason) for outcome, _, reason, _, _ in late] == [(3, None), (3, None)]
    with caplog.at_level(logging.WARNING, logger="test_netns_link"):
        assert log_returned(logger, ingest) == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (
        f"actor {stream.uuid & 0xFFFFFFFF:08x} back after {now + 5.0:.1f} s without a word; "
        "lost to peer_timeout (1 s): its open episode 0, 10 rows received (its chunks of it "
        "still on the way are dropped)"
    )
    assert ingest.counters()["rejected"] == {"peer_lost": 1, "out_of_order_chunk": 2}
    sent.clear()
    for _ in range(3):
        stream.add(row)
    stream.end_episode(True)
    assert [ingest.ingest(f, now=now + 6.0)[0] for f in sent] == [2]  # its next one: stored
    assert memory.num_episode() == 1 and ingest.take_returned() == []
    # Gone again, back with a keepalive: a new absence, reported again.
    sent.clear()
    for _ in range(5):
        stream.add(row)
    assert ingest.ingest(sent[0], now=now + 7.0)[0] == 1
    later = now + 7.0
    while ingest.counters()["rejected"]["peer_lost"] < 2:
        later += 0.25
        assert later < now + 20, "the second open episode was never dropped"
        ingest.listen(now=later)
    ingest.ingest([memoryview(f).tobytes() for f in keepalive_frames(stream.uuid)], now=later + 1.0)
    ((uuid, silent, episode, episodes, rows, count),) = ingest.take_returned()
    assert (uuid, episode, episodes, rows, count) == (stream.uuid, 2, 1, 5, 2)
    assert silent == pytest.approx(later + 1.0 - (now + 7.0))
