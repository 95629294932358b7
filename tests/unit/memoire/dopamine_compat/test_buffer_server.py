"""A Dopamine buffer server with a checkpoint folder (``memoire serve --buffer KIND
--checkpoint_dir D``): checkpoints on request, on SIGTERM and on a period, the newest 3 kept,
the newest loadable one loaded at start; and a training run whose buffer server is killed with
SIGKILL and restarted on the same endpoint finishes.

Loopback only, OS-picked ports (a restart reuses the port its first server was given), every
wait bounded.
"""

import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

pytest.importorskip("gin")
pytest.importorskip("dopamine.discrete_domains.run_experiment")

from _buffer_server import BufferServerProcess  # noqa: E402
from _subprocess_env import subprocess_env  # noqa: E402
from _waiting import wait_until  # noqa: E402

from memoire.checkpoint_io import CheckpointError  # noqa: E402
from memoire.dopamine_compat import buffer_server, remote  # noqa: E402

pytestmark = pytest.mark.dopamine
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
JAX_CONFIG = os.path.join(ROOT, "configs", "dqn_cartpole_jax_remote.gin")
CIRCULAR = dict(observation_shape=(4,), stack_size=1, replay_capacity=200, batch_size=8)
CIRCULAR_ARGS = [f"--arg={k}={v!r}" for k, v in CIRCULAR.items()]
JAX_ARGS = [
    "--gin_files",
    JAX_CONFIG,
    "--arg",
    "stack_size=1",
    "--arg",
    "update_horizon=1",
    "--arg",
    "gamma=0.99",
]


def _add_circular(proxy, rng, steps, episode=10):
    """`steps` random CartPole-like rows, an episode ending every `episode` rows."""
    for k in range(steps):
        proxy.add(
            rng.standard_normal(4).astype(np.float32),
            int(rng.integers(2)),
            float(rng.random()),
            (k + 1) % episode == 0,
        )
    proxy.flush()


def _add_jax(proxy, rng, steps, episode=10):
    from dopamine.jax.replay_memory import elements

    for k in range(steps):
        proxy.add(
            elements.TransitionElement(
                rng.standard_normal(4).astype(np.float32),
                int(rng.integers(2)),
                float(rng.random()),
                (k + 1) % episode == 0,
                (k + 1) % episode == 0,
            )
        )
    proxy.flush()


def _checkpoints(folder):
    return sorted(n for n in os.listdir(folder) if re.fullmatch(r"buffer-\d{12}\.ckpt", n))


def test_checkpoints_on_request_keep_the_newest_three_and_a_new_server_loads_the_newest(tmp_path):
    folder = tmp_path / "ckpt"
    rng = np.random.default_rng(0)
    server, endpoint = buffer_server.start_buffer_server(
        "circular", checkpoint_dir=str(folder), seed=0, **CIRCULAR
    )
    try:
        with remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=20, retries=0) as proxy:
            names = []
            for _ in range(4):
                _add_circular(proxy, rng, 25)  # the last episode is left unfinished
                names.append(proxy.checkpoint())
            count = int(proxy.add_count)
            rows = proxy.sample_transition_batch(40, np.arange(40))
    finally:
        server.close()
    assert count == 100
    assert _checkpoints(folder) == names[-3:]

    server, endpoint = buffer_server.start_buffer_server(
        "circular", checkpoint_dir=str(folder), seed=0, **CIRCULAR
    )
    try:
        assert server.checkpoints.last_path == str(folder / names[-1])
        with remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=20, retries=0) as proxy:
            assert int(proxy.add_count) == count
            for a, b in zip(rows, proxy.sample_transition_batch(40, np.arange(40))):
                np.testing.assert_array_equal(a, b)
            # The episode in progress when the checkpoint was taken ends there (truncated).
            assert (count - 1) % CIRCULAR["replay_capacity"] in proxy.episode_end_indices
    finally:
        server.close()


def test_a_corrupt_newest_checkpoint_is_skipped_and_a_foreign_folder_refused(tmp_path):
    folder = tmp_path / "ckpt"
    rng = np.random.default_rng(1)
    server, endpoint = buffer_server.start_buffer_server(
        "circular", checkpoint_dir=str(folder), **CIRCULAR
    )
    try:
        with remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=20, retries=0) as proxy:
            _add_circular(proxy, rng, 30)
            proxy.checkpoint()
            _add_circular(proxy, rng, 30)
            newest = proxy.checkpoint()
    finally:
        server.close()
    # A save cut short leaves a temporary folder; the newest one's files are damaged.
    temporary = folder / "buffer-000000000009.ckpt.tmp-0123456789ab"
    temporary.mkdir()
    for f in (folder / newest).iterdir():
        f.write_bytes(b"not gzip")

    server, endpoint = buffer_server.start_buffer_server(
        "circular", checkpoint_dir=str(folder), **CIRCULAR
    )
    try:
        assert not temporary.exists()
        with remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=20, retries=0) as proxy:
            assert int(proxy.add_count) == 30  # the older checkpoint
    finally:
        server.close()

    with pytest.raises(CheckpointError, match="no checkpoint"):  # another capacity
        buffer_server.start_buffer_server(
            "circular", checkpoint_dir=str(folder), **dict(CIRCULAR, replay_capacity=100)
        )
    with pytest.raises(ValueError, match="needs a checkpoint_dir"):
        buffer_server.start_buffer_server("circular", checkpoint_every=1.0, **CIRCULAR)


def test_a_server_without_a_folder_refuses_a_checkpoint_request():
    server, endpoint = buffer_server.start_buffer_server("circular", **CIRCULAR)
    try:
        with remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=20, retries=0) as proxy:
            with pytest.raises(RuntimeError, match="no checkpoint folder"):
                proxy.checkpoint()
    finally:
        server.close()


def test_a_call_made_while_the_server_is_down_goes_through_once_it_restarts(tmp_path):
    folder = str(tmp_path / "ckpt")
    server, endpoint = buffer_server.start_buffer_server(
        "circular", checkpoint_dir=folder, **CIRCULAR
    )
    proxy = remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=0.5, retries=40)
    try:
        _add_circular(proxy, np.random.default_rng(3), 30)
        proxy.checkpoint()
        _add_circular(proxy, np.random.default_rng(4), 10)  # lost with the server
        server.close()
        restarted = []

        def restart():
            channel = proxy._remote._channel
            wait_until(
                lambda: channel.resends >= 2, "two of the proxy's attempts to meet no server"
            )
            restarted.append(
                buffer_server.start_buffer_server(
                    "circular", checkpoint_dir=folder, rep_endpoint=endpoint, **CIRCULAR
                )[0]
            )

        thread = threading.Thread(target=restart)
        thread.start()
        try:
            assert int(proxy.add_count) == 30  # asked while down, answered by the restored one
            _add_circular(proxy, np.random.default_rng(5), 10)
            assert int(proxy.add_count) == 40
        finally:
            thread.join(60)
            for s in restarted:
                s.close()
    finally:
        proxy._remote.close()  # no flush: nothing is pending, and no server may be left

    with pytest.raises(TimeoutError, match=r"did not answer for 0\.4 s"):
        remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=0.2, retries=1)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["circular", "jax"])
def test_sigterm_checkpoints_and_restarts_serve_the_same_contents_and_samples(tmp_path, kind):
    """SIGTERM writes a last checkpoint; two servers started from it (the first killed with
    SIGKILL, which writes none) hold the same contents and draw the same batches."""
    folder = tmp_path / "ckpt"
    args = ["--buffer", kind, "--seed", "0", "--checkpoint_dir", str(folder)]
    args += CIRCULAR_ARGS if kind == "circular" else JAX_ARGS
    env = {"JAX_PLATFORMS": "cpu"}

    def proxy_of(server):
        if kind == "circular":
            return remote.RemoteOutOfGraphReplayBuffer(server.endpoint, timeout=20, retries=0)
        return remote.RemoteReplayBuffer(server.endpoint, timeout=20, retries=0)

    first = BufferServerProcess(args, str(tmp_path / "a.log"), **env)
    try:
        with proxy_of(first) as proxy:
            (_add_circular if kind == "circular" else _add_jax)(proxy, np.random.default_rng(2), 95)
            count = int(proxy.add_count)
        assert _checkpoints(folder) == []
        first.proc.send_signal(signal.SIGTERM)
        assert first.proc.wait(60) == 0
    finally:
        first.stop()
    assert len(_checkpoints(folder)) == 1

    batches = []
    for name in ("b", "c"):
        server = BufferServerProcess(args, str(tmp_path / f"{name}.log"), **env)
        try:
            with proxy_of(server) as proxy:
                assert int(proxy.add_count) == count
                if kind == "circular":
                    batches.append(proxy.sample_transition_batch(90, np.arange(90)))
                    batches.append(proxy.sample_transition_batch())
                else:
                    batches.append(tuple(vars(proxy.sample(16)).values()))
            server.proc.kill()  # no last checkpoint: the next server loads the same one
            server.proc.wait(30)
        finally:
            server.stop()
    assert len(_checkpoints(folder)) == 1
    first_batches, second_batches = batches[: len(batches) // 2], batches[len(batches) // 2 :]
    for one, two in zip(first_batches, second_batches):
        for a, b in zip(one, two):
            np.testing.assert_array_equal(a, b)


def _logged_add_counts(path, what):
    """add_count of each ``<what> ...: add_count N`` line of a server's log."""
    with open(path) as f:
        return [int(m) for m in re.findall(rf"{what} \S+: add_count (\d+)", f.read())]


@pytest.mark.slow
def test_training_finishes_when_its_buffer_server_is_killed_and_restarted(tmp_path):
    folder = tmp_path / "server_checkpoints"
    iterations = 3
    args = JAX_ARGS + [
        "--buffer",
        "jax",
        "--seed",
        "0",
        "--gin_bindings",
        "ReplayBuffer.max_capacity = 5000",
        "--checkpoint_dir",
        str(folder),
        "--checkpoint_every",
        "1",
    ]
    env = {"JAX_PLATFORMS": "cpu"}
    first = BufferServerProcess(
        args + ["--rep", "tcp://127.0.0.1:*"], str(tmp_path / "a.log"), **env
    )
    endpoint = first.endpoint
    bindings = [
        f"Runner.num_iterations = {iterations}",
        "Runner.training_steps = 600",
        "Runner.evaluation_steps = 100",
        "JaxDQNAgent.min_replay_history = 100",
        f"MemoireJaxDQNAgent.replay_endpoint = '{endpoint}'",
    ]
    base_dir = tmp_path / "run"
    with open(tmp_path / "train.log", "w") as train_log:
        train = subprocess.Popen(
            [sys.executable, "-m", "memoire.cli", "train", f"--base_dir={base_dir}"]
            + [f"--gin_files={JAX_CONFIG}"]
            + [f"--gin_bindings={b}" for b in bindings],
            stdout=train_log,
            stderr=subprocess.STDOUT,
            env=subprocess_env(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", **env),
            cwd=str(tmp_path),
        )
    second = None
    try:
        try:
            # A periodic checkpoint holding the learner's transitions, then SIGKILL mid-run.
            wait_until(
                lambda: any(n >= 200 for n in _logged_add_counts(first.log_path, "checkpoint")),
                "a checkpoint of 200 transitions",
                timeout=240,
            )
            first.proc.kill()
            first.proc.wait(30)
        finally:
            first.stop()
        assert train.poll() is None, "training ended before the server was killed"
        saved = max(_logged_add_counts(first.log_path, "checkpoint"))

        second = BufferServerProcess(args + ["--rep", endpoint], str(tmp_path / "b.log"), **env)
        assert second.endpoint == endpoint
        (loaded,) = _logged_add_counts(second.log_path, "loaded checkpoint")
        assert loaded >= saved  # the newest complete checkpoint (maybe one not yet logged)

        rc = train.wait(300)
        with open(tmp_path / "train.log") as f:
            assert rc == 0, f.read()[-4000:]
        with remote.RemoteReplayBuffer(endpoint, timeout=20, retries=0) as proxy:
            final = int(proxy.add_count)
    finally:
        if train.poll() is None:
            train.kill()
            train.wait(30)
        if second is not None:
            second.stop()
    assert final > loaded  # the learner went on adding to the restored buffer
    with open(base_dir / "setting_0" / "run_0" / "replay.csv") as f:
        rows = f.read().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == list(range(iterations))
