"""A user's mistake, as every memoire entry point reports it: one line on stderr,
``<prog>: error: <what was expected>``, no traceback, exit status :data:`EXIT_USAGE`.

:class:`UsageError` is what commands raise; :func:`report` prints the line; the ``check_*``
functions are the checks several commands share; :func:`missing_extra` names the extra to
install when an optional package is missing.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from memoire import paths

EXIT_USAGE = 2  # the status of every user mistake (argparse's own)


class UsageError(Exception):
    """A mistake in the command a user typed: a missing file, an unknown name, a bad value.

    An :func:`memoire.cli.entry_point` reports it as one line on stderr and returns
    :data:`EXIT_USAGE`. Raise it before anything is written, so a mistake leaves nothing
    behind.
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


# Top-level modules of the optional packages, and the extra of pyproject.toml that installs
# each (`pip install "memoire[EXTRA]"`). Dopamine's own dependencies count as Dopamine's: a
# missing absl or TensorFlow means the Dopamine extra is not installed.
EXTRA_OF_MODULE = {
    "gin": "gin",
    "matplotlib": "plot",
    "ray": "ray",
    **dict.fromkeys(
        (
            "dopamine",
            "absl",
            "tensorflow",
            "tensorflow_probability",
            "jax",
            "flax",
            "optax",
            "orbax",
            "gym",
            "gymnasium",
            "ale_py",
        ),
        "dopamine",
    ),
}


# Extras that install another's packages too: the dopamine extra brings gin.
_EXTRA_INCLUDES = {"dopamine": ("gin",)}


def missing_extra(error: BaseException, needs: Optional[str] = None) -> Optional[str]:
    """The one line telling a user which extra to install, for ``error`` an import of an
    optional package that failed (:data:`EXTRA_OF_MODULE`): ``No module named 'absl' (a
    package of the dopamine extra): pip install "memoire[dopamine]"``. None for any other
    error (a module memoire itself should have, or no import error at all).

    ``needs``: the extra the command needs as a whole (``memoire train``: dopamine); named
    instead of the package's own when it brings that package too (gin), so one install
    fixes the command, not the first of several missing packages.
    """
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    extra = EXTRA_OF_MODULE.get(error.name.partition(".")[0])
    if extra is None:
        return None
    if needs is not None and extra in (needs, *_EXTRA_INCLUDES.get(needs, ())):
        extra = needs
    return f'{error} (a package of the {extra} extra): pip install "memoire[{extra}]"'
