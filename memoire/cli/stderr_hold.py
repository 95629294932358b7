"""Holding file descriptor 2 while a block runs: what Python and native code (C++ logging
that no setting reaches) write to the process's stderr, held back and then written out
without the lines a caller knows to be noise. Used while noisy packages are imported
(:func:`memoire.cli.third_party.filtered_stderr`) and while Ray connects
(:mod:`memoire.experiments.ray_launcher`)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Callable, Iterator, List, Optional


@contextlib.contextmanager
def hold_stderr(
    drop: Callable[[str], object],
    *,
    said: Optional[List[str]] = None,
    drop_after_error: bool = True,
) -> Iterator[None]:
    """Holds what is written to file descriptor 2 in a temporary file while the block runs,
    then writes it to ``sys.stderr`` without the lines (each with its newline) for which
    ``drop(line)`` is true.

    Args:
      drop: which held lines are noise (called after the block, once per line).
      said: when given, the whole text held (decoded as UTF-8, bad bytes replaced) is appended
        to it: what a caller reads to explain a failure.
      drop_after_error: False writes out every line held when the block raised (they may say
        why it failed).
    """
    stderr = sys.stderr
    stderr.flush()
    held = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(held.fileno(), 2)
    failed = True
    try:
        yield
        failed = False
    finally:
        stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        held.seek(0)
        text = held.read().decode("utf-8", "replace")
        held.close()
        if said is not None:
            said.append(text)
        lines = text.splitlines(keepends=True)
        if drop_after_error or not failed:
            lines = [line for line in lines if not drop(line)]
        if lines:
            stderr.write("".join(lines))
            stderr.flush()
