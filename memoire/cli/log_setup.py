"""Logging of every memoire command: memoire's messages on stderr at the level of
``--log-level`` (or ``$MEMOIRE_LOG_LEVEL``), other packages' chatter kept out
(:mod:`memoire.cli.third_party`)."""

from __future__ import annotations

import logging
import os
import sys

from memoire.cli.errors import UsageError
from memoire.cli.third_party import chatter_filter, quiet_third_party

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# The level of --log-level, kept in the environment so that the processes a command starts
# (sweep runs, spawned actors) log at the same level.
LOG_LEVEL_ENV = "MEMOIRE_LOG_LEVEL"


def configure_logging(level: str | None = None) -> None:
    """Shows memoire's messages (``logging.getLogger(__name__)`` in each module) on stderr, as
    ``INFO memoire.experiments.train: setting 0 run 0 ...``, at ``level`` (one of
    :data:`LOG_LEVELS`; None: ``$MEMOIRE_LOG_LEVEL``, else ``info``), and keeps other
    packages' chatter to ``debug`` (:func:`~memoire.cli.third_party.quiet_third_party`).

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
            handler.addFilter(chatter_filter)
        memoire_logger.setLevel((name or "info").upper())
    elif name:
        memoire_logger.setLevel(name.upper())
    quiet_third_party(name != "debug")
