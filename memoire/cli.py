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
import contextlib
import difflib
import functools
import gc
import importlib
import importlib.abc
import inspect
import logging
import os
import re
import sys
import tempfile
import warnings
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


# Sphinx/reST markup in docstrings: :role:`~a.b.c` / :role:`title <target>` / :role:`x`,
# ``literal``, `interpreted`.
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]*?)\s*(?:<([^`>]*)>)?`")
_LITERAL = re.compile(r"``(.+?)``", re.S)
_INTERPRETED = re.compile(r"(?<![\w`])`([^`\n]+)`(?![\w`])")


def plain_text(text: str | None) -> str | None:
    """``text`` (a docstring) as plain text for ``--help``, dedented (a function's docstring
    as a module's): Sphinx roles become their text
    (``:func:`~a.b.run``` -> ``run``, ``:mod:`a.b``` -> ``a.b``, ``:data:`t <x>``` -> ``t``),
    double and single backquotes go, and a literal block's ``::`` becomes ``:``. The one place
    a docstring turns into help (:class:`ArgumentParser` applies it to the description, the
    epilog and every option's help)."""
    if not text:
        return text

    def role(m: re.Match) -> str:
        tilde, shown, _target = m.groups()
        return shown.rsplit(".", 1)[-1] if tilde else shown

    text = _ROLE.sub(role, inspect.cleandoc(text))
    text = _LITERAL.sub(r"\1", text)
    text = _INTERPRETED.sub(r"\1", text)
    return re.sub(r"(\S)::(\s*)$", r"\1:\2", text, flags=re.M)


class ArgumentParser(argparse.ArgumentParser):
    """argparse for every memoire entry point: a parse error is one line on stderr (argparse
    prints the whole usage block first) and exit status 2; help keeps the description's layout,
    in plain text (:func:`plain_text`), and shows defaults. Sub-parsers made by
    ``add_subparsers`` are of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        # No prefixes: argparse would take --gin_file for --gin_files (or any unique start of an
        # option) without a word; an option is spelled out or refused (see error()).
        kwargs.setdefault("allow_abbrev", False)
        for key in ("description", "epilog"):
            kwargs[key] = plain_text(kwargs.get(key))
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

    def add_argument(self, *args, **kwargs):
        if isinstance(kwargs.get("help"), str):
            kwargs["help"] = plain_text(kwargs["help"])
        return super().add_argument(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        level = vars(namespace).pop("log_level", None)
        if level is not None:
            configure_logging(level)
        return namespace, rest

    def error(self, message):
        self.exit(
            EXIT_USAGE,
            f"{self.prog}: error: {one_line(message)}{self._did_you_mean(message)} "
            f"(see {self.prog} --help)\n",
        )

    def _did_you_mean(self, message: str) -> str:
        """``; did you mean --gin_files?`` for an unrecognized option close to one of ours
        (a prefix, or a letter or two off); '' otherwise."""
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return ""
        ours = [o for o in self._option_string_actions if o.startswith("--")]
        hints = []
        for word in message[len(prefix) :].split():
            given = word.partition("=")[0]
            if not given.startswith("--"):
                continue
            close = [o for o in ours if o.startswith(given)] or difflib.get_close_matches(
                given, ours, n=1, cutoff=0.8
            )
            if close:
                hints.append(f"{given}: did you mean {' or '.join(sorted(close))}?")
        return "; " + "; ".join(hints) if hints else ""


LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# The level of --log-level, kept in the environment so that the processes a command starts
# (sweep runs, spawned actors) log at the same level.
LOG_LEVEL_ENV = "MEMOIRE_LOG_LEVEL"


def configure_logging(level: str | None = None) -> None:
    """Shows memoire's messages (``logging.getLogger(__name__)`` in each module) on stderr, as
    ``INFO memoire.experiments.train: setting 0 run 0 ...``, at ``level`` (one of
    :data:`LOG_LEVELS`; None: ``$MEMOIRE_LOG_LEVEL``, else ``info``), and keeps other
    packages' chatter to ``debug`` (:func:`quiet_third_party`).

    The first call installs a stderr handler unless the program configured logging already
    (then its handlers decide where messages go; an explicit ``level`` still sets memoire's).
    Only memoire's loggers take the level: other packages' stay at WARNING, so the INFO chatter
    of TensorFlow, JAX and orbax stays out (Dopamine's own is absl's, set by ``--verbose``).
    Processes a command starts (spawned actors) call it too: they inherit the level through
    ``$MEMOIRE_LOG_LEVEL``.

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
        for handler in logging.getLogger().handlers:
            handler.addFilter(_chatter_filter)
        memoire_logger.setLevel((name or "info").upper())
    elif name:
        memoire_logger.setLevel(name.upper())
    quiet_third_party(name != "debug")


# ---------------------------------------------------------------------------------------------
# Other packages' output.
#
# What TensorFlow, XLA, JAX, gym, gymnasium, the ALE, orbax and Dopamine print for their own
# developers (C++ logging at import, CUDA plugin registration, deprecation notices, banners)
# says nothing a memoire user can act on. By default memoire's commands keep it out; with
# --log-level debug everything comes through as the packages wrote it. Each mechanism below
# is the narrowest one that reaches its source; what is not known chatter always comes through.

# Environment read by TensorFlow's and XLA's C++ logging when they start (so set before they
# are imported; spawned processes inherit it): 3 keeps their INFO, WARNING and ERROR lines
# (registration of CUDA plugins, CPU feature notes, graph placement notes) out.
_QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}

# Lines that modules print to the process's stderr while they are imported (C++ logging that
# no setting reaches: absl's messages before InitializeLog; gym's notice), dropped by
# :func:`filtered_stderr`. Anything else printed meanwhile is written out after the import.
_IMPORT_CHATTER = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|[IWE]\d{4} [\d:.]+ +\d+ \S+\.cc:\d+\] "  # absl C++ log lines
    r"|\d{4}-\d\d-\d\d [\d:.]+: [IWE] \S+\.cc:\d+\] "  # TensorFlow's C++ log lines
    r"|To enable the following instructions: .* rebuild TensorFlow"
    r"|Gym has been unmaintained since 2022"
    r"|Please upgrade to Gymnasium, the maintained drop-in replacement of Gym"
    r"|See the migration guide at https://gymnasium\.farama\.org/)"
)

# Top-level modules whose import prints chatter to the file descriptor (see above), and what to
# do once one is imported (the ALE prints its banner to stdout at each emulator it makes).
_NOISY_IMPORTS = {
    "tensorflow": None,
    "gym": None,
    "ale_py": lambda ale: ale.ALEInterface.setLoggerMode(ale.LoggerMode.Error),
}

# Log records of other packages that are notices to developers: (logger, message pattern).
_LOG_CHATTER = [
    ("tensorflow", re.compile(r"deprecated", re.I)),  # "From x.py:98: f (from m) is deprecated"
    ("absl", re.compile(r"^DEPRECATION WARNING: Logger is being deprecated")),  # Dopamine
    ("absl", re.compile(r"^Configured `CheckpointManager` using deprecated legacy API")),  # orbax
    ("absl", re.compile(r"^No registered CheckpointArgs found for handler type")),  # orbax
    ("absl", re.compile(r"^num_iterations \(\d+\) < start_iteration")),  # memoire says it
]

# Warnings (the warnings module) that ask the developer of the calling code to act.
_DEVELOPER_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)

_quiet = False  # whether chatter is kept out now (every level but debug)
_env_set: dict = {}  # what quiet_third_party put in os.environ, to take back for debug
_MEMOIRE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def quiet_third_party(quiet: bool = True) -> None:
    """Keeps other packages' chatter out of a command's output (``quiet``), or lets all of it
    through (``--log-level debug``). Idempotent; the last call wins (configure_logging calls it
    once with the environment's level, again with ``--log-level``, both before anything heavy
    is imported).

    - TensorFlow's and XLA's C++ logging: ``TF_CPP_MIN_LOG_LEVEL=3`` unless the user set it.
    - Imports of TensorFlow and gym: what they print to stderr (file descriptor 2, C++
      included) is held until the import ends and known chatter (:data:`_IMPORT_CHATTER`) is
      dropped; the ALE's banners are turned off when ``ale_py`` is imported.
    - At any level, the heavy packages (:data:`_HEAVY_PACKAGES`) import with the garbage
      collector paused (a quarter of their import time).
    - Warnings (``warnings``): deprecation and future warnings raised outside memoire go to the
      ``py.warnings`` logger at DEBUG; others are shown as usual.
    - Logging: known notices of TensorFlow, Dopamine and orbax (:data:`_LOG_CHATTER`) are
      dropped, and another package's identical message is said once (handlers installed by
      :func:`configure_logging`).
    """
    global _quiet
    _quiet = bool(quiet)
    for key, value in _QUIET_ENV.items():
        if quiet and key not in os.environ:
            os.environ[key] = _env_set[key] = value
        elif not quiet and key in _env_set and os.environ.get(key) == _env_set.pop(key):
            del os.environ[key]
    if not isinstance(warnings.showwarning, _WarningRouter):
        warnings.showwarning = _WarningRouter(warnings.showwarning)
    if not any(isinstance(f, _ThirdPartyImporter) for f in sys.meta_path):
        sys.meta_path.insert(0, _ThirdPartyImporter())


def third_party_quiet() -> bool:
    """Whether other packages' chatter is kept out now (every log level but debug): what a
    launcher asks before it lets a tool's own output through (Ray's, see
    :mod:`memoire.experiments.ray_report`)."""
    return _quiet


class _WarningRouter:
    """``warnings.showwarning`` that sends developer warnings raised outside memoire to the
    ``py.warnings`` logger at DEBUG while chatter is kept out, and shows the rest as before."""

    def __init__(self, show):
        self._show = show

    def __call__(self, message, category, filename, lineno, file=None, line=None):
        if (
            _quiet
            and issubclass(category, _DEVELOPER_WARNINGS)
            and not os.path.abspath(filename).startswith(_MEMOIRE_DIR)
        ):
            logging.getLogger("py.warnings").debug(
                "%s:%s: %s: %s", filename, lineno, category.__name__, message
            )
            return
        self._show(message, category, filename, lineno, file, line)


class _ChatterFilter(logging.Filter):
    """Drops, while chatter is kept out, other packages' known notices (:data:`_LOG_CHATTER`)
    and repeats of their messages (each distinct one is said once)."""

    MAX_SEEN = 4096

    def __init__(self):
        super().__init__()
        self._seen: set = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not _quiet or record.name == "memoire" or record.name.startswith("memoire."):
            return True
        message = record.getMessage()
        top = record.name.split(".")[0]
        if any(top == name and pattern.search(message) for name, pattern in _LOG_CHATTER):
            return False
        key = (record.name, record.levelno, message)
        if key in self._seen:
            return False
        if len(self._seen) < self.MAX_SEEN:
            self._seen.add(key)
        return True


_chatter_filter = _ChatterFilter()


class _ThirdPartyImporter(importlib.abc.MetaPathFinder):
    """A finder first in ``sys.meta_path`` that finds nothing itself: it hands the imports of
    other packages to :class:`_ThirdPartyLoader`, which runs the top-level modules of
    :data:`_NOISY_IMPORTS` through :func:`filtered_stderr` while chatter is kept out, and the
    outermost import of any module of :data:`_HEAVY_PACKAGES` with the cyclic garbage collector
    paused (:func:`_collector_paused`)."""

    def find_spec(self, fullname, path, target=None):
        noisy = _quiet and fullname in _NOISY_IMPORTS
        # Outermost only: inside a paused import (or a program that turned it off) the
        # collector is off already.
        heavy = gc.isenabled() and fullname.partition(".")[0] in _HEAVY_PACKAGES
        if not (noisy or heavy):
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _ThirdPartyImporter) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    after = _NOISY_IMPORTS.get(fullname) if noisy else None
                    spec.loader = _ThirdPartyLoader(spec.loader, noisy, heavy, after)
                return spec
        return None


class _ThirdPartyLoader(importlib.abc.Loader):
    def __init__(self, loader, noisy, heavy, after):
        self._loader, self._noisy, self._heavy, self._after = loader, noisy, heavy, after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # The module's own loader, as the import system would use it (packages read it back).
        module.__loader__ = module.__spec__.loader = self._loader
        with contextlib.ExitStack() as stack:
            if self._heavy:
                stack.enter_context(_collector_paused())
            if self._noisy:
                stack.enter_context(filtered_stderr())
            self._loader.exec_module(module)
        if self._after is not None:
            self._after(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self._loader, name)


# Packages whose import builds hundreds of thousands of objects (TensorFlow, JAX and Dopamine
# together: 545,000). Python's cyclic collector runs over and over while they are built, each
# pass over everything built so far: a quarter of a `memoire train` process's import time
# (6.0 s of CPU to 4.5 s for TensorFlow, JAX and Dopamine on 2 cores), paid again by every actor
# and every sweep run. So their imports run with the collector paused, and what they built is
# frozen afterwards (gc.freeze: later collections skip it, as the modules live as long as the
# process anyway).
_HEAVY_PACKAGES = frozenset(
    {"tensorflow", "tensorflow_probability", "jax", "flax", "optax", "orbax", "dopamine"}
    | {"gym", "gymnasium", "ale_py", "ray", "matplotlib", "scipy", "pandas"}
)


@contextlib.contextmanager
def _collector_paused():
    """Pauses the cyclic garbage collector while the block runs (if it was on); afterwards
    turns it back on and freezes every object then alive (gc.freeze)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()


_capture_depth = 0


@contextlib.contextmanager
def filtered_stderr():
    """While chatter is kept out (:func:`quiet_third_party`), holds what is written to file
    descriptor 2 (Python's and C++'s stderr) in a temporary file while the block runs; then
    writes it out without the lines of :data:`_IMPORT_CHATTER`. For imports, and for the first
    steps of native code that logs before anything can configure it (TensorFlow's first
    session run). Nested uses hold once. If the block raises, everything held is written out as
    it was. With ``--log-level debug`` it does nothing."""
    global _capture_depth
    if _capture_depth or not _quiet:
        yield
        return
    sys.stderr.flush()
    held = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(held.fileno(), 2)
    _capture_depth += 1
    failed = True
    try:
        yield
        failed = False
    finally:
        _capture_depth -= 1
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        held.seek(0)
        text = held.read().decode("utf-8", "replace")
        held.close()
        lines = text.splitlines(keepends=True)
        if not failed:
            lines = [line for line in lines if not _IMPORT_CHATTER.match(line)]
        if lines:
            sys.stderr.write("".join(lines))
            sys.stderr.flush()


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
