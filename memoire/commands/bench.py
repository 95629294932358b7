"""``memoire bench``: run the benchmark suite and print a table of ratios.

Parses the command line; :func:`memoire.bench.run_suite` runs the workloads (described in
:mod:`memoire.bench`).
"""

from __future__ import annotations

import os
import sys

from memoire import bench, cli


def build_parser() -> cli.ArgumentParser:
    """The parser of ``memoire bench``."""
    parser = cli.ArgumentParser(prog="memoire bench", description=bench.__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small capacities and fewer workloads, 3 repetitions (about 3 min)",
    )
    parser.add_argument(
        "--large",
        action="store_true",
        help="fill the 84x84 capacity-1,000,000 buffers completely (about 7 GB "
        "per system) instead of with 100,000 transitions",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="alternating repetitions per workload; medians are reported "
        "(default: 3 with --quick, else 5)",
    )
    parser.add_argument(
        "--out", default=None, help="write the report (markdown) here, and scaling.png next to it"
    )
    return parser


@cli.entry_point("memoire bench")
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.out is not None:
        cli.check_output_dir(os.path.dirname(os.path.abspath(args.out)), "--out")
    text = bench.run_suite(args)
    cli.emit(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
