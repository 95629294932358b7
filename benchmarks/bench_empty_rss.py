"""Resident memory of empty 1,000,000-transition Atari stores (uint8[84, 84], stack 4) and its
growth as transitions arrive, for one or more source trees side by side.

Runs every case of :mod:`memoire.bench.empty_rss` (ReplayMemory, the Dopamine TF faces, the JAX
face uniform and prioritized, a server, a central-mode actor), each in a fresh process with
PYTHONPATH set to the tree, and prints one markdown table: MiB over the interpreter's baseline
after construction, and after adding ``--fill`` transitions (their frames: fill * 84 * 84
bytes). A tree without memoire/bench/empty_rss.py (older than this script) can run it from a
copy: put the file there.

    nice env PYTHONPATH=. python benchmarks/bench_empty_rss.py [--trees BEFORE .] [--fill 4000]

Linux only (reads /proc/self/status). The JAX cases need dopamine-rl.
"""

import argparse
import json
import os
import subprocess
import sys

from memoire.bench.empty_rss import CASES

MiB = 1 << 20


def run(tree: str, case: str, fill: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    got = subprocess.run(
        # -P: the tree's memoire (PYTHONPATH), not one in the working folder.
        [sys.executable, "-P", "-m", "memoire.bench.empty_rss", case, str(fill)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = [x for x in got.stdout.splitlines() if x.startswith("RESULT ")]
    if got.returncode or not lines:
        sys.exit(f"{tree} {case}: failed\n{got.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", nargs="+", default=["."])
    ap.add_argument("--fill", type=int, default=4000)
    args = ap.parse_args()
    results = {case: [run(t, case, args.fill) for t in args.trees] for case in CASES}
    raw = args.fill * 84 * 84 / MiB
    print(f"MiB over the baseline; fill: {args.fill} transitions ({raw:.1f} MiB of frames)")
    head = " | ".join(f"{t}: empty | {t}: +fill" for t in args.trees)
    print(f"| store | {head} |")
    print("|---|" + "---|" * (2 * len(args.trees)))
    for case, rs in results.items():
        cells = " | ".join(f"{r['construct'] / MiB:.1f} | {r['fill'] / MiB:.1f}" for r in rs)
        print(f"| {case} | {cells} |")


if __name__ == "__main__":
    main()
