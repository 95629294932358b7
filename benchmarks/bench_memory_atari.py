"""Resident memory of memoire's and Dopamine's (dopamine-rl 4.1.2) TF-era replay buffers at
Dopamine's stock Atari size, side by side.

Setting: OutOfGraphReplayBuffer, uint8[84, 84] observations, stack 4, capacity 1,000,000,
batch 32. Each implementation runs in its own fresh subprocess, one after the other, and
reports (bytes from /proc/self/status; peaks via VmHWM reset with /proc/self/clear_refs):

- RSS growth over construction;
- RSS growth after adding ``--fill`` transitions, and its ratio to the raw frame bytes
  (fill * 84 * 84);
- saving Dopamine's checkpoint files: RSS before, peak RSS while saving, their ratio, seconds;
- loading them into a fresh buffer: RSS growth, peak growth, seconds.

A full fill (1,000,000 frames, 7 GB raw for each implementation; Dopamine's load then commits
the whole 7 GB store too) needs about 16 GB free; the default fills a tenth.

    nice -n 10 env PYTHONPATH=. python benchmarks/bench_memory_atari.py [--fill 100000]
        [--capacity 1000000] [--only memoire|dopamine]

Linux only. Needs dopamine-rl for the Dopamine column.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from memoire.bench.memory import proc_status as status
from memoire.bench.memory import reset_peak

SHAPE = (84, 84)
STACK = 4
BATCH = 32
EPISODE = 1000  # steps per episode (a terminal every EPISODE adds)


def frame(i):
    """An Atari-like frame: a fixed background and an 8x8 sprite that moves with i (so frames
    differ and checkpoints compress like real ones)."""
    f = np.full(SHAPE, 40, np.uint8)
    f[70:74, :] = 120
    r, c = (i // 7) % 76, (i * 3) % 76
    f[r : r + 8, c : c + 8] = 200 + i % 50
    return f


def measure(impl, capacity, fill):
    """Runs in the subprocess: builds, fills, saves and loads one implementation."""
    if impl == "memoire":
        from memoire.dopamine_compat import OutOfGraphReplayBuffer  # pylint: disable=g-import-not-at-top
    else:
        from dopamine.tf.replay_memory.circular_replay_buffer import OutOfGraphReplayBuffer  # pylint: disable=g-import-not-at-top
    frames = np.stack([frame(i) for i in range(512)])
    out = {"impl": impl, "capacity": capacity, "fill": fill, "raw": fill * SHAPE[0] * SHAPE[1]}
    base = status("VmRSS")
    buf = OutOfGraphReplayBuffer(SHAPE, STACK, capacity, BATCH)
    out["construct"] = status("VmRSS") - base
    before = status("VmRSS")
    for i in range(fill):
        buf.add(frames[i % 512], i % 18, 1.0, (i + 1) % EPISODE == 0)
    out["after_fill"] = status("VmRSS") - before
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as d:
        out["save_before"] = status("VmRSS")
        reset_peak()
        t0 = time.perf_counter()
        buf.save(d, 0)
        out["save_s"] = time.perf_counter() - t0
        out["save_peak"] = status("VmHWM")
        out["checkpoint_bytes"] = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))
        del buf
        fresh = OutOfGraphReplayBuffer(SHAPE, STACK, capacity, BATCH)
        out["load_before"] = status("VmRSS")
        reset_peak()
        t0 = time.perf_counter()
        fresh.load(d, 0)
        out["load_s"] = time.perf_counter() - t0
        out["load_peak"] = status("VmHWM")
        out["load_after"] = status("VmRSS")
        out["add_count_after_load"] = int(fresh.add_count)
    return out


def run_subprocess(impl, capacity, fill):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            impl,
            "--capacity",
            str(capacity),
            "--fill",
            str(fill),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError("{} failed:\n{}".format(impl, proc.stderr[-3000:]))
    return json.loads(lines[-1][len("RESULT ") :])


def table(results):
    def mib(b):
        return "{:,.0f}".format(b / (1 << 20))

    rows = [
        ("RSS growth after construction (MiB)", lambda r: mib(r["construct"])),
        ("RSS growth after fill (MiB)", lambda r: mib(r["after_fill"])),
        ("  / raw frame bytes", lambda r: "{:.3f}".format(r["after_fill"] / r["raw"])),
        ("RSS before save (MiB)", lambda r: mib(r["save_before"])),
        ("peak RSS while saving (MiB)", lambda r: mib(r["save_peak"])),
        ("  peak / before", lambda r: "{:.3f}".format(r["save_peak"] / r["save_before"])),
        ("  peak - before (MiB)", lambda r: mib(r["save_peak"] - r["save_before"])),
        ("save (s)", lambda r: "{:.1f}".format(r["save_s"])),
        ("checkpoint files (MiB)", lambda r: "{:,.1f}".format(r["checkpoint_bytes"] / (1 << 20))),
        ("RSS growth after load (MiB)", lambda r: mib(r["load_after"] - r["load_before"])),
        ("peak RSS growth while loading (MiB)", lambda r: mib(r["load_peak"] - r["load_before"])),
        ("load (s)", lambda r: "{:.1f}".format(r["load_s"])),
    ]
    first = results[0]
    # RSS includes each process's imports (Dopamine's imports TensorFlow): compare growths.
    lines = [
        "OutOfGraphReplayBuffer, uint8{}, stack {}, capacity {:,}, {:,} transitions added "
        "({:,.0f} MiB raw)".format(
            list(SHAPE), STACK, first["capacity"], first["fill"], first["raw"] / (1 << 20)
        ),
        "",
        "| | " + " | ".join(r["impl"] for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    for label, cell in rows:
        lines.append("| {} | {} |".format(label, " | ".join(cell(r) for r in results)))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--fill", type=int, default=100_000)
    parser.add_argument("--only", choices=["memoire", "dopamine"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args.child, args.capacity, args.fill)), flush=True)
        return
    impls = [args.only] if args.only else ["memoire", "dopamine"]
    results = []
    for impl in impls:  # one at a time: each holds its whole buffer
        results.append(run_subprocess(impl, args.capacity, args.fill))
        print(json.dumps(results[-1]), flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
