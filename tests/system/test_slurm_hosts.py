"""``memoire train --launcher slurm`` on a SLURM cluster of two hosts (tests/helpers/_slurm_hosts.py:
network namespaces joined by a 100 Mbit/s link, slurmctld and a slurmd on node1, a slurmd on
node2), submitted with the README's command for several nodes as pasted there.

The learner (task 0) runs alone on node1 and binds its node's address (SlurmConfig.learner_host
'auto': the NodeAddr slurm.conf gives, a name no resolver knows), with the run's CURVE keys;
both actors run on node2 and their episodes cross the link. Then node2 is lost (its slurmd,
step daemon and actors killed at once): the learner says so in one line and exits, SLURM marks
the node down and requeues the job, and once node2's slurmd is back the same job resumes from
the last checkpoint with actors on node2 again. Through all of it every stored episode is
stored once: the replay memory's add count at each checkpoint is the transitions of exactly
the episodes episodes.csv records up to it.

Root only, with SLURM installed (skipped elsewhere, saying why); slow (a real Dopamine learner
and actors, two runs of one job).
"""

import csv
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from _slurm_hosts import CRED_EXPIRE_S, SLURMD_TIMEOUT_S, SlurmHosts, unavailable
from _subprocess_env import subprocess_env
from _tiny_run import TINY
from _waiting import wait_until

pytestmark = [pytest.mark.dopamine, pytest.mark.slow]

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
README = os.path.join(ROOT, "README.md")
RECIPE_MARKER = "tests/system/test_slurm_hosts.py"  # named in the readme-test line of the recipe
JOB_S = 300  # a job's run on a loaded 2-core machine reaches each waited-for state within this
# What the test adds to the README's command: TINY's short iterations, many of them (the run
# is mid-way when the node goes), and a learner that notices gone actors within seconds.
BINDINGS = TINY + (
    "Runner.num_iterations = 1000",
    "DistributedConfig.peer_timeout = 3.0",
    "DistributedConfig.keepalive = 0.5",
)


def readme_recipe() -> list:
    """argv of the README's several-node command (the block after the readme-test line naming
    this file), ``memoire`` being this interpreter, with BINDINGS appended."""
    lines = open(README).read().splitlines()
    start = next(i for i, line in enumerate(lines) if RECIPE_MARKER in line)
    assert lines[start + 1] == "```bash", lines[start + 1]
    end = lines.index("```", start + 2)
    words = shlex.split("\n".join(lines[start + 2 : end]).replace("\\\n", " "))
    assert words[:2] == ["memoire", "train"], words
    argv = [sys.executable, "-m", "memoire.cli", *words[1:]]
    for b in BINDINGS:
        argv += ["--gin_bindings", b]
    return argv


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with SlurmHosts(str(tmp_path_factory.mktemp("slurm-hosts")), rate=1e8) as c:
        yield c


def _rows(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _train_rows(run):
    return [r for r in _rows(os.path.join(run, "episodes.csv")) if r["phase"] == "train"]


def _checkpoints(run):
    folder = os.path.join(run, "checkpoints")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(
        int(n.rsplit(".", 1)[1]) for n in names if n.startswith("sentinel_checkpoint_complete.")
    )


def _memoire_tasks(cluster, node):
    """The memoire processes (Python ones: not srun, whose arguments name memoire too) on
    `node`."""
    out = subprocess.run(
        ["ip", "netns", "pids", cluster.hosts.netns[node]],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    found = 0
    for pid in out.split():
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue  # gone since the listing
        found += "python" in os.path.basename(argv[0].decode()) and b"memoire.cli" in argv
    return found


def _assert_stored_once(run):
    """Every iteration's replay add count is the transitions of the train episodes recorded up
    to it (an episode of L steps is L - 1 transitions of Dopamine's JAX buffer): none lost,
    none stored twice; and the train episodes are numbered 0..n-1, each once."""
    train = _train_rows(run)
    numbers = [int(r["episode"]) for r in train]
    assert numbers == list(range(len(numbers))), numbers
    replay = _rows(os.path.join(run, "replay.csv"))
    assert replay
    for row in replay:
        it = int(row["iteration"])
        expected = sum(int(r["length"]) - 1 for r in train if int(r["iteration"]) <= it)
        assert int(row["add_count"]) == expected, (it, row, len(train))


def test_actors_on_the_other_node_its_loss_and_the_requeued_job(cluster, tmp_path):
    folder = tmp_path / "user"
    folder.mkdir()
    os.symlink(os.path.join(ROOT, "configs"), folder / "configs")  # the README's paths
    run = str(folder / "runs" / "two_nodes" / "setting_0" / "run_0")
    out_file = os.path.join(run, "slurm", "{job}.out")
    env = subprocess_env(SLURM_CONF=cluster.conf)
    sub = cluster.run(readme_recipe(), timeout=120, env=env, cwd=str(folder))
    job = re.search(r"^JOB (\d+)$", sub.stdout, re.M).group(1)
    out_file = out_file.format(job=job)

    def said():
        text = open(out_file).read() if os.path.exists(out_file) else ""
        return text[-4000:] + "\n--- slurmctld:\n" + cluster.log("slurmctld")[-1500:]

    def job_ended():
        return cluster.job(job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED")

    # The learner alone on node1, both actors on node2, their episodes stored by the learner
    # after the first checkpoint: they crossed the link.
    wait_until(
        lambda: (
            (_checkpoints(run) and {r["actor"] for r in _train_rows(run)} == {"0", "1"})
            or job_ended()
        ),
        "a checkpoint and episodes of both actors",
        JOB_S,
    )
    assert not job_ended(), said()
    assert (_memoire_tasks(cluster, "node1"), _memoire_tasks(cluster, "node2")) == (1, 2)
    ends = json.load(open(os.path.join(run, "slurm", "endpoints.json")))
    learner = cluster.address("node1")
    assert ends["node"] == "node1" and ends["encrypted"] is True, ends
    assert ends["experience"].startswith(f"tcp://{learner}:"), ends
    sent = cluster.hosts.link_bytes("node2", "node1")["tx"]
    assert sent > 20_000, sent  # a few episodes of CartPole observations, and CURVE's frames
    _assert_stored_once(run)
    before = _checkpoints(run)[-1]

    # node2 lost: the learner says so in one line and exits; SLURM requeues the job.
    cluster.hosts.lose("node2")
    lost_line = "the learner stops: all 2 SLURM actor task(s) disconnected: their node(s) node2"
    # Requeued, it waits (PENDING) for two nodes: node2 is down until its slurmd is back.
    wait_until(
        lambda: (
            lost_line in said()
            and (cluster.job(job).get("Restarts"), cluster.job(job).get("JobState"))
            == ("1", "PENDING")
        ),
        "the learner's line and the job requeued",
        JOB_S + SLURMD_TIMEOUT_S,
    )
    assert said().count(lost_line) == 1, said()
    assert f"SLURM requeues job {job} when a node fails" in said()
    assert cluster.node_states()["node2"].startswith("down"), cluster.node_states()
    _assert_stored_once(run)
    last = _checkpoints(run)[-1]
    assert last >= before

    # node2 back: the same job starts again and resumes; its actors on node2 stream again.
    cluster.start_slurmd("node2")
    resumed = f"resuming {run} at iteration {last + 1}"
    wait_until(
        lambda: (
            (
                resumed in said()
                and {r["actor"] for r in _train_rows(run) if int(r["iteration"]) > last}
                == {"0", "1"}
                and _checkpoints(run)[-1] > last
            )
            or job_ended()
        ),
        "the requeued job resumed, with both actors",
        JOB_S + CRED_EXPIRE_S,
    )
    assert not job_ended(), said()
    assert (_memoire_tasks(cluster, "node1"), _memoire_tasks(cluster, "node2")) == (1, 2)
    cluster.run(["scancel", job])
    wait_until(job_ended, f"the end of job {job}", JOB_S)
    assert cluster.job(job)["JobState"] == "CANCELLED", said()
    assert "task 0 (learner) stopped by SIGTERM" in said(), said()
    _assert_stored_once(run)
