"""Learning curves from trackers: what ``memoire plot D`` draws (:mod:`memoire.commands.plot`).

Reads every ``D/setting_<s>/run_<k>/episodes.csv`` and draws one line per setting: the
interquartile mean (IQM) over runs of the episode return against training environment steps,
with a band of its 95% bootstrap confidence interval (no band for a single run), as rliable
(Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice") reports results.
``--raw`` also draws every run's own curve. Each run's train episodes are first averaged in bins
of ``--bin`` environment steps, so runs with different episode boundaries line up; its eval
episodes per iteration, the runs' points of one iteration lining up. The legend names
each setting by its bindings (from ``setting.json``). Writes ``D/learning_curves.png`` unless
``--out`` says otherwise.
"""

from __future__ import annotations

import glob
import json
import os
import re
import warnings
from typing import Sequence

import numpy as np

from memoire.experiments import trackers

_RUN_RE = re.compile(r"setting_(\d+)[/\\]run_(\d+)$")


def find_runs(base_dir: str) -> dict[int, list[str]]:
    """``{setting: [run directories]}`` for runs under ``base_dir`` that have episodes;
    ``{0: [base_dir]}`` when ``base_dir`` is itself a run (a runner built in code, such as
    ``runner.create_runner(base_dir)``, writes its trackers there)."""
    if os.path.exists(os.path.join(base_dir, trackers.EPISODES_FILE)):
        return {0: [base_dir]}
    out: dict[int, list[str]] = {}
    for d in sorted(glob.glob(os.path.join(base_dir, "setting_*", "run_*"))):
        m = _RUN_RE.search(d)
        if m and os.path.exists(os.path.join(d, trackers.EPISODES_FILE)):
            out.setdefault(int(m.group(1)), []).append(d)
    return dict(sorted(out.items()))


def binned_curve(run_dir: str, phase: str, bin_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """One run's mean return per bin of training env steps.

    Returns:
      (bin_ends int64[n], mean_return float64[n]); bins with no episode are left out.
    """
    cols = trackers.read_columns(os.path.join(run_dir, trackers.EPISODES_FILE))
    if not cols:
        return np.zeros(0, np.int64), np.zeros(0)
    mask = cols["phase"] == phase
    steps, returns = cols["env_steps"][mask], cols["return"][mask]
    bins = (np.maximum(1, np.round(steps / bin_steps)) * bin_steps).astype(np.int64)
    keys, inverse = np.unique(bins, return_inverse=True)
    sums = np.bincount(inverse, weights=returns)
    counts = np.bincount(inverse)
    return keys, sums / counts


def iteration_curve(run_dir: str, phase: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One run's mean return per iteration, and the training env steps at its end.

    Eval rows carry the training steps of their iteration: a little past a multiple of the
    iteration length, by an amount that grows with each iteration and differs between runs
    (phases end on episode boundaries), so runs are aligned on the iteration, not on steps.

    Returns:
      (iteration int64[n], env_steps float64[n], mean_return float64[n]); iterations with no
      episode of ``phase`` are left out.
    """
    cols = trackers.read_columns(os.path.join(run_dir, trackers.EPISODES_FILE))
    if not cols:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    mask = cols["phase"] == phase
    keys, inverse = np.unique(cols["iteration"][mask].astype(np.int64), return_inverse=True)
    counts = np.bincount(inverse)
    steps = np.bincount(inverse, weights=cols["env_steps"][mask]) / counts
    return keys, steps, np.bincount(inverse, weights=cols["return"][mask]) / counts


def run_table(run_dirs: Sequence[str], phase: str, bin_steps: int):
    """One setting's runs on common points: train episodes in bins of ``bin_steps`` env steps
    (binned_curve), eval episodes per iteration (iteration_curve) placed at the runs' mean
    training env steps.

    Returns:
      (x float64[m], table float64[runs, m]) as align's, or None when no run has an episode of
      ``phase`` (runs without one are left out).
    """
    if phase != "eval":
        curves = [binned_curve(d, phase, bin_steps) for d in run_dirs]
        curves = [c for c in curves if len(c[0])]
        return align(curves) if curves else None
    per_run = [c for c in (iteration_curve(d, phase) for d in run_dirs) if len(c[0])]
    if not per_run:
        return None
    _, table = align([(it, ret) for it, _, ret in per_run])
    _, steps = align([(it, st) for it, st, _ in per_run])
    return np.nanmean(steps, axis=0), table


def setting_label(run_dirs: Sequence[str], setting: int) -> str:
    """The legend's name of a setting: its sweep bindings, then the command line's."""
    path = os.path.join(run_dirs[0], "setting.json")
    try:
        with open(path) as f:
            record = json.load(f)
        bindings = list(record.get("bindings", [])) + list(record.get("gin_bindings", []))
    except (OSError, ValueError, AttributeError, TypeError):
        bindings = []
    text = "; ".join(b.replace(" ", "") for b in bindings)
    return f"setting {setting}" + (f": {text}" if text else "")


# ---------------------------------------------------------------------------------------------
# Aggregation over runs: interquartile mean and its stratified bootstrap confidence interval.

IQM_LOW, IQM_HIGH = 0.25, 0.75  # the IQM averages the scores between these quantiles


def align(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Puts runs' curves on common x values.

    Args:
      curves: one ``(x, y)`` per run, 1-D arrays of one length, x distinct (binned_curve's).

    Returns:
      (x int64[m], table float64[runs, m]): every x any run reached, and each run's y there,
      NaN where the run has none (a run that stopped early).

    Raises:
      ValueError: no curve, or a curve whose x and y are not 1-D of one length, or repeat an x.
    """
    if len(curves) == 0:
        raise ValueError("no runs: need at least one (x, y) curve to aggregate")
    pairs = []
    for i, (x, y) in enumerate(curves):
        x, y = np.asarray(x), np.asarray(y, dtype=np.float64)
        if x.ndim != 1 or x.shape != y.shape:
            raise ValueError(
                f"run {i}: x and y must be 1-D arrays of one length, got shapes "
                f"{x.shape} and {y.shape}"
            )
        if len(np.unique(x)) != len(x):
            raise ValueError(f"run {i}: x values must be distinct (one y per x)")
        pairs.append((x, y))
    xs = np.unique(np.concatenate([x for x, _ in pairs])).astype(np.int64)
    table = np.full((len(pairs), len(xs)), np.nan)
    for i, (x, y) in enumerate(pairs):
        table[i, np.searchsorted(xs, x)] = y
    return xs, table


def _check_scores(scores) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim not in (1, 2) or s.shape[0] == 0:
        raise ValueError(
            f"scores must be float[runs] or float[runs, points] with at least one "
            f"run, got shape {s.shape}"
        )
    return s


def _iqm_runs_first(s: np.ndarray) -> np.ndarray:
    """IQM over axis 0 of ``s`` (runs first, any trailing shape; NaN = no score)."""
    runs = s.shape[0]
    ordered = np.sort(s, axis=0)  # NaN sort last
    n = np.sum(~np.isnan(s), axis=0)  # scores per column, shape s.shape[1:]
    # The i-th smallest of n scores holds the quantiles [i/n, (i+1)/n]; its weight is the part
    # of that interval inside [0.25, 0.75], over 0.5. With n a multiple of 4 this is the plain
    # mean of the middle n/2 scores (scipy.stats.trim_mean(s, 0.25), rliable's IQM); otherwise
    # the two boundary scores count in part, so 3 runs give weights 1/6, 2/3, 1/6, not the mean.
    i = np.arange(runs, dtype=np.float64).reshape((runs,) + (1,) * (s.ndim - 1))
    nf = np.maximum(n, 1).astype(np.float64)
    w = np.clip(np.minimum((i + 1) / nf, IQM_HIGH) - np.maximum(i / nf, IQM_LOW), 0.0, None)
    w = np.where(i < n, w / (IQM_HIGH - IQM_LOW), 0.0)
    total = np.sum(np.where(w > 0, w * ordered, 0.0), axis=0)  # 0 * NaN would be NaN
    return np.where(n > 0, total, np.nan)


def iqm(scores) -> np.ndarray:
    """Interquartile mean over runs: the mean of the middle 50% of the runs' scores.

    Args:
      scores: float[runs] or float[runs, points] (e.g. align's table); NaN = the run has no
        score there and is left out of that point.

    Returns:
      float64[points] (a 0-d array for float[runs]); NaN where no run has a score.

    Raises:
      ValueError: scores is not 1-D or 2-D, or has no run.
    """
    return _iqm_runs_first(_check_scores(scores))


def iqm_ci(
    scores,
    *,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    max_elements: int = 1 << 24,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap confidence interval of ``iqm(scores)``, as rliable computes it.

    Each of ``reps`` resamples draws ``runs`` runs with replacement from the runs (the stratum:
    one setting's runs; settings are resampled apart), whole curves at a time, and takes their
    IQM at every point; the interval is the (1 - confidence) / 2 and (1 + confidence) / 2
    quantiles of those IQMs. All resamples are drawn as one index array and evaluated in
    blocks of at most ``max_elements`` scores (memory), not one by one.

    Args:
      scores: float[runs] or float[runs, points], NaN = no score (see iqm).
      reps: number of bootstrap resamples (>= 1).
      confidence: the interval's coverage, in (0, 1).
      seed: seeds numpy's default_rng: the same seed and scores give the same interval.

    Returns:
      (low, high), each float64[points] (0-d for float[runs]).

    Raises:
      ValueError: bad scores (see iqm), reps < 1 or confidence outside (0, 1).
    """
    s = _check_scores(scores)
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    runs = s.shape[0]
    idx = np.random.default_rng(seed).integers(0, runs, size=(reps, runs))
    stats = np.empty((reps,) + s.shape[1:])
    block = max(1, max_elements // s.size)
    for start in range(0, reps, block):  # a few blocks, each one array op over its resamples
        sample = s[idx[start : start + block]]  # (b, runs, ...)
        stats[start : start + block] = _iqm_runs_first(np.moveaxis(sample, 1, 0))
    tail = 100.0 * (1.0 - confidence) / 2.0
    with warnings.catch_warnings():  # a point no run reached: NaN, said by the return value
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high = np.nanpercentile(stats, [tail, 100.0 - tail], axis=0)
    return low, high


def plot(
    base_dir: str,
    out: str | None = None,
    phase: str = "auto",
    bin_steps: int = 1000,
    *,
    raw: bool = False,
    reps: int = 2000,
    seed: int = 0,
) -> str:
    """Draws the learning curves of ``base_dir`` to a PNG and returns its path.

    Each setting: the IQM over its runs and the 95% bootstrap confidence band (iqm, iqm_ci).

    Args:
      phase: 'train', 'eval', or 'auto' (eval if any run has eval rows, else train).
      raw: also draw every run's own curve (thin, in its setting's colour).
      reps, seed: the bootstrap's resamples and seed (the same seed draws the same band).

    Raises:
      FileNotFoundError: if no run under ``base_dir`` has an episodes.csv.
      ValueError: if ``phase`` is unknown, ``bin_steps`` or ``reps`` < 1, or if no run has an
        episode of ``phase`` (runs that failed or have not finished an episode): nothing is
        written.
      ImportError: matplotlib is not installed (there is something to draw).
    """
    if phase not in ("auto", "train", "eval"):
        raise ValueError(f"phase must be 'auto', 'train' or 'eval', got {phase!r}")
    if bin_steps < 1:
        raise ValueError(f"bin_steps must be >= 1, got {bin_steps}")
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    runs = find_runs(base_dir)
    if not runs:
        raise FileNotFoundError(f"no setting_*/run_*/{trackers.EPISODES_FILE} under {base_dir}")
    if phase == "auto":
        has_eval = any(
            "eval"
            in set(trackers.read_columns(os.path.join(d, trackers.EPISODES_FILE)).get("phase", []))
            for ds in runs.values()
            for d in ds
        )
        phase = "eval" if has_eval else "train"

    drawn = {}
    for setting, dirs in runs.items():
        table = run_table(dirs, phase, bin_steps)
        if table is not None:
            drawn[setting] = (dirs, table)
    if not drawn:
        raise ValueError(
            f"nothing to draw: no {phase} episode in the "
            f"{sum(map(len, runs.values()))} run(s) under {base_dir} "
            "(did they fail before finishing an episode?)"
        )

    # Only now: what there is to draw was checked without matplotlib (not a core dependency).
    try:
        import matplotlib
    except ImportError:
        raise ImportError("memoire plot needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = draw(
        drawn,
        phase,
        raw=raw,
        reps=reps,
        seed=seed,
        title=os.path.basename(os.path.abspath(base_dir)),
    )
    out = out or os.path.join(base_dir, "learning_curves.png")
    # "tight": the saved picture grows to hold the legend below the axes, whole.
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return out


LEGEND_WIDTH = 100  # characters per legend line; longer setting names wrap (never cut)


def draw(drawn: dict, phase: str, *, raw: bool, reps: int, seed: int, title: str):
    """The figure of :func:`plot`: ``drawn`` maps a setting to ``(run_dirs, (x, table))``
    (:func:`run_table`'s). The legend sits below the axes, off the data, each setting's name
    whole (wrapped at :data:`LEGEND_WIDTH` characters); save with ``bbox_inches="tight"`` so
    that the picture holds it. Needs matplotlib (imported by the caller)."""
    import textwrap

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for setting, (dirs, (x, table)) in drawn.items():
        center = iqm(table)
        n = len(table)
        label = f"{setting_label(dirs, setting)} ({n} run{'s' * (n > 1)})"
        label = "\n".join(textwrap.wrap(label, LEGEND_WIDTH, subsequent_indent="    "))
        (line,) = ax.plot(x, center, label=label, linewidth=2)
        if n > 1:
            low, high = iqm_ci(table, reps=reps, seed=seed)
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2)
        if raw:
            for row in table:
                ax.plot(x, row, color=line.get_color(), linewidth=0.7, alpha=0.45)
    ax.set_xlabel("training environment steps")
    ax.set_ylabel(
        f"{phase} episode return\n(IQM over runs, band: 95% bootstrap CI"
        + (", thin: each run)" if raw else ")")
    )
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    # Below the x label, left-aligned with the axes: outside the data whatever its shape.
    ax.legend(
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(0.0, -0.13),
        borderaxespad=0.0,
        frameon=False,
    )
    return fig
