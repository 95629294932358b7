"""``memoire plot D``: draw the learning curves of an experiment directory to a PNG.

Parses the command line; :func:`memoire.experiments.plot.plot` draws (the curves, the IQM and
its bootstrap band are described there). ``python -m memoire.commands.plot D`` is the same.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from memoire import cli
from memoire.experiments import plot


def build_parser() -> cli.ArgumentParser:
    """The parser of ``memoire plot``."""
    p = cli.ArgumentParser(
        prog="memoire plot",
        description="Learning curves from trackers: the IQM of runs with a 95% band, to a PNG.",
    )
    p.add_argument("base_dir", help="an experiment directory (memoire train's --base_dir)")
    p.add_argument("--out", default=None, help="PNG path (default D/learning_curves.png)")
    p.add_argument(
        "--phase",
        default="auto",
        choices=("auto", "train", "eval"),
        help="which episodes to draw; auto: eval if any run evaluated, else train",
    )
    p.add_argument(
        "--bin",
        type=int,
        default=1000,
        dest="bin_steps",
        help="env steps per bin of train episodes (eval episodes: one point per iteration)",
    )
    add_statistics_arguments(p)
    return p


def add_statistics_arguments(p: cli.ArgumentParser) -> None:
    """``memoire plot``'s flags for the IQM band and the raw curves."""
    p.add_argument(
        "--raw",
        action="store_true",
        help="also draw each run's own curve beside the IQM and its band",
    )
    p.add_argument(
        "--reps",
        type=int,
        default=2000,
        help="bootstrap resamples of the 95%% confidence band (default 2000)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the bootstrap's random seed (default 0: the same band every time)",
    )


@cli.entry_point("memoire plot")
def main(argv: Sequence[str] | None = None) -> int:
    """``memoire plot D``. Returns the process exit code (2 when there is nothing to draw)."""
    args = build_parser().parse_args(argv)
    if not os.path.isdir(args.base_dir):
        raise cli.UsageError(f"base_dir {args.base_dir!r}: no such directory")
    if args.out is not None:
        cli.check_output_dir(os.path.dirname(os.path.abspath(args.out)), "--out")
    try:
        path = plot.plot(
            args.base_dir,
            args.out,
            args.phase,
            args.bin_steps,
            raw=args.raw,
            reps=args.reps,
            seed=args.seed,
        )
    except (FileNotFoundError, ValueError, ImportError) as e:
        raise cli.UsageError(e) from None
    cli.emit(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
