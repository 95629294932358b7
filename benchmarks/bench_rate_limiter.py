"""A remote learner's sampling rate while an actor writes at full speed, with and without the
server's rate limiter, against the same learner with no writer (idle), in one run.

    PYTHONPATH=$PWD nice -n 10 python benchmarks/bench_rate_limiter.py [--seconds 4] [--repeats 2]

The server (central mode, Atari-like uint8[84,84] states stacked 4, this process) runs its REP
and PULL workers in threads; the learner (``RemoteMemory.sample(32)`` in a loop) and the writer
(a ``ChunkStream`` over PUSH, as fast as it can) are processes of their own. Cases:

- ``idle``: the memory prefilled (FILLED transitions), no writer, no limiter;
- ``writer``: a full-speed writer, no limiter (the learner competes with the ingest for CPU);
- ``writer+limiter``: a full-speed writer and ``SampleToInsertRatio(samples_per_insert=8)``
  (DQN's replay ratio: batch 32 every 4 steps), so the ingest stops pulling once the learner
  falls behind and the writer waits on ZeroMQ's high-water mark.

The writer cases start sampling once the writer has stored FILLED transitions (the limiter's
``min_size_to_sample``), so every case samples a memory about as full.

Prints batches per second (medians over alternating repetitions) and each case's ratio to
``idle``; the issue's target is ``writer+limiter / idle >= 0.8``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import numpy as np

SHAPE = (84, 84)
BATCH = 32
EPISODE = 256
CAPACITY = 20000
FILLED = CAPACITY - 4 * EPISODE  # every case samples from a memory this full (same cache reuse)


def _templates():
    """The Atari-like layout: uint8 frames of shape SHAPE."""
    from memoire.bench.ingest import templates as layout

    return layout(SHAPE, np.uint8)


def _writer(endpoint, spec, stop, rate: float = 0.0):
    """Streams Atari-like episodes into `endpoint` until `stop`: as fast as it can, or at about
    `rate` transitions per second when `rate` > 0 (a paced writer: a few actors' worth)."""
    import zmq

    from memoire.experience import ChunkStream
    from memoire.transport import open_socket

    ctx = zmq.Context()
    sock = open_socket(ctx, zmq.PUSH, endpoint, "Conn", hwm=8)
    sock.sndtimeo = 100

    def send(frames):
        while not stop.is_set():
            try:
                sock.send_multipart(frames)
                return True
            except zmq.Again:
                continue
        return False

    stream = ChunkStream(spec, send, chunk_rows=64)
    frames = np.random.default_rng(0).integers(0, 255, (EPISODE, *SHAPE), np.uint8)
    row = {"a": 1, "r": 0.5, "p": 0.5, "v": 0.0, "i": np.zeros(0, np.uint8), "init_w": 1.0}
    sent, start = 0, time.monotonic()
    while not stop.is_set():
        for k in range(EPISODE):
            row["s"] = frames[k]
            stream.add(row)
            sent += 1
            if rate > 0:
                ahead = start + sent / rate - time.monotonic()
                if ahead > 0.002:
                    time.sleep(ahead)
        stream.end_episode(terminal=True)
    sock.close(0)
    ctx.term()


def _learner(endpoint, seconds, out):
    from memoire.remote import RemoteMemory

    with RemoteMemory(endpoint, timeout=30, retries=0) as rm:
        end = time.monotonic() + 0.5  # warm-up
        while time.monotonic() < end:
            rm.sample(BATCH, timeout=20)
        n, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            rm.sample(BATCH, timeout=20)
            n += 1
        out.put(n / (time.monotonic() - start))


def _prefill(srv, rows):
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 255, (EPISODE, *SHAPE), np.uint8)
    rem = srv.rem
    while rem.size < rows:
        rem.new_episode()
        for k in range(EPISODE):
            rem.add_entry(frames[k], 1, 0.5, 0.5, 0.0)
        rem.close_episode()


def run_case(case: str, seconds: float) -> float:
    from memoire import ReplayMemoryServer
    from memoire.rate_limiter import SampleToInsertRatio

    ctx = mp.get_context("spawn")
    limiter = None
    if case == "writer+limiter":
        limiter = SampleToInsertRatio(
            samples_per_insert=8.0, min_size_to_sample=FILLED, error_buffer=100 * BATCH
        )
    srv = ReplayMemoryServer(*_templates(), CAPACITY, None, rate_limiter=limiter, seed=0)
    srv.rem.frame_stack = 4
    try:
        ep = srv.start()
        stop, writer = ctx.Event(), None
        if case == "idle":
            _prefill(srv, FILLED)
        else:
            writer = ctx.Process(
                target=_writer, daemon=True, args=(ep["pull"], srv._central.ingest.row_spec, stop)
            )
            writer.start()
            srv.wait_rows_in(FILLED, 120)
        out = ctx.Queue()
        learner = ctx.Process(target=_learner, args=(ep["rep"], seconds, out), daemon=True)
        learner.start()
        rate = out.get(timeout=seconds + 120)
        learner.join(30)
        stop.set()
        if writer is not None:
            writer.join(30)
            if writer.is_alive():
                writer.terminate()
        return rate
    finally:
        srv.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="timed window per repetition")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    cases = ("idle", "writer", "writer+limiter")
    rates = {c: [] for c in cases}
    for _ in range(args.repeats):
        for c in cases:  # alternating, so drifts in the machine's load hit every case alike
            rates[c].append(run_case(c, args.seconds))
    idle = statistics.median(rates["idle"])
    print(
        f"{'case':<16} {'batches/s':>10} {'vs idle':>8}   (batch {BATCH}, uint8{list(SHAPE)} "
        "stacked 4, remote learner)"
    )
    for c in cases:
        r = statistics.median(rates[c])
        runs = ", ".join(f"{x:.0f}" for x in rates[c])
        print(f"{c:<16} {r:10.0f} {r / idle:8.2f}   runs: {runs}")


if __name__ == "__main__":
    main()
