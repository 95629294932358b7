"""``memoire bench``: the same workloads on memoire and the alternatives, in one run.

Every workload builds each available system for one configuration, fills them with the same
frames, then times the same operation on each, alternating, with several repetitions, and
reports medians and ratios (the first system's throughput over each system's; the first is
memoire's Dopamine-layout buffer). The systems: memoire's three faces (Dopamine layout,
native ReplayMemory, JAX ReplayBuffer), Dopamine's OutOfGraph and JAX buffers, cpprb, a NumPy
ring, and the gather and memcpy ceilings; raw pyzmq for the distributed ingest. The table,
the targets of issue 5, the machine, the versions, the load average and the date go to stdout
and, with ``--out``, to a markdown file; the scaling plot (scaling.png) goes next to it.

    memoire bench                       # the standard suite (about 10-15 min on 2 cores)
    memoire bench --quick               # small capacities, for a smoke run (about 3 min)
    memoire bench --out benchmarks/RESULTS.md

Workloads: uint8[84, 84] frames with stack 4 at capacities 1e5 and 1e6, float32[4] states at
1e6; batch sizes 32 and 256; n-step 1 and 3; uniform sampling and prioritized sampling plus a
priority update; per-step adds; save and load; ingest from 1, 2 and 4 actor processes;
resident memory per transition; time per batch against capacity (1e4 to 1e6).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import multiprocessing as mp
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from memoire.bench import report, systems
from memoire.bench.harness import Measurement, compare
from memoire.bench.systems import SAMPLERS, Config, Unavailable
from memoire.progress import Progress

log = logging.getLogger(__name__)


def _load_optional_adapters() -> None:
    try:
        import memoire.bench.dopamine  # noqa: F401  (registers Dopamine and compat adapters)
    except ImportError:
        pass


def _fill_of(cls: type, fill: int) -> int:
    return fill if cls.max_fill is None else min(fill, cls.max_fill)


def _build(cfg: Config, fill: int, classes: Sequence[type]) -> Dict[str, systems.System]:
    """Each available class built for ``cfg`` and filled; a partial fill shows in the name."""
    built: Dict[str, systems.System] = {}
    for cls in classes:
        try:
            s = cls(cfg)
        except Unavailable as e:
            log.info("skip %s: %s not installed", cls.name, e)
            continue
        n = _fill_of(cls, fill)
        s.add(n)
        name = s.name if n == fill else f"{s.name} [filled {n:,}]"
        built[name] = s
    return built


def _close(built: Dict[str, systems.System]) -> None:
    for s in built.values():
        s.close()
    built.clear()
    gc.collect()


def sample_workload(
    cfg: Config,
    fill: int,
    *,
    repeats: int,
    batches: Sequence[int] = (32,),
    with_update: bool = False,
    ceilings: bool = True,
    classes: Optional[Sequence[type]] = None,
) -> List[Measurement]:
    """Times one batch (with next states), or one batch plus a priority update, for each batch
    size on the same filled systems."""
    built = _build(cfg, fill, SAMPLERS if classes is None else classes)
    out: List[Measurement] = []
    for batch in batches:
        bcfg = dataclasses.replace(cfg, batch=batch)
        for s in built.values():
            s.cfg = bcfg
        ops: Dict[str, Callable[[], object]] = {}
        for name, s in built.items():
            if with_update:

                def op(s=s):
                    s.sample()
                    s.update()
            else:
                op = s.sample
            ops[name] = op
        ring = next((s for s in built.values() if isinstance(s, systems.NumpyRing)), None)
        if ceilings and not cfg.prioritized and not with_update and ring is not None:
            ops["ceiling: numpy gather"] = systems.GatherCeiling(bcfg, ring).sample
            ops["ceiling: memcpy"] = systems.MemcpyCeiling(bcfg).sample
        verb = "sample+update" if with_update else "sample"
        partial = f" fill{fill:.0e}" if fill < cfg.capacity else ""  # every system's fill
        out += compare(f"{verb} {bcfg.label}{partial}", ops, repeats=repeats, items_per_op=batch)
    _close(built)
    return out


def add_workload(cfg: Config, fill: int, adds: int, *, repeats: int) -> List[Measurement]:
    """Times adding transitions one by one (the per-step path of an agent), after ``fill``."""
    built = _build(cfg, fill, SAMPLERS)
    ops = {name: (lambda s=s: s.add(1)) for name, s in built.items()}
    out = compare(f"add {cfg.label}", ops, repeats=repeats, calls={n: adds for n in ops})
    _close(built)
    return out


def checkpoint_workload(cfg: Config, fill: int, *, repeats: int) -> List[Measurement]:
    """Times save and load of each Dopamine-API pair (memoire's drop-in vs Dopamine's), into
    temporary directories, one call per repetition."""
    try:
        from memoire.bench.dopamine import CHECKPOINT_PAIRS
    except ImportError:
        return []
    out: List[Measurement] = []
    for pair in CHECKPOINT_PAIRS:
        built = _build(cfg, fill, pair)
        if len(built) < 2:
            _close(built)
            continue
        for s in built.values():
            s.save()  # the first save creates files and directories
        label = f"{pair[0].name.split('(')[1].rstrip(')')} {cfg.label}"
        for verb in ("save", "load"):
            ops = {n: getattr(s, verb) for n, s in built.items()}
            out += compare(
                f"{verb} {label}",
                ops,
                repeats=repeats,
                calls={n: 1 for n in ops},
                items_per_op=fill,
            )
        _close(built)
    return out


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _trim() -> None:
    """Returns the C heap's free pages to the system (glibc), so that the resident set counts
    what the buffer holds, not what temporaries of the fill left free in the heap."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _memory_child(cls_name: str, cfg: Config, fill: int, queue) -> None:
    _load_optional_adapters()
    cls = next(c for c in SAMPLERS if c.name == cls_name)
    try:
        s = cls(cfg)  # imports happen here: a first tiny build, measured from after it
        del s
        gc.collect()
        _trim()
        before = _rss_bytes()
        s = cls(cfg)
        s.add(fill)
        s.sample()  # a system may allocate lazily on first sample
        _trim()
        queue.put((_rss_bytes() - before) / fill)
    except Unavailable:
        queue.put(None)


def memory_workload(cfg: Config, fill: int) -> Tuple[List[str], Dict[str, float]]:
    """Resident bytes per stored transition of each system (filled with ``fill`` transitions),
    each in a fresh spawned process: the growth of its resident set from before the buffer's
    construction to after the fill and one sample, divided by ``fill``.

    Returns:
      markdown rows, and each system's bytes per transition over the raw observation bytes.
    """
    rows, ratios = [], {}
    raw = int(np.prod(cfg.obs_shape)) * np.dtype(cfg.obs_dtype).itemsize
    ctx = mp.get_context("spawn")
    for cls in SAMPLERS:
        n = _fill_of(cls, fill)
        q = ctx.Queue()
        p = ctx.Process(target=_memory_child, args=(cls.name, cfg, n, q))
        p.start()
        try:
            per = q.get(timeout=900)
        except Exception:  # noqa: BLE001 - a child that died or hung gives no row
            per = None
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
        if per is not None:
            ratios[cls.name] = per / raw
            rows.append(
                f"| {cfg.label.rsplit(' batch', 1)[0]} | {cls.name} | {n:,} | "
                f"{per:,.0f} B | {per / raw:.2f}x |"
            )
    return rows, ratios


def scaling_plot(path: str, repeats: int, quick: bool) -> List[Measurement]:
    """Time per batch of memoire and the alternatives as capacity grows (1e4 to 1e6, full
    buffers) for batch sizes 32 and 256; one PNG with one panel per batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]
    classes = [c for c in SAMPLERS if c.name.startswith("memoire (Dopamine")] + [
        systems.NumpyRing,
        systems.Cpprb,
    ]
    series: Dict[tuple, List[float]] = {}
    results: List[Measurement] = []
    for cap in caps:
        cfg = Config(obs_shape=(4,), obs_dtype=np.float32, stack=1, capacity=cap)
        results += sample_workload(
            cfg, cap, repeats=repeats, batches=(32, 256), ceilings=False, classes=classes
        )
    for m in results:
        cap = int(float(m.workload.split(" cap")[1].split()[0]))
        batch = int(m.workload.split(" batch")[1].split()[0])
        series.setdefault((batch, m.system), []).append((cap, m.median * 1e6))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for batch, ax in zip((32, 256), axes):
        for (b, system), pts in series.items():
            if b == batch:
                ax.plot(*zip(*pts), marker="o", label=system)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("capacity (transitions, full)")
        ax.set_ylabel("time per batch (us)")
        ax.set_title(f"float32[4] states, uniform, batch {batch}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [dataclasses.replace(m, workload="scaling " + m.workload) for m in results]


def _loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "unknown"


def run_suite(args) -> str:
    """Runs the suite as ``memoire bench`` was asked (``args``: its parsed flags ``quick``,
    ``large``, ``repeats``, ``out``), announcing each stage (:class:`memoire.progress.Progress`);
    returns the report's markdown text."""
    _load_optional_adapters()
    repeats = args.repeats or (3 if args.quick else 5)
    atari_cap = 20_000 if args.quick else 100_000
    vec_cap = 100_000 if args.quick else 1_000_000
    load_start = _loadavg()
    try:
        from memoire.bench import ingest
    except ImportError:
        ingest = None
    n_steps = (1,) if args.quick else (1, 3)
    stages = len(n_steps) + (6 if args.quick else 7) + (ingest is not None)
    with Progress(stages, "memoire bench", log, unit="stage") as progress:
        return _run(args, repeats, atari_cap, vec_cap, n_steps, ingest, load_start, progress.stage)


def _run(args, repeats, atari_cap, vec_cap, n_steps, ingest, load_start, stage) -> str:
    """The workloads of :func:`run_suite`, each announced by ``stage(name)``; the report's text."""
    results: List[Measurement] = []
    atari = dict(obs_shape=(84, 84), obs_dtype=np.uint8, stack=4)
    vec = dict(obs_shape=(4,), obs_dtype=np.float32, stack=1)
    for n_step in n_steps:
        stage(f"atari uniform n{n_step}")
        results += sample_workload(
            Config(**atari, capacity=atari_cap, n_step=n_step),
            atari_cap,
            repeats=repeats,
            batches=(32, 256),
        )
    stage("atari prioritized")
    results += sample_workload(
        Config(**atari, capacity=atari_cap, prioritized=True),
        atari_cap,
        repeats=repeats,
        batches=(32, 256),
        with_update=True,
    )
    if not args.quick:
        stage("atari capacity 1e6")
        big_fill = 1_000_000 if args.large else 100_000
        # memoire commits its whole ring at construction (7 GB here); the other memoire
        # adapters would each take as much again, so this workload leaves them out.
        big = [
            c for c in SAMPLERS if not c.name.startswith("memoire") or getattr(c, "primary", False)
        ]
        results += sample_workload(
            Config(**atari, capacity=1_000_000),
            big_fill,
            repeats=repeats,
            batches=(32,),
            classes=big,
        )
    stage("vector uniform / prioritized")
    results += sample_workload(
        Config(**vec, capacity=vec_cap), vec_cap, repeats=repeats, batches=(32, 256)
    )
    results += sample_workload(
        Config(**vec, capacity=vec_cap, prioritized=True),
        vec_cap,
        repeats=repeats,
        batches=(32, 256),
        with_update=True,
    )
    stage("add")
    results += add_workload(Config(**atari, capacity=atari_cap), 2_000, 2_000, repeats=repeats)
    results += add_workload(Config(**vec, capacity=vec_cap), 2_000, 20_000, repeats=repeats)
    stage("save/load")
    ckpt = 2_000 if args.quick else 5_000
    results += checkpoint_workload(
        Config(**atari, capacity=ckpt), ckpt, repeats=2 if args.quick else 3
    )
    ingest_rows: List[Measurement] = []
    if ingest is not None:
        stage("ingest")
        ingest_rows = ingest.ingest_workload(
            actors=(1, 2) if args.quick else (1, 2, 4),
            repeats=repeats,
            seconds=0.5 if args.quick else 1.0,
        )

    out_dir = os.path.dirname(args.out) if args.out else "."
    plot_path = os.path.join(out_dir or ".", "scaling.png")
    stage("scaling")
    results += scaling_plot(plot_path, repeats, args.quick)
    stage("memory")
    mem_rows, mem_ratios = memory_workload(Config(**atari, capacity=atari_cap), atari_cap)
    load_end = _loadavg()

    sections = [
        "# memoire benchmark results",
        "Regenerate with `memoire bench --out benchmarks/RESULTS.md` (`make bench`); "
        "`memoire bench --quick` is a smaller smoke run.",
        report.header(
            {"load average (1/5/15 min) at start": load_start, "load average at end": load_end}
        ),
        "## Targets\n\n"
        + report.targets(
            results + ingest_rows,
            Config(**atari, capacity=atari_cap).label,
            Config(**atari, capacity=atari_cap, prioritized=True).label,
            next((v for k, v in mem_ratios.items() if k.startswith("memoire (Dopamine")), None),
        ),
        "## Throughput\n\n" + report.NOTES + "\n\n" + report.table(results),
    ]
    if ingest_rows:
        sections.append(
            "## Distributed ingest\n\n" + report.INGEST_NOTES + "\n\n" + report.table(ingest_rows)
        )
    else:
        sections.append(
            "## Distributed ingest\n\nNot measured: memoire.bench.ingest needs "
            "memoire's network layer (ReplayMemoryServer / ReplayMemoryClient)."
        )
    sections += [
        "## Memory per stored transition\n\nResident-set growth of a fresh process from before "
        "the buffer's construction to after the fill and one sample, over the transitions "
        "stored. The raw frame is one uint8[84, 84] (7,056 B).\n\n"
        "| configuration | system | transitions | resident bytes / transition | x raw frame |\n"
        "|---|---|---:|---:|---:|\n" + "\n".join(mem_rows),
        f"## Scaling\n\n![scaling]({os.path.basename(plot_path)})\n\nTime per batch as the "
        "capacity grows (full buffers, float32[4] states); the numbers are the `scaling` rows "
        "of the throughput table.",
    ]
    return "\n\n".join(sections)
