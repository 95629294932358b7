"""A buffer server (``memoire serve --buffer ...``) in a subprocess, for tests that need a real
server process. Every wait is bounded."""

import os
import selectors
import subprocess
import sys
import time

import pytest
from _subprocess_env import subprocess_env


class BufferServerProcess:
    """Starts ``memoire serve`` with `args` (``--buffer KIND ...``) in folder `cwd` (stderr to
    `log_path`) and reads its endpoint from the ``ENDPOINT`` line of its stdout within
    `timeout` seconds; fails the test if none comes. `module`: the entry run with ``-m``
    (``memoire.dopamine_compat.remote`` for the old entry, which takes ``--serve KIND``)."""

    def __init__(
        self, args, log_path, cwd=None, timeout=120.0, module=("memoire.cli", "serve"), **env
    ):
        cmd = [sys.executable, "-m", *module] + list(args)
        self.log_path = log_path
        # stderr to a file: a full pipe nobody reads would block the server.
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=subprocess_env(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", **env),
            cwd=str(cwd or os.path.dirname(log_path)),
        )
        self.endpoint = None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while self.endpoint is None and time.monotonic() < deadline:
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    break
                line = self.proc.stdout.readline()
                if not line:  # exited
                    break
                if line.startswith("ENDPOINT "):
                    self.endpoint = line.split()[1]
        finally:
            sel.close()
        if self.endpoint is None:
            self.stop()
            with open(log_path) as log:
                pytest.fail(f"server did not start: {log.read()[-3000:]}")
        assert self.endpoint.startswith("tcp://127.0.0.1:")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self.proc.stdout.close()
        self.log.close()
