"""``memoire actor``: one actor joining a learner by endpoint.

Parses the command line; :func:`memoire.experiments.distributed.actor_main` runs the actor.
``python -m memoire.commands.actor ...`` is the same command.
"""

from __future__ import annotations

import inspect
import sys

from memoire import cli
from memoire.experiments import distributed

# The defaults of a learner's own actors (DistributedConfig's), written once there.
_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(distributed.DistributedConfig).parameters.items()
}


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
        "--chunk_size",
        type=int,
        default=_DEFAULTS["chunk_size"],
        help="steps per episode chunk streamed to the learner",
    )
    parser.add_argument(
        "--queue_chunks",
        type=int,
        default=_DEFAULTS["queue_chunks"],
        help="chunks queued before this actor's sends wait",
    )
    parser.add_argument(
        "--keepalive",
        type=float,
        default=_DEFAULTS["keepalive"],
        help="seconds with an open episode and nothing sent before a keepalive goes out "
        "(shorter than the learner's peer_timeout)",
    )
    parser.add_argument(
        "--episodes_ahead",
        type=int,
        default=_DEFAULTS["episodes_ahead"],
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

    The gin files are the learner's (same agent and environment). It says when it has
    connected to the learner, and stops with an error when nothing answers at ``--experience``
    within {wait:g} s. It runs until ``--max_steps`` environment steps, Ctrl-C, the learner's
    stop notice (exit status 0), or the learner taking nothing of it for {silence:g} s (status
    1). (``--rep`` and ``--pub`` are older names of ``--experience`` and ``--params``.)
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
    try:
        return distributed.actor_main(
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
    except distributed.NoLearner as e:
        raise cli.UsageError(e) from None


main.__doc__ = main.__doc__.format(
    wait=distributed.LEARNER_WAIT_S, silence=distributed.LEARNER_SILENCE_S
)


if __name__ == "__main__":
    from memoire.commands import actor as command  # the importable module's main (see train)

    sys.exit(command.main())
