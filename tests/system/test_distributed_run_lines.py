"""What a user sees when a distributed run starts, finishes, is stopped or misses a peer: one
line per event, the exact lines asserted, and the exit status.

- A learner whose replay server is not running says once what it waits for, then fails within
  seconds with one line (status 2, nothing written).
- Each actor says when it has connected; the learner's closing line is labelled figures.
- A finished distributed run, run again, starts no actor.
- SIGTERM stops a learner cleanly: its actors stopped, one "stopped" line, status 143, and no
  semaphore left for multiprocessing's resource tracker to complain about.
"""

import os
import re
import signal
import subprocess
import sys

import pytest
from _subprocess_env import subprocess_env
from _tiny_run import DIST_GIN, train_command
from _waiting import wait_until

pytestmark = pytest.mark.dopamine

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
REMOTE_GIN = os.path.join(ROOT, "configs", "dqn_cartpole_jax_remote.gin")


def _lines(text):
    return [line for line in text.splitlines() if line.strip()]


def test_a_learner_without_its_replay_server_fails_within_seconds(tmp_path):
    import socket

    from memoire.experiments.train import SERVER_WAIT_S

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        endpoint = "tcp://127.0.0.1:%d" % s.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "memoire.cli", "train", "--gin_files", REMOTE_GIN]
            + ["--base_dir", "runs", "--gin_bindings"]
            + [f"MemoireJaxDQNAgent.replay_endpoint = '{endpoint}'"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env=subprocess_env(),
        )
    assert out.returncode == 2, out.stderr[-3000:]
    assert _lines(out.stderr) == [
        f"INFO memoire.experiments.train: replay on the server at {endpoint} (buffer 'replay'); "
        f"waiting up to {SERVER_WAIT_S:g} s for it",
        f"memoire train: error: no replay server answers at {endpoint} (waited "
        f"{SERVER_WAIT_S:g} s): start it first (memoire serve --buffer KIND --gin_files F), or "
        "check MemoireJaxDQNAgent.replay_endpoint",
    ]
    assert out.stdout == ""
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_run_says_who_connected_sums_up_and_starts_nothing_once_finished(tmp_path):
    cmd = train_command(tmp_path / "runs", gin_file=DIST_GIN)
    first = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=subprocess_env()
    )
    assert first.returncode == 0, first.stderr[-3000:]
    lines = _lines(first.stderr)
    connected = sorted(line for line in lines if " connected to the learner at " in line)
    experience = re.search(r"experience (tcp://\S+|ipc://\S+),", first.stderr).group(1)
    assert connected == [
        f"INFO memoire.experiments.distributed: actor {i} connected to the learner at {experience}"
        for i in range(2)
    ]
    closing = lines[-1]
    assert re.fullmatch(
        r"INFO memoire\.experiments\.distributed: experience: \d+ episodes stored \(rows = "
        r"actor steps in each\); \d+ chunks and \d+ keepalives received, 0 rejected",
        closing,
    ), closing
    # Run again: the run is finished; one line says so, and no actor starts.
    again = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=subprocess_env()
    )
    assert again.returncode == 0, again.stderr[-3000:]
    run = os.path.join(str(tmp_path / "runs"), "setting_0", "run_0")
    assert _lines(again.stderr) == [
        f"INFO memoire.experiments.train: {run}: all its iterations are done; nothing to "
        "train, no actor started. Delete the folder, or choose another --base_dir, to start over"
    ]
    assert again.stdout == ""


@pytest.mark.slow
def test_sigterm_stops_a_learner_and_its_actors_cleanly(tmp_path):
    # Iterations long enough that the signal comes mid-run however slow the machine.
    cmd = train_command(
        tmp_path / "runs", "Runner.num_iterations = 2", "Runner.training_steps = 5000"
    )
    err_path = tmp_path / "err.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=err, text=True, env=subprocess_env()
        )
    try:
        wait_until(
            lambda: (
                err_path.read_text().count(" connected to the learner at ") == 2
                and "learner with 2 actor(s)" in err_path.read_text()
            ),
            "the learner and its 2 actors",
            timeout=240,
        )
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = err_path.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    run = os.path.join(str(tmp_path / "runs"), "setting_0", "run_0")
    assert _lines(err)[-1] == (
        "INFO memoire.experiments.train: stopped by SIGTERM; the same command resumes from the "
        f"last checkpoint in {run}"
    )
    assert "leaked semaphore" not in err and "Traceback" not in err, err[-3000:]
    assert out == ""
