"""``memoire train --launcher slurm``: a distributed run as one SLURM job.

The script the command writes and the tasks' rendezvous (the endpoints file) are checked without
SLURM; the run itself is submitted for real to a one-node cluster on this machine
(scripts/slurm_local.sh, started once for the session), where ``scancel`` in the middle must
leave a run that the same command, submitted again, resumes and finishes. Where SLURM is not
installed (``scripts/slurm_local.sh install`` installs it, as CI does) those tests skip, saying
so.
"""

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import gin
import pytest
from _sbatch import _directives
from _subprocess_env import run_script, subprocess_env
from _tiny_run import DIST_GIN, train_command
from _waiting import wait_until

from memoire.experiments import slurm_launcher

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SLURM_LOCAL = os.path.join(ROOT, "scripts", "slurm_local.sh")
JOB_END_S = 300  # a tiny job of three tasks on a loaded 2-core machine ends well within this


# ---------------------------------------------------------------------------------------------
# Without SLURM: the script, the rendezvous.


@pytest.mark.dopamine
def test_script_runs_the_same_command_as_learner_and_actor_tasks(tmp_path, capsys):
    from memoire.commands import train as train_command_module

    base = tmp_path / "runs"
    argv = ["--base_dir", str(base), "--gin_files", DIST_GIN, "--launcher", "slurm"]
    bindings = [
        "DistributedConfig.num_actors = 3",
        "SlurmConfig.submit = False",
        "SlurmConfig.cpus_per_task = 2",
        "SlurmConfig.time = '1:00:00'",
        "SlurmConfig.options = ['--mem=4G', '--account=rl']",
        "Runner.num_iterations = 'two words'",  # a value with a space survives the quoting
    ]
    for b in bindings:
        argv += ["--gin_bindings", b]
    assert train_command_module.main(argv) == 0
    script = capsys.readouterr().out.strip()
    run = base / "setting_0" / "run_0"
    assert script == str(run / "slurm" / "train.sbatch")
    text = open(script).read()
    assert _directives(text) == {
        "--job-name": "memoire-train",
        "--ntasks": "4",  # the learner and 3 actors
        "--cpus-per-task": "2",
        "--chdir": os.getcwd(),
        "--output": f"{run}/slurm/%j.out",
        "--open-mode": "append",
        "--time": "1:00:00",
        "--mem": "4G",
        "--account": "rl",
    }
    srun = [line for line in text.splitlines() if line.startswith("exec srun ")]
    assert len(srun) == 1 and "export MEMOIRE_SLURM_TASK=1" in text
    words = shlex.split(srun[0])
    assert words[:5] == ["exec", "srun", "--ntasks=4", "--cpus-per-task=2", "--kill-on-bad-exit=0"]
    expected = [sys.executable, "-m", "memoire.cli", "train", "--base_dir", str(base)]
    expected += ["--index", "0", "--launcher", "slurm", "--gin_files", DIST_GIN]
    for b in bindings:
        expected += ["--gin_bindings", b]
    assert words[5:] == expected
    assert (run / "setting.json").exists()  # written once, by the submitting command


@pytest.mark.dopamine
@pytest.mark.parametrize(
    "binding, message",
    [
        ("DistributedConfig.num_actors = 0", "needs DistributedConfig.num_actors >= 1"),
        ("SlurmConfig.options = ['--mem=4G\\n#SBATCH --x']", "--name=value"),
        ("SlurmConfig.time = 'soon'", "time must look like"),
        ("SlurmConfig.cpus_per_task = 0", "cpus_per_task must be >= 1"),
    ],
)
def test_bad_slurm_settings_are_usage_errors_writing_nothing(tmp_path, capsys, binding, message):
    from memoire.commands import train as train_command_module

    base = tmp_path / "runs"
    argv = ["--base_dir", str(base), "--gin_files", DIST_GIN, "--launcher", "slurm"]
    argv += ["--gin_bindings", "SlurmConfig.submit = False", "--gin_bindings", binding]
    assert train_command_module.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not base.exists()


def test_actors_take_only_the_endpoints_of_their_own_job(tmp_path, monkeypatch):
    ends = {"experience": "tcp://127.0.0.1:5001", "params": "tcp://127.0.0.1:5002"}
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    path = slurm_launcher.write_endpoints(str(tmp_path), ends)
    assert path == str(tmp_path / "slurm" / "endpoints.json")
    assert slurm_launcher.read_endpoints(str(tmp_path), timeout=5) == dict(ends, encrypted=False)
    # The next job in the same run folder (submitted again to resume) waits for its learner.
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    with pytest.raises(TimeoutError, match=r"learner of job 42 .*endpoints.json after 0.3 s"):
        slurm_launcher.read_endpoints(str(tmp_path), timeout=0.3, poll=0.05)
    # A requeued job keeps its id: the restart count tells its runs apart.
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with pytest.raises(TimeoutError):
        slurm_launcher.read_endpoints(str(tmp_path), timeout=0.1, poll=0.05)
    # A half-written or foreign file is waited out, not taken.
    path_text = '{"job": "41", "restart": "1", "experience": '
    open(path, "w").write(path_text)
    with pytest.raises(TimeoutError):
        slurm_launcher.read_endpoints(str(tmp_path), timeout=0.1, poll=0.05)
    slurm_launcher.write_endpoints(str(tmp_path), dict(ends, encrypted=True))
    assert slurm_launcher.read_endpoints(str(tmp_path), timeout=5) == dict(ends, encrypted=True)


def test_sigterm_that_python_drops_inside_a_gc_callback_still_stops_the_task(tmp_path):
    # JAX registers a gc callback; a SIGTERM whose handler runs inside it raised Terminated
    # there, which Python prints and drops: a learner ran on after scancel (seen in CI).
    # Other exceptions raised where Python drops them are still printed as before.
    proc = run_script(
        """
        import gc, os, signal, time
        from memoire.experiments import slurm_launcher

        class Leaky:
            def __del__(self):
                raise ValueError("from __del__")

        slurm_launcher.catch_sigterm()
        Leaky()

        def in_gc(phase, info):
            if phase == "start":
                os.kill(os.getpid(), signal.SIGTERM)
                sum(range(1000))  # Python code: the handler runs here, inside the callback

        gc.callbacks.append(in_gc)
        try:
            gc.collect()
            gc.callbacks.remove(in_gc)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(0.01)
            print("ran on")
        except slurm_launcher.Terminated:
            print("stopped")
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: ignored, cleanup runs on
        print("OK")
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["stopped", "OK"], proc.stdout + proc.stderr[-2000:]
    assert "ValueError: from __del__" in proc.stderr


def test_learner_binds_loopback_on_a_one_node_job(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    assert slurm_launcher.learner_host() == "127.0.0.1"
    # Several nodes: the address the learner's node name resolves to (a name that is an
    # address resolves to itself, with no lookup), never a loopback one.
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURMD_NODENAME", "10.1.2.3")
    assert slurm_launcher.learner_host() == "10.1.2.3"
    monkeypatch.setenv("SLURMD_NODENAME", "localhost")
    with pytest.raises(ValueError, match="SlurmConfig.learner_host"):
        slurm_launcher.learner_host()
    assert slurm_launcher.learner_host("10.9.8.7") == "10.9.8.7"  # named: taken as it is


def _fake_scontrol(folder, monkeypatch, node_addr):
    """An ``scontrol`` first on PATH that knows nodes node1 (NodeAddr `node_addr`) and node2
    and expands ``node[1-2]``, as a cluster whose slurm.conf names nodes no resolver knows."""
    script = folder / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f'  "-o show node node1") echo "NodeName=node1 Arch=x86_64 NodeAddr={node_addr} '
        'NodeHostName=vm State=MIXED" ;;\n'
        '  "-o show job 7") echo "JobId=7 JobState=COMPLETING Restarts=1 BatchFlag=1" ;;\n'
        '  "show hostnames node[1-2]") printf "node1\\nnode2\\n" ;;\n'
        "  *) exit 1 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


def test_learner_binds_the_node_address_slurm_knows(tmp_path, monkeypatch):
    # Node names that resolve nowhere (the two-host test's cluster): 'auto' takes the
    # NodeAddr the controller has for the learner's node; it raised socket.gaierror before.
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    _fake_scontrol(tmp_path, monkeypatch, "10.231.1.1")
    assert slurm_launcher.learner_host() == "10.231.1.1"
    _fake_scontrol(tmp_path, monkeypatch, "127.0.1.1")
    with pytest.raises(ValueError, match="resolves to 127.0.1.1.*SlurmConfig.learner_host"):
        slurm_launcher.learner_host()
    # No NodeAddr from the controller and a name no resolver knows: said, with the fix.
    monkeypatch.setenv("SLURMD_NODENAME", "no-such-node.invalid")
    with pytest.raises(ValueError, match="no address that SLURM or the resolver knows"):
        slurm_launcher.learner_host()


def test_lost_actors_and_requeue_lines(tmp_path, monkeypatch):
    _fake_scontrol(tmp_path, monkeypatch, "10.231.1.1")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert slurm_launcher.job_nodes() == ["node1", "node2"]
    line = slurm_launcher._actors_lost(2)
    assert line.startswith("all 2 SLURM actor task(s) disconnected: their node(s) node2 lost")
    assert "SLURM requeues job 7" in line and "scancel 7" in line and "\n" not in line
    # One node: the actors were on the learner's own.
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node1")
    # SIGTERM's line tells a requeue (the controller counts a restart this run has not seen)
    # from a scancel.
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert slurm_launcher.requeued()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert not slurm_launcher.requeued()
    monkeypatch.setenv("SLURM_JOB_ID", "8")  # the controller does not answer for it
    assert not slurm_launcher.requeued()
    line = slurm_launcher._actors_lost(1)
    assert line.startswith("all 1 SLURM actor task(s) disconnected: killed or failed on this")
    assert "(node1)" in line and "requeue" not in line


@pytest.mark.dopamine
@pytest.mark.parametrize("insecure", [False, True])
def test_submission_hands_the_runs_keys_to_the_job_environment_only(
    tmp_path, capsys, monkeypatch, insecure
):
    """The submitting command makes the run's CURVE keys and gives them to sbatch in the
    environment it exports to the job: nothing in the run folder holds them, and the tasks
    read back working keys (the learner's authorizes exactly the actors' public key)."""
    from memoire.commands import train as train_command_module
    from memoire.experiments import slurm

    seen = {}

    def submit(path, env=None):
        seen["env"] = env
        return "77"

    monkeypatch.setattr(slurm, "submit", submit)
    base = tmp_path / "runs"
    argv = ["--base_dir", str(base), "--gin_files", DIST_GIN, "--launcher", "slurm"]
    argv += ["--insecure"] if insecure else []
    try:
        assert train_command_module.main(argv) == 0
    finally:
        gin.clear_config()  # --insecure bound RayConfig.curve too: no leak into other tests
    assert capsys.readouterr().out.splitlines()[-1] == "JOB 77"
    if insecure:
        assert seen["env"] is None or slurm_launcher.KEYS_ENV not in seen["env"]
        return
    text = seen["env"][slurm_launcher.KEYS_ENV]
    monkeypatch.setenv(slurm_launcher.KEYS_ENV, text)
    server, client = slurm_launcher.run_keys_from_env()
    assert server.authorized == (client.public,) and client.server_public == server.public
    assert len({server.public, server.secret, client.public, client.secret}) == 4
    for secret in (server.secret, client.secret):
        for folder, _, files in os.walk(base):
            for name in files:
                assert secret not in open(os.path.join(folder, name), "rb").read(), name
    # A job script submitted again by hand has no keys: its learner says what to do.
    monkeypatch.delenv(slurm_launcher.KEYS_ENV)
    with pytest.raises(ValueError, match="--insecure"):
        slurm_launcher.run_keys_from_env()
    monkeypatch.setenv(slurm_launcher.KEYS_ENV, "{not json")
    with pytest.raises(ValueError, match="malformed"):
        slurm_launcher.run_keys_from_env()


# ---------------------------------------------------------------------------------------------
# A real one-node SLURM cluster.


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """SLURM_CONF of a one-node cluster started for this session (stopped at its end)."""
    missing = [
        c for c in ("sbatch", "scancel", "slurmctld", "slurmd", "munged") if not shutil.which(c)
    ]
    if missing:
        pytest.skip(
            f"SLURM is not installed ({', '.join(missing)} not found): "
            "scripts/slurm_local.sh install (root, Debian's slurm-wlm and munge)"
        )
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster runs its daemons as root")
    env = dict(os.environ, SLURM_LOCAL_DIR=str(tmp_path_factory.mktemp("slurm-local")))
    out = subprocess.run(
        [SLURM_LOCAL, "start"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    conf = re.search(r"export SLURM_CONF=(\S+)", out.stdout).group(1)
    try:
        yield conf
    finally:
        subprocess.run([SLURM_LOCAL, "stop"], env=env, timeout=60)


def _slurm_env(conf):
    return subprocess_env(SLURM_CONF=conf)


def _job_state(conf, job):
    """(JobState, ExitCode) as scontrol reports them ('' while it does not know the job)."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job],
        env=_slurm_env(conf),
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
    return fields.get("JobState", ""), fields.get("ExitCode", "")


def _wait_job_end(conf, job):
    def ended():
        state, code = _job_state(conf, job)
        return (state, code) if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None

    return wait_until(ended, f"the end of job {job}", timeout=JOB_END_S)


def _submit(conf, base, *bindings):
    out = subprocess.run(
        train_command(base, *bindings, launcher="slurm"),
        env=_slurm_env(conf),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=base,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return re.search(r"^JOB (\d+)$", out.stdout, re.M).group(1)


def _iterations_done(run):
    ckpt = os.path.join(run, "checkpoints")
    names = os.listdir(ckpt) if os.path.isdir(ckpt) else []
    return sorted(
        int(n.rsplit(".", 1)[1]) for n in names if n.startswith("sentinel_checkpoint_complete.")
    )


def _train_actors(run, iteration=None):
    """The actors (as episodes.csv numbers them) of the stored training episodes."""
    path = os.path.join(run, "episodes.csv")
    if not os.path.exists(path):
        return set()
    rows = list(csv.DictReader(open(path)))
    return {
        r["actor"]
        for r in rows
        if r["phase"] == "train" and (iteration is None or int(r["iteration"]) == iteration)
    }


@pytest.mark.dopamine
@pytest.mark.slow
def test_scancel_stops_a_job_that_the_same_command_resumes_and_finishes(slurm_cluster, tmp_path):
    conf = slurm_cluster
    base = str(tmp_path)
    run = os.path.join(base, "setting_0", "run_0")
    # Far more iterations than the job runs before it is cancelled.
    # With keys although on loopback: the tasks get them through the job's environment.
    keys_on = "SlurmConfig.curve = 'on'"
    job = _submit(conf, base, "Runner.num_iterations = 1000", keys_on)
    wait_until(lambda: _iterations_done(run), "the first checkpoint", timeout=JOB_END_S)
    # Both actor tasks found the learner and streamed to it, through its CURVE keys.
    wait_until(
        lambda: _train_actors(run) == {"0", "1"}, "episodes of both actors", timeout=JOB_END_S
    )
    assert json.load(open(os.path.join(run, "slurm", "endpoints.json")))["encrypted"] is True
    subprocess.run(["scancel", job], env=_slurm_env(conf), check=True, timeout=30)
    state, _ = _wait_job_end(conf, job)
    assert state == "CANCELLED"
    said = open(os.path.join(run, "slurm", f"{job}.out")).read()
    # Every task took SIGTERM the clean way (its `finally` blocks ran), none was killed.
    assert said.count("stopped by SIGTERM") == 3, said[-3000:]
    for task in ("task 0 (learner)", "task 1 (actor 0)", "task 2 (actor 1)"):
        assert f"{task} stopped by SIGTERM" in said, said[-3000:]
    assert "learner with 2 SLURM actor task(s) (experience tcp://127.0.0.1:" in said
    done = _iterations_done(run)

    # The same command, submitted again (with an end in reach), resumes from the checkpoint.
    last = done[-1]
    job2 = _submit(conf, base, f"Runner.num_iterations = {last + 2}", keys_on)
    assert job2 != job
    state, code = _wait_job_end(conf, job2)
    said2 = open(os.path.join(run, "slurm", f"{job2}.out")).read()
    assert (state, code) == ("COMPLETED", "0:0"), said2[-3000:]
    assert f"resuming {run} at iteration {last + 1}" in said2
    assert _iterations_done(run)[-1] == last + 1
    assert _train_actors(run, last + 1) <= {"0", "1"} and _train_actors(run, last + 1)
