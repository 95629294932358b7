"""`memoire serve`: starts, prints endpoints and counters, stops on SIGINT keeping its logfile."""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

from memoire import ReplayMemoryClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_serve_runs_and_stops_on_ctrl_c(tmp_path):
    log = tmp_path / "actors.log"
    env = dict(
        os.environ
    )  # the installed memoire (or the caller's PYTHONPATH), not the source tree
    cmd = [
        sys.executable,
        "-c",
        "import sys, memoire.commands.serve as s; sys.exit(s.main(sys.argv[1:]))",
        "--state_shape",
        "4",
        "--cache_size",
        "4",
        "--interval",
        "0.2",
        "--logfile",
        str(log),
        "--gin_binding",
        "serve_config.n_caches = 8",
    ]
    # cwd: `python -c` puts it first on sys.path, and the source tree has no extension built.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(tmp_path)
    )
    try:
        first = proc.stdout.readline()
        m = re.match(r"memoire serve: pub (\S+)  rep (\S+)  pull (\S+)", first)
        assert m, first
        pub, rep, pull = m.groups()
        with ReplayMemoryClient(pub, rep, pull, input_uuid=5, timeout=5) as c:
            assert c.rem.cache_size == 4
            c.rem.new_episode()
            for k in range(5):
                c.rem.add_entry(np.zeros(4, np.float32), k, 1.0, 0.5, 0.0)
            c.rem.close_episode()
            assert c.update_counter()["total_episodes"] == 1
            assert c.write_log("bye") == 0
            c.update_counter()
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert "inserts/s" in out and "memoire.commands.serve: stopped" in out
    assert log.read_text().endswith(",00000005,bye\n")
