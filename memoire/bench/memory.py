"""Resident memory of a process, from Linux's /proc/PID/status (bytes)."""

from __future__ import annotations


def proc_status(key: str, pid: int | str = "self") -> int:
    """Bytes of /proc/PID/status field ``key`` (VmRSS: resident now; VmHWM: peak since start or
    since :func:`reset_peak`). Linux only.

    Raises:
      KeyError: the field is not there.
    """
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_peak() -> None:
    """Restarts this process's VmHWM from its current RSS (Linux 4.0+)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
