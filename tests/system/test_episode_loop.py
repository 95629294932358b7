"""memoire.experiments.episode_loop: the one episode loop a local run and a distributed actor
play, in process on a small game with lives (tests/helpers/_lives_env.py), and in whole runs: a local
run and a distributed one store the same transitions for the same environment, lost lives
reported as terminal included."""

import os
import subprocess
import sys

import numpy as np
import pytest
from _lives_env import LivesGame
from _subprocess_env import HELPERS, subprocess_env

from memoire.experiments.episode_loop import Episode, play_episode

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _RecordingAgent:
    """Dopamine's agent interface; records what the loop asked of it."""

    def __init__(self):
        self.calls = []

    def begin_episode(self, observation):
        self.calls.append(("begin", tuple(observation[:3])))
        return 0

    def step(self, reward, observation):
        self.calls.append(("step", float(reward)))
        return 0

    def end(self, reward, terminal):
        self.calls.append(("end", float(reward), bool(terminal)))


def _play(game, agent, **kwargs):
    settings = dict(max_steps_per_episode=100, clip_rewards=True, end_agent_episode=agent.end)
    settings.update(kwargs)
    return play_episode(game, agent, None, **settings)


def test_a_lost_life_reported_as_terminal_ends_the_agents_episode_within_the_game():
    agent = _RecordingAgent()
    episode = _play(LivesGame(3, terminal_on_life_loss=True), agent)
    # Game 0: lives of 2, 3 and 4 steps; a lost life's reward -2 reaches the agent clipped.
    assert episode == Episode(length=9, total_reward=0.0, terminated=True)
    assert [c for c in agent.calls if c[0] != "step"] == [
        ("begin", (0.0, 0.0, 0.0)),
        ("end", -1.0, True),
        ("begin", (0.0, 1.0, 0.0)),
        ("end", -1.0, True),
        ("begin", (0.0, 2.0, 0.0)),
        ("end", -1.0, True),
    ]
    assert sum(c[0] == "step" for c in agent.calls) == 6


def test_without_life_loss_terminals_a_game_is_one_agent_episode():
    agent = _RecordingAgent()
    episode = _play(LivesGame(3, terminal_on_life_loss=False), agent)
    assert episode == Episode(length=9, total_reward=0.0, terminated=True)
    assert [c for c in agent.calls if c[0] != "step"] == [
        ("begin", (0.0, 0.0, 0.0)),
        ("end", -1.0, True),
    ]
    assert ("step", -1.0) in agent.calls  # a lost life's reward, clipped, on a plain step


def test_the_step_limit_truncates_and_keep_going_abandons():
    agent = _RecordingAgent()
    game = LivesGame(3, terminal_on_life_loss=False)
    cut = _play(game, agent, max_steps_per_episode=4, clip_rewards=False)
    assert cut == Episode(length=4, total_reward=1.0, terminated=False)
    assert agent.calls[-1] == ("end", 1.0, False)  # stored as a truncation, reward unclipped

    agent = _RecordingAgent()
    seen = []
    stopped = _play(game, agent, keep_going=lambda length: seen.append(length) or length < 3)
    # Game 1's first life lasts 3 steps: 1.0, 1.0, then -2.0 as it is lost.
    assert stopped == Episode(length=3, total_reward=0.0, terminated=False, abandoned=True)
    assert seen == [1, 2, 3] and not any(c[0] == "end" for c in agent.calls)


# --- Whole runs: local and distributed store the same episodes. ------------------------------

RUN_GIN = """
include '{root}/configs/dqn_cartpole_jax_local.gin'
import _lives_env

Runner.create_environment_fn = @create_lives_game
create_lives_game.terminal_on_life_loss = {terminal_on_life_loss}
Runner.num_iterations = 1
Runner.training_steps = 60
Runner.evaluation_steps = 5
Runner.fine_grained_print_to_console = False
JaxDQNAgent.min_replay_history = 100000  # never trains: these runs are about what is stored
ClassicControlDQNNetwork.hidden_units = 8
"""

DISTRIBUTED = """
import memoire.experiments.distributed
DistributedConfig.num_actors = 1
DistributedConfig.chunk_size = 4
DistributedConfig.publish_period = 10
"""


def _stored_elements(tmp_path, name: str, gin_text: str):
    """Runs ``memoire train`` on ``gin_text`` in ``tmp_path/name``; returns the elements of the
    replay buffer its checkpoint holds (oldest first)."""
    from memoire.dopamine_compat import jax_replay_buffer as mj

    gin_file = tmp_path / f"{name}.gin"
    gin_file.write_text(gin_text)
    base = tmp_path / name
    cmd = [sys.executable, "-m", "memoire.cli", "train", "--gin_files", str(gin_file)]
    cmd += ["--base_dir", str(base)]
    out = subprocess.run(
        cmd,
        cwd=str(tmp_path),
        env=subprocess_env(HELPERS),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    buf = mj.ReplayBuffer(
        mj.TransitionAccumulator(1, 1, 0.99),
        mj.UniformSamplingDistribution(0),
        batch_size=8,
        max_capacity=50000,
    )
    buf.load(str(base / "setting_0" / "run_0" / "checkpoints"), 0)
    return buf.get_elements(buf.keys())


@pytest.mark.dopamine
@pytest.mark.slow
@pytest.mark.parametrize("terminal_on_life_loss", [True, False])
def test_a_distributed_run_stores_the_episodes_a_local_run_stores(tmp_path, terminal_on_life_loss):
    gin_text = RUN_GIN.format(root=ROOT, terminal_on_life_loss=terminal_on_life_loss)
    local = _stored_elements(tmp_path, "local", gin_text)
    distributed = _stored_elements(tmp_path, "distributed", gin_text + DISTRIBUTED)
    # Both stored whole games from the first (the distributed learner may take a game more
    # or fewer within its 60 steps): they agree on every field of every element they share.
    n = min(len(local.reward), len(distributed.reward))
    assert n >= 40
    for field in ("state", "action", "reward", "next_state", "is_terminal", "episode_end"):
        np.testing.assert_array_equal(
            getattr(local, field)[:n], getattr(distributed, field)[:n], err_msg=field
        )
    # The setting took effect: terminal elements before a game's last life are lost lives.
    terminal_lives = local.state[:n][local.is_terminal[:n], 1].reshape(-1)
    assert set(terminal_lives.tolist()) == ({0.0, 1.0, 2.0} if terminal_on_life_loss else {2.0})
