"""Screens recorded from ALE games, as Dopamine's agents store them: uint8[84, 84] frames from
``dopamine.discrete_domains.atari_lib.create_atari_environment`` (grayscale, max over the last
two of 4 skipped frames, resized to 84x84, sticky actions), a random policy.

    PYTHONPATH=$PWD python benchmarks/_ale_frames.py --out /tmp/ale_frames.npy [--per-game 4000]

:func:`recorded` records once and caches the file, so benchmarks on both sides of a comparison
(memoire's and Reverb's interpreters) read the same frames. Needs dopamine-rl and ale-py (which
ships the ROMs).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

GAMES = ("Pong", "Breakout", "SpaceInvaders")
DEFAULT_PATH = os.path.join("/tmp", "memoire-ale-frames.npy")


def record_game(game: str, frames: int, seed: int = 0) -> np.ndarray:
    """uint8[frames, 84, 84]: consecutive frames of `game` (Dopamine's name, e.g. "Pong") under
    random actions; episodes restart on game over."""
    from dopamine.discrete_domains import atari_lib

    rng = np.random.default_rng(seed)
    out = np.empty((frames, 84, 84), np.uint8)
    env = atari_lib.create_atari_environment(game_name=game, sticky_actions=True)
    env.environment.reset(seed=seed)
    obs = env.reset()
    for k in range(frames):
        out[k] = obs[..., 0]
        obs, _, done, _ = env.step(int(rng.integers(env.action_space.n)))
        if done:
            obs = env.reset()
    return out


def record(games=GAMES, per_game: int = 4000, seed: int = 0) -> np.ndarray:
    """uint8[len(games) * per_game, 84, 84]: `per_game` consecutive frames of each game."""
    return np.concatenate([record_game(g, per_game, seed) for g in games])


def recorded(path: str = DEFAULT_PATH, per_game: int = 4000) -> str:
    """The path of a .npy file of recorded frames, recording it first when it is missing."""
    if not os.path.exists(path):
        frames = record(per_game=per_game)
        tmp = path + f".{os.getpid()}.tmp.npy"
        np.save(tmp, frames)
        os.replace(tmp, path)
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_PATH)
    ap.add_argument("--per-game", type=int, default=4000)
    args = ap.parse_args()
    print(recorded(args.out, args.per_game))
