"""``memoire train``: train a Dopamine agent from gin files (local or distributed).

    memoire train --gin_files configs/dqn_cartpole_jax_local.gin --base_dir runs/dqn
    memoire train --sweep configs/sweep_dqn_cartpole.gin --index 5 --base_dir runs/sweep

Parses the command line; :func:`memoire.experiments.train.launch` runs it (what a run writes,
how gin is loaded and how a killed run resumes are described there).
``python -m memoire.commands.train`` is the same command.
"""

from __future__ import annotations

import sys
from typing import Sequence

from memoire import cli
from memoire.experiments import distributed, replay_routing, train


def parse_args(argv: Sequence[str] | None):
    return build_parser().parse_args(argv)


def build_parser() -> cli.ArgumentParser:
    """The parser of ``memoire train``."""
    p = cli.ArgumentParser(
        prog="memoire train",
        description="Train a Dopamine agent from gin files (local or distributed).",
    )
    p.add_argument(
        "--base_dir",
        required=True,
        help="experiment directory; runs go to setting_<s>/run_<k>/ under it",
    )
    p.add_argument(
        "--gin_files",
        action="append",
        default=[],
        help="gin file (repeatable), as in Dopamine; Dopamine's stock files work",
    )
    p.add_argument(
        "--gin_bindings",
        action="append",
        default=[],
        help="gin binding (repeatable), as in Dopamine; wins over the files",
    )
    p.add_argument(
        "--index",
        type=int,
        default=0,
        help="sweep index N: setting N mod S, run N div S (seed = run)",
    )
    p.add_argument("--sweep", default=None, help="sweep gin file (see memoire.experiments.sweep)")
    p.add_argument(
        "--replay",
        choices=replay_routing.REPLAY_BACKENDS,
        default=None,
        help="whose replay buffer the agent uses (default: gin's "
        "replay_backend.name, else memoire)",
    )
    p.add_argument("--verbose", action="store_true", help="keep Dopamine's INFO logging")
    _add_launcher_flags(p)
    return p


def _add_launcher_flags(p: cli.ArgumentParser) -> None:
    """``--launcher``, ``--ray_address`` and ``--insecure``: shorthands for their gin
    bindings."""
    p.add_argument(
        "--launcher",
        choices=distributed.LAUNCHERS,
        default=None,
        help="who starts a distributed run's learner and actors (default: gin's "
        "DistributedConfig.launcher, else local); ray: Ray actors "
        "(pip install memoire[ray]); slurm: the tasks of one SLURM job, submitted "
        "with sbatch (the script is written to the run's slurm/ folder)",
    )
    p.add_argument(
        "--ray_address",
        default=None,
        help="Ray cluster to join ('auto', 'HOST:PORT'; gin: RayConfig.address); "
        "none: a local Ray cluster for this command",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="Ray and SLURM launchers: no CURVE keys for a learner bound beyond loopback "
        "(experience and parameters in clear between nodes; gin: RayConfig.curve = 'off', "
        "SlurmConfig.curve = 'off')",
    )


@cli.entry_point("memoire train")
def main(argv: Sequence[str] | None = None) -> int:
    """``memoire train``. Returns the process exit code."""
    return train.launch(parse_args(argv))


if __name__ == "__main__":
    # `python -m` runs this file as __main__: run the importable module's main (the one
    # memoire.cli runs).
    from memoire.commands import train as command

    sys.exit(command.main())
