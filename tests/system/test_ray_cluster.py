"""`memoire train --launcher ray` on a Ray cluster of several nodes on this machine (Ray's
``ray.cluster_utils.Cluster``; every node on 127.0.0.1, so nodes are told apart by their Ray
node ids): the learner lands on the node with its custom resource, actors on another; that
node lost mid-run, its actors are restarted on the node left and rejoin, the run finishes
with whole episodes only; the learner's node lost, the command exits 1 and leaves a run that
resumes from its last checkpoint. The run uses CURVE keys (forced: on loopback 'auto' would
not) and a plain socket sent to the learner is refused and counted.

One run of the tiny CartPole config (real Dopamine learner and actors), so it is slow."""

import os
import re
import subprocess

import pytest
from _ray_probe import _call, _named, _rows
from _subprocess_env import subprocess_env
from _tiny_run import train_command
from _waiting import wait_until

pytestmark = [pytest.mark.dopamine, pytest.mark.ray, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A head (no CPUs: it only holds Ray's servers and the drivers), a node with the custom
    resource ``learner`` and one with ``actor_node``, all on 127.0.0.1."""
    import ray
    from ray.cluster_utils import Cluster

    # The nodes' worker processes inherit this environment: they must import the memoire
    # under test, never the checkout by accident (tests/helpers/_subprocess_env.py).
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    monkeypatch.chdir(tmp_path)  # Ray puts the driver's directory on its workers' path
    # Ray turns a loopback address given to ray.init (these drivers', the command's) into the
    # machine's own IP address unless told this machine is a cluster of its own: keep every
    # driver on 127.0.0.1, where the nodes listen. (The command's children inherit it.)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)  # read at import
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # no report to ray.io from the head
    loopback = dict(node_ip_address="127.0.0.1")
    c = Cluster(
        initialize_head=True,
        head_node_args=dict(num_cpus=0, include_dashboard=False, **loopback),
    )
    try:
        learner_node = c.add_node(num_cpus=3, resources={"learner": 1}, **loopback)
        actor_node = c.add_node(num_cpus=2, resources={"actor_node": 1}, **loopback)
        c.wait_for_nodes()
        ray.init(address=c.address, namespace="memoire", log_to_driver=False)
        yield c, learner_node, actor_node
    finally:
        ray.shutdown()
        c.shutdown()


def test_nodes_lost_mid_run(cluster, tmp_path):
    from memoire.experiments import ray_launcher

    c, learner_node, actor_node = cluster
    base = str(tmp_path)
    run = os.path.join(base, "setting_0", "run_0")
    ckpt = os.path.join(run, "checkpoints", "sentinel_checkpoint_complete.{}")
    cmd = train_command(
        base,
        # Long enough (2 x 4,000 steps) that the run cannot end before the test's steps
        # however loaded the machine is: the node loss must come mid-run.
        "Runner.num_iterations = 2",
        "Runner.training_steps = 4000",
        "RayConfig.learner_resources = {'learner': 1}",
        "RayConfig.curve = 'on'",
        "DistributedConfig.peer_timeout = 3.0",
        "DistributedConfig.keepalive = 0.5",
        launcher="ray",
        ray_address=c.address,
    )
    import ray
    import zmq

    # 1. Placement: the learner on the node with 'learner', both actors apart from it (the
    # head has no CPU: on the actor node).
    out_path = tmp_path / "first.out"
    proc = subprocess.Popen(
        cmd, cwd=base, stdout=open(out_path, "w"), stderr=subprocess.STDOUT, env=subprocess_env()
    )
    ctx = zmq.Context()
    try:
        learner = wait_until(
            lambda: _named(ray_launcher.learner_name(run)), "the learner", timeout=150
        )
        assert (
            wait_until(lambda: _call(learner, "node"), "learner node", timeout=150)
            == learner_node.node_id
        )
        actors = [
            wait_until(
                lambda i=i: _named(ray_launcher.actor_name(run, i)), f"actor {i}", timeout=150
            )
            for i in range(2)
        ]
        for a in actors:
            wait_until(
                lambda a=a: (_call(a, "chunks_sent", 0) or 0) >= 1,
                "chunks from an actor",
                timeout=300,
            )
            assert _call(a, "node") == actor_node.node_id

        # 2. The actors' node is lost (its raylet and every process on it): Ray restarts both
        # actors on the node left with room (the learner's), and they stream again.
        pids = [_call(a, "pid") for a in actors]
        c.remove_node(actor_node)
        # Meanwhile a plain socket to the learner's experience port is refused (the run uses
        # CURVE keys) and counted.
        endpoint = ray.get(learner.endpoints.remote())["experience"]
        plain = ctx.socket(zmq.PUSH)
        plain.linger = 0
        plain.connect(endpoint)
        plain.send(b"not a chunk", zmq.NOBLOCK)
        wait_until(
            lambda: (_call(learner, "refused", 0) or 0) >= 1, "a refused connection", timeout=60
        )
        plain.close(0)
        # (The run may end meanwhile: restarted actors stream fast. Where they ran and that
        # they streamed is then read from the command's lines below.)
        for a, pid in zip(actors, pids):
            wait_until(
                lambda a=a, pid=pid: _call(a, "pid", pid) != pid or proc.poll() is not None,
                "restarted actor",
                timeout=150,
            )
            wait_until(
                lambda a=a: (_call(a, "chunks_sent", 0) or 0) >= 1 or proc.poll() is not None,
                "chunks again",
                timeout=150,
            )
        proc.wait(timeout=300)
    finally:
        ctx.term()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = out_path.read_text()
    assert proc.returncode == 0, out[-3000:]
    assert "CURVE keys of the run" in out
    # What Ray did, one line each, and counted in the learner's closing line: both actors lost
    # with their node and restarted on the learner's.
    # (Ray may see the actors' processes die before it sees their node die: either cause.)
    said = "INFO memoire.experiments.ray_launcher: ray: "
    node = re.escape(f"({learner_node.node_id[:8]})")  # the node left with room
    for i in range(2):
        lost = rf"^{re.escape(said)}actor {i} lost \((its node was lost|its process died)\); "
        lost += r"Ray restarts it \(restart 1 of 3\)$"
        restarted = rf"^{re.escape(said)}actor {i} restarted on \S+ {node}$"
        both = rf"^{re.escape(said)}actor {i} lost and restarted on \S+ {node}$"
        assert (re.search(lost, out, re.M) and re.search(restarted, out, re.M)) or re.search(
            both, out, re.M
        ), out[-3000:]
    closing = [line for line in out.splitlines() if "experience: " in line]
    assert closing and closing[-1].endswith("; Ray actors: 2 of 2 placed, 2 lost, 2 restarted")
    assert os.path.exists(ckpt.format(1))
    # Only whole episodes stored: every stored episode of L steps is L - 1 transitions of
    # Dopamine's JAX buffer (update horizon 1), recorded once; what the lost node's actors
    # had unfinished was never stored.
    train = [r for r in _rows(os.path.join(run, "episodes.csv")) if r["phase"] == "train"]
    replay = _rows(os.path.join(run, "replay.csv"))
    assert int(replay[-1]["add_count"]) == sum(int(r["length"]) - 1 for r in train)

    # 3. One more iteration; the learner's node is lost during it: exit 1, checkpoint 1 left.
    again = cmd + ["--gin_bindings", "Runner.num_iterations = 3"]
    out_path = tmp_path / "second.out"
    proc = subprocess.Popen(
        again, cwd=base, stdout=open(out_path, "w"), stderr=subprocess.STDOUT, env=subprocess_env()
    )
    try:
        learner = wait_until(
            lambda: _named(ray_launcher.learner_name(run)), "the learner", timeout=150
        )
        actor = wait_until(lambda: _named(ray_launcher.actor_name(run, 0)), "an actor", timeout=150)
        wait_until(
            lambda: (_call(actor, "chunks_sent", 0) or 0) >= 1, "chunks from an actor", timeout=300
        )
        c.remove_node(learner_node)  # the learner is in iteration 2 (it took that chunk)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = out_path.read_text()
    assert proc.returncode == 1, out[-3000:]
    assert "run the same command again to resume" in out
    assert os.path.exists(ckpt.format(1)) and not os.path.exists(ckpt.format(2))

    # 4. A new node with 'learner' joins; the command run again resumes after checkpoint 1
    # (with a shorter last iteration: nothing races it any more).
    written = os.stat(ckpt.format(1)).st_mtime_ns
    c.add_node(num_cpus=3, resources={"learner": 1}, node_ip_address="127.0.0.1")
    c.wait_for_nodes()
    done = subprocess.run(
        again + ["--gin_bindings", "Runner.training_steps = 300"],
        cwd=base,
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert os.stat(ckpt.format(1)).st_mtime_ns == written
    assert os.path.exists(ckpt.format(2))
    assert [r["iteration"] for r in _rows(os.path.join(run, "replay.csv"))] == ["0", "1", "2"]
