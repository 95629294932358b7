"""The ``memoire`` command: one entry point, one module per subcommand.

    memoire train --gin_files F --base_dir D [--index N]   train a Dopamine agent on memoire
    memoire sweep list|run ...                              hyperparameter sweeps
    memoire actor --gin_files F --rep EP --pub EP           an actor joining a learner by endpoint
    memoire plot D                                          learning curves to a PNG
    memoire serve ...                                       a standalone replay server
    memoire bench ...                                       benchmarks against the alternatives
    memoire version                                         print the version

Every entry point (these commands, and ``python -m memoire.dopamine_compat.jax_agents`` and
``python -m memoire.dopamine_compat.remote``, which run ``memoire train`` and ``memoire serve
--buffer``) shares one convention, kept here: a mistake
in what the user typed is one line on stderr, ``<prog>: error: <what was expected>``, with no
traceback, exit status 2, and nothing written (commands check before they write). Parsers are
:class:`ArgumentParser` (argparse with that ``error``), mains are wrapped by
:func:`entry_point` (a :class:`UsageError` raised inside becomes that line, and logging is
configured once, see :func:`configure_logging`). An optional package that is not installed is
such a mistake too: its line names the extra to install (:func:`missing_extra`).

The package, one concept per module: :mod:`~memoire.cli.errors` (the one-line mistakes),
:mod:`~memoire.cli.parser` (the parser and docstrings turned into help),
:mod:`~memoire.cli.log_setup` (logging), :mod:`~memoire.cli.third_party` (other packages'
chatter kept out, heavy imports with the collector paused),
:mod:`~memoire.cli.stderr_hold` (file descriptor 2 held while a block runs); this module
dispatches ``memoire <command>`` and re-exports what commands use (``cli.UsageError``,
``cli.ArgumentParser``, ``cli.entry_point``, ...).
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Callable, Sequence

from memoire.cli.errors import (
    EXIT_USAGE,
    UsageError,
    check_files,
    check_output_dir,
    missing_extra,
    one_line,
    report,
)
from memoire.cli.log_setup import LOG_FORMAT, LOG_LEVEL_ENV, LOG_LEVELS, configure_logging
from memoire.cli.parser import ArgumentParser, HelpFormatter, plain_text
from memoire.cli.stderr_hold import hold_stderr
from memoire.cli.third_party import filtered_stderr, quiet_third_party, third_party_quiet

__all__ = [
    "COMMANDS",
    "COMMAND_EXTRAS",
    "EXIT_USAGE",
    "LOG_FORMAT",
    "LOG_LEVELS",
    "LOG_LEVEL_ENV",
    "ArgumentParser",
    "HelpFormatter",
    "UsageError",
    "check_files",
    "check_output_dir",
    "configure_logging",
    "emit",
    "entry_point",
    "filtered_stderr",
    "hold_stderr",
    "main",
    "missing_extra",
    "one_line",
    "plain_text",
    "quiet_third_party",
    "report",
    "third_party_quiet",
]


def emit(text: object) -> None:
    """Writes a command's result to stdout, flushed: a table, a path, an ``ENDPOINT ...`` line
    that scripts parse. The one place commands print; status messages go to logging."""
    print(text, flush=True)


def entry_point(prog: str) -> Callable:
    """Decorates a ``main(argv) -> int`` so that a :class:`UsageError` raised in it is reported
    as one line (``prog: error: ...``) and returns :data:`EXIT_USAGE`, as is an optional
    package that is missing (naming the extra to install, :func:`missing_extra`); ``None``
    returns 0. Logging is configured (:func:`configure_logging`) before ``main`` runs."""

    def wrap(main: Callable) -> Callable:
        @functools.wraps(main)
        def run(argv: Sequence[str] | None = None) -> int:
            try:
                configure_logging()
                return int(main(argv) or 0)
            except UsageError as e:
                return report(prog, e)
            except ModuleNotFoundError as e:  # an optional package this command needs
                hint = missing_extra(e, COMMAND_EXTRAS.get(prog))
                if hint is None:
                    raise
                return report(prog, hint)

        return run

    return wrap


# subcommand -> (module in memoire/commands/, one-line help); each module's ``main(argv)`` runs
# it. Modules are imported only when used, so `memoire serve` does not pay for TensorFlow.
COMMANDS = {
    "train": (
        "memoire.commands.train",
        "train a Dopamine agent from gin files (local or distributed)",
    ),
    "sweep": ("memoire.commands.sweep", "list or run the settings of a hyperparameter sweep"),
    "actor": ("memoire.commands.actor", "run one actor that joins a learner by endpoint"),
    "plot": ("memoire.commands.plot", "draw learning curves of a base_dir to a PNG"),
    "serve": ("memoire.commands.serve", "run a standalone replay memory server"),
    "bench": ("memoire.commands.bench", "run the benchmark suite and print a table of ratios"),
}

# The extra a command needs as a whole (pyproject.toml's optional dependencies), named when a
# package of it is missing (missing_extra); other commands name the missing package's extra.
COMMAND_EXTRAS = {"memoire train": "dopamine", "memoire actor": "dopamine"}


def _usage() -> str:
    lines = ["usage: memoire <command> [args]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += [
        "  version  print the version",
        "",
        "options (before or after the command):",
        f"  --log-level LEVEL  memoire's log messages on stderr: {', '.join(LOG_LEVELS)} "
        "(default: info)",
    ]
    return "\n".join(lines)


def _global_options(argv: list) -> list:
    """``argv`` without the global options before the command (``--log-level LEVEL``, applied
    here). After the command, each command's parser takes ``--log-level`` itself."""
    while argv and argv[0].startswith("--log-level"):
        flag, sep, value = argv[0].partition("=")
        if flag != "--log-level":
            break
        if not sep:
            if len(argv) < 2:
                raise UsageError("--log-level: expected a level")
            value, argv = argv[1], argv[1:]
        configure_logging(value)
        argv = argv[1:]
    return argv


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = _global_options(argv)
    except UsageError as e:
        return report("memoire", e)
    if not argv or argv[0] in ("-h", "--help", "help"):
        emit(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command in ("version", "--version"):
        from memoire import __version__

        emit(__version__)
        return 0
    if command not in COMMANDS:
        return report(
            "memoire",
            f"unknown command {command!r}; expected one of "
            f"{', '.join([*COMMANDS, 'version'])} (see memoire --help)",
        )
    try:
        module = importlib.import_module(COMMANDS[command][0])
    except ModuleNotFoundError as e:  # the command's tools need an optional package
        prog = f"memoire {command}"
        hint = missing_extra(e, COMMAND_EXTRAS.get(prog))
        if hint is None:
            raise
        return report(prog, hint)
    return int(module.main(rest) or 0)
