"""The server's checkpoints: on request (locally and remotely), on a period and on SIGTERM;
the newest few kept; the newest loadable one loaded at start. A `memoire serve` killed with
SIGKILL and restarted on the same folder serves the same memory: the same size, and the same
batches (the generator's state is in the checkpoint).

Loopback only, OS-picked ports, every wait bounded.
"""

import os
import re
import selectors
import signal
import subprocess
import sys

import numpy as np
import pytest
from _subprocess_env import subprocess_env
from _waiting import wait_until

from memoire import ReplayMemoryClient
from memoire.checkpoint_io import CheckpointError
from memoire.remote import RemoteMemory
from memoire.server import ReplayMemoryServer

SHAPE = (8, 8)


def _templates(shape=SHAPE):
    return (
        np.zeros(shape, np.uint8),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([0], np.uint8),
    )


def _stream(rep, pull, episodes, seed, stored, length=12):
    """Streams `episodes` episodes of `length` random frames as an actor in central mode, and
    waits until `stored()` is true (the server took them) before the actor goes."""
    rng = np.random.default_rng(seed)
    with ReplayMemoryClient(None, rep, pull, mode="central", chunk_size=5, timeout=5) as c:
        for _ in range(episodes):
            c.new_episode()
            for k in range(length):
                c.add_entry(
                    rng.integers(0, 255, SHAPE, dtype=np.uint8),
                    k % 3,
                    float(rng.random()),
                    0.5,
                    float(rng.random()),
                )
            c.close_episode(terminal=True)
        wait_until(stored, "the episodes stored", timeout=60)


def _ckpts(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".ckpt"))


def _same(a, b):
    for u, v in zip(tuple(a.prev) + tuple(a.next), tuple(b.prev) + tuple(b.next)):
        assert (u is None and v is None) or np.array_equal(u, v)
    for name in ("weight", "prob", "done", "id"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_checkpoint_on_request_keeps_the_newest_three_and_a_new_server_loads_it(tmp_path):
    folder = tmp_path / "ckpt"
    with ReplayMemoryServer(*_templates(), 500, None, seed=1, checkpoint_dir=str(folder)) as srv:
        assert srv.checkpoint_dir == str(folder) and srv.rem.size == 0  # nothing to load yet
        srv.rem.frame_stack = 2
        ep = srv.start()
        _stream(ep["rep"], ep["pull"], 10, 0, lambda: srv.wait_rows_in(120, timeout=0.5))
        with RemoteMemory(ep["rep"], timeout=20) as remote:
            names = [remote.checkpoint() for _ in range(5)]
        assert names == [f"memory-{k:012d}.ckpt" for k in range(1, 6)]
        assert _ckpts(folder) == names[2:]  # the newest 3
        srv.rem.seed(9)
        expected = [srv.sample(16) for _ in range(3)]
        size, weight = srv.rem.size, srv.rem.total_weight
    with ReplayMemoryServer(*_templates(), 500, None, checkpoint_dir=str(folder)) as again:
        assert again.rem.size == size == 120 and again.rem.total_weight == weight
        assert again.rem.frame_stack == 2
        again.rem.seed(9)
        for b in expected:
            _same(again.sample(16), b)
        again.checkpoint()
        assert _ckpts(folder) == [f"memory-{k:012d}.ckpt" for k in (4, 5, 6)]


def test_a_server_without_a_folder_refuses_checkpoints(tmp_path):
    with ReplayMemoryServer(*_templates(), 100, None) as srv:
        assert srv.checkpoint_dir is None
        with pytest.raises(RuntimeError, match="no checkpoint folder"):
            srv.checkpoint()
        ep = srv.start()
        with (
            RemoteMemory(ep["rep"]) as remote,
            pytest.raises(RuntimeError, match="no checkpoint folder"),
        ):
            remote.checkpoint()
    with pytest.raises(ValueError, match="needs a checkpoint_dir"):
        ReplayMemoryServer(*_templates(), 100, None, checkpoint_every=1.0)
    with pytest.raises(ValueError, match="seconds > 0"):
        ReplayMemoryServer(
            *_templates(), 100, None, checkpoint_dir=str(tmp_path), checkpoint_every=0
        )


def test_periodic_checkpoints_run_until_close(tmp_path):
    srv = ReplayMemoryServer(
        *_templates(), 100, None, checkpoint_dir=str(tmp_path), checkpoint_every=0.1
    )
    saver = srv._checkpoints._thread
    try:
        wait_until(
            lambda: _ckpts(tmp_path)[-1:] >= ["memory-000000000004.ckpt"], "4 saves", timeout=60
        )
    finally:
        srv.close()  # joins the saving thread: a save under way finishes, pruning included
    # The thread has ended, so what the folder holds now is final: no window to wait out.
    assert not saver.is_alive()
    after_close = _ckpts(tmp_path)
    newest = int(after_close[-1][len("memory-") : -len(".ckpt")])
    assert after_close == [f"memory-{k:012d}.ckpt" for k in range(newest - 2, newest + 1)]
    assert srv._checkpoints.saves == newest


def test_a_corrupt_newest_checkpoint_is_skipped_and_a_foreign_folder_refused(tmp_path):
    with ReplayMemoryServer(*_templates(), 300, None, checkpoint_dir=str(tmp_path)) as srv:
        srv.rem.new_episode()
        for k in range(7):
            srv.rem.add_entry(np.full(SHAPE, k, np.uint8), 0, 1.0, 0.5, 0.0)
        srv.rem.close_episode()
        srv.checkpoint()
        srv.rem.new_episode()
        srv.rem.add_entry(np.zeros(SHAPE, np.uint8), 0, 1.0, 0.5, 0.0)
        srv.rem.close_episode()
        newest = srv.checkpoint()
    data = bytearray(open(newest, "rb").read())
    data[-20] ^= 0xFF
    open(newest, "wb").write(bytes(data))
    # Leftover of a save cut short by a crash: removed, never loaded.
    (tmp_path / "memory-000000000003.ckpt.tmp-0123456789ab").write_bytes(b"partial")
    with ReplayMemoryServer(*_templates(), 300, None, checkpoint_dir=str(tmp_path)) as srv:
        assert srv.rem.size == 7  # the older checkpoint
    assert _ckpts(tmp_path) == ["memory-000000000001.ckpt", "memory-000000000002.ckpt"]
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    with pytest.raises(CheckpointError, match=r"could be loaded.*field s: expected uint8\[9,9\]"):
        ReplayMemoryServer(*_templates((9, 9)), 300, None, checkpoint_dir=str(tmp_path))


# ---------------------------------------------------------------- `memoire serve` processes


class ServeProcess:
    """``memoire serve`` with `args` in a subprocess; reads its endpoints from the first line
    of stdout within `timeout` s. stderr goes to `log`."""

    def __init__(self, args, log, timeout=60.0):
        self.log = open(log, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memoire.cli", "serve"] + list(args),
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=subprocess_env(),
            cwd=os.path.dirname(log),
        )
        line = self._line(timeout)
        m = re.match(r"memoire serve: pub (\S+)  rep (\S+)  pull (\S+)", line or "")
        if not m:
            self.kill()
            pytest.fail(f"memoire serve did not start: {line!r}; {open(log).read()[-3000:]}")
        self.pub, self.rep, self.pull = m.groups()
        assert self.rep.startswith("tcp://127.0.0.1:")

    def _line(self, timeout):
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            return self.proc.stdout.readline() if sel.select(timeout) else None
        finally:
            sel.close()

    def output_until_exit(self, timeout=60.0):
        out, _ = self.proc.communicate(timeout=timeout)
        self.log.close()
        return out

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(15)
        self.proc.stdout.close()
        self.log.close()


def _remote_size(rep):
    with RemoteMemory(rep, timeout=10) as remote:
        return remote.stats()["memory_size"]


def test_a_server_killed_with_sigkill_restarts_from_its_checkpoint(tmp_path):
    folder = tmp_path / "ckpt"
    args = [
        "--state_shape",
        "8,8",
        "--state_dtype",
        "uint8",
        "--max_step",
        "3000",
        "--frame_stack",
        "2",
        "--seed",
        "3",
        "--interval",
        "60",
        "--checkpoint_dir",
        str(folder),
    ]
    log = tmp_path / "serve.log"
    first = ServeProcess(args, log)
    try:
        _stream(first.rep, first.pull, 20, 1, lambda: _remote_size(first.rep) == 240)
        with RemoteMemory(first.rep, timeout=20) as remote:
            assert remote.checkpoint() == "memory-000000000001.ckpt"
            before = [remote.sample(32) for _ in range(3)]  # drawn after the checkpoint
        # Stored after the checkpoint: the crash loses it.
        _stream(first.rep, first.pull, 3, 2, lambda: _remote_size(first.rep) == 276)
    finally:
        first.kill()  # SIGKILL: no last checkpoint
    assert first.proc.returncode == -signal.SIGKILL
    assert _ckpts(folder) == ["memory-000000000001.ckpt"]

    second = ServeProcess(args, log)
    try:
        assert _remote_size(second.rep) == 240
        with RemoteMemory(second.rep, timeout=20) as remote:
            for b in before:
                _same(remote.sample(32), b)
        # SIGTERM writes a last checkpoint holding what arrived since.
        _stream(second.rep, second.pull, 2, 3, lambda: _remote_size(second.rep) == 264)
        second.proc.send_signal(signal.SIGTERM)
        second.output_until_exit()
    finally:
        second.kill()
    assert second.proc.returncode == 0, open(log).read()[-2000:]
    logged = open(log).read()  # status lines are logged to stderr
    assert "memoire.commands.serve: checkpoint " in logged and "memory-000000000002.ckpt" in logged
    assert _ckpts(folder) == ["memory-000000000001.ckpt", "memory-000000000002.ckpt"]

    third = ServeProcess(args, log)
    try:
        assert _remote_size(third.rep) == 264
    finally:
        third.kill()


def test_serve_refuses_a_checkpoint_folder_of_another_memory_in_one_line(tmp_path):
    folder = tmp_path / "ckpt"
    with ReplayMemoryServer(*_templates(), 100, None, checkpoint_dir=str(folder)) as srv:
        srv.checkpoint()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "memoire.cli",
            "serve",
            "--state_shape",
            "4",
            "--max_step",
            "100",
            "--checkpoint_dir",
            str(folder),
            "--duration",
            "0",
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=str(tmp_path),
        timeout=60,
    )
    assert proc.returncode == 2
    assert "field s: expected float32[4]" in proc.stderr and "Traceback" not in proc.stderr
