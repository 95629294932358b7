"""Adapters for Dopamine's replay buffers and memoire's drop-ins for them.

Four pairs of the same API, each timed side by side:

- ``memoire (Dopamine layout)``: memoire.dopamine_compat.OutOfGraph(Prioritized)ReplayBuffer,
  the like-for-like row against Dopamine and cpprb (channel-last stacks
  ``uint8[batch, 84, 84, stack]``, n-step rewards, next states, terminals). It is the baseline
  of every sampling workload.
- ``dopamine (OutOfGraph)``: dopamine.tf.replay_memory's OutOfGraph(Prioritized)ReplayBuffer.
- ``memoire (JAX ReplayBuffer)`` and ``dopamine (JAX ReplayBuffer)``: the Dopamine 4 JAX
  ``ReplayBuffer`` with a TransitionAccumulator and a uniform or prioritized distribution.

Dopamine's own buffers add in Python (tens to hundreds of microseconds per step), so they are
filled with at most ``max_fill`` transitions; their capacity is still the stated one, and the
table names the fill. Sampling cost does not depend on the fill once the stored frames exceed
the CPU caches (a few MB).

Importing this module registers the adapters with :func:`memoire.bench.systems.register`; it
raises ImportError when dopamine-rl is not installed (the suite then runs without these rows).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import dopamine  # noqa: F401  (ImportError here: the suite runs without these rows)
import numpy as np

from memoire.bench.systems import FILL_CHUNK, Config, System, Unavailable, register


def _dopamine_kwargs(cfg: Config) -> dict:
    return dict(
        observation_shape=tuple(cfg.obs_shape),
        stack_size=cfg.stack,
        replay_capacity=cfg.capacity,
        batch_size=cfg.batch,
        update_horizon=cfg.n_step,
        gamma=0.99,
        observation_dtype=cfg.obs_dtype,
    )


class _OutOfGraph(System):
    """The TF-era OutOfGraph(Prioritized)ReplayBuffer API: add, sample_transition_batch,
    set_priority, save, load."""

    max_fill = None  # transitions added at most by fill(); None: as many as asked

    def _classes(self):
        raise NotImplementedError

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        uniform, prioritized = self._classes()
        self.buf = (prioritized if cfg.prioritized else uniform)(**_dopamine_kwargs(cfg))
        self.last = None

    def _one(self, t: int) -> None:
        args = (self.frames[t % len(self.frames)], 0, 1.0, self._terminal(t))
        if self.cfg.prioritized:
            self.buf.add(*args, 1.0)
        else:
            self.buf.add(*args)

    def add(self, k: int) -> None:
        for _ in range(k):
            self._one(self.count)
            self.count += 1

    def sample(self):
        self.last = self.buf.sample_transition_batch(self.cfg.batch)
        return self.last

    def content(self):
        state, action, reward, next_state, _, _, terminal, *_ = self.last
        return state, action, reward, next_state, terminal

    def update(self) -> None:
        idx = self.last[7]
        self.buf.set_priority(idx, self.rng.random(len(idx)).astype(np.float32) + 1e-3)

    # Checkpoints: one directory per adapter, iteration 0 overwritten each time.
    def _ckpt_dir(self) -> str:
        if getattr(self, "_dir", None) is None:
            self._dir = tempfile.mkdtemp(prefix="memoire-bench-")
        return self._dir

    def save(self) -> None:
        self.buf.save(self._ckpt_dir(), 0)

    def load(self) -> None:
        self.buf.load(self._ckpt_dir(), 0)

    def close(self) -> None:
        if getattr(self, "_dir", None):
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


@register
class MemoireOutOfGraph(_OutOfGraph):
    name = "memoire (Dopamine layout)"
    primary = True

    def _classes(self):
        from memoire.dopamine_compat import (
            OutOfGraphPrioritizedReplayBuffer,
            OutOfGraphReplayBuffer,
        )

        return OutOfGraphReplayBuffer, OutOfGraphPrioritizedReplayBuffer

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.buf.seed(cfg.seed)

    def add(self, k: int) -> None:
        if k == 1:  # the per-step path of an agent
            self._one(self.count)
            self.count += 1
            return
        while k > 0:  # bulk fill: memoire's add_batch, the same transitions as k add() calls
            n = min(k, FILL_CHUNK)
            t = self.count + np.arange(n)
            pr = np.ones(n) if self.cfg.prioritized else None
            self.buf.add_batch(
                self.frames[t % len(self.frames)],
                np.zeros(n, np.int32),
                np.ones(n, np.float32),
                ((t + 1) % self.cfg.episode_length == 0),
                priorities=pr,
            )
            self.count += n
            k -= n


@register
class DopamineOutOfGraph(_OutOfGraph):
    name = "dopamine (OutOfGraph)"
    max_fill = 100_000

    def _classes(self):
        try:
            from absl import logging
            from dopamine.tf.replay_memory import circular_replay_buffer as crb
            from dopamine.tf.replay_memory import prioritized_replay_buffer as prb
        except ImportError as e:
            raise Unavailable("dopamine.tf (tensorflow)") from e
        logging.set_verbosity(logging.WARNING)
        return crb.OutOfGraphReplayBuffer, prb.OutOfGraphPrioritizedReplayBuffer


class _Jax(System):
    """Dopamine 4's JAX ReplayBuffer API: add(TransitionElement), sample, update, save, load."""

    max_fill = None

    def _modules(self):
        raise NotImplementedError

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        try:
            from dopamine.jax.replay_memory import elements
        except ImportError as e:
            raise Unavailable("dopamine.jax (jax)") from e
        self.elements = elements
        acc_mod, dist_mod, buf_cls = self._modules()
        acc = acc_mod.TransitionAccumulator(
            stack_size=cfg.stack, update_horizon=cfg.n_step, gamma=0.99
        )
        dist = (
            dist_mod.PrioritizedSamplingDistribution(cfg.seed, max_capacity=cfg.capacity)
            if cfg.prioritized
            else dist_mod.UniformSamplingDistribution(cfg.seed)
        )
        self.buf = buf_cls(acc, dist, batch_size=cfg.batch, max_capacity=cfg.capacity)
        self.last = None

    def add(self, k: int) -> None:
        kw = {"priority": 1.0} if self.cfg.prioritized else {}
        te = self.elements.TransitionElement
        for _ in range(k):
            t = self.count
            self.buf.add(te(self.frames[t % len(self.frames)], 0, 1.0, self._terminal(t)), **kw)
            self.count += 1

    def sample(self):
        self.last = self.buf.sample(self.cfg.batch, with_sample_metadata=True)
        return self.last

    def content(self):
        e = self.last[0]
        return e.state, e.action, e.reward, e.next_state, e.is_terminal

    def update(self) -> None:
        keys = self.last[1].keys
        self.buf.update(keys, priorities=self.rng.random(len(keys)) + 1e-3)

    def _ckpt_dir(self) -> str:
        if getattr(self, "_dir", None) is None:
            self._dir = tempfile.mkdtemp(prefix="memoire-bench-")
        return self._dir

    def save(self) -> None:
        # orbax keeps at most checkpoint_duration steps; one fresh step per save.
        self._step = getattr(self, "_step", 0) + 1
        self.buf.save(os.path.join(self._ckpt_dir(), "ckpt"), self._step)

    def load(self) -> None:
        self.buf.load(os.path.join(self._ckpt_dir(), "ckpt"), self._step)

    def close(self) -> None:
        if getattr(self, "_dir", None):
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


@register
class MemoireJax(_Jax):
    name = "memoire (JAX ReplayBuffer)"

    def _modules(self):
        from memoire.dopamine_compat import jax_replay_buffer as mj

        return mj, mj, mj.ReplayBuffer


@register
class DopamineJax(_Jax):
    name = "dopamine (JAX ReplayBuffer)"
    max_fill = 30_000

    def _modules(self):
        from dopamine.jax.replay_memory import accumulator, replay_buffer, samplers

        return accumulator, samplers, replay_buffer.ReplayBuffer


# The save/load pairs (memoire's drop-in first: the ratio's baseline).
CHECKPOINT_PAIRS = ((MemoireOutOfGraph, DopamineOutOfGraph), (MemoireJax, DopamineJax))
