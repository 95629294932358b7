"""Dopamine's own entry points train TF and JAX agents on CartPole with their replay on a
memoire server process (configs/*_remote.gin), then resume from the checkpoint against a
fresh server that reloads the replay from it.

Each case: server A (spawned, loopback, OS-chosen port) + one training iteration of 150 steps
(training from step 50)
-> checkpoint 0 (the replay written by the server); server A stops; server B starts empty;
a second run resumes at iteration 1, the agent's unbundle makes server B load checkpoint 0, and
150 more steps follow. Every subprocess wait is bounded. The cases run two at a time
(tests/helpers/_two_at_a_time.py).
"""

import functools
import os
import subprocess
import sys

import pytest

pytest.importorskip("gin")
pytest.importorskip("gym")
pytest.importorskip("dopamine.discrete_domains.run_experiment")

from _buffer_server import BufferServerProcess  # noqa: E402
from _subprocess_env import dopamine_runner_module  # noqa: E402
from _two_at_a_time import TwoAtATime  # noqa: E402

from memoire.dopamine_compat import remote  # noqa: E402

pytestmark = [pytest.mark.dopamine, pytest.mark.slow]
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STEPS = 150
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")


def _config(name):
    return os.path.join(ROOT, "configs", name)


def _Server(kind, gin_file, log_path, args=()):
    """A buffer server process of `kind` configured by `gin_file`, in log_path's folder."""
    # Through the buffer server's old entry, as configs/*_remote.gin say to start it.
    return BufferServerProcess(
        ["--serve", kind, "--gin_files", _config(gin_file), "--seed", "0"] + list(args),
        log_path,
        module=("memoire.dopamine_compat.remote",),
        JAX_PLATFORMS="cpu",
    )


def _train(module, gin_file, base_dir, bindings):
    # Dopamine's runner as the README starts it (through upstream_compat where needed).
    modules = dopamine_runner_module() if module == "dopamine.discrete_domains.train" else [module]
    cmd = [
        sys.executable,
        "-m",
        *modules,
        f"--base_dir={base_dir}",
        f"--gin_files={_config(gin_file)}",
    ] + [f"--gin_bindings={b}" for b in bindings]
    # cwd: not ROOT, whose memoire/ (no extension built there) would shadow the installed one.
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=base_dir, check=False
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout + out.stderr


CASES = {
    # id: (entry point, gin file, server kind, server args, agent prefix, endpoint binding)
    "tf_dqn": (
        "dopamine.discrete_domains.train",
        "dqn_cartpole_tf_remote.gin",
        "circular",
        [],
        "DQNAgent",
        "MemoireRemoteOutOfGraphReplayBuffer.endpoint",
    ),
    "tf_rainbow": (
        "dopamine.discrete_domains.train",
        "rainbow_cartpole_tf_remote.gin",
        "prioritized",
        [],
        "RainbowAgent",
        "MemoireRemoteOutOfGraphReplayBuffer.endpoint",
    ),
    "jax_dqn": (
        "memoire.dopamine_compat.jax_agents",
        "dqn_cartpole_jax_remote.gin",
        "jax",
        [
            "--arg",
            "stack_size=1",
            "--arg",
            "update_horizon=1",
            "--arg",
            "gamma=0.99",
            "--gin_bindings",
            "ReplayBuffer.max_capacity = 2000",
        ],
        "JaxDQNAgent",
        "MemoireJaxDQNAgent.replay_endpoint",
    ),
    "jax_rainbow": (
        "memoire.dopamine_compat.jax_agents",
        "rainbow_cartpole_jax_remote.gin",
        "jax_prioritized",
        [
            "--arg",
            "stack_size=1",
            "--arg",
            "update_horizon=3",
            "--arg",
            "gamma=0.99",
            "--gin_bindings",
            "ReplayBuffer.max_capacity = 2000",
            "--gin_bindings",
            "PrioritizedSamplingDistribution.max_capacity = 2000",
        ],
        "JaxRainbowAgent",
        "MemoireJaxRainbowAgent.replay_endpoint",
    ),
}


def _add_count(kind, endpoint):
    if kind.startswith("jax"):
        proxy = remote.RemoteReplayBuffer(endpoint, "replay", timeout=20)
    else:
        proxy = remote.RemoteOutOfGraphReplayBuffer(endpoint, "replay", timeout=20)
    try:
        return int(proxy.add_count)
    finally:
        proxy.close()


def _train_checkpoint_and_resume(case, tmp_path):
    """The case's two runs against servers A and B (above), with the test's checks."""
    tmp_path.mkdir()
    module, gin_file, kind, server_args, prefix, endpoint_binding = CASES[case]
    common = [
        f"Runner.training_steps = {STEPS}",
        "Runner.evaluation_steps = 20",
        "Runner.max_steps_per_episode = 200",
        f"{prefix}.min_replay_history = 50",
    ]

    first = _Server(kind, gin_file, tmp_path / "server_a.log", server_args)
    try:
        _train(
            module,
            gin_file,
            tmp_path,
            common + ["Runner.num_iterations = 1", f"{endpoint_binding} = '{first.endpoint}'"],
        )
        saved = _add_count(kind, first.endpoint)
    finally:
        first.stop()
    # The iteration's steps were added on the server (the JAX accumulator stores fewer
    # transitions than steps: none until a stack fills, per episode).
    assert saved >= STEPS // 2
    # memoire's JAX entry point is memoire train, whose runs live in setting_0/run_0.
    run_dir = tmp_path / "setting_0" / "run_0" if module.startswith("memoire") else tmp_path
    ckpt = run_dir / "checkpoints"
    written = [p.name for p in ckpt.rglob("*")]
    assert any("ckpt.0" in n for n in written) or (ckpt / "0" / "replay").exists(), written

    second = _Server(kind, gin_file, tmp_path / "server_b.log", server_args)
    try:
        assert _add_count(kind, second.endpoint) == 0  # a fresh, empty buffer
        log = _train(
            module,
            gin_file,
            tmp_path,
            common + ["Runner.num_iterations = 2", f"{endpoint_binding} = '{second.endpoint}'"],
        )
        resumed = _add_count(kind, second.endpoint)
    finally:
        second.stop()
    # Dopamine's runner logs the first; memoire train (quiet at INFO) prints the second.
    assert "will start from iteration 1" in log or "at iteration 1" in log, log[-3000:]
    # Server B reloaded checkpoint 0, then one iteration added its own steps (without the
    # reload it would hold one iteration's worth, about `saved`).
    assert resumed >= saved + STEPS // 2


@pytest.fixture(scope="module")
def cases(request, tmp_path_factory):
    """The selected cases, two at a time (each is a sequence of single-process training runs
    and a light server); ``cases(request)`` waits for the requesting test's case, failing as
    it failed."""
    root = tmp_path_factory.mktemp("cases")
    jobs = {
        f"test_agent_trains_on_server_checkpoints_and_resumes[{case}]": functools.partial(
            _train_checkpoint_and_resume, case, root / case
        )
        for case in CASES
    }
    runs = TwoAtATime(request, jobs)
    yield lambda test_request: runs.result(test_request.node.name)
    runs.close()


@pytest.mark.parametrize("case", list(CASES))
def test_agent_trains_on_server_checkpoints_and_resumes(cases, request, case):
    cases(request)


def test_jax_agents_remote_wait_is_a_setting():
    # replay_timeout / replay_retries reach the agent's proxy: against an endpoint nobody
    # serves, constructing the agent gives up after (1 + retries) * timeout, and says so.
    import socket

    import numpy as np

    from memoire.dopamine_compat.jax_agents import MemoireJaxDQNAgent

    with socket.socket() as s:  # a port the OS picked, then let go: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TimeoutError, match=r"did not answer for 0\.6 s"):
        MemoireJaxDQNAgent(
            num_actions=2,
            observation_shape=(4,),
            observation_dtype=np.float32,
            stack_size=1,
            replay_endpoint=f"tcp://127.0.0.1:{port}",
            replay_timeout=0.3,
            replay_retries=1,
        )
