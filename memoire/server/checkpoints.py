"""A server's checkpoint folder: numbered checkpoints of what it serves, the newest few kept.

Two kinds share the folder logic (:class:`Checkpoints`):

- :class:`MemoryCheckpoints`: a :class:`memoire.ReplayMemory` (a ``ReplayMemoryServer``'s), one
  :meth:`memoire.ReplayMemory.save` file per checkpoint, ``memory-<12-digit sequence>.ckpt``;
- ``BufferCheckpoints`` (:mod:`memoire.dopamine_compat.buffer_server`): a hosted Dopamine
  buffer, one folder per checkpoint, ``buffer-<12-digit sequence>.ckpt/``, holding the buffer's
  own ``save(folder, 0)`` files.

The highest sequence is the newest. Each is written atomically: under a temporary name beside
it (``<name>.tmp-<token>``), fsync-ed, then renamed (one rename, also for a folder), so every
entry with a checkpoint's name is complete. After each save the oldest beyond ``keep`` are
removed. One server per folder: temporaries left by a crash are removed when the folder is
opened.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import threading
import time
from typing import List, Optional, Tuple

from memoire.checkpoint_io import CheckpointError, sync_folder

log = logging.getLogger("memoire.server")

DEFAULT_KEEP = 3  # checkpoints kept in the folder (the newest)


def check_period(folder: Optional[str], every: Optional[float]) -> None:
    """Raises ValueError unless `every` (seconds between periodic checkpoints) is None, or > 0
    with a `folder` to write them in."""
    if every is None:
        return
    if folder is None:
        raise ValueError("checkpoint_every: needs a checkpoint_dir")
    if not float(every) > 0:
        raise ValueError(f"checkpoint_every: expected seconds > 0, got {every}")


class Checkpoints:
    """Numbered checkpoints in `folder` (created if missing), the newest `keep` (>= 1) kept.
    Thread-safe: saves run one at a time.

    A subclass says what one checkpoint is: :attr:`PREFIX` (its names), :attr:`FOLDERS` (a
    folder per checkpoint, else a file), :meth:`_write` (a complete checkpoint at a path that
    does not exist yet), :meth:`_read` (restore one) and :meth:`_summary` (for the log).
    """

    PREFIX = "checkpoint"
    FOLDERS = False
    # What a refused (corrupt, foreign) checkpoint raises from _read; it is skipped.
    REFUSED: tuple = (CheckpointError, OSError)

    def __init__(self, folder: str, keep: int = DEFAULT_KEEP):
        if int(keep) < 1:
            raise ValueError(f"keep: expected >= 1 checkpoints, got {keep}")
        self.folder = os.path.abspath(os.fspath(folder))
        self.keep = int(keep)
        self._finished = re.compile(re.escape(self.PREFIX) + r"-(\d{12})\.ckpt$")
        temporary = re.escape(self.PREFIX) + r"-\d{12}\.ckpt\.tmp-[0-9a-f]{12}$"
        os.makedirs(self.folder, exist_ok=True)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.saves = 0  # checkpoints written by this object
        self.last_path: Optional[str] = None  # the newest checkpoint written or loaded
        for name in os.listdir(self.folder):  # a crash mid-save left these
            if re.match(temporary, name):
                _remove(os.path.join(self.folder, name))

    def _write(self, path: str) -> None:
        raise NotImplementedError

    def _read(self, path: str) -> None:
        raise NotImplementedError

    def _summary(self) -> str:
        raise NotImplementedError

    def existing(self) -> List[Tuple[int, str]]:
        """``(sequence, path)`` of the checkpoints in the folder (regular files, or folders for
        a folder kind; never symlinks), oldest first."""
        want = stat.S_ISDIR if self.FOLDERS else stat.S_ISREG
        found = []
        for name in os.listdir(self.folder):
            m = self._finished.match(name)
            path = os.path.join(self.folder, name)
            if m and want(os.lstat(path).st_mode):
                found.append((int(m.group(1)), path))
        return sorted(found)

    def load_newest(self) -> Optional[str]:
        """Loads the newest checkpoint that loads; returns its path, or None when the folder
        holds none. A newer one that is refused (corrupt) is logged and skipped.

        Raises:
          CheckpointError: checkpoints exist but none fits (another schema or size, or all
            corrupt); what they restore into is unchanged.
        """
        errors = []
        for _, path in reversed(self.existing()):
            try:
                started = time.monotonic()
                self._read(path)
            except self.REFUSED as e:
                log.warning("checkpoint %s not loaded: %s: %s", path, type(e).__name__, e)
                errors.append(str(e))
                continue
            log.info(
                "loaded checkpoint %s: %s in %.1f s",
                path,
                self._summary(),
                time.monotonic() - started,
            )
            self.last_path = path
            return path
        if errors:
            raise CheckpointError(
                f"no checkpoint in {self.folder} could be loaded: " + "; ".join(errors)
            )
        return None

    def save(self) -> str:
        """Writes a new checkpoint (the next sequence number), removes the oldest beyond
        `keep`, and returns its path.

        Raises:
          OSError: it could not be written (the older checkpoints stay).
        """
        with self._lock:
            existing = self.existing()
            sequence = existing[-1][0] + 1 if existing else 1
            path = os.path.join(self.folder, f"{self.PREFIX}-{sequence:012d}.ckpt")
            started = time.monotonic()
            self._write(path)
            self.saves += 1
            self.last_path = path
            log.info(
                "checkpoint %s: %s in %.1f s", path, self._summary(), time.monotonic() - started
            )
            for _, old in (existing + [(sequence, path)])[: -self.keep]:
                _remove(old)
            sync_folder(self.folder)
            return path

    def every(self, seconds: float) -> None:
        """Saves every `seconds` seconds (> 0) in a daemon thread until :meth:`stop`; a failed
        save is logged and the next is tried a period later."""
        seconds = float(seconds)
        if not seconds > 0:
            raise ValueError(f"checkpoint_every: expected seconds > 0, got {seconds}")
        if self._thread is not None:
            raise RuntimeError("checkpoints are already saved periodically")

        def loop():
            while not self._stop.wait(seconds):
                try:
                    self.save()
                except Exception:  # noqa: BLE001 (a full disk must not end the server)
                    log.exception("periodic checkpoint in %s failed", self.folder)

        self._thread = threading.Thread(target=loop, name="memoire-checkpoints", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ends the periodic saves (a save in progress finishes; waits up to `timeout` s)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


class MemoryCheckpoints(Checkpoints):
    """Checkpoints of `memory` (a :class:`memoire.ReplayMemory`) in `folder`: one
    :meth:`memoire.ReplayMemory.save` file each (written atomically by the memory itself). A
    save holds the memory's lock while it streams the memory to disk (adds and samples wait)."""

    PREFIX = "memory"

    def __init__(self, memory, folder: str, keep: int = DEFAULT_KEEP):
        self.memory = memory
        super().__init__(folder, keep)

    def _write(self, path: str) -> None:
        self.memory.save(path)

    def _read(self, path: str) -> None:
        self.memory.load(path)

    def _summary(self) -> str:
        return f"{self.memory.size} entries, {self.memory.num_episode()} episodes"


def fsync_tree(top: str) -> None:
    """fsyncs every file and folder under `top` (what a folder checkpoint wrote), so that its
    rename into place is not persisted before its contents."""
    for folder, _, files in os.walk(top):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        sync_folder(folder)


def _remove(path: str) -> None:
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.remove(path)
    except FileNotFoundError:
        pass
