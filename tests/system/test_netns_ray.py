"""`memoire train --launcher ray` on a Ray cluster of two hosts (network namespaces joined by a
1 Gbit/s link, tests/helpers/_netns.py): the head, with the learner's custom resource, on one, a worker
node on the other, each started with ``ray start`` as the README says (Ray 2.60's token
authentication on, with a token of the test's own). The learner binds on its host's address
(beyond loopback: the run's CURVE keys), the actors run on the other host and their episodes
cross the link; that host lost (every process on it killed), Ray restarts the actors on the
head, and the run finishes with whole episodes only. With the default learner_host ('auto')
the learner binds its node's address too.

One run of the tiny CartPole config (a real Dopamine learner and actors) on a real two-node
cluster: slow, and root only (skipped elsewhere, saying why).
"""

import csv
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
from _link_peers import Peer
from _netns import TestHosts, unavailable
from _subprocess_env import subprocess_env
from _tiny_run import train_command
from _waiting import wait_until

pytestmark = [pytest.mark.dopamine, pytest.mark.ray, pytest.mark.slow]

RAY = os.path.join(os.path.dirname(sys.executable), "ray")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(hosts, the head's address, the environment every Ray process and driver gets)."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("ray")
    folder = tmp_path_factory.mktemp("ray-link")
    env = subprocess_env(
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="token",  # Ray 2.60's default for `ray start --head`, said explicitly
        RAY_AUTH_TOKEN=os.urandom(32).hex(),  # this cluster's own: ~/.ray is left alone
    )
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    # Ray's sockets live under its temp folder, and a socket's path may not pass 107 bytes:
    # pytest's per-worker temp paths are too deep for it (a pytest-xdist run failed so).
    ray_temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    with TestHosts(("head", "worker"), rate=1e9) as hosts:
        head, worker = hosts.address("head"), hosts.address("worker")
        hosts.run(
            "head",
            [RAY, "start", "--head", "--node-ip-address", head, "--port", "6379"]
            + ["--num-cpus", "3", "--resources", '{"learner": 1}', "--include-dashboard=false"]
            + ["--temp-dir", ray_temp, "--disable-usage-stats"],
            timeout=300,
            env=env,
        )
        hosts.run(
            "worker",
            [RAY, "start", "--address", f"{head}:6379", "--node-ip-address", worker]
            + ["--num-cpus", "2", "--disable-usage-stats"],
            timeout=300,
            env=env,
        )
        try:
            yield hosts, head, env, folder
        finally:
            hosts.close()  # Ray's processes go before the folder they write in
            shutil.rmtree(ray_temp, ignore_errors=True)


def _rows(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_actors_on_the_other_host_and_its_loss(cluster):
    hosts, head, env, folder = cluster
    base = folder / "runs"
    run = str(base / "setting_0" / "run_0")
    cmd = train_command(
        str(base),
        "Runner.training_steps = 6000",  # long enough to need the actors after the loss
        "RayConfig.learner_resources = {'learner': 1}",
        # The head's address, said explicitly (the test below checks what 'auto' finds).
        f"RayConfig.learner_host = '{head}'",
        "DistributedConfig.peer_timeout = 3.0",
        "DistributedConfig.keepalive = 0.5",
        launcher="ray",
        ray_address=f"{head}:6379",
    )
    out_path = folder / "train.out"
    with open(out_path, "w") as out:
        train = hosts.popen(
            "head", cmd, cwd=str(folder), stdout=out, stderr=subprocess.STDOUT, env=env
        )
    probe = Peer(
        hosts, "head", "ray_probe", {"address": f"{head}:6379", "run": run, "actors": 2}, env
    )

    def said() -> str:
        return out_path.read_text()[-3000:] + "\n--- probe:\n" + probe.stderr()

    def actors(on: str, but=()):
        got = probe.status.get("actors", [])
        return len(got) == 2 and all(
            a["node"] == on and a["chunks"] and a["pid"] not in but for a in got
        )

    try:
        # The learner on the head, both actors on the other host, and their episodes stored
        # by the learner: they crossed the link.
        wait_until(
            lambda: (
                (actors(hosts.address("worker")) and len(_rows(f"{run}/episodes.csv")) >= 3)
                or train.poll() is not None
            ),
            "episodes from the actors on the other host",
            600,
        )
        assert train.poll() is None, said()
        assert probe.status["learner"] == head, said()
        pids = [a["pid"] for a in probe.status["actors"]]
        # That host is lost: Ray restarts both actors on the head, and they stream again.
        hosts.lose("worker")
        wait_until(
            lambda: actors(head, but=pids) or train.poll() is not None,
            "the actors restarted on the head",
            300,
        )
        assert train.poll() is None, said()
        train.wait(600)
    finally:
        probe.stop()
    out = out_path.read_text()
    assert train.returncode == 0, said()
    assert f"experience tcp://{head}:" in out and "CURVE keys of the run" in out, said()
    # Only whole episodes stored: every stored episode of L steps is L - 1 transitions of
    # Dopamine's JAX buffer; what the lost host's actors had open was never stored.
    train_rows = [r for r in _rows(f"{run}/episodes.csv") if r["phase"] == "train"]
    replay = _rows(f"{run}/replay.csv")
    assert int(replay[-1]["add_count"]) == sum(int(r["length"]) - 1 for r in train_rows)


def test_auto_binds_the_learners_node_address(cluster):
    # With --ray_address, learner_host 'auto' is the learner's node address as the cluster
    # registered it, keyed (it bound 127.0.0.1, unkeyed, until the launcher told a joined
    # cluster from one of its own).
    # Only the learner's first line is needed: the command is stopped once it says where the
    # learner bound.
    hosts, head, env, folder = cluster
    base = folder / "auto"
    cmd = train_command(
        str(base),
        "RayConfig.learner_resources = {'learner': 1}",
        launcher="ray",
        ray_address=f"{head}:6379",
    )
    out_path = folder / "auto.out"
    with open(out_path, "w") as out:
        train = hosts.popen(
            "head", cmd, cwd=str(folder), stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        wait_until(
            lambda: "(experience tcp://" in out_path.read_text() or train.poll() is not None,
            "where the learner bound",
            300,
        )
    finally:
        if train.poll() is None:
            os.killpg(train.pid, signal.SIGTERM)  # its learner and actors go with it
            train.wait(60)
    out = out_path.read_text()
    assert f"experience tcp://{head}:" in out, out[-3000:]
    assert "CURVE keys of the run" in out, out[-3000:]
