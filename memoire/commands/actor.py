"""``memoire actor``: one actor joining a learner by endpoint.

Parses the command line; :func:`memoire.experiments.distributed.actor_main` runs the actor.
``python -m memoire.commands.actor ...`` is the same command.
"""

from __future__ import annotations

import sys

from memoire import cli, transport
from memoire.experiments import distributed


def build_parser() -> cli.ArgumentParser:
    """The parser of ``memoire actor``."""
    parser = cli.ArgumentParser(prog="memoire actor", description=main.__doc__)
    parser.add_argument(
        "--gin_files",
        action="append",
        default=[],
        required=True,
        help="the learner's gin file (repeatable): same agent and environment",
    )
    parser.add_argument(
        "--gin_bindings",
        action="append",
        default=[],
        help="gin binding (repeatable), as the learner's",
    )
    parser.add_argument(
        "--experience",
        "--rep",
        dest="experience",
        required=True,
        help="the learner's experience (PULL) endpoint",
    )
    parser.add_argument(
        "--params",
        "--pub",
        dest="params",
        required=True,
        help="the learner's parameter (PUB) endpoint",
    )
    parser.add_argument(
        "--actor_id", type=int, default=0, help="this actor's number among the learner's actors"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of this actor's environment and exploration"
    )
    parser.add_argument(
        "--max_steps",
        type=int,
        default=None,
        help="stop after this many environment steps (default: no limit)",
    )
    parser.add_argument(
        "--chunk_size", type=int, default=64, help="steps per episode chunk streamed to the learner"
    )
    parser.add_argument(
        "--queue_chunks", type=int, default=32, help="chunks queued before this actor's sends wait"
    )
    parser.add_argument(
        "--keepalive",
        type=float,
        default=transport.KEEPALIVE_S,
        help="seconds with an open episode and nothing sent before a keepalive goes out "
        "(shorter than the learner's peer_timeout)",
    )
    parser.add_argument(
        "--episodes_ahead",
        type=int,
        default=1,
        help="finished episodes not yet stored by the learner before this "
        "actor waits (0: lockstep)",
    )
    return parser


@cli.entry_point("memoire actor")
def main(argv=None) -> int:
    """``memoire actor``: one actor joining a learner by endpoint (another machine, or a learner
    started with ``DistributedConfig.spawn_actors = False``).

        memoire actor --gin_files F [--gin_bindings B] --experience tcp://HOST:PORT
                      --params tcp://HOST:PORT [--actor_id K] [--seed S] [--max_steps N]

    The gin files are the learner's (same agent and environment). It runs until ``--max_steps``
    environment steps, Ctrl-C, the learner's stop notice, or the learner taking nothing for
    60 s. (``--rep`` and ``--pub`` are older names of ``--experience`` and ``--params``.)
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("chunk_size", "queue_chunks"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.episodes_ahead < 0:
        parser.error(f"--episodes_ahead must be >= 0, got {args.episodes_ahead}")
    if not (0 < args.keepalive < float("inf")):
        parser.error(f"--keepalive must be finite seconds > 0, got {args.keepalive}")
    cli.check_files(args.gin_files, "--gin_files")

    facts = {"gin_files": args.gin_files, "bindings": args.gin_bindings, "seed": args.seed}
    config = {"chunk_size": args.chunk_size, "actor_threads": 1, "max_steps": args.max_steps}
    distributed.actor_main(
        args.actor_id,
        facts,
        config,
        distributed.ActorEndpoints(
            args.experience,
            args.params,
            args.queue_chunks,
            args.episodes_ahead,
            keepalive=args.keepalive,
        ),
    )
    return 0


if __name__ == "__main__":
    from memoire.commands import actor as command  # the importable module's main (see train)

    sys.exit(command.main())
