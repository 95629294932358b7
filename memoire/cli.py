"""The ``memoire`` command: one entry point, one module per subcommand.

    memoire train --gin_files F --base_dir D [--index N]   train a Dopamine agent on memoire
    memoire sweep list|run ...                              hyperparameter sweeps
    memoire actor --gin_files F --rep EP --pub EP           an actor joining a learner by endpoint
    memoire plot D                                          learning curves to a PNG
    memoire serve ...                                       a standalone replay server
    memoire bench ...                                       benchmarks against the alternatives
    memoire version                                         print the version
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, one-line help). Modules are imported only when used, so `memoire serve`
# does not pay for TensorFlow.
COMMANDS = {
    "train": ("memoire.train", "train a Dopamine agent from gin files (local or distributed)"),
    "sweep": ("memoire.sweep", "list or run the settings of a hyperparameter sweep"),
    "actor": ("memoire.distributed", "run one actor that joins a learner by endpoint"),
    "plot": ("memoire.plot", "draw learning curves of a base_dir to a PNG"),
    "serve": ("memoire.serve", "run a standalone replay memory server"),
    "bench": ("memoire.bench", "run the benchmark suite and print a table of ratios"),
}


def _usage() -> str:
    lines = ["usage: memoire <command> [args]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["  version  print the version"]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command in ("version", "--version"):
        from memoire import __version__

        print(__version__)
        return 0
    if command not in COMMANDS:
        print(f"memoire: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    entry = module.actor_cli if command == "actor" else module.main
    return int(entry(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
