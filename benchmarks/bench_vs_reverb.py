"""memoire against Reverb (dm-reverb 0.14.0) on the same workloads, in the same run: ingest,
sampling from a learner in its own process (idle and under a full-speed writer) and server
memory per transition; a markdown table of memoire/Reverb ratios.

    PYTHONPATH=$PWD nice -n 10 python benchmarks/bench_vs_reverb.py \\
        --setup-reverb /tmp/reverbenv            # once: Reverb's own venv (minutes, ~1.3 GB)
    PYTHONPATH=$PWD nice -n 10 python benchmarks/bench_vs_reverb.py \\
        --reverb-python /tmp/reverbenv/bin/python [--seconds 3] [--repeats 1] [--memory-items 5000]
    PYTHONPATH=$PWD python benchmarks/bench_vs_reverb.py --quick   # memoire only, seconds

Reverb needs TensorFlow 2.15, so it lives in a virtual environment of its own and runs in a
child process of that interpreter (``benchmarks/_reverb_driver.py``, JSON lines over its
stdin/stdout); memoire's environment never imports it. Without ``--reverb-python`` only
memoire's columns are measured.

Workloads, in two layouts: Atari-like uint8[84,84] frames stacked 4, and CartPole-like
float32[4] observations (stack 1); batches of 32:

1. ingest, 1 and 2 actor processes, transitions stored per second at the server. memoire:
   central mode, ``ReplayMemoryClient(mode="central")`` chunks of 256 rows
   (:func:`memoire.bench.ingest.measure`); Reverb: ``trajectory_writer`` with one
   ``create_item`` per step over the last stack + 1 observations (see the driver's docstring).
2. sampling from a prefilled, idle server: in the server's own process (memoire's
   ``get_batch``, Reverb's ``TrajectoryDataset`` beside its server), and from a learner in its
   own process: memoire's ``SamplingStream`` (credit 32, shared memory on one host) and
   ``RemoteMemory.sample`` for reference; Reverb's ``TrajectoryDataset(...).batch(32)``.
   Batches per second.
3. the same (Atari, learner process) while one writer process writes: paced (``--paced-rate``
   transitions per second, a few actors' worth) or at full speed, without a limiter, and at
   full speed with ``SampleToInsertRatio(8, FILLED, 100 * 32)`` on both sides.
4. server memory per transition: the RSS growth of the server's process divided by the
   transitions stored, on random frames, on synthetic compressible (Breakout-like) frames and
   on screens recorded from ALE games (``benchmarks/_ale_frames.py``); memoire stores frames
   raw, and again with ``compress_states`` (LZ4 per frame, docs/COMPRESSION.md) on the
   compressible kinds; Reverb compresses its chunks (zstd) always.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _reverb_driver as rd  # noqa: E402  (numpy only at import: the frames and constants)
import bench_rate_limiter as brl  # noqa: E402  (its writer, prefill and limiter settings)

BATCH = rd.BATCH
RAW_BYTES = int(np.prod(rd.FRAME))  # one uint8[84,84] frame: 7,056 bytes
CTX = mp.get_context("spawn")
SETUP_HINT = (
    "Reverb columns skipped: create its venv with `python benchmarks/bench_vs_reverb.py "
    "--setup-reverb /tmp/reverbenv` and pass `--reverb-python /tmp/reverbenv/bin/python`."
)


# ---------------------------------------------------------------------------- memoire


def memoire_ingest(actors: int, seconds: float, layout: str = "atari") -> float:
    """Transitions stored per second by `actors` central-mode actor processes."""
    from memoire.bench import ingest

    shape, dtype, _ = rd.LAYOUTS[layout]
    setup = ingest.Setup(
        mode="central", shape=shape, dtype=np.dtype(dtype), actors=actors, spi=0.0, capacity=20000
    )
    sec = ingest.measure(setup, repeats=1, seconds=seconds)["memoire"]
    return 1.0 / sec[0]


def _learner(way: str, endpoint: str, seconds: float, out) -> None:
    """A learner process: batches per second of `way` ("stream" or "remote")."""
    from memoire.remote import RemoteMemory
    from memoire.stream import SamplingStream

    if way == "stream":
        src = SamplingStream(endpoint, BATCH, timeout=30)
        take = src.__next__
    else:
        src = RemoteMemory(endpoint, timeout=30, retries=0)
        take = lambda: src.sample(BATCH, timeout=20)  # noqa: E731
    with src:
        end = time.monotonic() + 0.5  # warm-up
        while time.monotonic() < end:
            take()
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            take()
            n += 1
        out.put(n / (time.monotonic() - t0))


def _fill(rem, items: int, obs: np.ndarray) -> None:
    """Stores `items` transitions in `rem`, in episodes of rd.EPISODE whose observations are
    `obs[:EPISODE]` (made once, so that no temporary array is allocated while memory is
    measured)."""
    stored = 0
    while stored < items:
        k = min(rd.EPISODE, items - stored)
        rem.new_episode()
        rem.add_entries(
            obs[:k],
            np.zeros(k, np.int64),
            np.full(k, 0.5, np.float32),
            np.full(k, 0.5, np.float32),
            np.zeros(k, np.float32),
            np.zeros((k, 0), np.uint8),
            np.ones(k, np.float32),
        )
        rem.close_episode()
        stored += k


def _inprocess(srv, seconds: float) -> float:
    """Batches per second of ``get_batch`` in the server's own process (prev and next stacks)."""
    rem = srv.rem
    end = time.monotonic() + 0.5  # warm-up
    while time.monotonic() < end:
        rem.get_batch(BATCH)
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        rem.get_batch(BATCH)
        n += 1
    return n / (time.monotonic() - t0)


def memoire_sample(
    case: str, way: str, seconds: float, layout: str = "atari", rate: float = 0.0
) -> float:
    """Batches per second of a learner sampling `way` ("stream", "remote" from a process of its
    own, or "inprocess": ``get_batch`` in the server's process) from a server in this process
    (threads) holding about ``brl.FILLED`` transitions; `case` is "idle", "writer" (at `rate`
    transitions per second, 0: full speed) or "writer+limiter" (as
    ``bench_rate_limiter.run_case``). Writers write Atari frames."""
    from memoire import ReplayMemoryServer
    from memoire.bench.ingest import templates
    from memoire.rate_limiter import SampleToInsertRatio

    limiter = None
    if case == "writer+limiter":
        limiter = SampleToInsertRatio(
            samples_per_insert=rd.SAMPLES_PER_INSERT,
            min_size_to_sample=brl.FILLED,
            error_buffer=100 * BATCH,
        )
    shape, dtype, stack = rd.LAYOUTS[layout]
    srv = ReplayMemoryServer(
        *templates(shape, np.dtype(dtype)), brl.CAPACITY, None, rate_limiter=limiter, seed=0
    )
    srv.rem.frame_stack = stack
    writer, stop = None, CTX.Event()
    try:
        ep = srv.start()
        endpoint = srv.start_stream("tcp://127.0.0.1:*") if way == "stream" else ep["rep"]
        if case == "idle":
            rng = np.random.default_rng(0)
            _fill(srv.rem, brl.FILLED, rd.frames("random", rd.EPISODE, rng, layout))
        else:
            writer = CTX.Process(
                target=brl._writer,
                daemon=True,
                args=(ep["pull"], srv._central.ingest.row_spec, stop, rate),
            )
            writer.start()
            if not srv.wait_rows_in(brl.FILLED, 120):
                raise RuntimeError("the writer did not fill the memory within 120 s")
        if way == "inprocess":
            return _inprocess(srv, seconds)
        out = CTX.Queue()
        learner = CTX.Process(target=_learner, args=(way, endpoint, seconds, out), daemon=True)
        learner.start()
        rate = out.get(timeout=seconds + 120)
        learner.join(30)
        return rate
    finally:
        stop.set()
        if writer is not None:
            writer.join(30)
            if writer.is_alive():
                writer.kill()
        srv.close()


def _rss() -> int:
    return rd._rss()


def _memory_child(items: int, kind: str, source, compress: bool, out) -> None:
    from memoire import ReplayMemoryServer

    srv = ReplayMemoryServer(*brl._templates(), items, None, compress_states=compress)
    rem = srv.rem
    rem.frame_stack = rd.STACK
    obs = rd.frames(kind, rd.EPISODE, np.random.default_rng(0), "atari", source)
    before = _rss()
    _fill(rem, items, obs)
    out.put((_rss() - before) / rem.size)
    srv.close()


def memoire_memory(items: int, kind: str, source=None, compress: bool = False) -> float:
    """Bytes of server RSS per stored transition (a server process of its own), states stored
    raw or, with `compress`, LZ4-compressed (``compress_states``)."""
    out = CTX.Queue()
    p = CTX.Process(target=_memory_child, args=(items, kind, source, compress, out), daemon=True)
    p.start()
    try:
        return out.get(timeout=300)
    finally:
        p.join(30)


# ---------------------------------------------------------------------------- Reverb


class Reverb:
    """``_reverb_driver.py`` in Reverb's interpreter, one JSON request and reply per line."""

    def __init__(self, python: str):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="reverb-driver-", suffix=".log")
        driver = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reverb_driver.py")
        self.proc = subprocess.Popen(
            [python, driver],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
        )
        self._reply()  # its worker processes have imported Reverb

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            tail = self.log.read()[-3000:]
            raise RuntimeError(f"the Reverb driver exited ({self.proc.poll()}); its log:\n{tail}")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise RuntimeError(f"Reverb driver: {reply['error']}")
        return reply

    def __call__(self, op: str, **kw) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        return self._reply()

    def close(self) -> None:
        try:
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.close()
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.log.close()


def setup_reverb(folder: str) -> None:
    """Creates Reverb's virtual environment in `folder` (python3.11, dm-reverb 0.14.0)."""
    subprocess.run(["python3.11", "-m", "venv", folder], check=True)
    pip = os.path.join(folder, "bin", "pip")
    subprocess.run(
        [pip, "install", "dm-reverb==0.14.0", "tensorflow-cpu==2.15.*", "numpy<2"], check=True
    )
    print(f"Reverb installed: pass --reverb-python {os.path.join(folder, 'bin', 'python')}")


# ---------------------------------------------------------------------------- the table


LAYOUT_NAMES = {"atari": "Atari uint8[84,84] stack 4", "small": "CartPole float32[4]"}
FRAME_NAMES = {
    "random": "random frames",
    "compressible": "synthetic compressible frames",
    "ale": "ALE screens (Pong, Breakout, Space Invaders)",
}


def _fmt(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.2f}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setup-reverb", metavar="DIR", help="create Reverb's venv in DIR and exit")
    ap.add_argument("--reverb-python", metavar="PY", help="Reverb's interpreter (DIR/bin/python)")
    ap.add_argument("--seconds", type=float, default=3.0, help="timed window per measurement")
    ap.add_argument("--repeats", type=int, default=1, help="alternating runs (medians)")
    ap.add_argument("--memory-items", type=int, default=5000, help="transitions (memory rows)")
    ap.add_argument(
        "--paced-rate",
        type=float,
        default=2000.0,
        help="the paced writer's transitions per second (a few actors' worth)",
    )
    ap.add_argument(
        "--ale-frames",
        metavar="NPY",
        help="uint8[N,84,84] screens recorded from ALE (default: benchmarks/_ale_frames.py "
        "records them once into /tmp); 'none' leaves the ALE memory row out",
    )
    ap.add_argument(
        "--only", metavar="TEXT", help="measure only the rows whose workload contains TEXT"
    )
    ap.add_argument(
        "--quick", action="store_true", help="memoire only, tiny: ingest 1 actor, idle stream"
    )
    args = ap.parse_args(argv)
    if args.setup_reverb:
        setup_reverb(args.setup_reverb)
        return
    reverb = None
    if args.quick:
        args.reverb_python, args.seconds, args.memory_items, args.repeats = None, 0.3, 500, 1
    if args.reverb_python:
        reverb = Reverb(args.reverb_python)
    else:
        print(SETUP_HINT)
    rows = []  # (workload, unit, memoire, Reverb, higher is better)

    def row(name, unit, mem_fn, rev_op, rev_key, better="higher", **kw):
        """Measures memoire (`mem_fn()`) and Reverb (`rev_op`) alternately, --repeats times
        each, and keeps the medians."""
        if args.only and args.only not in name:
            return
        mems, revs = [], []
        for _ in range(args.repeats):
            mems.append(mem_fn())
            if reverb is not None:
                revs.append(reverb(rev_op, **kw)[rev_key])
        mem, rev = statistics.median(mems), (statistics.median(revs) if revs else None)
        rows.append((name, unit, mem, rev, better))
        runs = ", ".join(_fmt(x) for x in mems) + " / " + ", ".join(_fmt(x) for x in revs)
        print(f"{name} ({unit}), memoire / Reverb: {runs}", file=sys.stderr, flush=True)

    s = args.seconds
    layouts = ("atari",) if args.quick else ("atari", "small")
    ale = None
    if not args.quick and args.ale_frames != "none":
        import _ale_frames

        ale = args.ale_frames or _ale_frames.recorded()
    try:
        for layout in layouts:
            for n in (1,) if args.quick else (1, 2):
                row(
                    f"ingest, {LAYOUT_NAMES[layout]}, {n} actor{'s' if n > 1 else ''}",
                    "transitions/s",
                    lambda n=n, lay=layout: memoire_ingest(n, s, lay),
                    "ingest",
                    "items_per_s",
                    actors=n,
                    seconds=s,
                    layout=layout,
                )
        fill = brl.FILLED
        # (case, way, layout): writers write Atari frames.
        cases = [("idle", "stream", "atari")]
        if not args.quick:
            cases += [("idle", "inprocess", "atari"), ("idle", "remote", "atari")]
            cases += [("idle", "inprocess", "small"), ("idle", "stream", "small")]
            cases += [("paced", "stream", "atari"), ("writer", "stream", "atari")]
            cases += [("writer", "remote", "atari"), ("writer+limiter", "remote", "atari")]
            cases += [("writer+limiter", "stream", "atari")]
        for case, way, layout in cases:
            way_name = {
                "stream": "learner process, SamplingStream",
                "remote": "learner process, RemoteMemory.sample",
                "inprocess": "server's process, get_batch",
            }[way]
            when = {
                "idle": "idle",
                "paced": f"writer at {args.paced_rate:,.0f}/s",
                "writer": "full-speed writer",
            }.get(case, "full-speed writer, limiter on")
            row(
                f"sample B={BATCH}, {LAYOUT_NAMES[layout]}, {when}: {way_name} "
                f"/ TrajectoryDataset{' in process' if way == 'inprocess' else ''}",
                "batches/s",
                lambda c=case, w=way, lay=layout: memoire_sample(
                    "writer" if c == "paced" else c,
                    w,
                    s,
                    lay,
                    args.paced_rate if c == "paced" else 0.0,
                ),
                "sample",
                "batches_per_s",
                writer=case != "idle",
                limiter=case == "writer+limiter",
                seconds=s,
                fill=fill,
                rate=args.paced_rate if case == "paced" else 0.0,
                inprocess=way == "inprocess",
                layout=layout,
            )
        kinds = ("random",) if args.quick else ("random", "compressible")
        kinds += ("ale",) if ale else ()
        runs = [(kind, False) for kind in kinds]
        runs += [(kind, True) for kind in kinds if kind != "random" and not args.quick]
        for kind, packed in runs:
            row(
                f"server memory per transition, {FRAME_NAMES[kind]} (raw frame {RAW_BYTES:,} B)"
                + (", memoire with compress_states" if packed else ""),
                "bytes",
                lambda k=kind, c=packed: memoire_memory(args.memory_items, k, ale, c),
                "memory",
                "bytes_per_item",
                better="lower",
                items=args.memory_items,
                frames=kind,
                source=ale,
            )
    finally:
        if reverb is not None:
            reverb.close()

    load = os.getloadavg()
    print(
        f"\nbatch {BATCH}, {s} s windows, "
        f"medians of {args.repeats}, "
        f"{os.cpu_count()} cpus, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}\n"
    )
    print("| workload | unit | memoire | Reverb | memoire/Reverb |")
    print("|---|---|---|---|---|")
    for name, unit, mem, rev, better in rows:
        ratio = f"{mem / rev:.2f}x" if rev else "-"
        if rev and better == "lower":
            ratio += " (lower is better)"
        print(f"| {name} | {unit} | {_fmt(mem)} | {_fmt(rev)} | {ratio} |")


if __name__ == "__main__":
    main()
