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
configured once, see :func:`configure_logging`).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import os
import sys
from typing import Callable, Sequence

from memoire import paths

EXIT_USAGE = 2  # the status of every user mistake (argparse's own)


class UsageError(Exception):
    """A mistake in the command a user typed: a missing file, an unknown name, a bad value.

    An :func:`entry_point` reports it as one line on stderr and returns :data:`EXIT_USAGE`.
    Raise it before anything is written, so a mistake leaves nothing behind.
    """


def one_line(text: object) -> str:
    """``text`` on one line: gin's multi-line errors ("msg\n  In file F, line 3\n    text")
    become "msg (In file F, line 3: text)"."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} ({': '.join(lines[1:])})"


def report(prog: str, message: object) -> int:
    """Prints ``prog: error: message`` (one line) to stderr; returns :data:`EXIT_USAGE`."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr, flush=True)
    return EXIT_USAGE


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions as written and appends ``(default: X)`` to an option's help when the
    default says something (not None, False or an empty list)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or default in (None, False, [], argparse.SUPPRESS)
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


class ArgumentParser(argparse.ArgumentParser):
    """argparse for every memoire entry point: a parse error is one line on stderr (argparse
    prints the whole usage block first) and exit status 2; help keeps the description's layout
    and shows defaults. Sub-parsers made by ``add_subparsers`` are of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        # Every parser (sub-parsers too) takes the global --log-level. Its default is SUPPRESS,
        # so a sub-parser's absent option does not undo the parent's, and the parsed value is
        # applied (configure_logging) and dropped from the namespace, leaving mains as they are.
        self.add_argument(
            "--log-level",
            dest="log_level",
            default=argparse.SUPPRESS,
            type=str.lower,
            choices=LOG_LEVELS,
            metavar="LEVEL",
            help="level of memoire's log messages on stderr: "
            f"{', '.join(LOG_LEVELS)} (default: info; also "
            f"${LOG_LEVEL_ENV})",
        )

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        level = vars(namespace).pop("log_level", None)
        if level is not None:
            configure_logging(level)
        return namespace, rest

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# The level of --log-level, kept in the environment so that the processes a command starts
# (sweep runs, spawned actors) log at the same level.
LOG_LEVEL_ENV = "MEMOIRE_LOG_LEVEL"


def configure_logging(level: str | None = None) -> None:
    """Shows memoire's messages (``logging.getLogger(__name__)`` in each module) on stderr, as
    ``INFO memoire.experiments.train: setting 0 run 0 ...``, at ``level`` (one of
    :data:`LOG_LEVELS`; None: ``$MEMOIRE_LOG_LEVEL``, else ``info``).

    The first call installs a stderr handler unless the program configured logging already
    (then its handlers decide where messages go; an explicit ``level`` still sets memoire's).
    Only memoire's loggers take the level: other packages' stay at WARNING, so the INFO chatter
    of TensorFlow, JAX and orbax stays out (Dopamine's own is absl's, set by ``--verbose``).

    Raises:
      UsageError: ``level`` (or the environment's) is not one of :data:`LOG_LEVELS`.
    """
    name = str(os.environ.get(LOG_LEVEL_ENV, "") if level is None else level).strip().lower()
    if name and name not in LOG_LEVELS:
        raise UsageError(
            f"--log-level / ${LOG_LEVEL_ENV}: expected one of {', '.join(LOG_LEVELS)}, got {name!r}"
        )
    if level is not None:
        os.environ[LOG_LEVEL_ENV] = name
    memoire_logger = logging.getLogger("memoire")
    if not logging.getLogger().handlers:
        logging.basicConfig(stream=sys.stderr, format=LOG_FORMAT)
        memoire_logger.setLevel((name or "info").upper())
    elif name:
        memoire_logger.setLevel(name.upper())


def emit(text: object) -> None:
    """Writes a command's result to stdout, flushed: a table, a path, an ``ENDPOINT ...`` line
    that scripts parse. The one place commands print; status messages go to logging."""
    print(text, flush=True)


def entry_point(prog: str) -> Callable:
    """Decorates a ``main(argv) -> int`` so that a :class:`UsageError` raised in it is reported
    as one line (``prog: error: ...``) and returns :data:`EXIT_USAGE`; ``None`` returns 0.
    Logging is configured (:func:`configure_logging`) before ``main`` runs."""

    def wrap(main: Callable) -> Callable:
        @functools.wraps(main)
        def run(argv: Sequence[str] | None = None) -> int:
            try:
                configure_logging()
                return int(main(argv) or 0)
            except UsageError as e:
                return report(prog, e)

        return run

    return wrap


def check_output_dir(path: str, flag: str) -> None:
    """Checks, writing nothing, that directory ``path`` exists or can be made: the path and
    every existing parent on the way are directories, the nearest existing one writable.

    Raises:
      UsageError: naming ``flag`` (e.g. ``--base_dir``) and what is in the way.
    """
    try:
        paths.check_writable_dir(path, flag)
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_files(paths: Sequence[str], flag: str) -> None:
    """Raises :class:`UsageError` naming ``flag`` for the first of ``paths`` that is not an
    existing file."""
    for path in paths:
        if not os.path.isfile(path):
            why = "is a directory" if os.path.isdir(path) else "no such file"
            raise UsageError(f"{flag} {path!r}: {why}")


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
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
