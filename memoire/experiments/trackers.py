"""Trackers: what a run has done, written as CSV while it runs, so a crash loses nothing.

Two files per run, both plain CSV with a header line:

- ``episodes.csv``, one row per finished episode, flushed at once:

  ============  ================================================================================
  iteration     the runner's iteration (checkpoint number) the episode belongs to
  phase         ``train`` or ``eval``
  actor         the actor that ran it (-1: the runner's own environment)
  episode       episode number within the run and phase, from 0
  env_steps     training environment steps of the whole run when the episode ended (for eval
                rows: the training steps done so far)
  return        undiscounted, unclipped sum of rewards
  length        steps in the episode
  terminated    1 if the environment reached a terminal state
  truncated     1 if a time limit (the environment's or the runner's) cut the episode short
  wall_time     seconds since the epoch when the episode ended
  ============  ================================================================================

  Exactly one of ``terminated`` and ``truncated`` is 1 in every row.

- ``replay.csv``, one row per iteration: ``iteration, wall_time, env_steps, replay_size,
  add_count, inserts_per_s, samples_per_s, memory`` (samples are transitions drawn, batch
  items counted; ``memory`` is the replay memory's class, ``module.Class``).

On resume from checkpoint ``c`` the trackers drop rows of iterations after ``c``: those belong
to the iteration the crash interrupted, which the runner will play again.

The replay figures also go to TensorBoard (:func:`replay_scalars`: the row's numbers and the
priorities' spread, tags ``replay/...``), written by the runner through Dopamine's collector
dispatcher into the run's event files.
"""

from __future__ import annotations

import csv
import os
import time
from typing import Any, Iterable, Sequence

import numpy as np

EPISODE_FIELDS = (
    "iteration",
    "phase",
    "actor",
    "episode",
    "env_steps",
    "return",
    "length",
    "terminated",
    "truncated",
    "wall_time",
)
REPLAY_FIELDS = (
    "iteration",
    "wall_time",
    "env_steps",
    "replay_size",
    "add_count",
    "inserts_per_s",
    "samples_per_s",
    "memory",
)
EPISODES_FILE = "episodes.csv"
REPLAY_FILE = "replay.csv"


class CsvTracker:
    """Appends rows to a CSV file, flushing each one.

    Args:
      path: the CSV file. Created with a header if missing.
      fields: column names, in order.
      keep_before_iteration: if given and the file exists, rows whose ``iteration`` is >= this
        are removed first (rewritten atomically), so a resumed run starts clean.

    Raises:
      ValueError: if an existing file's header differs from ``fields``.

    Not thread-safe: one writer per file.
    """

    def __init__(self, path: str, fields: Sequence[str], keep_before_iteration: int | None = None):
        self.path = path
        self.fields = tuple(fields)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if os.path.exists(path) and keep_before_iteration is not None:
            self._truncate(keep_before_iteration)
        fresh = not os.path.exists(path) or os.path.getsize(path) == 0
        if not fresh:
            with open(path, newline="") as f:
                header = tuple(next(csv.reader(f), ()))
            if header != self.fields:
                raise ValueError(f"{path}: expected columns {self.fields}, found {header}")
        self._file = open(path, "a", newline="")
        self._writer = csv.writer(self._file)
        if fresh:
            self._writer.writerow(self.fields)
            self._file.flush()

    def _truncate(self, keep_before_iteration: int) -> None:
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        if not rows:
            return
        header, body = rows[0], rows[1:]
        col = header.index("iteration") if "iteration" in header else None
        kept = [
            r
            for r in body
            if col is None or (len(r) == len(header) and int(r[col]) < keep_before_iteration)
        ]
        tmp = self.path + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(kept)
        os.replace(tmp, self.path)

    def write(self, **row: Any) -> None:
        """Appends one row and flushes it to the OS.

        Raises:
          ValueError: if ``row`` does not have exactly the tracker's fields.
        """
        if set(row) != set(self.fields):
            raise ValueError(f"expected fields {self.fields}, got {tuple(sorted(row))}")
        self._writer.writerow([_cell(row[k]) for k in self.fields])
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def _cell(v: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return repr(float(v))
    if isinstance(v, np.integer):
        return int(v)
    return v


class EpisodeTracker(CsvTracker):
    """``episodes.csv`` writer. See the module docstring for the columns."""

    def __init__(self, directory: str, keep_before_iteration: int | None = None):
        super().__init__(
            os.path.join(directory, EPISODES_FILE), EPISODE_FIELDS, keep_before_iteration
        )
        # Counters continue from the rows kept, so a resumed run numbers on.
        self.episodes = {"train": 0, "eval": 0}
        self.env_steps = 0
        for r in read_rows(self.path):
            self.episodes[r["phase"]] = self.episodes.get(r["phase"], 0) + 1
            if r["phase"] == "train":
                self.env_steps += int(r["length"])

    def record(
        self,
        *,
        iteration: int,
        phase: str,
        episode_return: float,
        length: int,
        terminated: bool,
        actor: int = -1,
        wall_time: float | None = None,
    ) -> None:
        """Records one finished episode; ``truncated`` is ``not terminated``.

        Raises:
          ValueError: if ``phase`` is not 'train' or 'eval' or ``length`` < 1.
        """
        if phase not in ("train", "eval"):
            raise ValueError(f"phase must be 'train' or 'eval', got {phase!r}")
        if int(length) < 1:
            raise ValueError(f"an episode has at least one step, got length {length}")
        if phase == "train":
            self.env_steps += int(length)
        self.write(
            iteration=iteration,
            phase=phase,
            actor=actor,
            episode=self.episodes[phase],
            env_steps=self.env_steps,
            **{"return": float(episode_return)},
            length=int(length),
            terminated=bool(terminated),
            truncated=not terminated,
            wall_time=time.time() if wall_time is None else wall_time,
        )
        self.episodes[phase] += 1


class ReplayTracker(CsvTracker):
    """``replay.csv`` writer: replay figures once per iteration."""

    def __init__(self, directory: str, keep_before_iteration: int | None = None):
        super().__init__(os.path.join(directory, REPLAY_FILE), REPLAY_FIELDS, keep_before_iteration)
        self._last: tuple[float, int, int] | None = None

    def record(
        self,
        *,
        iteration: int,
        env_steps: int,
        replay_size: int,
        add_count: int,
        sampled: int,
        memory: str = "",
    ) -> dict[str, Any]:
        """Records cumulative figures; rates are over the time since the previous call.

        Args:
          add_count: transitions ever inserted (cumulative).
          sampled: transitions ever sampled (cumulative, batch items).
          memory: the replay memory's class name.

        Returns:
          the row written (field -> value).
        """
        now = time.time()
        if self._last is None:
            ins_rate = smp_rate = float("nan")
        else:
            t0, a0, s0 = self._last
            dt = max(now - t0, 1e-9)
            ins_rate, smp_rate = (add_count - a0) / dt, (sampled - s0) / dt
        self._last = (now, add_count, sampled)
        row = dict(
            iteration=iteration,
            wall_time=now,
            env_steps=env_steps,
            replay_size=replay_size,
            add_count=add_count,
            inserts_per_s=ins_rate,
            samples_per_s=smp_rate,
            memory=memory,
        )
        self.write(**row)
        return row

    def start_clock(self, add_count: int, sampled: int) -> None:
        """Sets the reference point for the first row's rates."""
        self._last = (time.time(), add_count, sampled)


class ReplayProbe:
    """Reads size and counters from an agent's replay memory, whatever its kind.

    Supports Dopamine's JAX ``ReplayBuffer`` (``agent._replay``), Dopamine's TF
    ``WrappedReplayBuffer`` (``agent._replay.memory``) and any memory exposing
    ``add_count`` and ``__len__``. Samples are counted by wrapping the memory's sampling
    method on this instance (``sample`` or ``sample_transition_batch``); the class is not
    modified. A memory offering ``sample_count`` (memoire's buffers) is read directly
    instead.
    """

    def __init__(self, agent: Any):
        replay = getattr(agent, "_replay", None)
        self._memory = getattr(replay, "memory", replay)  # TF wrapper holds the real one
        self._sampled = 0
        if self._memory is not None and not hasattr(self._memory, "sample_count"):
            for name in ("sample", "sample_transition_batch"):
                fn = getattr(self._memory, name, None)
                if callable(fn):
                    setattr(self._memory, name, self._counting(fn))
                    break

    def _counting(self, fn):
        batch = (
            getattr(self._memory, "_batch_size", None)
            or getattr(self._memory, "batch_size", None)
            or 1
        )

        def sample(*args, **kwargs):
            n = (
                kwargs.get("batch_size")
                or kwargs.get("size")
                or (args[0] if args and isinstance(args[0], int) else None)
                or batch
            )
            self._sampled += int(n)
            return fn(*args, **kwargs)

        return sample

    @property
    def add_count(self) -> int:
        return int(getattr(self._memory, "add_count", 0) or 0)

    @property
    def size(self) -> int:
        m = self._memory
        if m is None:
            return 0
        if hasattr(m, "_memory") and hasattr(m._memory, "__len__"):  # Dopamine JAX buffer
            return len(m._memory)
        if hasattr(m, "__len__"):
            return len(m)
        cap = getattr(m, "_replay_capacity", None)  # Dopamine TF buffer: a full ring
        return min(self.add_count, cap) if cap else self.add_count

    @property
    def sampled(self) -> int:
        if hasattr(self._memory, "sample_count"):
            return int(self._memory.sample_count)
        return self._sampled

    def priorities(self) -> np.ndarray | None:
        """The priorities of the stored transitions (float, one per transition), or None for a
        memory without them (uniform sampling, or a kind this probe does not know).

        Every memoire face, local or remote (TF and JAX), answers ``stored_priorities()`` (a
        remote one in one call to its server). Dopamine's own buffers are read directly: the
        JAX ``ReplayBuffer``'s sampling distribution's sum tree, the TF prioritized buffer's
        sum tree leaves. Values are what the trees hold (for the JAX buffers, priorities raised
        to the priority exponent).
        """
        m = self._memory
        stored = getattr(m, "stored_priorities", None)
        if callable(stored):
            values = stored()
            return None if values is None else np.asarray(values, np.float64)
        dist = getattr(m, "_sampling_distribution", None)
        if dist is not None:  # Dopamine's JAX ReplayBuffer
            tree = getattr(dist, "_sum_tree", None)
            if tree is None:
                return None
            return np.asarray(tree.get(np.arange(dist.size)), np.float64)
        tree = getattr(m, "sum_tree", None)
        capacity = getattr(m, "_replay_capacity", None)
        if tree is None or capacity is None:
            return None
        n = min(self.add_count, int(capacity))
        nodes = getattr(tree, "nodes", None)  # Dopamine's TF buffer: leaves are the last level
        return None if nodes is None else np.asarray(nodes[-1][:n], np.float64)

    @property
    def name(self) -> str:
        """``module.Class`` of the memory (the wrapped one for TF agents); '' if none."""
        m = self._memory
        return "" if m is None else f"{type(m).__module__}.{type(m).__name__}"


# replay.csv columns -> TensorBoard tags (the same tags `memoire serve --tensorboard` writes).
REPLAY_TAGS = {
    "replay_size": "replay/size",
    "add_count": "replay/inserts",
    "inserts_per_s": "replay/inserts_per_s",
    "samples_per_s": "replay/samples_per_s",
    "env_steps": "replay/env_steps",
}


def priority_spread(priorities: np.ndarray | None) -> dict[str, float]:
    """``min``, ``mean``, ``max`` and ``std`` of ``priorities`` (float); {} for None or none."""
    if priorities is None or len(priorities) == 0:
        return {}
    p = np.asarray(priorities, np.float64)
    return {
        "min": float(p.min()),
        "mean": float(p.mean()),
        "max": float(p.max()),
        "std": float(p.std()),
    }


def replay_scalars(
    row: dict[str, Any], priorities: np.ndarray | None = None, sampled: int | None = None
) -> dict[str, float]:
    """The TensorBoard scalars of one replay.csv row (tag -> value, see :data:`REPLAY_TAGS`),
    ``replay/samples`` (transitions sampled, cumulative) when given, and the priorities' spread
    as ``replay/priority_{min,mean,max,std}``. Non-finite values (the first row's rates when no
    clock was started) are left out."""
    out = {tag: float(row[k]) for k, tag in REPLAY_TAGS.items() if k in row}
    if sampled is not None:
        out["replay/samples"] = float(sampled)
    for k, v in priority_spread(priorities).items():
        out[f"replay/priority_{k}"] = v
    return {k: v for k, v in out.items() if np.isfinite(v)}


def read_rows(path: str) -> list[dict[str, str]]:
    """All rows of a tracker CSV as dicts of strings; [] if the file is missing."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if None not in r.values()]


def read_columns(path: str, fields: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Columns of a tracker CSV as arrays (numbers as float64, ``phase`` as str)."""
    rows = read_rows(path)
    if not rows:
        return {}
    out = {}
    for k in fields or rows[0].keys():
        vals = [r[k] for r in rows]
        try:
            out[k] = np.asarray(vals, dtype=np.float64)
        except ValueError:
            out[k] = np.asarray(vals)
    return out
