"""The systems compared, each behind one small adapter with the same three verbs.

An adapter is built for one configuration (observation shape, stack, capacity, n-step,
prioritized), then ``add(k)`` adds ``k`` transitions from a fixed pool of frames and
``sample()`` draws one batch of ``cfg.batch`` (the batch size may change between calls)
*including next states*; ``update()`` sets priorities of the last batch where the system
supports it; ``content()`` gives the last batch as (states, actions, n-step rewards,
next states, terminals), so that a test can check every system returns the same things.
Adapters of missing packages raise ``Unavailable``.

Every system stores the same stream: episodes of ``episode_length`` steps, action 0, reward 1,
frames cycled from one pool of Atari-like frames (flat regions and a moving sprite, which
compress about as well as real ones; random noise would not, and would penalise Dopamine's JAX
buffer, which stores snappy-compressed stacks).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np


class Unavailable(Exception):
    """The system's package is not installed."""


@dataclasses.dataclass
class Config:
    obs_shape: tuple = (84, 84)
    obs_dtype: type = np.uint8
    stack: int = 4
    capacity: int = 100_000
    batch: int = 32
    n_step: int = 1
    prioritized: bool = False
    episode_length: int = 1000
    seed: int = 0

    @property
    def label(self) -> str:
        obs = "x".join(map(str, self.obs_shape))
        kind = "prioritized" if self.prioritized else "uniform"
        return (
            f"{obs} {np.dtype(self.obs_dtype).name} stack{self.stack} cap{self.capacity:.0e} "
            f"batch{self.batch} n{self.n_step} {kind}"
        )


def frame_pool(cfg: Config, n: int = 512) -> np.ndarray:
    """``n`` observations, cycled through by every adapter's add.

    Integer frames look like Atari screens: a background of flat 12x12 tiles from a small
    palette, plus a 6x6 sprite moving one pixel per frame. Float states are Gaussian.
    """
    rng = np.random.default_rng(cfg.seed)
    if not np.issubdtype(cfg.obs_dtype, np.integer):
        return rng.standard_normal((n, *cfg.obs_shape)).astype(cfg.obs_dtype)
    shape = tuple(cfg.obs_shape)
    if len(shape) != 2:
        return rng.integers(0, 255, (n, *shape), dtype=cfg.obs_dtype)
    h, w = shape
    palette = np.array([0, 40, 90, 144, 200], cfg.obs_dtype)
    tiles = palette[rng.integers(0, len(palette), (-(-h // 12), -(-w // 12)))]
    background = np.kron(tiles, np.ones((12, 12), cfg.obs_dtype))[:h, :w]
    frames = np.repeat(background[None], n, axis=0)
    for t in range(n):
        y, x = (t * 3) % (h - 6), t % (w - 6)
        frames[t, y : y + 6, x : x + 6] = 255
    return frames


# Transitions per bulk add call in fills: small enough that the temporary copy of their frames
# (256 x 7 KB) does not weigh in the memory figures.
FILL_CHUNK = 256


class System:
    name = "?"
    max_fill = None  # the most transitions fill() adds (slow adders); None: all asked

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.frames = frame_pool(cfg)
        self.count = 0
        self.rng = np.random.default_rng(cfg.seed + 1)

    def add(self, k: int) -> None:
        raise NotImplementedError

    def sample(self):
        raise NotImplementedError

    def update(self) -> None:
        raise NotImplementedError

    def content(self):
        """The last batch as (states, actions, n-step rewards, next states, terminals)."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases files or processes the adapter made (nothing by default)."""

    def _terminal(self, t: int) -> bool:
        return (t + 1) % self.cfg.episode_length == 0


class MemoireCore(System):
    """memoire.ReplayMemory, the native episodic layout: contiguous stacks
    ``[batch, stack, *obs]``, lambda-returns instead of n-step sums."""

    name = "memoire (ReplayMemory)"

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        import memoire

        z = np.zeros
        self.rem = memoire.ReplayMemory(
            z(cfg.obs_shape, cfg.obs_dtype),
            z([], np.int32),
            z([], np.float32),
            z([], np.float32),
            z([], np.float32),
            z([], np.float32),
            z([0], np.uint8),
            cfg.capacity,
        )
        self.rem.frame_stack = cfg.stack
        self.rem.multi_step = cfg.n_step
        self.rem.discount_factor = 0.99
        flags = np.zeros(14, bool)
        # prev s, a, q (the lambda-return: the native counterpart of an n-step return) and
        # next s: what a DQN learner reads.
        flags[[0, 1, 5, 7]] = True
        self.rem.cache_flags = flags
        self.rem.seed(cfg.seed)
        self.last = None

    def add(self, k: int) -> None:
        # Episodes of episode_length entries: opened at their first step, closed (returns and
        # priorities computed) at their last; one add_entry per step, add_entries for a fill.
        L = self.cfg.episode_length
        while k > 0:
            pos = self.count % L
            n = min(k, L - pos, FILL_CHUNK)
            if pos == 0:
                self.rem.new_episode()
            if n == 1:
                self.rem.add_entry(self.frames[self.count % len(self.frames)], 0, 1.0, 0.0, 0.0)
            else:
                idx = (self.count + np.arange(n)) % len(self.frames)
                self.rem.add_entries(
                    self.frames[idx],
                    np.zeros(n, np.int32),
                    np.ones(n, np.float32),
                    np.zeros(n, np.float32),
                    np.zeros(n, np.float32),
                    np.zeros((n, 0), np.uint8),
                    np.ones(n, np.float32),
                )
            self.count += n
            k -= n
            if self.count % L == 0:
                self.rem.close_episode()

    def sample(self):
        self.last = self.rem.get_batch(self.cfg.batch)
        return self.last

    def update(self) -> None:
        self.rem.update_weights(self.last.id, self.rng.random(len(self.last.id)).astype(np.float32))

    def content(self):
        b = self.last
        return b.prev[0], b.prev[1][:, -1], b.prev[5][:, -1], b.next[0], b.done


class NumpyRing(System):
    """A plain NumPy ring buffer: frames stored once, stacks gathered by fancy indexing into
    ``[batch, stack, *obs]`` (channel-first: the layout a NumPy user gets without a transpose).
    It ignores episode boundaries when stacking, as a minimal buffer would."""

    name = "numpy ring"

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.obs = np.zeros((cfg.capacity, *cfg.obs_shape), cfg.obs_dtype)
        self.act = np.zeros(cfg.capacity, np.int32)
        self.rew = np.zeros(cfg.capacity, np.float32)
        self.term = np.zeros(cfg.capacity, np.uint8)
        self.prio = np.ones(cfg.capacity, np.float64)
        self.cursor = 0
        self.size = 0
        self.last = None
        self.discounts = 0.99 ** np.arange(cfg.n_step, dtype=np.float32)

    def add(self, k: int) -> None:
        for _ in range(k):
            c = self.cursor
            self.obs[c] = self.frames[self.count % len(self.frames)]
            self.act[c] = 0
            self.rew[c] = 1.0
            self.term[c] = self._terminal(self.count)
            self.cursor = (c + 1) % self.cfg.capacity
            self.size = min(self.size + 1, self.cfg.capacity)
            self.count += 1

    def sample(self):
        cfg = self.cfg
        lo, hi = cfg.stack - 1, self.size - cfg.n_step
        if cfg.prioritized:
            p = self.prio[lo:hi]
            idx = lo + self.rng.choice(hi - lo, cfg.batch, p=p / p.sum())
        else:
            idx = self.rng.integers(lo, hi, cfg.batch)
        offsets = np.arange(-cfg.stack + 1, 1)
        state = self.obs[idx[:, None] + offsets]
        nxt = self.obs[idx[:, None] + cfg.n_step + offsets]
        steps = idx[:, None] + np.arange(cfg.n_step)
        # The n-step return stops at the first terminal (as Dopamine's and cpprb's).
        term = self.term[steps]
        alive = np.cumprod(
            np.concatenate([np.ones((len(idx), 1), np.uint8), 1 - term[:, :-1]], 1), 1
        )
        rew = (self.rew[steps] * self.discounts * alive).sum(1)
        self.last = idx
        self.batch = (state, self.act[idx], rew, nxt, term.max(1))
        return self.batch

    def update(self) -> None:
        self.prio[self.last] = self.rng.random(len(self.last))

    def content(self):
        return self.batch


class Cpprb(System):
    """cpprb's ReplayBuffer / PrioritizedReplayBuffer: channel-last stacks
    ``[batch, *obs, stack]`` stored with ``stack_compress`` (each frame once) and, for 1-step,
    ``next_of`` (next states not stored twice); ``Nstep`` for n-step returns (which stop at a
    terminal), with next states stored as a field of their own (cpprb's Nstep drops next_of's
    next states)."""

    name = "cpprb"

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        try:
            import cpprb
        except ImportError as e:
            raise Unavailable("cpprb") from e
        shape = (*cfg.obs_shape, cfg.stack)
        env = {
            "obs": {"shape": shape, "dtype": cfg.obs_dtype},
            "act": {"dtype": np.int32},
            "rew": {},
            "done": {},
        }
        compress = cfg.stack > 1
        if cfg.n_step == 1:
            kwargs = dict(next_of="obs", stack_compress="obs" if compress else None)
        else:
            # cpprb's Nstep does not return next_of's next states (it drops the key), so
            # next_obs is a stored field of its own here, stack-compressed too.
            env["next_obs"] = env["obs"]
            kwargs = dict(
                stack_compress=["obs", "next_obs"] if compress else None,
                Nstep={"size": cfg.n_step, "gamma": 0.99, "rew": "rew", "next": "next_obs"},
            )
        cls = cpprb.PrioritizedReplayBuffer if cfg.prioritized else cpprb.ReplayBuffer
        self.rb = cls(cfg.capacity, env, **kwargs)
        # Stacked observations, built once from the pool (cpprb takes whole stacks per add).
        f = self.frames
        self.stacks = np.stack([f[(np.arange(len(f)) + j) % len(f)] for j in range(cfg.stack)], -1)
        self.last = None

    def add(self, k: int) -> None:
        # One add per step, as an agent does; a fill (k > 1) adds up to the episode's end in
        # one call (cpprb takes leading batch dimensions), which is how cpprb fills fastest.
        L, P = self.cfg.episode_length, len(self.frames)
        while k > 0:
            n = min(k, L - self.count % L, FILL_CHUNK)
            i = (self.count + np.arange(n)) % P
            done = ((self.count + np.arange(n) + 1) % L == 0).astype(np.float32)
            if n == 1:
                self.rb.add(
                    obs=self.stacks[i[0]],
                    next_obs=self.stacks[(i[0] + 1) % P],
                    act=0,
                    rew=1.0,
                    done=done[0],
                )
            else:
                self.rb.add(
                    obs=self.stacks[i],
                    next_obs=self.stacks[(i + 1) % P],
                    act=np.zeros(n, np.int32),
                    rew=np.ones(n, np.float32),
                    done=done,
                )
            if done[-1]:  # the episode's last step
                self.rb.on_episode_end()
            self.count += n
            k -= n

    def sample(self):
        self.last = self.rb.sample(self.cfg.batch)
        return self.last

    def update(self) -> None:
        idx = self.last["indexes"]
        self.rb.update_priorities(idx, self.rng.random(len(idx)) + 1e-3)

    def content(self):
        b = self.last
        return b["obs"], b["act"][:, 0], b["rew"][:, 0], b["next_obs"], b["done"][:, 0]


class GatherCeiling(System):
    """The physical ceiling: one NumPy gather of the same rows a batch reads (states and next
    states), without any bookkeeping."""

    name = "ceiling: numpy gather"

    def __init__(self, cfg: Config, ring: Optional[NumpyRing] = None):
        super().__init__(cfg)
        self.ring = ring

    def add(self, k: int) -> None:  # shares the ring's storage
        pass

    def sample(self):
        cfg, ring = self.cfg, self.ring
        idx = self.rng.integers(cfg.stack - 1, ring.size - cfg.n_step, cfg.batch)
        rows = idx[:, None] + np.arange(-cfg.stack + 1, 1)
        return ring.obs[np.concatenate([rows, rows + cfg.n_step])]


class MemcpyCeiling(System):
    """The physical ceiling: one memcpy of as many bytes as a batch's states and next states."""

    name = "ceiling: memcpy"

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        nbytes = (
            2
            * cfg.batch
            * cfg.stack
            * int(np.prod(cfg.obs_shape))
            * np.dtype(cfg.obs_dtype).itemsize
        )
        self.src = np.ones(nbytes, np.uint8)
        self.dst = np.empty_like(self.src)

    def add(self, k: int) -> None:
        pass

    def sample(self):
        np.copyto(self.dst, self.src)
        return self.dst


# System classes in table order. The first one built for a workload is its baseline (the
# ratios' numerator): memoire's Dopamine-layout buffer once memoire.bench.dopamine registers it.
SAMPLERS: list[type] = [MemoireCore, NumpyRing, Cpprb]


def register(cls: type) -> type:
    """Adds a system adapter to the suite (used by memoire.bench.dopamine).

    A class with ``primary = True`` goes first (the baseline); other memoire adapters go after
    the memoire ones already there; the rest go last.
    """
    if cls in SAMPLERS:
        return cls
    if getattr(cls, "primary", False):
        SAMPLERS.insert(0, cls)
    elif cls.name.startswith("memoire"):
        SAMPLERS.insert(len([c for c in SAMPLERS if c.name.startswith("memoire")]), cls)
    else:
        SAMPLERS.append(cls)
    return cls
