"""The ``memoire <command>`` modules: each parses its arguments and runs the library or the
tools (``memoire.experiments``, ``memoire.bench``); :mod:`memoire.cli` finds them by name."""
