"""CURVE by default beyond loopback: the one helper that decides it, a learner's sockets with a
run's keys (a plain or wrongly keyed peer is refused and counted, the run's actors get
through), the Ray launcher's choice and `--insecure`, and `memoire serve`'s warning.

Tests bind loopback only: what a bind beyond loopback decides is checked on the decision
(:func:`memoire.transport.beyond_loopback`, :func:`distributed.use_curve`, a config's warning),
and the keys themselves on loopback sockets forced to use them."""

import logging
import types

import numpy as np
import pytest
import zmq
from _waiting import wait_until

from memoire import cli, transport
from memoire.commands import serve
from memoire.experiments import distributed, ray_launcher
from memoire.experiments import train as train_lib


@pytest.mark.parametrize(
    "where, beyond",
    [
        ("127.0.0.1", False),
        ("127.0.0.2", False),
        ("localhost", False),
        ("::1", False),
        ("[::1]", False),
        ("tcp://127.0.0.1:5555", False),
        ("tcp://[::1]:*", False),
        ("ipc:///tmp/x", False),
        ("inproc://x", False),
        ("0.0.0.0", True),
        ("*", True),
        ("10.0.0.7", True),
        ("tcp://0.0.0.0:5555", True),
        ("tcp://*:*", True),
        ("tcp://[::]:5555", True),
        ("node7.cluster", True),
    ],
)
def test_beyond_loopback(where, beyond):
    assert transport.beyond_loopback(where) is beyond


def test_a_learner_with_run_keys_refuses_plain_and_foreign_peers_and_counts_them():
    server, client = transport.run_keys()
    config = distributed.DistributedConfig(num_actors=1, transport="zmq")
    sockets = distributed.LearnerSockets(config, host="127.0.0.1", keys=server)
    ctx = zmq.Context()
    strangers = []
    try:
        assert sockets.encrypted
        ep = sockets.endpoints["experience"]
        assert ep.startswith("tcp://127.0.0.1:")
        # A plain socket, and one with CURVE keys of its own (it knows the learner's public
        # key, but the learner lets only the run's client key in).
        plain = transport.open_socket(ctx, zmq.PUSH, ep, "Conn")
        _, foreign = transport.run_keys()
        foreign.server_public = client.server_public
        keyed = transport.open_socket(ctx, zmq.PUSH, ep, "Conn", keys=foreign, server_side=False)
        strangers = [plain, keyed]
        for sock in strangers:
            sock.send(b"from a stranger", zmq.NOBLOCK)  # queued: no handshake completes
        ends = distributed.ActorEndpoints(ep, sockets.endpoints["params"], keys=client)
        link = ends.open(0)
        try:
            assert link.send([b"from the run's actor"])
            assert sockets.pull.poll(10_000)
            assert sockets.pull.recv_multipart() == [b"from the run's actor"]

            def counted():
                sockets.watch()
                return sockets.refused >= 2

            assert wait_until(counted, "two refused strangers", fail=False), sockets.refused
            assert not sockets.pull.poll(200)  # the strangers' messages never arrived
            # Parameters reach the run's actor (published until its subscription is in).
            wait_until(
                lambda: sockets.publish(7, b"weights") or link.latest() is not None,
                "sockets.publish(7, b'weights') or link.latest() is not None",
            )
            sockets.publish(8, b"weights")
            wait_until(lambda: link.latest() == (8, b"weights"), "link.latest() == (8, b'weights')")
        finally:
            link.close()
    finally:
        for sock in strangers:
            sock.close(0)
        ctx.term()
        sockets.close()


def test_a_learner_without_keys_takes_a_plain_peer():
    config = distributed.DistributedConfig(num_actors=1, transport="zmq")
    sockets = distributed.LearnerSockets(config, host="127.0.0.1")
    ctx = zmq.Context()
    try:
        assert not sockets.encrypted
        plain = transport.open_socket(ctx, zmq.PUSH, sockets.endpoints["experience"], "Conn")
        plain.send(b"x")
        assert sockets.pull.poll(10_000) and sockets.pull.recv() == b"x"
        sockets.watch()
        assert sockets.refused == 0
        plain.close(0)
    finally:
        ctx.term()
        sockets.close()


def test_run_keys_are_fresh_in_memory_and_never_printed():
    server, client = transport.run_keys()
    again, _ = transport.run_keys()
    assert server.secret_file is None and client.secret_file is None  # no file anywhere
    assert server.public != again.public
    assert client.server_public == server.public
    assert server.authorized == (client.public,)
    for keys in (server, client):
        assert keys.secret.decode() not in repr(keys)


@pytest.mark.parametrize(
    "setting, host, used",
    [
        ("auto", "127.0.0.1", False),
        ("auto", "10.1.2.3", True),
        ("auto", "0.0.0.0", True),
        ("on", "127.0.0.1", True),
        ("off", "10.1.2.3", False),
    ],
)
def test_the_ray_launcher_uses_keys_beyond_loopback(setting, host, used):
    assert distributed.use_curve(setting, host) is used


def test_insecure_says_so_only_when_something_travels_in_clear():
    warning = distributed.insecure_warning("off", "tcp://10.1.2.3:4000")
    assert warning.startswith("--insecure: ") and "tcp://10.1.2.3:4000" in warning
    assert distributed.insecure_warning("off", "tcp://127.0.0.1:4000") is None
    assert distributed.insecure_warning("auto", "tcp://10.1.2.3:4000") is None


def test_insecure_flag_and_bad_settings():
    args = types.SimpleNamespace(launcher="ray", ray_address=None, insecure=True)
    assert "RayConfig.curve = 'off'" in train_lib._launcher_bindings(args)
    args.insecure = False
    assert not any("curve" in b for b in train_lib._launcher_bindings(args))
    with pytest.raises(ValueError, match="curve must be one of"):
        ray_launcher.RayConfig(curve="yes")
    with pytest.raises(ValueError, match="learner_resources"):
        ray_launcher.RayConfig(learner_resources={"learner": -1})
    config = ray_launcher.RayConfig(learner_resources={"learner": 1})
    assert config.learner_resources == {"learner": 1.0} and config.curve == "auto"


def test_actors_go_apart_from_the_learners_node_unless_told_otherwise():
    apart = ray_launcher.actor_placement(ray_launcher.RayConfig(), "abc")
    assert apart["label_selector"] == {"ray.io/node-id": "!abc"}
    assert apart["fallback_strategy"] == [{"label_selector": {}}]  # never stranded
    spread = ray_launcher.actor_placement(ray_launcher.RayConfig(actors_apart=False), "abc")
    assert spread == {"scheduling_strategy": "SPREAD"}


def _cfg(**flags):
    cfg = dict(serve.DEFAULTS)
    cfg.update(flags)
    return cfg


def test_serve_warns_beyond_loopback_without_keys():
    assert serve.keys_warning(_cfg()) is None  # loopback by default
    assert serve.keys_warning(_cfg(bind_host="0.0.0.0", curve_secret="k.key_secret")) is None
    wide = serve.keys_warning(_cfg(bind_host="0.0.0.0"))
    assert "--curve_secret" in wide and "tcp://0.0.0.0:*" in wide
    one = serve.keys_warning(_cfg(pull="tcp://10.0.0.5:7000"))
    assert "tcp://10.0.0.5:7000" in one and "tcp://127.0.0.1" not in one
    assert serve.keys_warning(_cfg(buffer="circular", pull="tcp://10.0.0.5:7000")) is None


def test_serve_says_it_once_at_start(monkeypatch, caplog):
    # Stops right after the warning, where the server would bind: nothing leaves loopback.
    def refuse(cfg):
        raise cli.UsageError("stopped by the test")

    monkeypatch.setattr(serve, "build_server", refuse)
    with caplog.at_level(logging.WARNING, logger=serve.log.name):
        assert serve.main(["--bind_host", "0.0.0.0"]) == 2
    said = [r for r in caplog.records if "--curve_secret" in r.getMessage()]
    assert len(said) == 1


def test_serve_keys_come_from_one_place_and_authorized_needs_a_secret(tmp_path, capsys):
    """Both servers' keys are serve_settings.curve_keys: none without a secret, and
    --curve_authorized alone is refused (before, the memory server dropped it in silence)."""
    from memoire.server.serve_settings import curve_keys

    assert curve_keys(_cfg()) is None
    with pytest.raises(ValueError, match="--curve_authorized needs --curve_secret"):
        curve_keys(_cfg(curve_authorized=str(tmp_path)))
    _, secret = transport.generate_keys(str(tmp_path / "keys"), "server")
    keys = curve_keys(_cfg(curve_secret=secret))
    assert isinstance(keys, transport.CurveKeys)
    for buffer in ([], ["--buffer", "circular"]):
        assert serve.main(["--curve_authorized", str(tmp_path), "--duration", "0", *buffer]) == 2
        assert capsys.readouterr().err == (
            "memoire serve: error: --curve_authorized needs --curve_secret\n"
        )


def test_chunk_arrays_pass_curve_unchanged():
    """What an actor sends (codec frames of numpy columns) arrives byte for byte."""
    server, client = transport.run_keys()
    config = distributed.DistributedConfig(num_actors=1, transport="zmq")
    sockets = distributed.LearnerSockets(config, host="127.0.0.1", keys=server)
    try:
        ends = distributed.ActorEndpoints(
            sockets.endpoints["experience"], sockets.endpoints["params"], keys=client
        )
        link = ends.open(3)
        frame = np.arange(4096, dtype=np.float32).tobytes()
        assert link.send([b"h", frame])
        assert sockets.pull.poll(10_000)
        assert sockets.pull.recv_multipart() == [b"h", frame]
        link.close()
    finally:
        sockets.close()


def test_serve_and_a_learner_warn_with_the_one_clear_text_warning():
    where = "tcp://10.1.2.3:4000"
    assert transport.clear_text_warning("x", ["tcp://127.0.0.1:1", "ipc:///tmp/a"]) is None
    line = transport.clear_text_warning("x", ["tcp://127.0.0.1:1", where], "do this")
    assert line.startswith(f"x: bound beyond loopback ({where}) without CURVE keys: ")
    assert line.endswith("; do this")
    said = transport.clear_text_warning("x", [where]).split(": ", 1)[1]
    assert said in serve.keys_warning(_cfg(pull=where))
    assert said in distributed.insecure_warning("off", where)
