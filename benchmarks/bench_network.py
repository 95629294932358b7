"""End-to-end network throughput: actor processes -> one learner, against raw pyzmq PUSH/PULL
moving exactly the same frames, in the same run (see memoire/bench/ingest.py for what each
side does and counts).

    PYTHONPATH=$PWD python benchmarks/bench_network.py [--seconds 3] [--mode both] [--spi 1]

Prints transitions per second (medians over alternating repetitions) and the ratio memoire /
raw pyzmq for each mode (cache, central) and state layout (float32[4], uint8[84,84,4]).
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from memoire.bench.ingest import ATARI, FLOAT, Setup, measure


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="timed window per repetition")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--mode", choices=("central", "cache", "both"), default="both")
    ap.add_argument("--states", default="both", choices=("float", "atari", "both"))
    ap.add_argument("--cache_size", type=int, default=128, help="rows per cache (cache mode)")
    ap.add_argument("--chunk", type=int, default=256, help="rows per episode chunk (central)")
    ap.add_argument("--episode", type=int, default=1024, help="entries per episode (central)")
    ap.add_argument("--capacity", type=int, default=20000, help="server memory (central)")
    ap.add_argument(
        "--batch", type=int, default=0, help="learner batch (central; 0: the chunk's rows)"
    )
    ap.add_argument(
        "--spi",
        type=float,
        default=1.0,
        help="sampled rows per stored row (central; 0: ingest only)",
    )
    args = ap.parse_args(argv)
    states = {"float": [FLOAT], "atari": [ATARI], "both": [FLOAT, ATARI]}[args.states]
    modes = ("cache", "central") if args.mode == "both" else (args.mode,)
    print(f"{'mode':<8} {'state':<16} {'memoire tr/s':>13} {'raw pyzmq tr/s':>15} {'ratio':>6}")
    for mode in modes:
        for shape, dtype in states:
            setup = Setup(
                mode=mode,
                shape=shape,
                dtype=dtype,
                actors=args.actors,
                cache_size=args.cache_size,
                chunk=args.chunk,
                episode=args.episode,
                capacity=args.capacity,
                batch=args.batch,
                spi=args.spi,
            )
            sec = measure(setup, args.repeats, args.seconds)
            m, r = (1.0 / statistics.median(s) for s in sec.values())
            name = f"{np.dtype(dtype).name}{list(shape)}"
            print(f"{mode:<8} {name:<16} {m:13.0f} {r:15.0f} {m / r:6.2f}", flush=True)


if __name__ == "__main__":
    main()
