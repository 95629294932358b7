"""`memoire serve`: starts, prints endpoints and counters, stops on SIGINT keeping its logfile."""

import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
from _waiting import wait_until

from memoire import ReplayMemoryClient

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))


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
        # Its live line (every 0.2 s) says what it took; then Ctrl-C.
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")))
        reader.start()
        wait_until(lambda: any("inserts/s" in x for x in lines), "a live line from the server")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        reader.join(20)
        out = "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert "memoire.commands.serve: stopped" in out
    assert log.read_text().endswith(",00000005,bye\n")


def test_live_line_shows_what_a_central_server_stores():
    """The live line counts the episodes actors streamed into the server's memory (central
    mode), not only those reported by update_counter (cache mode)."""
    import memoire
    from memoire.commands import serve

    srv = memoire.ReplayMemoryServer(
        np.zeros([4], np.float32),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([0], np.uint8),
        1000,
        "tcp://127.0.0.1:*",
        4,
    )
    try:
        ep = srv.start("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        before = srv.stats()
        with ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"], mode="central", timeout=5) as c:
            for _ in range(3):
                c.new_episode()
                for k in range(7):
                    c.add_entry(np.zeros(4, np.float32), k, 1.0, 0.5, 0.0)
                c.close_episode()
            wait_until(
                lambda: srv.stats()["memory_episodes"] >= 3, "the server to store 3 episodes"
            )
        now = srv.stats()
    finally:
        srv.close()
    figures = serve.counter_scalars(now, before, 1.0, int(srv.rem.cache_size), None)
    line = serve.live_line(now, figures)
    assert "stored 21 entries in 3 episodes" in line, line
    assert "episodes reported 0" in line, line
    assert figures["replay/episodes"] == 3
