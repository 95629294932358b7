"""The Ray launcher on a local Ray cluster (loopback, one per module): a distributed CartPole
DQN whose Ray-placed actors and learner are killed and come back, and a sweep through Ray
that leaves the local launcher's records. Without Ray, one line says what to install."""

import json
import logging
import os
import re
import subprocess
import sys
import types

import pytest
from _ray_probe import _call, _named, _rows
from _subprocess_env import subprocess_env
from _tiny_run import DIST_GIN, train_command
from _waiting import wait_until

from memoire.commands import sweep as sweep_command
from memoire.experiments import sweep as sw

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray cluster on loopback for this module; yields its address."""
    import ray

    # Ray puts the driver's working directory first on its workers' sys.path: started from the
    # checkout, they would import the source tree's memoire/, which has no extension when
    # memoire is installed.
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("ray_driver"))
    try:
        ray.init(
            num_cpus=4,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            namespace="memoire",
            log_to_driver=False,
        )
    finally:
        os.chdir(here)
    try:
        # Ray's servers listen on every interface; the tests reach them through loopback.
        yield "127.0.0.1:" + ray.get_runtime_context().gcs_address.rsplit(":", 1)[1]
    finally:
        ray.shutdown()


@pytest.mark.dopamine
@pytest.mark.ray
def test_ray_run_survives_killed_actors_and_resumes_after_the_learner_dies(cluster, tmp_path):
    from memoire.experiments import ray_launcher

    base = str(tmp_path)
    run = os.path.join(base, "setting_0", "run_0")
    # Iterations long enough (2,000 steps) that the first actors cannot finish iteration 0
    # before the test kills them, and the learner cannot finish iteration 1 before its kill,
    # however slow the machine is between the test's steps.
    cmd = train_command(
        base,
        "Runner.num_iterations = 2",
        "Runner.training_steps = 2000",
        launcher="ray",
        ray_address=cluster,
    )

    # 1. Both actors are placed and stream; then both processes are killed, so the run can
    # only go on if Ray restarts them and they rejoin the learner.
    out_path = tmp_path / "first.out"  # a file, not a pipe nobody reads while we wait
    proc = subprocess.Popen(
        cmd, cwd=base, stdout=open(out_path, "w"), stderr=subprocess.STDOUT, env=subprocess_env()
    )
    try:
        actors = [
            wait_until(
                lambda i=i: _named(ray_launcher.actor_name(run, i)), f"Ray actor {i}", timeout=150
            )
            for i in range(2)
        ]
        for a in actors:
            wait_until(
                lambda a=a: (_call(a, "chunks_sent", 0) or 0) >= 2,
                "chunks from an actor",
                timeout=300,
            )  # the learner starts first (TF, JAX)
        # Chunks counted as sent may still sit in a killed process's send queue: wait until the
        # learner has stored an episode of each actor, so iteration 0 holds both.
        episodes_csv = os.path.join(run, "episodes.csv")
        wait_until(
            lambda: (
                {r["actor"] for r in _rows(episodes_csv) if r["phase"] == "train"} >= {"0", "1"}
            ),
            "an episode stored from each actor",
            timeout=150,
        )
        import ray

        pids = []
        for a in actors:
            pids.append(_call(a, "pid"))
            ray.kill(a, no_restart=False)  # the process dies; Ray restarts it
        for a, pid in zip(actors, pids):
            wait_until(
                lambda a=a, pid=pid: _call(a, "pid", pid) != pid, "restarted actor", timeout=150
            )
        # The new processes rejoin: each streams chunks again (a counter of the
        # new process, which starts at 0), and the run goes on to its first checkpoint.
        for a in actors:
            wait_until(
                lambda a=a: (_call(a, "chunks_sent", 0) or 0) >= 2,
                "chunks from a restarted actor",
                timeout=150,
            )
        ckpt0 = os.path.join(run, "checkpoints", "sentinel_checkpoint_complete.0")
        wait_until(
            lambda: os.path.exists(ckpt0) or proc.poll() is not None, "checkpoint 0", timeout=300
        )
        assert proc.poll() is None and os.path.exists(ckpt0)
        # Iteration 0's records, as its checkpoint left them (both actors, unless one was slow
        # enough to start that the other filled the iteration alone).
        iteration0 = [r for r in _rows(episodes_csv) if r["iteration"] == "0"]
        # 2. The learner's process dies during iteration 1: the command fails and says how to
        # go on.
        ray.kill(_named(ray_launcher.learner_name(run)))
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = out_path.read_text()
    assert proc.returncode == 1, out[-3000:]
    assert "run the same command again to resume" in out
    assert "learner with 2 Ray actor(s) (experience tcp://127.0.0.1:" in out
    assert "(raylet)" not in out and "(pid=" not in out  # Ray's own notices: at debug only
    # What Ray did, one line each: both actors placed, each lost and restarted (a loss and its
    # restart that fall between two of the driver's looks are one line).
    said = "INFO memoire.experiments.ray_launcher: ray: "
    assert f"{said}2 of 2 actors placed" in out.splitlines()
    for i in range(2):
        lost = f"{said}actor {i} lost (its process died); Ray restarts it (restart 1 of 3)"
        restarted = re.search(rf"^{re.escape(said)}actor {i} restarted on \S+ \(\w+\)$", out, re.M)
        both = re.search(rf"^{re.escape(said)}actor {i} lost and restarted on \S+", out, re.M)
        assert (lost in out.splitlines() and restarted) or both, out[-3000:]

    # 3. The same command again resumes after checkpoint 0 and finishes. (Proved by the files:
    # a run from scratch would write checkpoint 0 again. The learner's "resuming" log line is
    # printed by Ray's log forwarding, which may drop a worker's first lines.)
    ckpt0_written = os.stat(ckpt0).st_mtime_ns
    again = subprocess.run(
        cmd, cwd=base, capture_output=True, text=True, timeout=300, env=subprocess_env()
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert os.stat(ckpt0).st_mtime_ns == ckpt0_written
    assert os.path.exists(os.path.join(run, "checkpoints", "sentinel_checkpoint_complete.1"))
    rows = _rows(os.path.join(run, "episodes.csv"))
    train = [r for r in rows if r["phase"] == "train"]
    assert {r["actor"] for r in rows if r["phase"] == "eval"} == {"-1"}
    assert [r for r in rows if r["iteration"] == "0"] == iteration0  # kept as they were
    assert {r["actor"] for r in train} == {"0", "1"}
    replay = _rows(os.path.join(run, "replay.csv"))
    assert [r["iteration"] for r in replay] == ["0", "1"]  # the interrupted one was dropped
    for it, rec in enumerate(replay):
        episodes = [r for r in train if int(r["iteration"]) <= it]
        assert sum(int(r["length"]) for r in train if r["iteration"] == str(it)) >= 300
        # Counts consistent: what killed processes left unfinished was never stored; every
        # stored episode of L steps is L - 1 transitions in Dopamine's JAX buffer (update
        # horizon 1), and is recorded once.
        assert int(rec["add_count"]) == sum(int(r["length"]) - 1 for r in episodes)
    assert replay[0]["memory"] == "memoire.dopamine_compat.jax_replay_buffer.ReplayBuffer"


# A stand-in for `memoire train --sweep S --base_dir D --index N`: writes the records a launch
# writes before training (setting.json, as train.prepare does) and prints; odd indices fail.
_CHILD = """
import sys
from memoire.experiments import sweep as sw
path, base, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
sweep = sw.load_sweep(path)
s, r = sweep.locate(index)
sw.write_setting_record(sw.run_dir(base, s, r), index=index, setting=s, run=r,
                        seed=sw.seed_for_run(r), bindings=sweep.bindings(s),
                        gin_files=sweep.gin_files, sweep_file=path)
print("child", index, s, r)
sys.exit(3 * (index % 2))
"""


def _tree(base):
    """{relative path: content} of a sweep's base_dir, setting.json without its clock."""
    out = {}
    for d, _, files in os.walk(base):
        for f in files:
            path = os.path.join(d, f)
            text = open(path).read()
            if f == sw.SETTING_FILE:
                rec = json.loads(text)
                rec.pop("written_at")
                text = rec
            out[os.path.relpath(path, base)] = text
    return out


@pytest.mark.ray
def test_a_sweep_through_ray_leaves_the_local_launchers_records(
    cluster, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(
        sw,
        "_train_command",
        lambda args, index: [sys.executable, "-c", _CHILD, args.sweep, args.base_dir, str(index)],
    )
    (tmp_path / "s.gin").write_text("A.x = [1, 2]\nB.y = ['u', 'v']\n")
    # The children run `python -c` in this directory: not the checkout, whose memoire/ has no
    # extension when memoire is installed.
    monkeypatch.chdir(tmp_path)
    records, messages = {}, {}
    for launcher in ("local", "ray"):
        base = tmp_path / launcher
        args = types.SimpleNamespace(
            sweep=str(tmp_path / "s.gin"),
            base_dir=str(base),
            indices="0-3",
            parallel=2,
            gin_files=[],
            gin_bindings=[],
            launcher=launcher,
            ray_address=cluster,
            cpus=1,
            gpus=0,
        )
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="memoire.experiments.sweep"):
            assert sw.run_indices(args) == 2  # indices 1 and 3 fail, under either launcher
        records[launcher] = _tree(str(base))
        messages[launcher] = {
            r.getMessage()
            for r in caplog.records
            if "index" in r.getMessage() or "succeeded" in r.getMessage()
        }
    assert records["ray"] == records["local"]
    assert len(records["ray"]) == 8  # setting.json and train.log of each of the 4 indices
    assert records["ray"][os.path.join("setting_1", "run_0", "train.log")] == "child 1 1 0\n"
    for launcher in ("local", "ray"):
        assert {
            "index 0 done",
            "index 2 done",
            "index 1 FAILED (exit 3)",
            "index 3 FAILED (exit 3)",
            "2/4 succeeded",
        } <= messages[launcher]
    # Resumable: run again, every index runs again into the same directory (memoire train
    # resumes from its checkpoints), and the records stay where they were.
    args.indices = "0"
    assert sw.run_indices(args) == 0
    log_0 = tmp_path / "ray" / "setting_0" / "run_0" / "train.log"
    assert log_0.read_text() == "child 0 0 0\nchild 0 0 0\n"


def test_without_ray_one_line_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    (tmp_path / "s.gin").write_text("A.x = [1, 2]\n")
    code = sweep_command.main(
        [
            "run",
            str(tmp_path / "s.gin"),
            "--base_dir",
            str(tmp_path / "runs"),
            "--indices",
            "0-1",
            "--launcher",
            "ray",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err == "memoire sweep: error: the Ray launcher needs Ray: pip install memoire[ray]\n"
    assert not (tmp_path / "runs").exists()  # nothing written


@pytest.mark.dopamine
@pytest.mark.ray
def test_a_resource_no_node_has_fails_within_seconds_with_its_fix(cluster, tmp_path):
    """RayConfig.learner_resources naming a resource no node of the cluster has: one line
    naming it and the fix, status 2, nothing written (Ray would wait for ever)."""
    out = subprocess.run(
        train_command(
            "runs",
            "RayConfig.learner_resources = {'learner': 1}",
            launcher="ray",
            ray_address=cluster,
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines() == [
        "memoire train: error: the learner asks Ray for 1 CPU, 1 learner "
        "(RayConfig.learner_resources), and no node of the cluster has 'learner': start such a "
        """node (ray start --address HEAD:PORT --resources '{"learner": 1}'), or change """
        "RayConfig.learner_resources"
    ]
    assert out.stdout == "" and not (tmp_path / "runs").exists()


# `memoire train` where no Ray cluster can be found by `auto`: Ray's lookup of the clusters of
# this machine (other users' clusters included) finds none, and its temp folder is the test's.
_NO_CLUSTER = (
    "import functools, sys, ray._private.services as s; "
    "s.find_gcs_addresses = functools.lru_cache(lambda: []); "
    "from memoire.cli import main; sys.exit(main())"
)


@pytest.mark.dopamine
@pytest.mark.ray
@pytest.mark.parametrize("address", ["auto", "nothing listening"])
def test_no_ray_cluster_is_one_line(tmp_path, address):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        given = "auto" if address == "auto" else f"127.0.0.1:{port}"
        out = subprocess.run(
            [sys.executable, "-c", _NO_CLUSTER, "train", "--gin_files", DIST_GIN]
            + ["--base_dir", "runs", "--launcher", "ray", "--ray_address", given],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env=subprocess_env(RAY_TMPDIR=str(tmp_path), RAY_ADDRESS=""),
        )
    expect = {
        "auto": "--ray_address auto: no Ray cluster runs on this machine; start one (ray start "
        "--head), give the head's HOST:PORT, or leave --ray_address out for a cluster of this "
        "command's own",
        "nothing listening": f"--ray_address 127.0.0.1:{port}: nothing listens there; start the "
        f"head there (ray start --head --port {port}), or give the address its `ray start "
        "--head` printed",
    }[address]
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines() == [f"memoire train: error: {expect}"]
    assert out.stdout == "" and not (tmp_path / "runs").exists()


LOCAL_GIN = os.path.join(ROOT, "configs", "dqn_cartpole_jax_local.gin")
# `memoire train` in a fresh interpreter where `import ray` fails (as without the extra).
_NO_RAY = "import sys; sys.modules['ray'] = None; from memoire.cli import main; sys.exit(main())"


@pytest.mark.dopamine
@pytest.mark.parametrize(
    "gin, ray_missing, expect",
    [
        (
            LOCAL_GIN,
            False,
            "DistributedConfig.launcher = 'ray' needs DistributedConfig.num_actors >= 1",
        ),
        (DIST_GIN, True, "the Ray launcher needs Ray: pip install memoire[ray]"),
    ],
)
def test_train_launcher_mistakes_are_one_line_and_write_nothing(tmp_path, gin, ray_missing, expect):
    cmd = ["-c", _NO_RAY, "train"] if ray_missing else ["-m", "memoire.cli", "train"]
    out = subprocess.run(
        [sys.executable, *cmd, "--gin_files", gin, "--base_dir", "runs", "--launcher", "ray"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=subprocess_env(),
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"memoire train: error: {expect}"
    assert not (tmp_path / "runs").exists()
