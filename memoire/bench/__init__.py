"""``memoire bench``: the same workloads on memoire and the alternatives, in one run.

Every workload builds each available system for one configuration, fills them with the same
frames, then times the same operation on each, alternating, with several repetitions, and
reports medians and ratios (memoire's throughput over each system's). The table, the machine,
the versions and the date go to stdout and, with ``--out``, to a markdown file; scaling plots
(PNG) go next to it.

    memoire bench                       # the standard suite (a few minutes)
    memoire bench --quick               # small capacities, for a smoke run
    memoire bench --out benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import os
import sys
from typing import Callable, Dict, List, Sequence

import numpy as np

from memoire.bench import report, systems
from memoire.bench.harness import Measurement, compare
from memoire.bench.systems import Config, Unavailable

# System classes in table order; memoire's adapters first. Adapters register themselves here.
SAMPLERS: List[type] = [systems.MemoireCore, systems.NumpyRing, systems.Cpprb]


def register(cls: type) -> type:
    """Adds a system adapter to the suite (used by memoire.bench.dopamine)."""
    SAMPLERS.insert(len([c for c in SAMPLERS if c.name.startswith("memoire")]) if
                    cls.name.startswith("memoire") else len(SAMPLERS), cls)
    return cls


def _load_optional_adapters() -> None:
    try:
        import memoire.bench.dopamine  # noqa: F401  (registers Dopamine and compat adapters)
    except ImportError:
        pass


def _build(cfg: Config, fill: int, classes: Sequence[type]) -> Dict[str, systems.System]:
    built: Dict[str, systems.System] = {}
    for cls in classes:
        try:
            s = cls(cfg)
        except Unavailable as e:
            print(f"  skip {cls.name}: {e} not installed", file=sys.stderr)
            continue
        s.add(fill)
        built[s.name] = s
    return built


def sample_workload(cfg: Config, fill: int, *, repeats: int, with_update: bool = False,
                    ceilings: bool = True) -> List[Measurement]:
    """Times one batch (with next states), or one batch plus a priority update."""
    built = _build(cfg, fill, SAMPLERS)
    if ceilings and not cfg.prioritized and not with_update and "numpy ring" in built:
        built["ceiling: numpy gather"] = systems.GatherCeiling(cfg, built["numpy ring"])
        built["ceiling: memcpy"] = systems.MemcpyCeiling(cfg)
    ops: Dict[str, Callable[[], object]] = {}
    for name, s in built.items():
        if with_update:
            def op(s=s):
                s.sample()
                s.update()
        else:
            op = s.sample
        ops[name] = op
    verb = "sample+update" if with_update else "sample"
    out = compare(f"{verb} {cfg.label}", ops, repeats=repeats, items_per_op=cfg.batch)
    del built
    gc.collect()
    return out


def add_workload(cfg: Config, fill: int, adds: int, *, repeats: int) -> List[Measurement]:
    """Times adding transitions one by one (the per-step path of an agent)."""
    built = _build(cfg, fill, SAMPLERS)
    ops = {name: (lambda s=s: s.add(1)) for name, s in built.items()
           if not name.startswith("ceiling")}
    out = compare(f"add {cfg.label}", ops, repeats=repeats, calls={n: adds for n in ops})
    del built
    gc.collect()
    return out


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _memory_child(cls_name: str, cfg: Config, fill: int, queue) -> None:
    _load_optional_adapters()
    cls = next(c for c in SAMPLERS if c.name == cls_name)
    gc.collect()
    before = _rss_bytes()
    try:
        s = cls(cfg)
        s.add(fill)
    except Unavailable:
        queue.put(None)
        return
    queue.put((_rss_bytes() - before) / fill)


def memory_workload(cfg: Config, fill: int) -> List[str]:
    """Resident bytes per stored transition of each system, each in a fresh process."""
    rows = []
    raw = int(np.prod(cfg.obs_shape)) * np.dtype(cfg.obs_dtype).itemsize
    ctx = mp.get_context("spawn")
    for cls in SAMPLERS:
        q = ctx.Queue()
        p = ctx.Process(target=_memory_child, args=(cls.name, cfg, fill, q))
        p.start()
        p.join(timeout=600)
        if p.is_alive():
            p.kill()
            continue
        per = q.get(timeout=5) if not q.empty() else None
        if per is not None:
            rows.append(f"| {cfg.label} | {cls.name} | {per:,.0f} B | {per / raw:.2f}x |")
    return rows


def scaling_plot(path: str, repeats: int, quick: bool) -> List[Measurement]:
    """Time per sample of memoire and the NumPy ring as capacity and batch size grow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]
    results: List[Measurement] = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for batch, ax in zip((32, 256), axes):
        for cls in (systems.MemoireCore, systems.NumpyRing):
            ys = []
            for cap in caps:
                cfg = Config(obs_shape=(4,), obs_dtype=np.float32, stack=1, capacity=cap, batch=batch)
                s = cls(cfg)
                s.add(cap)
                m = compare(f"scaling {cfg.label}", {cls.name: s.sample}, repeats=repeats)[0]
                results.append(m)
                ys.append(m.median * 1e6)
                del s
            ax.plot(caps, ys, marker="o", label=cls.name)
        ax.set_xscale("log")
        ax.set_xlabel("capacity (transitions)")
        ax.set_ylabel("time per batch (us)")
        ax.set_title(f"4-float states, batch {batch}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="memoire bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small capacities, 3 repetitions")
    parser.add_argument("--large", action="store_true",
                        help="also 84x84 frames at capacity 1,000,000 (about 15 GB of memory)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", default=None, help="write the report (markdown) here")
    args = parser.parse_args(argv)
    _load_optional_adapters()
    repeats = args.repeats or (3 if args.quick else 5)
    atari_cap = 20_000 if args.quick else 100_000
    vec_cap = 100_000 if args.quick else 1_000_000

    results: List[Measurement] = []
    atari = dict(obs_shape=(84, 84), obs_dtype=np.uint8, stack=4)
    vec = dict(obs_shape=(4,), obs_dtype=np.float32, stack=1)
    for batch in (32, 256):
        for n_step in (1, 3):
            cfg = Config(**atari, capacity=atari_cap, batch=batch, n_step=n_step)
            results += sample_workload(cfg, atari_cap, repeats=repeats)
    cfg = Config(**atari, capacity=atari_cap, batch=32, prioritized=True)
    results += sample_workload(cfg, atari_cap, repeats=repeats, with_update=True)
    for batch in (32, 256):
        results += sample_workload(Config(**vec, capacity=vec_cap, batch=batch), vec_cap,
                                   repeats=repeats)
    results += sample_workload(Config(**vec, capacity=vec_cap, batch=32, prioritized=True),
                               vec_cap, repeats=repeats, with_update=True)
    if args.large:
        big = Config(**atari, capacity=1_000_000, batch=32)
        results += sample_workload(big, 1_000_000, repeats=repeats)
    results += add_workload(Config(**atari, capacity=atari_cap), 2_000, 2_000, repeats=repeats)
    results += add_workload(Config(**vec, capacity=vec_cap), 2_000, 20_000, repeats=repeats)

    out_dir = os.path.dirname(args.out) if args.out else "."
    plot_path = os.path.join(out_dir or ".", "scaling.png")
    results += scaling_plot(plot_path, repeats, args.quick)
    mem_rows = memory_workload(Config(**atari, capacity=atari_cap), atari_cap)

    text = "\n\n".join([
        "# memoire benchmark results",
        "Regenerate with `memoire bench --out benchmarks/RESULTS.md` (from `make bench`).",
        report.header(),
        "## Throughput\n\nRatios are memoire's throughput over each system's (> 1: memoire is "
        "faster); for the ceilings, below 1 is the fraction of the ceiling memoire reaches.\n\n"
        + report.table(results),
        "## Memory per stored transition\n\n| configuration | system | resident bytes | x raw frame |\n"
        "|---|---|---:|---:|\n" + "\n".join(mem_rows),
        f"## Scaling\n\n![scaling]({os.path.basename(plot_path)})",
    ])
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0
