"""Checkpoint files, safely: the error every checkpoint loader raises, a safe open for reading
and an atomic create for writing. Used by :meth:`memoire.ReplayMemory.save`/``load``, the
server's checkpoints and the Dopamine faces' (:mod:`memoire.dopamine_compat.checkpoint`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from typing import Iterator

from memoire._core import ProtocolError


class CheckpointError(ProtocolError):
    """A checkpoint file that is unreadable, malformed, or does not fit the buffer loading it
    (a ValueError; memoire.ProtocolError). The message names the file and what was expected."""


def open_regular(path):
    """``path`` opened for binary reading, refused unless it is a regular file.

    The open itself is safe (O_NONBLOCK, O_NOFOLLOW): a FIFO swapped in at `path` does not block
    (a blocked open would hang a buffer server's only request worker), a symlink is not followed,
    and the fd is fstat-ed, so what is read is the file that was checked.

    Raises:
      CheckpointError: `path` is a symlink, FIFO, device, socket or folder.
      OSError: it cannot be opened (FileNotFoundError when missing).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CheckpointError(
                "{}: a symlink; checkpoint files must be regular files".format(path)
            ) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CheckpointError(
                "{}: not a regular file (a FIFO, device, socket or folder); refused".format(path)
            )
        os.set_blocking(fd, True)  # no effect on a regular file's reads; plain semantics after
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def temporary_name(path: str) -> str:
    """The name a file being written for `path` has until it is complete: `path` plus
    ``.tmp-`` and a random token (never the name of a finished checkpoint)."""
    return "{}.tmp-{}".format(path, uuid.uuid4().hex[:12])


@contextlib.contextmanager
def atomic_create(path) -> Iterator[int]:
    """Yields the descriptor of a new file that becomes `path` only when the block succeeds.

    The file is created beside `path` under :func:`temporary_name` (exclusively: never a
    symlink or FIFO already there), then fsync-ed, renamed over `path` and the folder fsync-ed,
    so `path` is always either the old file or the complete new one, also after a crash. If the
    block raises, the temporary file is removed and `path` is untouched.
    """
    path = os.fspath(path)
    temp = temporary_name(path)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        yield fd
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)
        raise
    os.close(fd)
    try:
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)
        raise
    sync_folder(os.path.dirname(os.path.abspath(path)))


def sync_folder(folder: str) -> None:
    """fsyncs `folder` so that a rename or removal in it survives a crash (where the platform
    lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
