"""Progress of long commands (``memoire bench``, ``memoire sweep run``): a tqdm bar on a
terminal, log lines elsewhere.

tqdm is optional (the ``progress`` extra; ``constraints/dev.txt`` pins it): the bar is drawn
when tqdm is installed and stderr is a terminal. Otherwise (no tqdm, output to a file or a
pipe, as in CI or a sweep's log) each step is one INFO line of the command's logger, e.g.
``INFO memoire.bench: 3/9 atari prioritized``, so a log shows how far a run got.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Optional


def _tqdm():
    """tqdm's module, or None when it is not installed."""
    try:
        import tqdm
    except ImportError:
        return None
    return tqdm


class Progress:
    """Counts ``total`` steps of a command.

    Args:
      total: steps expected.
      desc: what is counted ("bench", "sweep").
      logger: where the log lines go when no bar is drawn.
      unit: the steps' unit in the bar ("stage", "run").
      bar: force the bar on (True) or off (False); None: on when tqdm is installed and
        stderr is a terminal.

    Use as a context manager: while open, memoire's log messages are written above the bar
    (tqdm's ``logging_redirect_tqdm``) instead of through it.
    """

    def __init__(
        self,
        total: int,
        desc: str,
        logger: logging.Logger,
        *,
        unit: str = "step",
        bar: Optional[bool] = None,
    ):
        self.total, self.done, self.desc = int(total), 0, desc
        self._log = logger
        self._note = ""
        self._stage: Optional[str] = None
        tqdm = _tqdm()
        if bar is None:
            bar = tqdm is not None and sys.stderr.isatty()
        # leave=False: at the end the bar goes, leaving the terminal as the log lines left it
        # (a bar left behind ends in a line of its own, blank where log lines cleared it).
        self._bar = (
            tqdm.tqdm(
                total=self.total,
                desc=desc,
                unit=unit,
                file=sys.stderr,
                dynamic_ncols=True,
                leave=False,
            )
            if bar and tqdm is not None
            else None
        )
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "Progress":
        if self._bar is not None:
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._stack.enter_context(logging_redirect_tqdm())
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(finished=exc_type is None)

    def stage(self, name: str) -> None:
        """Starts stage ``name``: the previous stage (if any) counts as done."""
        if self._stage is not None:
            self.update(1, quiet=True)
        self._stage = name
        self.note(name)

    def note(self, text: str) -> None:
        """Shows ``text`` beside the count (the bar's postfix, or a log line)."""
        self._note = text
        if self._bar is not None:
            self._bar.set_postfix_str(text)
        else:
            self._log.info("%d/%d %s", self.done, self.total, text)

    def update(self, n: int = 1, *, quiet: bool = False) -> None:
        """Counts ``n`` more steps done (a log line unless ``quiet``)."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif not quiet:
            self._log.info("%d/%d %s", self.done, self.total, self._note)

    def close(self, finished: bool = True) -> None:
        """Ends the count; a running stage counts as done if ``finished``."""
        if self._stage is not None and finished:
            self.update(1, quiet=True)
        self._stage = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._stack.close()
