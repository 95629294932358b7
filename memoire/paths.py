"""Checks of paths a command or a writer is about to write into."""

import os


def check_writable_dir(path, what: str) -> str:
    """``path`` as an absolute path, checked (writing nothing) to be a directory that exists or
    can be made: the path and every existing parent on the way are directories, and the nearest
    existing one is writable.

    Raises:
      ValueError: starting with ``what`` (a flag or a component's name), naming what is in the
        way (an empty path, a file, no permission).
    """
    if not path or not str(path).strip():
        raise ValueError(f"{what}: expected a directory, got an empty path")
    path = os.path.abspath(os.fspath(path))
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise ValueError(f"{what}: {probe!r} is a file; expected a directory for {path!r}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{what}: cannot write in {probe!r} (permission denied)")
    return path
