"""A small deterministic game with lives, in Dopamine's environment interface, for runs that
compare how episodes are stored (tests/system/test_episode_loop.py); gin files name it with
``import _lives_env`` and ``Runner.create_environment_fn = @create_lives_game``.

Game ``g`` (counted by resets from 0) has ``lives`` lives; life ``k`` lasts ``2 + (g + k) % 3``
steps. There is one action (``action_space.n == 1``) and the game ignores it, so any agent
plays the same transitions. An observation is ``float64[4]``: (game, life, step in the life,
1.0), life ``lives`` after the last one is lost. The reward is 1.0 per step and -2.0 on the step that loses a life (clipped to -1 by
Dopamine's runner). As Dopamine's ``AtariPreprocessing`` does under ``terminal_on_life_loss``,
``step`` reports ``is_terminal`` on a lost life as well as at the game's end; ``game_over`` is
set only when the last life is lost.
"""

import types

import gin
import numpy as np


class LivesGame:
    def __init__(self, lives: int = 3, terminal_on_life_loss: bool = False):
        self.action_space = types.SimpleNamespace(n=1)
        self._lives = int(lives)
        self._terminal_on_life_loss = bool(terminal_on_life_loss)
        self._game = -1
        self.game_over = True

    def _life_length(self) -> int:
        return 2 + (self._game + self._life) % 3

    def _observation(self) -> np.ndarray:
        return np.array([self._game, self._life, self._step, 1.0], np.float64)

    def reset(self) -> np.ndarray:
        self._game += 1
        self._life = self._step = 0
        self.game_over = False
        return self._observation()

    def step(self, action):
        if self.game_over:
            raise RuntimeError("step after the game ended: reset first")
        self._step += 1
        reward, life_lost = 1.0, self._step == self._life_length()
        if life_lost:
            reward = -2.0
            self._life, self._step = self._life + 1, 0
            self.game_over = self._life == self._lives
        is_terminal = self.game_over or (life_lost and self._terminal_on_life_loss)
        return self._observation(), reward, is_terminal, {}


@gin.configurable("create_lives_game")
def create_lives_game(lives: int = 3, terminal_on_life_loss: bool = False) -> LivesGame:
    return LivesGame(lives, terminal_on_life_loss)
