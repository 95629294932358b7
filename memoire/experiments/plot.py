"""Learning curves from trackers: ``memoire plot D`` / ``python -m memoire.experiments.plot D``.

Reads every ``D/setting_<s>/run_<k>/episodes.csv`` and draws one line per setting: the mean
over runs of the episode return against training environment steps, with a band of one
standard deviation across runs (no band for a single run). Each run's episodes are first
averaged in bins of ``--bin`` environment steps, so runs with different episode boundaries
line up. The legend names each setting by its bindings (from
``setting.json``). Writes ``D/learning_curves.png`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
from typing import Sequence

import numpy as np

from memoire import cli
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
    # Eval rows carry the training steps of their iteration, a little past a multiple of the
    # iteration length (phases end on episode boundaries): rounding to the nearest bin puts
    # them on it, and aligns runs as it aligns train rows.
    bins = (np.maximum(1, np.round(steps / bin_steps)) * bin_steps).astype(np.int64)
    keys, inverse = np.unique(bins, return_inverse=True)
    sums = np.bincount(inverse, weights=returns)
    counts = np.bincount(inverse)
    return keys, sums / counts


def setting_label(run_dirs: Sequence[str], setting: int) -> str:
    path = os.path.join(run_dirs[0], "setting.json")
    try:
        with open(path) as f:
            bindings = json.load(f).get("bindings", [])
    except (OSError, ValueError):
        bindings = []
    text = "; ".join(b.replace(" ", "") for b in bindings)
    return f"setting {setting}" + (f": {text}" if text else "")


def aggregate(curves: Sequence[tuple[np.ndarray, np.ndarray]]):
    """Mean and standard deviation over runs at the x values all runs reached.

    Runs are aligned on x; a point is kept while at least one run has it, so a run that
    stopped early shortens the band, not the line.

    Returns:
      (x int64[n], mean float64[n], std float64[n], count int64[n]).
    """
    xs = np.unique(np.concatenate([c[0] for c in curves])) if curves else np.zeros(0, np.int64)
    table = np.full((len(curves), len(xs)), np.nan)
    for i, (x, y) in enumerate(curves):
        table[i, np.searchsorted(xs, x)] = y
    count = np.sum(~np.isnan(table), axis=0)
    with np.errstate(invalid="ignore"):
        mean = np.nanmean(table, axis=0) if len(curves) else np.zeros(0)
        std = np.nanstd(table, axis=0) if len(curves) else np.zeros(0)
    return xs, mean, std, count


def plot(base_dir: str, out: str | None = None, phase: str = "auto",
         bin_steps: int = 1000) -> str:
    """Draws the learning curves of ``base_dir`` to a PNG and returns its path.

    Args:
      phase: 'train', 'eval', or 'auto' (eval if any run has eval rows, else train).

    Raises:
      FileNotFoundError: if no run under ``base_dir`` has an episodes.csv.
      ValueError: if ``phase`` is unknown or ``bin_steps`` < 1, or if no run has an episode
        of ``phase`` (runs that failed or have not finished an episode): nothing is written.
      ImportError: matplotlib is not installed (there is something to draw).
    """
    if phase not in ("auto", "train", "eval"):
        raise ValueError(f"phase must be 'auto', 'train' or 'eval', got {phase!r}")
    if bin_steps < 1:
        raise ValueError(f"bin_steps must be >= 1, got {bin_steps}")
    runs = find_runs(base_dir)
    if not runs:
        raise FileNotFoundError(f"no setting_*/run_*/{trackers.EPISODES_FILE} under {base_dir}")
    if phase == "auto":
        has_eval = any("eval" in set(trackers.read_columns(
            os.path.join(d, trackers.EPISODES_FILE)).get("phase", []))
            for ds in runs.values() for d in ds)
        phase = "eval" if has_eval else "train"

    drawn = {}
    for setting, dirs in runs.items():
        curves = [binned_curve(d, phase, bin_steps) for d in dirs]
        curves = [c for c in curves if len(c[0])]
        if curves:
            drawn[setting] = (dirs, curves)
    if not drawn:
        raise ValueError(f"nothing to draw: no {phase} episode in the "
                         f"{sum(map(len, runs.values()))} run(s) under {base_dir} "
                         "(did they fail before finishing an episode?)")

    # Only now: what there is to draw was checked without matplotlib (not a core dependency).
    try:
        import matplotlib
    except ImportError:
        raise ImportError("memoire plot needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for setting, (dirs, curves) in drawn.items():
        x, mean, std, count = aggregate(curves)
        label = f"{setting_label(dirs, setting)} ({len(curves)} run{'s' * (len(curves) > 1)})"
        line, = ax.plot(x, mean, label=label[:90])
        if len(curves) > 1:
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("training environment steps")
    ax.set_ylabel(f"{phase} episode return (mean over runs, band: ±1 std)")
    ax.set_title(os.path.basename(os.path.abspath(base_dir)))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    out = out or os.path.join(base_dir, "learning_curves.png")
    fig.savefig(out)
    plt.close(fig)
    return out


def build_parser() -> cli.ArgumentParser:
    """The parser of ``memoire plot``."""
    p = cli.ArgumentParser(prog="memoire plot", description=__doc__.split("\n")[0])
    p.add_argument("base_dir", help="an experiment directory (memoire train's --base_dir)")
    p.add_argument("--out", default=None, help="PNG path (default D/learning_curves.png)")
    p.add_argument("--phase", default="auto", choices=("auto", "train", "eval"),
                   help="which episodes to draw; auto: eval if any run evaluated, else train")
    p.add_argument("--bin", type=int, default=1000, dest="bin_steps",
                   help="env steps per bin (use the runner's training_steps for eval curves)")
    return p


@cli.entry_point("memoire plot")
def main(argv: Sequence[str] | None = None) -> int:
    """``memoire plot D``. Returns the process exit code (2 when there is nothing to draw)."""
    args = build_parser().parse_args(argv)
    if not os.path.isdir(args.base_dir):
        raise cli.UsageError(f"base_dir {args.base_dir!r}: no such directory")
    if args.out is not None:
        cli.check_output_dir(os.path.dirname(os.path.abspath(args.out)), "--out")
    try:
        path = plot(args.base_dir, args.out, args.phase, args.bin_steps)
    except (FileNotFoundError, ValueError, ImportError) as e:
        raise cli.UsageError(e) from None
    cli.emit(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
