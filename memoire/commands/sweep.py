"""``memoire sweep``: list or run the settings of a hyperparameter sweep.

    memoire sweep list SWEEP.gin [--runs R]
    memoire sweep run SWEEP.gin --base_dir D --indices 0-7 [--parallel 2] [--gin_bindings B]
    memoire sweep run SWEEP.gin --base_dir D --indices 0-7 --launcher ray [--ray_address A]
    memoire sweep slurm SWEEP.gin --base_dir D --indices 0-99 [--submit] [--cpus 4 --gpus 1]

Parses the command line; :mod:`memoire.experiments.sweep` reads sweeps and runs the indices
(the sweep file's syntax is described there).
"""

from __future__ import annotations

import sys
from typing import Sequence

from memoire import cli
from memoire.experiments import sweep


def build_parser() -> cli.ArgumentParser:
    """The parser of ``memoire sweep`` (sub-commands ``list``, ``run`` and ``slurm``)."""
    parser = cli.ArgumentParser(
        prog="memoire sweep",
        description="Hyperparameter sweeps over gin bindings: one file lists candidates, "
        "an index picks one.",
    )
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{list,run,slurm}",
        help="list: print the table of indices; run: run indices; "
        "slurm: a SLURM job array of indices",
    )
    p_list = sub.add_parser("list", help="print the table of indices and settings")
    p_list.add_argument("sweep", help="sweep gin file")
    p_list.add_argument("--runs", type=int, default=1, help="runs per setting to list")
    p_run = sub.add_parser("run", help="run several indices locally")
    p_run.add_argument("sweep", help="sweep gin file")
    p_run.add_argument(
        "--base_dir",
        required=True,
        help="experiment directory; each index's log is run_dir/train.log",
    )
    p_run.add_argument("--indices", required=True, help="e.g. 0-7 or 0,3,5-6")
    p_run.add_argument("--parallel", type=int, default=1, help="memoire train processes at once")
    p_run.add_argument(
        "--gin_files",
        action="append",
        default=[],
        help="extra gin files, parsed after the sweep's own includes (so they win over them)",
    )
    p_run.add_argument(
        "--gin_bindings",
        action="append",
        default=[],
        help="gin binding passed to every run (repeatable); wins over the sweep",
    )
    _add_launcher_arguments(p_run, sub)
    return parser


def _add_launcher_arguments(p_run, sub) -> None:
    """``sweep run``'s Ray options and the ``sweep slurm`` sub-command."""
    p_run.add_argument(
        "--launcher",
        choices=("local", "ray"),
        default="local",
        help="local: --parallel processes here; ray: each index a Ray task, "
        "as many at once as the cluster's CPUs and GPUs allow "
        "(pip install memoire[ray])",
    )
    p_run.add_argument(
        "--ray_address",
        default="",
        help="Ray cluster to join ('auto', 'HOST:PORT'); none: a local one",
    )
    p_run.add_argument("--cpus", type=float, default=1.0, help="CPUs per Ray task")
    p_run.add_argument("--gpus", type=float, default=0.0, help="GPUs per Ray task")
    p = sub.add_parser("slurm", help="write (and submit) a SLURM job array of indices")
    p.add_argument("sweep", help="sweep gin file")
    p.add_argument(
        "--base_dir",
        required=True,
        help="experiment directory (on storage the nodes share); the script is "
        "written to base_dir/sweep.sbatch",
    )
    p.add_argument("--indices", required=True, help="e.g. 0-99 or 0,3,5-6: the array's task ids")
    p.add_argument("--submit", action="store_true", help="run sbatch on the script")
    p.add_argument("--cpus", type=int, default=1, help="--cpus-per-task of each index")
    p.add_argument("--gpus", type=int, default=0, help="GPUs of each index (--gres=gpu:N)")
    p.add_argument("--mem", default=None, help="memory of each index, e.g. 8G")
    p.add_argument("--time", default=None, help="time limit of each index, e.g. 4:00:00")
    p.add_argument("--partition", default=None, help="SLURM partition")
    p.add_argument(
        "--max_parallel", type=int, default=None, help="tasks running at once (--array=...%%N)"
    )
    p.add_argument("--job_name", default="memoire-sweep", help="SLURM job name")
    p.add_argument(
        "--sbatch_option",
        action="append",
        default=[],
        help="another #SBATCH option, e.g. --account=rl (repeatable)",
    )
    p.add_argument("--python", default=None, help="the Python the tasks run (default: this one)")
    p.add_argument(
        "--gin_files",
        action="append",
        default=[],
        help="extra gin files, parsed after the sweep's own includes",
    )
    p.add_argument(
        "--gin_bindings",
        action="append",
        default=[],
        help="gin binding passed to every run (repeatable); wins over the sweep",
    )


@cli.entry_point("memoire sweep")
def main(argv: Sequence[str] | None = None) -> int:
    """``memoire sweep list|run|slurm``. Returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            if args.runs < 1:
                parser.error(f"--runs must be >= 1, got {args.runs}")
            cli.emit(sweep.format_table(sweep.load_sweep(args.sweep), args.runs))
            return 0
        if args.command == "slurm":
            cli.check_files(args.gin_files, "--gin_files")
            cli.check_output_dir(args.base_dir, "--base_dir")
            sweep.write_slurm(args)
            return 0
        if args.launcher == "ray":
            from memoire.experiments import ray_launcher

            if args.cpus < 0 or args.gpus < 0:
                parser.error(f"--cpus and --gpus must be >= 0, got {args.cpus}, {args.gpus}")

            ray_launcher.import_ray()  # one line saying what to install, before anything runs
        if args.parallel < 1:
            parser.error(f"--parallel must be >= 1, got {args.parallel}")
        cli.check_files(args.gin_files, "--gin_files")
        cli.check_output_dir(args.base_dir, "--base_dir")
        return 1 if sweep.run_indices(args) else 0
    except FileNotFoundError as e:
        raise cli.UsageError(f"{e.filename or args.sweep!r}: no such file") from None
    except sweep.SweepError as e:
        raise cli.UsageError(e) from None


if __name__ == "__main__":
    from memoire.commands import sweep as command  # the importable module's main (see train)

    sys.exit(command.main())
