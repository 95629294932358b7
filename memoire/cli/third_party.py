"""Other packages' output, kept out of a memoire command's own.

What TensorFlow, XLA, JAX, gym, gymnasium, the ALE, orbax and Dopamine print for their own
developers (C++ logging at import, CUDA plugin registration, deprecation notices, banners)
says nothing a memoire user can act on. By default memoire's commands keep it out; with
--log-level debug everything comes through as the packages wrote it. Each mechanism below
is the narrowest one that reaches its source; what is not known chatter always comes through.
:func:`quiet_third_party` installs them all (:func:`memoire.cli.configure_logging` calls it).

The same import hook pauses the garbage collector while the heavy packages import
(:data:`_HEAVY_PACKAGES`), at every log level.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.abc
import logging
import os
import re
import sys
import warnings

from memoire.cli.stderr_hold import hold_stderr

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
# memoire's own files (its warnings are for its users): the package holding this one.
_MEMOIRE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


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
      :func:`memoire.cli.configure_logging`).
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


chatter_filter = _ChatterFilter()


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


_capture_depth = 0  # filtered_stderr blocks open now: nested ones hold once


@contextlib.contextmanager
def filtered_stderr():
    """While chatter is kept out (:func:`quiet_third_party`), holds what is written to file
    descriptor 2 (Python's and C++'s stderr) while the block runs; then writes it out without
    the lines of :data:`_IMPORT_CHATTER` (:func:`~memoire.cli.stderr_hold.hold_stderr`). For
    imports, and for the first steps of native code that logs before anything can configure
    it (TensorFlow's first session run). Nested uses hold once. If the block raises,
    everything held is written out as it was. With ``--log-level debug`` it does nothing."""
    global _capture_depth
    if _capture_depth or not _quiet:
        yield
        return
    _capture_depth += 1
    try:
        with hold_stderr(_IMPORT_CHATTER.match, drop_after_error=False):
            yield
    finally:
        _capture_depth -= 1
