"""memoire.experiments.train: tracked Dopamine runs, records, checkpoints, resume after a kill."""

import csv
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from _chatter import chatter, check_quiet
from _subprocess_env import subprocess_env
from _waiting import wait_until

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LOCAL_GIN = os.path.join(ROOT, "configs", "dqn_cartpole_jax_local.gin")
MEMOIRE_JAX = "memoire.dopamine_compat.jax_replay_buffer.ReplayBuffer"
TINY = [
    "Runner.training_steps = 150",
    "Runner.evaluation_steps = 60",
    "Runner.max_steps_per_episode = 12",  # many episodes end by this limit: truncations
    "Runner.fine_grained_print_to_console = False",
    "JaxDQNAgent.min_replay_history = 40",
    "JaxDQNAgent.update_period = 2",
    "ClassicControlDQNNetwork.hidden_units = 32",
]


def _cmd(base_dir, iterations):
    cmd = [
        sys.executable,
        "-m",
        "memoire.commands.train",
        "--gin_files",
        LOCAL_GIN,
        "--base_dir",
        base_dir,
        "--gin_bindings",
        f"Runner.num_iterations = {iterations}",
    ]
    for b in TINY:
        cmd += ["--gin_bindings", b]
    return cmd


def _env():
    # The installed memoire, not the source tree: no ROOT on the path (subprocesses also run
    # outside ROOT, since `python -m` puts the working directory first on sys.path).
    return dict(os.environ)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.dopamine
def test_local_run_trackers_checkpoint_and_resume_after_kill(tmp_path):
    base = str(tmp_path)
    run = os.path.join(base, "setting_0", "run_0")
    ckpt = os.path.join(run, "checkpoints")

    # 1. A long run, killed (SIGKILL) once iteration 1 is checkpointed.
    proc = subprocess.Popen(
        _cmd(base, 50),
        env=_env(),
        cwd=base,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def inside_a_later_iteration():
        # Killed once an episode of iteration 2 is written: its iteration is neither done nor
        # checkpointed, so the resume must not write that episode twice.
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        if not os.path.exists(os.path.join(ckpt, "sentinel_checkpoint_complete.1")):
            return False
        episodes = os.path.join(run, "episodes.csv")
        return os.path.exists(episodes) and any(r.get("iteration") == "2" for r in _rows(episodes))

    try:
        wait_until(inside_a_later_iteration, "an episode of iteration 2", timeout=150)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    done = max(
        int(f.split(".")[-1])
        for f in os.listdir(ckpt)
        if f.startswith("sentinel_checkpoint_complete.")
    )

    # 2. What the killed run left: records, trackers written as it went, a checkpoint.
    rec = json.load(open(os.path.join(run, "setting.json")))
    assert (rec["setting"], rec["run"], rec["seed"]) == (0, 0, 0)
    config = open(os.path.join(run, "config.gin")).read()
    assert "JaxDQNAgent.seed = 0" in config and "Runner.max_steps_per_episode = 12" in config
    eps = _rows(os.path.join(run, "episodes.csv"))
    train = [r for r in eps if r["phase"] == "train" and r["iteration"] == "0"]
    assert sum(int(r["length"]) for r in train) >= 150
    assert {r["phase"] for r in eps} == {"train", "eval"}
    for r in eps:  # exactly one way to end; only the limit of 12 truncates
        assert int(r["terminated"]) + int(r["truncated"]) == 1
        if r["truncated"] == "1":
            assert int(r["length"]) == 12
        else:
            assert int(r["length"]) <= 12
    assert any(r["truncated"] == "1" for r in eps) and any(r["terminated"] == "1" for r in eps)
    assert int(_rows(os.path.join(run, "replay.csv"))[0]["add_count"]) > 100

    # 3. The same command again resumes after the last complete checkpoint.
    out = subprocess.run(
        _cmd(base, done + 2), env=_env(), cwd=base, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # memoire's messages are logged to stderr (memoire.cli.configure_logging).
    assert f"INFO memoire.experiments.train: resuming {run} at iteration {done + 1}" in out.stderr
    assert f"INFO memoire.experiments.runner: iteration {done + 2}/" in out.stderr
    assert "iteration 1/" not in out.stderr  # iteration 0 was not played again
    eps = _rows(os.path.join(run, "episodes.csv"))
    iters = [int(r["iteration"]) for r in eps]
    assert iters == sorted(iters) and max(iters) == done + 1
    for phase in ("train", "eval"):  # no duplicated episodes from the killed iteration
        numbers = [int(r["episode"]) for r in eps if r["phase"] == phase]
        assert numbers == list(range(len(numbers)))
    steps = [int(r["env_steps"]) for r in eps if r["phase"] == "train"]
    assert steps == sorted(steps) and steps[-1] == sum(
        int(r["length"]) for r in eps if r["phase"] == "train"
    )
    replay = _rows(os.path.join(run, "replay.csv"))
    assert [int(r["iteration"]) for r in replay] == list(range(done + 2))
    adds = [int(r["add_count"]) for r in replay]
    # The replay memory came back from the checkpoint: its count continues to grow.
    assert all(b > a for a, b in zip(adds, adds[1:]))
    # It was memoire's buffer throughout, and it was sampled.
    assert {r["memory"] for r in replay} == {MEMOIRE_JAX}
    assert float(replay[-1]["samples_per_s"]) > 0

    # 4. The last checkpoint holds exactly the run's training transitions, killed iteration
    # excluded: with horizon 1 every episode of L steps yields L - 1 elements (Dopamine's
    # accumulator drops the last reward), and only terminations are stored as terminal.
    from memoire.dopamine_compat import jax_replay_buffer as mj

    buf = mj.ReplayBuffer(
        mj.TransitionAccumulator(1, 1, 0.99),
        mj.UniformSamplingDistribution(0),
        batch_size=128,
        max_capacity=50000,
    )
    buf.load(ckpt, done + 1)
    train = [r for r in eps if r["phase"] == "train"]
    assert buf.add_count == adds[-1] == sum(int(r["length"]) - 1 for r in train)
    elements = buf.get_elements(buf.keys())
    terminated = sum(r["terminated"] == "1" for r in train)
    assert 0 < terminated < len(train)  # both kinds of ends happened
    assert int(elements.is_terminal.sum()) == terminated  # truncations are not terminal


# --- In-process: the episode loop keeps termination and truncation apart. -------------------


class _FakeAgent:
    def __init__(self):
        self.ends = []
        self.eval_mode = False

    def begin_episode(self, observation):
        return 0

    def step(self, reward, observation):
        return 0


class _FakeRunner:
    """The attributes of Dopamine's Runner that TrackingMixin relies on."""

    def __init__(self, base_dir, create_agent_fn, environment=None, max_steps=100):
        self._environment = environment
        self._agent = _FakeAgent()
        self._start_iteration = 0
        self._clip_rewards = True
        self._max_steps_per_episode = max_steps
        self._num_iterations = 1

    def _initialize_episode(self):
        return self._agent.begin_episode(self._environment.reset())

    def _run_one_step(self, action):
        observation, reward, is_terminal, _ = self._environment.step(action)
        return observation, reward, is_terminal

    def _end_episode(self, reward, terminal=True):
        self._agent.ends.append(bool(terminal))


@pytest.mark.parametrize("time_limit, runner_limit", [(5, 100), (100, 5)])
def test_episode_loop_separates_termination_and_truncation(tmp_path, time_limit, runner_limit):
    gymnasium = pytest.importorskip("gymnasium")
    from dopamine.discrete_domains import gym_lib

    from memoire.experiments.episode_loop import install_end_recorder
    from memoire.experiments.runner import TrackingMixin

    class Runner(TrackingMixin, _FakeRunner):
        pass

    inner = gymnasium.make("CartPole-v1", max_episode_steps=time_limit)
    env = gym_lib.GymPreprocessing(inner)
    runner = Runner(str(tmp_path), None, seed=3, environment=env, max_steps=runner_limit)
    lengths = [runner._run_one_episode()[0] for _ in range(3)]
    assert lengths == [5, 5, 5]  # whichever limit is lower ends the episode
    assert runner._agent.ends == [False, False, False]  # stored as not terminal

    # Action 0 forever: the pole falls within the limit, a real termination.
    runner._max_steps_per_episode = 500
    env2 = gym_lib.GymPreprocessing(gymnasium.make("CartPole-v1", max_episode_steps=500))
    runner._environment = env2
    runner._end_recorder = install_end_recorder(env2)
    length, _ = runner._run_one_episode()
    assert length < 500 and runner._agent.ends[-1] is True
    runner.close()
    rows = _rows(os.path.join(str(tmp_path), "episodes.csv"))
    assert [r["truncated"] for r in rows] == ["1", "1", "1", "0"]
    assert [r["terminated"] for r in rows] == ["0", "0", "0", "1"]
    assert np.all(np.diff([int(r["env_steps"]) for r in rows]) > 0)


# --- Which replay memory a run uses. --------------------------------------------------------


@pytest.mark.dopamine
def test_replay_backend_chooses_the_agent_factory():
    import gin
    from dopamine.discrete_domains import run_experiment

    from memoire.dopamine_compat import jax_agents
    from memoire.experiments import replay_routing, runner

    try:
        for extra, want in (
            ([], jax_agents.create_memoire_agent),
            (["replay_backend.name = 'dopamine'"], run_experiment.create_agent),
        ):
            gin.clear_config()
            runner.load_gin([LOCAL_GIN], extra)
            assert replay_routing.create_agent_fn() is want
        gin.clear_config()
        runner.load_gin([LOCAL_GIN], ["replay_backend.name = 'reverb'"])
        with pytest.raises(ValueError, match="replay_backend.name"):
            replay_routing.replay_backend()
    finally:
        gin.clear_config()


TF_DQN_GIN = """
# Dopamine's TF DQN on CartPole, with nothing about memoire: memoire train routes replay.
import dopamine.discrete_domains.gym_lib
import dopamine.discrete_domains.run_experiment
import dopamine.tf.agents.dqn.dqn_agent
import dopamine.tf.replay_memory.circular_replay_buffer

DQNAgent.observation_shape = %gym_lib.CARTPOLE_OBSERVATION_SHAPE
DQNAgent.observation_dtype = %gym_lib.CARTPOLE_OBSERVATION_DTYPE
DQNAgent.stack_size = %gym_lib.CARTPOLE_STACK_SIZE
DQNAgent.network = @gym_lib.CartpoleDQNNetwork
DQNAgent.min_replay_history = 40
DQNAgent.update_period = 2
DQNAgent.epsilon_fn = @tf.agents.dqn.dqn_agent.identity_epsilon
create_gym_environment.environment_name = 'CartPole'
create_gym_environment.version = 'v0'
create_runner.schedule = 'continuous_train_and_eval'
create_agent.agent_name = 'dqn'
Runner.create_environment_fn = @gym_lib.create_gym_environment
Runner.num_iterations = 1
Runner.training_steps = 200
Runner.evaluation_steps = 20
Runner.max_steps_per_episode = 9  # poles fall in about 8 to 12 steps: both kinds of ends
Runner.fine_grained_print_to_console = False
WrappedReplayBuffer.replay_capacity = 5000
WrappedReplayBuffer.batch_size = 32
"""


@pytest.mark.dopamine
def test_tf_agent_runs_on_memoire_buffer_and_stores_truncations(tmp_path):
    gin_file = tmp_path / "dqn_tf.gin"
    gin_file.write_text(TF_DQN_GIN)
    base = str(tmp_path / "run")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "memoire.commands.train",
            "--gin_files",
            str(gin_file),
            "--base_dir",
            base,
        ],
        env=_env(),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run = os.path.join(base, "setting_0", "run_0")
    replay = _rows(os.path.join(run, "replay.csv"))
    assert replay[0]["memory"] == (
        "memoire.dopamine_compat.circular_replay_buffer.OutOfGraphReplayBuffer"
    )
    assert float(replay[0]["samples_per_s"]) > 0
    config = open(os.path.join(run, "config.gin")).read()
    assert "MemoireOutOfGraphReplayBuffer.replay_capacity = 5000" in config

    # The checkpointed memory: one slot per training step, terminal only where the episode
    # terminated; every end (truncations included) is an episode end.
    from memoire.dopamine_compat import OutOfGraphReplayBuffer

    train = [r for r in _rows(os.path.join(run, "episodes.csv")) if r["phase"] == "train"]
    mem = OutOfGraphReplayBuffer((4, 1), 1, 5000, 32, observation_dtype=np.float64)
    mem.load(os.path.join(run, "checkpoints"), 0)
    steps = sum(int(r["length"]) for r in train)
    terminated = sum(r["terminated"] == "1" for r in train)
    assert int(mem.add_count) == steps == int(replay[0]["add_count"])
    assert 0 < terminated < len(train)
    assert int(np.count_nonzero(mem._store["terminal"][:steps])) == terminated
    assert len(mem.episode_end_indices) == len(train)


@pytest.mark.dopamine
@pytest.mark.slow
def test_demo_prints_memoires_lines_only_and_debug_brings_the_rest_back(tmp_path):
    """`make demo`'s command (configs/demo_distributed.gin: a learner and 2 spawned actors),
    at a tiny budget: stdout empty (training has no result line), stderr memoire's lines only.
    Run again, the finished run says so and trains no more; with --log-level debug, what the
    other packages print (TensorFlow's C++ logging, gym's notice, deprecations) is back."""
    base = str(tmp_path / "demo")
    cmd = [
        sys.executable,
        "-m",
        "memoire.cli",
        "train",
        "--gin_files",
        os.path.join(ROOT, "configs", "demo_distributed.gin"),
        "--base_dir",
        base,
    ]
    for b in (
        "Runner.num_iterations = 1",
        "Runner.training_steps = 150",
        "Runner.evaluation_steps = 30",
        "JaxDQNAgent.min_replay_history = 40",
        "ClassicControlDQNNetwork.hidden_units = 16",
        "DistributedConfig.publish_period = 20",
    ):
        cmd += ["--gin_bindings", b]
    out = subprocess.run(
        cmd, env=subprocess_env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # The setting, each actor connecting, the learner's endpoints, the iteration (and a phase
    # line per minute), the learner's closing figures.
    lines = check_quiet(out, most_lines=7)
    assert all(line.startswith("INFO memoire.") for line in lines), lines
    assert any("iteration 1/1: train return" in line for line in lines), lines

    again = subprocess.run(
        [*cmd, "--log-level", "debug"],
        env=subprocess_env(),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout == ""
    assert "all its iterations are done" in again.stderr and "to start over" in again.stderr
    assert "iteration 1/1: train return" not in again.stderr  # nothing trained
    assert "connected to the learner" not in again.stderr  # no actor started
    back = chatter(again.stderr)
    assert len(back) >= 1, again.stderr[-3000:]  # the command's own imports (TensorFlow's)
