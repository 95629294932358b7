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


# Module name -> distribution name, where they differ.
_DISTRIBUTIONS = {"dopamine": "dopamine-rl", "zmq": "pyzmq"}


def versions(
    packages: Iterable[str] = ("memoire", "numpy", "dopamine", "cpprb", "zmq", "jax", "tensorflow"),
) -> Dict[str, str]:
    """Version of each package: its distribution's metadata, else the module's
    ``__version__`` (always for memoire, which may run from a source tree), else
    "not installed"."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in packages:
        if name != "memoire":  # memoire: the imported tree, which may not be the installed one
            try:
                out[name] = version(_DISTRIBUTIONS.get(name, name))
                continue
            except PackageNotFoundError:
                pass
        try:
            out[name] = getattr(importlib.import_module(name), "__version__", "unknown")
        except Exception:  # noqa: BLE001 - a missing or broken package is reported, not fatal
            out[name] = "not installed"
    return out


def _fmt_rate(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.1f}"


NOTES = """Each workload builds every system for one configuration, fills it with the same stream
(Atari-like uint8[84, 84] frames or float32[4] states; episodes of 1,000 steps), then times
the same operation on each, alternating systems within every repetition, and keeps the median
over repetitions. **ratio** is the baseline's throughput over the system's (the system's
median time over the baseline's): above 1, the baseline is faster. The baseline of each
workload is its first row: memoire's Dopamine-layout buffer (channel-last stacks
`uint8[batch, 84, 84, 4]`, n-step rewards, next states, terminals: the same content as
Dopamine and cpprb return). For the ceilings the ratio is below 1: the fraction of the ceiling
memoire reaches. `[filled N]`: a buffer of the stated capacity filled with only N transitions
because its adds are slow (sampling does not depend on the fill once the frames exceed the CPU
caches); `fill1e+05` in a workload's name: every system holds that many transitions (the
84x84 capacity-1e6 rows, unless run with `--large`, which needs about 7 GB per system).
`ceiling: numpy gather` gathers the same frames (states and next states) from a NumPy array
by fancy indexing without any bookkeeping; `ceiling: memcpy` copies as many bytes
contiguously. The numpy ring returns channel-first stacks (`[batch, 4, 84, 84]`, no
transpose) and ignores episode boundaries when stacking."""

INGEST_NOTES = """Actor processes feed one learner process over loopback TCP
(`memoire.bench.ingest`). Cache mode (the seed's): memoire's actors `push_cache()` into a
ReplayMemoryServer and the learner draws `get_batch(cache_size)`. Central mode (Dopamine's
path): memoire's actors stream episodes in chunks of 256 rows into the server's memory; a
transition counts once stored and sampleable. raw pyzmq: each actor resends exactly the frames
of one of memoire's messages (a cache, a chunk) on PUSH and the learner receives them on PULL,
doing nothing else. The ratio here is memoire's throughput over raw pyzmq's (the fraction of
raw pyzmq memoire reaches; above 1, memoire's native paths move the same frames with less
work than pyzmq's Python receive loop)."""


def table(measurements: List[Measurement]) -> str:
    """A markdown table: one row per (workload, system), with the ratio of the baseline's
    throughput to each system's (``> 1`` means the baseline is faster). The baseline of a
    workload is its first measurement."""
    rows = [
        "| workload | system | median time/op | throughput | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    by_workload: Dict[str, List[Measurement]] = {}
    for m in measurements:
        by_workload.setdefault(m.workload, []).append(m)
    for workload, ms in by_workload.items():
        base = ms[0]
        for m in ms:
            ratio = m.median / base.median
            rows.append(
                f"| {workload} | {m.system} | {_fmt_time(m.median)} | "
                f"{_fmt_rate(m.throughput)} {m.unit}/s | {ratio:.2f}x |"
            )
    return "\n".join(rows)


def _fmt_time(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def ratio(measurements: List[Measurement], workload: str, system_prefix: str) -> Optional[float]:
    """The baseline's throughput over the first system of ``workload`` whose name starts with
    ``system_prefix`` (None when absent)."""
    ms = [m for m in measurements if m.workload == workload]
    other = next((m for m in ms if m.system.startswith(system_prefix)), None)
    if not ms or other is None:
        return None
    return other.median / ms[0].median


def header(extra: Optional[Dict[str, str]] = None) -> str:
    lines = ["| | |", "|---|---|"]
    for k, v in {**machine(), **versions(), **(extra or {})}.items():
        lines.append(f"| {k} | {v} |")
    return "\n".join(lines)


def targets(
    measurements: List[Measurement],
    atari_label: str,
    prio_label: str,
    memory_ratio: Optional[float],
) -> str:
    """The issue's targets, each with this run's value, as a markdown table.

    Args:
      atari_label / prio_label: the Config labels of the uniform and the prioritized Atari
        batch-32 workloads.
      memory_ratio: memoire's resident bytes per Atari transition over the raw frame bytes.
    """
    rows = ["| target | goal | this run | met |", "|---|---|---:|---|"]

    def row(what, goal, value, ok):
        shown = "not measured" if value is None else value
        met = "-" if value is None else ("yes" if ok else "**no**")
        rows.append(f"| {what} | {goal} | {shown} | {met} |")

    def speedup(workload, prefix, goal):
        r = ratio(measurements, workload, prefix)
        return (None, False) if r is None else (f"{r:.2f}x", r >= goal)

    sample = f"sample {atari_label}"
    upd = f"sample+update {prio_label}"
    row("sample 32 stacked Atari transitions vs cpprb", ">= 1.0x", *speedup(sample, "cpprb", 1.0))
    row(
        "sample 32 stacked Atari transitions vs Dopamine",
        ">= 20x",
        *speedup(sample, "dopamine (OutOfGraph)", 20.0),
    )
    g = ratio(measurements, sample, "ceiling: numpy gather")
    # The ceilings' ratio is memoire's throughput over the ceiling's: the fraction reached.
    row(
        "sample 32 stacked Atari transitions, fraction of the raw gather ceiling",
        ">= 70%",
        None if g is None else f"{100 * g:.0f}%",
        g is not None and g >= 0.7,
    )
    row("prioritized sample + priority update vs cpprb", ">= 1.0x", *speedup(upd, "cpprb", 1.0))
    row(
        "prioritized sample + priority update vs Dopamine",
        ">= 20x",
        *speedup(upd, "dopamine (OutOfGraph)", 20.0),
    )
    ingest = sorted({m.workload for m in measurements if m.workload.startswith("ingest")})
    for w in ingest:
        frac = ratio(measurements, w, "raw pyzmq")  # memoire's throughput over raw pyzmq's
        row(
            f"distributed {w.split('ingest ', 1)[1]}: fraction of raw pyzmq",
            ">= 80%",
            None if frac is None else f"{100 * frac:.0f}%",
            frac is not None and frac >= 0.8,
        )
    if not ingest:
        row("distributed ingest: fraction of raw pyzmq", ">= 80%", None, False)
    row(
        "resident bytes per Atari transition / raw frame bytes",
        "<= 1.1x",
        None if memory_ratio is None else f"{memory_ratio:.2f}x",
        memory_ratio is not None and memory_ratio <= 1.1,
    )
    return "\n".join(rows)
