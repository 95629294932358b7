"""Tables of ratios, the machine and versions, RESULTS.md and scaling plots."""

from __future__ import annotations

import datetime
import importlib
import os
import platform
from typing import Dict, Iterable, List, Optional

from memoire.bench.harness import Measurement


def machine() -> Dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "unknown"
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def versions(packages: Iterable[str] = ("memoire", "numpy", "dopamine", "cpprb", "zmq", "jax",
                                         "tensorflow")) -> Dict[str, str]:
    out = {}
    for name in packages:
        try:
            mod = importlib.import_module(name)
            out[name] = getattr(mod, "__version__", "installed")
        except Exception:  # noqa: BLE001 - a missing or broken package is reported, not fatal
            out[name] = "not installed"
    try:
        from importlib.metadata import version

        out["dopamine"] = version("dopamine-rl") if out.get("dopamine") != "not installed" else out["dopamine"]
    except Exception:  # noqa: BLE001
        pass
    return out


def _fmt_rate(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.1f}"


def table(measurements: List[Measurement], baseline: str = "memoire") -> str:
    """A markdown table: one row per (workload, system), with the ratio of memoire's throughput
    to each system's (``> 1`` means memoire is faster). The baseline of a workload is its first
    system whose name starts with ``baseline``."""
    rows = ["| workload | system | median time/op | throughput | memoire / system |",
            "|---|---|---:|---:|---:|"]
    by_workload: Dict[str, List[Measurement]] = {}
    for m in measurements:
        by_workload.setdefault(m.workload, []).append(m)
    for workload, ms in by_workload.items():
        base: Optional[Measurement] = next((m for m in ms if m.system.startswith(baseline)), None)
        for m in ms:
            ratio = f"{m.median / base.median:.2f}x" if base is not None else "-"
            if m is base:
                ratio = "1.00x"
            rows.append(f"| {workload} | {m.system} | {m.median * 1e6:.1f} us | "
                        f"{_fmt_rate(m.throughput)} {m.unit}/s | {ratio} |")
    return "\n".join(rows)


def header(extra: Optional[Dict[str, str]] = None) -> str:
    lines = ["| | |", "|---|---|"]
    for k, v in {**machine(), **versions(), **(extra or {})}.items():
        lines.append(f"| {k} | {v} |")
    return "\n".join(lines)
