"""Compressed states (ReplayMemory's ``compress_states``) on real Atari screens: the memory
saved and the sampling rate it costs, compressed next to raw, in one run.

Frames: recorded from the ALE (ale-py's bundled ROMs) with random actions, through Dopamine's
own ``atari_lib.create_atari_environment`` (``benchmarks/_ale_frames.py``: sticky actions 0.25,
frame skip 4, grayscale, the max of the last two frames, cv2's area resize to uint8[84, 84]),
as a Dopamine agent stores them. A second source is uniformly
random frames, which do not compress (the worst case). A memory is filled with ``--fill``
transitions by cycling the recorded frames (each frame is compressed on its own, so cycling
changes no frame's size).

For each source it reports:
  - state bytes per transition: ``stored_state_bytes / size`` (the compressed blocks' payload,
    or the raw rows);
  - resident bytes per transition: the RSS growth of a fresh subprocess from before the
    memory's construction to after the fill and one batch, over the transitions stored
    (everything: states, the other fields, bookkeeping, sum tree, allocator overhead); then
    again after the ring was written over 3 more times, each slot getting other frames (the
    allocator's steady state under eviction);
  - sampling: ``get_batch(32)`` with frame_stack 4 (prev and next stacks of every field),
    batches per CPU second of the process (all its threads: on a shared machine the load of
    other processes disturbs CPU time less than wall time; both are printed), compressed and
    raw timed alternately, medians of ``--reps``;
  - adding: ``add_entries`` of 1,000-step episodes, transitions per CPU second, alternately.
Ratios are compressed / raw.

    nice python benchmarks/bench_compression.py [--games Pong,Breakout,SpaceInvaders]
        [--frames 3000] [--fill 30000] [--reps 7]

Linux only (RSS from /proc). Needs ale-py for the Atari rows (without it, random frames only).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _ale_frames  # noqa: E402  (screens recorded through Dopamine's Atari preprocessing)

SHAPE = (84, 84)
STACK = 4
BATCH = 32
EPISODE = 1000
WRAPS = 3  # times the ring is written over after the first fill


def _fill(rem, frames: np.ndarray, fill: int, rng_seed: int = 0, offset: int = 0):
    """Adds `fill` transitions (episodes of EPISODE steps) cycling through `frames` from
    frame `offset`."""
    rng = np.random.default_rng(rng_seed)
    n = len(frames)
    for start in range(0, fill, EPISODE):
        steps = min(EPISODE, fill - start)
        idx = (np.arange(start, start + steps) + offset) % n
        rem.new_episode()
        rem.add_entries(
            frames[idx],
            rng.integers(0, 6, steps),
            rng.normal(size=steps).astype(np.float32),
            np.zeros(steps, np.float32),
            rng.normal(size=steps).astype(np.float32),
            np.zeros((steps, 0), np.uint8),
            np.ones(steps, np.float32),
        )
        rem.close_episode()


def _memory(capacity: int, compress: bool):
    from memoire import ReplayMemory
    from memoire.bench.ingest import templates

    rem = ReplayMemory(*templates(SHAPE, np.uint8), capacity, compress_states=compress)
    rem.frame_stack = STACK
    rem.seed(0)
    return rem


def child(path: str, fill: int, compress: bool) -> dict:
    """In a fresh process: RSS growth per transition of a memory filled from `path`, after the
    first fill and after the ring has been written over WRAPS more times (other frames in each
    slot: the allocator's steady state)."""
    from memoire.bench.memory import proc_status

    frames = np.load(path)
    base = proc_status("VmRSS")
    rem = _memory(fill, compress)
    out = {}
    for w in range(1 + WRAPS):
        _fill(rem, frames, fill, rng_seed=w, offset=w * 777)
        rem.get_batch(BATCH)
        out["rss_first" if w == 0 else "rss_wrapped"] = (proc_status("VmRSS") - base) / rem.size
    return out


def _rss(path: str, fill: int, compress: bool) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", path, "--fill", str(fill)]
        + (["--compress"] if compress else []),
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rates(fn, count: int):
    """Calls per CPU second and per wall second of `count` calls of fn."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        fn()
    return count / (time.process_time() - cpu), count / (time.perf_counter() - wall)


def measure(name: str, frames: np.ndarray, fill: int, reps: int, tmp: str) -> dict:
    path = os.path.join(tmp, f"{name}.npy")
    np.save(path, frames)
    row = {"source": name, "frames": len(frames), "fill": fill}
    for compress in (True, False):
        rss = _rss(path, fill, compress)
        key = "packed" if compress else "raw"
        row["rss_" + key], row["rsswrap_" + key] = rss["rss_first"], rss["rss_wrapped"]
    mems = {c: _memory(fill, c) for c in (True, False)}
    adds = {True: [], False: []}
    add_fill = min(fill, 10 * EPISODE)
    for _ in range(reps):  # adding, alternately (fresh memories each time)
        for c in (True, False):
            m = _memory(add_fill, c)
            t = time.process_time()
            _fill(m, frames, add_fill)
            adds[c].append(add_fill / (time.process_time() - t))
    for m in mems.values():
        _fill(m, frames, fill)
    row["state_packed"] = mems[True].stored_state_bytes / mems[True].size
    row["state_raw"] = mems[False].stored_state_bytes / mems[False].size
    samples = {True: [], False: []}
    count = 200
    for _ in range(reps):  # sampling, alternately
        for c in (True, False):
            samples[c].append(_rates(lambda m=mems[c]: m.get_batch(BATCH), count))
    for c in (True, False):
        key = "packed" if c else "raw"
        row["sample_" + key] = statistics.median(cpu for cpu, _ in samples[c])
        row["wall_" + key] = statistics.median(wall for _, wall in samples[c])
        row["add_" + key] = statistics.median(adds[c])
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--games", default=",".join(_ale_frames.GAMES))
    p.add_argument("--frames", type=int, default=3000, help="frames recorded per game")
    p.add_argument("--fill", type=int, default=30000, help="transitions stored per memory")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--compress", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.fill, a.compress)))
        return 0

    sources = []
    try:
        import ale_py  # noqa: F401

        games = [g for g in a.games.split(",") if g]
        per_game = [_ale_frames.record_game(g, a.frames, seed=k) for k, g in enumerate(games)]
        sources.append(("atari " + "+".join(games), np.concatenate(per_game)))
    except ImportError:
        print("ale-py is not installed: random frames only", file=sys.stderr)
        per_game, games = [], []
    rng = np.random.default_rng(0)
    sources.append(("random", rng.integers(0, 256, (2000,) + SHAPE, dtype=np.uint8)))

    print(f"load: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} CPUs")
    if per_game:  # each game's own compression, for the record
        for g, f in zip(games, per_game):
            m = _memory(len(f), True)
            _fill(m, f, len(f))
            print(f"{g}: {m.stored_state_bytes / m.size:,.0f} B per frame compressed (raw 7,056)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, frames in sources:
            rows.append(measure(name, frames, a.fill, a.reps, tmp))
    print()
    print("| frames | state B/transition raw | compressed | ratio | resident B/transition raw "
          "| compressed | ratio | after wrapping: raw | compressed | ratio "
          "| sample batch 32 raw (CPU) | compressed | ratio | wall ratio "
          "| add raw (CPU) | compressed | ratio |")  # fmt: skip
    print("|---|" + "---:|" * 16)
    for r in rows:
        print(
            f"| {r['source']} ({r['fill']:,} transitions) "
            f"| {r['state_raw']:,.0f} | {r['state_packed']:,.0f} "
            f"| {r['state_packed'] / r['state_raw']:.2f}x "
            f"| {r['rss_raw']:,.0f} | {r['rss_packed']:,.0f} "
            f"| {r['rss_packed'] / r['rss_raw']:.2f}x "
            f"| {r['rsswrap_raw']:,.0f} | {r['rsswrap_packed']:,.0f} "
            f"| {r['rsswrap_packed'] / r['rsswrap_raw']:.2f}x "
            f"| {r['sample_raw']:,.0f}/s | {r['sample_packed']:,.0f}/s "
            f"| {r['sample_packed'] / r['sample_raw']:.2f}x "
            f"| {r['wall_packed'] / r['wall_raw']:.2f}x "
            f"| {r['add_raw']:,.0f}/s | {r['add_packed']:,.0f}/s "
            f"| {r['add_packed'] / r['add_raw']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
