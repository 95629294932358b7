"""The one episode loop: Dopamine's ``Runner._run_one_episode``, as memoire plays it in a local
run (:class:`memoire.experiments.runner.TrackingMixin`) and in a distributed actor
(:mod:`memoire.experiments.distributed.actor`), so that both store the same transitions for the
same environment; and how the environment's last step ended (:func:`install_end_recorder`).

Two things on top of Dopamine's loop: a game also ends at the environment's own time limit,
and the last transition is stored as terminal only when the environment says the game
terminated (not when a time limit cut it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np


class _AleEndFlags:
    """The end flags of Dopamine's Atari environment, read from the emulator.

    Dopamine's ``AtariPreprocessing`` folds the ALE's ``(terminated, truncated)`` into one
    ``game_over`` and reads ``environment.env.ale`` directly, so no wrapper may sit between
    it and the ALE; the ALE itself still knows why the game stopped (its frame cap,
    ``max_num_frames_per_episode``, truncates).
    """

    def __init__(self, ale: Any):
        self._ale = ale

    @property
    def terminated(self) -> bool:
        return bool(self._ale.game_over(with_truncation=False))

    @property
    def truncated(self) -> bool:
        return bool(self._ale.game_truncated())


def install_end_recorder(environment: Any):
    """Something whose ``terminated`` / ``truncated`` (bool) say how the environment's last
    step ended, for :func:`play_episode`.

    Dopamine's wrappers fold gymnasium's ``(terminated, truncated)`` into one ``game_over``
    that does not tell a time limit from a true end. For ``GymPreprocessing`` (gym_lib) this
    wraps the gymnasium env inside it to record both flags of the last step; for Atari
    (``AtariPreprocessing``) it reads the ALE's own flags. Returns None for other
    environments, whose only truncation is the runner's ``max_steps_per_episode``.
    """
    import gymnasium

    # By the wrapper's class name: importing gym_lib here would register gin configurables
    # after the config is locked (the gin files import what they use).
    kind = type(environment).__name__
    inner = getattr(environment, "environment", None)
    if kind == "AtariPreprocessing":
        ale = getattr(getattr(inner, "unwrapped", None), "ale", None)
        return None if ale is None else _AleEndFlags(ale)
    if kind != "GymPreprocessing" or not isinstance(inner, gymnasium.Env):
        return None

    class EndRecorder(gymnasium.Wrapper):
        terminated = False
        truncated = False

        def reset(self, **kwargs):
            self.terminated = self.truncated = False
            return self.env.reset(**kwargs)

        def step(self, action):
            out = self.env.step(action)
            self.terminated, self.truncated = bool(out[2]), bool(out[3])
            return out

    recorder = EndRecorder(inner)
    environment.environment = recorder
    return recorder


@dataclasses.dataclass(frozen=True)
class Episode:
    """What :func:`play_episode` played: one game, from a reset to its end.

    Attributes:
      length: environment steps (int).
      total_reward: the sum of the game's rewards, unclipped (float).
      terminated: the game ended in a terminal state (False: a time limit cut it, or it
        was abandoned).
      abandoned: the caller's ``keep_going`` stopped it before its end; the agent's episode
        was not ended (nothing more of it is stored).
    """

    length: int
    total_reward: float
    terminated: bool
    abandoned: bool = False


def play_episode(
    environment: Any,
    agent: Any,
    end_recorder: Any,
    *,
    max_steps_per_episode: int,
    clip_rewards: bool,
    end_agent_episode: Callable[[float, bool], None],
    keep_going: Optional[Callable[[int], bool]] = None,
) -> Episode:
    """Plays one game of ``agent`` on ``environment``, as Dopamine's runner does.

    The game ends at ``environment.game_over``, at the end recorder's ``truncated`` (the
    environment's own time limit) or after ``max_steps_per_episode`` steps; the agent's
    episode then ends, terminal when the environment says the game terminated. A step whose
    ``is_terminal`` is set while the game goes on (a lost life under Atari's
    ``terminal_on_life_loss``) ends the agent's episode, as terminal, and the agent begins a
    new one on the next observation, within the same game.

    Args:
      environment: Dopamine's environment: ``reset() -> observation``, ``step(action) ->
        (observation, reward, is_terminal, info)``, ``game_over`` (bool).
      agent: Dopamine's agent: ``begin_episode(observation) -> action``,
        ``step(reward, observation) -> action``.
      end_recorder: :func:`install_end_recorder`'s result for ``environment``, or None.
      max_steps_per_episode: steps after which the game is cut (a truncation).
      clip_rewards: whether the agent sees rewards clipped to [-1, 1].
      end_agent_episode: ``(reward, terminal)``, called where the agent's episode ends (the
        runner's ``_end_episode``; an actor's ``agent.end_episode``).
      keep_going: called after each step that does not end the game, with the game's steps
        so far; False abandons the game there (an actor told to stop). None: never.

    Returns:
      The :class:`Episode` played.
    """
    length, total_reward = 0, 0.0
    action = agent.begin_episode(environment.reset())
    while True:
        observation, reward, is_terminal, _ = environment.step(action)
        total_reward += reward
        length += 1
        if clip_rewards:
            reward = np.clip(reward, -1, 1)
        truncated = end_recorder is not None and end_recorder.truncated
        if environment.game_over or truncated or length == max_steps_per_episode:
            break
        if is_terminal:  # a life lost, not the end of the game
            end_agent_episode(reward, True)
            action = agent.begin_episode(observation)
        else:
            action = agent.step(reward, observation)
        if keep_going is not None and not keep_going(length):
            return Episode(length, total_reward, terminated=False, abandoned=True)
    # A terminal state reached at the very step the time limit hits is a termination.
    terminated = bool(
        end_recorder.terminated if end_recorder is not None else environment.game_over
    )
    end_agent_episode(reward, terminated)
    return Episode(length, total_reward, terminated)
