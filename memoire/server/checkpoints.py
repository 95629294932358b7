"""The server memory's checkpoints: a folder of :meth:`memoire.ReplayMemory.save` files.

Files are named ``memory-<12-digit sequence>.ckpt``; the highest sequence is the newest. Each
is written atomically (a temporary ``....ckpt.tmp-<token>`` beside it, fsync-ed, renamed), so
every file with a checkpoint's name is complete. After each save the oldest beyond ``keep``
are removed. One server per folder: temporaries of that pattern left by a crash are removed
when the folder is opened.

A save holds the memory's lock while it streams the memory to disk (adds and samples wait).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from typing import List, Optional, Tuple

from memoire.checkpoint_io import CheckpointError, sync_folder

log = logging.getLogger("memoire.server")

DEFAULT_KEEP = 3  # checkpoints kept in the folder (the newest)
_NAME = "memory-{:012d}.ckpt"
_FINISHED = re.compile(r"memory-(\d{12})\.ckpt$")
_TEMPORARY = re.compile(r"memory-\d{12}\.ckpt\.tmp-[0-9a-f]{12}$")


class MemoryCheckpoints:
    """Checkpoints of `memory` (a :class:`memoire.ReplayMemory`) in `folder` (created if
    missing), keeping the newest `keep` (>= 1). Thread-safe: saves run one at a time."""

    def __init__(self, memory, folder: str, keep: int = DEFAULT_KEEP):
        if int(keep) < 1:
            raise ValueError(f"keep: expected >= 1 checkpoints, got {keep}")
        self.memory = memory
        self.folder = os.path.abspath(os.fspath(folder))
        self.keep = int(keep)
        os.makedirs(self.folder, exist_ok=True)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.saves = 0  # checkpoints written by this object
        self.last_path: Optional[str] = None  # the newest checkpoint written or loaded
        for name in os.listdir(self.folder):  # a crash mid-save left these
            if _TEMPORARY.match(name):
                _remove(os.path.join(self.folder, name))

    def existing(self) -> List[Tuple[int, str]]:
        """``(sequence, path)`` of the checkpoint files in the folder (regular files only),
        oldest first."""
        found = []
        for name in os.listdir(self.folder):
            m = _FINISHED.match(name)
            path = os.path.join(self.folder, name)
            if m and stat.S_ISREG(os.lstat(path).st_mode):
                found.append((int(m.group(1)), path))
        return sorted(found)

    def load_newest(self) -> Optional[str]:
        """Loads the newest checkpoint that loads; returns its path, or None when the folder
        holds none. A newer one that is refused (corrupt) is logged and skipped.

        Raises:
          CheckpointError: checkpoints exist but none fits the memory (another schema or
            max_step, or all corrupt); the memory is unchanged.
        """
        errors = []
        for _, path in reversed(self.existing()):
            try:
                started = time.monotonic()
                self.memory.load(path)
            except (CheckpointError, OSError) as e:
                log.warning("checkpoint %s not loaded: %s", path, e)
                errors.append(str(e))
                continue
            log.info(
                "loaded checkpoint %s: %d entries, %d episodes in %.1f s",
                path,
                self.memory.size,
                self.memory.num_episode(),
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
            path = os.path.join(self.folder, _NAME.format(sequence))
            started = time.monotonic()
            self.memory.save(path)
            self.saves += 1
            self.last_path = path
            log.info(
                "checkpoint %s: %d entries, %d episodes in %.1f s",
                path,
                self.memory.size,
                self.memory.num_episode(),
                time.monotonic() - started,
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


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
