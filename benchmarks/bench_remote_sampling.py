"""A learner in its own process against the same learner in the server's process: batches/s.

A server process holds a central memory of Atari-like transitions (uint8[84,84] random frames,
stack 4, multi-step 1) and serves it three ways; the learner process (this one) holds a copy of
the same memory and measures, in interleaved rounds (medians kept, the machine may be shared):

  in-process get_batch   ReplayMemory.get_batch(B) on the local copy (the reference, 1.0)
  in-process feed        memoire.feed.Feed over the local copy (native sampler thread, ring)
  RemoteMemory.sample    one synchronous remote call per batch (the REP endpoint, tcp)
  stream tcp / ipc       memoire.stream.SamplingStream over tcp:// or ipc:// (credit, distinct
                         rows, stacked on arrival into the feed's ring), rows in the messages,
                         drawn by the server's N native sampler threads (--stream-threads);
                         with --connections K > 1 also over K connections (K streams of the
                         server's, each received by a thread of the learner's)
  stream shm             the same through shared memory: the server's native sampler
                         threads (N per stream, --stream-threads) draw each batch straight
                         into a slot the learner maps, in the final layout, and the learner
                         hands out views of it (the socket carries the notices)

Each remote way is reported as batches/s and as a ratio to in-process get_batch in the same run,
with the learner process's and the server process's CPU time per batch (all their threads): on a
shared machine the rates move with the load, the CPU cost much less.

``--step-ms S`` makes it a learner's loop: after each batch the learner copies the batch's
stacks into a buffer of its own (as a host-to-device transfer reads them) and then sleeps S ms
(a GPU's training step, which leaves the CPU free). Rates are then steps/s.

    python benchmarks/bench_remote_sampling.py [--fill 20000] [--batch 32] [--seconds 2] \\
        [--rounds 3] [--credit 32] [--depth 4] [--ahead K] [--step-ms 0] [--stream-threads 1,2] \\
        [--connections 1,2] [--shm-only] [--frames random|ale|SCREENS.npy]

Needs only memoire, numpy and pyzmq.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time

import numpy as np

FRAME = (84, 84)
STACK = 4
EPISODE = 1000


def templates():
    """The Atari-like layout: uint8 frames of shape FRAME."""
    from memoire.bench.ingest import templates as layout

    return layout(FRAME, np.uint8)


def fill(rem, n: int, frames=None) -> None:
    """n entries in episodes of EPISODE: random frames (nothing compresses or caches), or
    `frames` (uint8[m, *FRAME], recorded screens) cycled."""
    rem.frame_stack = STACK
    rng = np.random.default_rng(0)
    for start in range(0, n, EPISODE):
        k = min(EPISODE, n - start)
        if frames is None:
            states = rng.integers(0, 255, (k,) + FRAME, dtype=np.uint8)
        else:
            states = frames[np.arange(start, start + k) % len(frames)]
        rem.new_episode()
        rem.add_entries(
            states,
            np.zeros(k, np.int64),
            np.ones(k, np.float32),
            np.full(k, 0.5, np.float32),
            np.zeros(k, np.float32),
            np.zeros((k, 0), np.uint8),
            np.ones(k, np.float32),
        )
        rem.close_episode()


def serve(n: int, ipc_path: str, threads: list, conn, frames_path=None) -> None:
    """The server process: fills its memory, serves REP and the stream on tcp and ipc, one
    pair of stream endpoints per sampler thread count (keys ("tcp", N) and ("ipc", N)). With
    `frames_path` (recorded screens), a second server of the same contents that compresses its
    states serves a tcp stream too (key ("tcp", "compressed"))."""
    from memoire.server import ReplayMemoryServer

    frames = None if frames_path is None else np.load(frames_path)
    srv = ReplayMemoryServer(*templates(), n, pub_endpoint=None)
    fill(srv.rem, n, frames)
    eps = srv.start()
    for t in threads:
        eps["tcp", t] = srv.start_stream("tcp://127.0.0.1:*", threads=t)
        eps["ipc", t] = srv.start_stream(f"ipc://{ipc_path}-{t}", threads=t)
    servers = [srv]
    if frames is not None:
        z = ReplayMemoryServer(*templates(), n, pub_endpoint=None, compress_states=True)
        fill(z.rem, n, frames)
        eps["tcp", "compressed"] = z.start_stream("tcp://127.0.0.1:*", threads=threads[0])
        servers.append(z)
    conn.send(eps)
    while conn.recv() == "cpu":  # until the learner is done
        conn.send(time.process_time())
    for s in servers:
        s.close()


def wire_bytes(endpoint: str, batch: int, batches: int = 20) -> float:
    """Bytes per STREAM_BATCH message a rows stream of `endpoint` sends a learner that decodes
    compressed states (what crosses the network between two hosts), over `batches` batches."""
    import zmq

    from memoire import codec
    from memoire.codec import Msg

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    try:
        sock.send_multipart(
            codec.encode(
                Msg.STREAM,
                {"op": "open", "batch_size": batch, "credit": batches, "compressed_rows": True},
            )
        )
        sizes = []
        while len(sizes) < batches + 1:  # the layout, then the batches
            if not sock.poll(30000):
                raise SystemExit(f"no batch from {endpoint}")
            sizes.append(sum(len(f) for f in sock.recv_multipart()))
        sock.send_multipart(codec.encode(Msg.STREAM, {"op": "close"}))
        return statistics.mean(sizes[1:])
    finally:
        sock.close(0)
        ctx.term()


def rate(take, seconds: float, server) -> tuple:
    """(batches/s, the learner process's CPU ms per batch: all its threads, so a stream's
    receiving thread and ZeroMQ's I/O thread count; the server process's CPU ms per batch
    over the same window, all its threads)."""
    take()  # warm: first batch, lazily built rings
    server.send("cpu")
    s0 = server.recv()
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        take()
        n += 1
    r, c = n / (time.perf_counter() - t0), (time.process_time() - c0) * 1e3 / max(n, 1)
    server.send("cpu")
    return r, c, (server.recv() - s0) * 1e3 / max(n, 1)


def learner_step(take, step_ms: float):
    """`take` followed by a learner's step: the batch's stacks copied out (what a transfer to
    an accelerator reads), then `step_ms` of sleep (the accelerator computing)."""
    out = {}

    def step():
        batch = take()
        for i, a in enumerate(batch.prev + batch.next):
            if a is not None:
                np.copyto(out.setdefault(i, np.empty_like(a)), a)
        time.sleep(step_ms / 1e3)

    return step


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fill", type=int, default=20000, help="transitions stored")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=2.0, help="timed window per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--credit", type=int, default=32, help="stream credit (batches in flight)")
    ap.add_argument("--depth", type=int, default=4, help="learner ring slots")
    ap.add_argument(
        "--ahead",
        type=int,
        default=None,
        help="shared memory: batches the server keeps drawn and not yet taken (default: its "
        "sampler threads + 1)",
    )
    ap.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="a learner's step after each batch: copy its stacks, then sleep this long",
    )
    ap.add_argument(
        "--stream-threads",
        default=None,
        help="sampler threads per stream, a comma-separated list measured side by side (rows "
        "in messages and shared memory; default: the server's default for this machine's cores)",
    )
    ap.add_argument(
        "--connections",
        default="1",
        help="rows in messages: connections per stream, a comma-separated list (those above 1 "
        "add rows streams over that many connections, with the first --stream-threads count)",
    )
    ap.add_argument(
        "--frames",
        default="random",
        help="random (frames that do not compress), ale (Atari screens recorded through "
        "Dopamine's preprocessing: benchmarks/_ale_frames.py, needs dopamine-rl and ale-py), "
        "or the path of a .npy of uint8[m, 84, 84] screens; screens add a rows stream from a "
        "memory that compresses its states",
    )
    ap.add_argument(
        "--shm-only",
        action="store_true",
        help="measure in-process get_batch and the shared-memory streams only",
    )
    args = ap.parse_args(argv)
    load = _loadavg()  # before this benchmark's own processes

    from memoire import ReplayMemory
    from memoire.feed import Feed
    from memoire.remote import RemoteMemory
    from memoire.server.sampling_service import default_stream_threads
    from memoire.stream import SamplingStream

    if args.stream_threads is None:
        threads = [default_stream_threads()]
    else:
        threads = [int(t) for t in args.stream_threads.split(",")]
    connections = [int(c) for c in args.connections.split(",")]

    frames_path = frames = None
    if args.frames == "ale":
        import _ale_frames

        frames_path = _ale_frames.recorded()
    elif args.frames != "random":
        frames_path = args.frames
    if frames_path is not None:
        frames = np.load(frames_path)
        if frames.dtype != np.uint8 or frames.shape[1:] != FRAME:
            raise SystemExit(
                f"{frames_path}: expected uint8[m, 84, 84], got {frames.dtype}{list(frames.shape)}"
            )
    ipc_path = os.path.join(tempfile.mkdtemp(prefix="memoire-bench-"), "stream.ipc")
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(
        target=serve, args=(args.fill, ipc_path, threads, child, frames_path), daemon=True
    )
    proc.start()
    local = ReplayMemory(*templates(), args.fill)
    fill(local, args.fill, frames)
    if not parent.poll(600):
        raise SystemExit("the server process did not start")
    eps = parent.recv()
    b = args.batch
    remote = feed = None
    streams = {}
    ways = {"in-process get_batch": lambda: local.get_batch(b)}
    if not args.shm_only:
        remote = RemoteMemory(eps["rep"], timeout=30)
        feed = Feed(local, b, depth=args.depth)
        ways["in-process feed"] = lambda: next(feed)
        ways["RemoteMemory.sample (tcp)"] = lambda: remote.sample(b)
        rows = {
            f"stream {k}" + (f", {t} thr" if len(threads) > 1 else ""): eps[k, t]
            for t in threads
            for k in ("tcp", "ipc")
        }
        rows = {name: (ep, 1) for name, ep in rows.items()}
        for c in connections:
            if c > 1:
                for k in ("tcp", "ipc"):
                    rows[f"stream {k}, {c} conn"] = (eps[k, threads[0]], c)
        if ("tcp", "compressed") in eps:
            rows["stream tcp, compressed states"] = (eps["tcp", "compressed"], 1)
        for name, (ep, c) in rows.items():
            streams[name] = SamplingStream(
                ep,
                b,
                credit=args.credit,
                depth=max(args.depth, c),
                timeout=30,
                shared_memory=False,
                connections=c,
            )
    for t in threads:
        for k in ("tcp", "ipc"):
            streams[f"stream {k} shm, {t} thr"] = SamplingStream(
                eps[k, t], b, credit=args.credit, ahead=args.ahead, timeout=30, shared_memory=True
            )
    ways.update({name: (lambda s=s: next(s)) for name, s in streams.items()})
    if args.step_ms > 0:
        ways = {name: learner_step(take, args.step_ms) for name, take in ways.items()}
    got = {k: [] for k in ways}
    cpu = {k: [] for k in ways}
    server_cpu = {k: [] for k in ways}
    wire = {}
    try:
        for _ in range(args.rounds):
            for name, take in ways.items():
                r, c, sc = rate(take, args.seconds, parent)
                got[name].append(r)
                cpu[name].append(c)
                server_cpu[name].append(sc)
        if not args.shm_only:  # what a rows stream puts on the network, per batch
            wire["stream tcp"] = wire_bytes(eps["tcp", threads[0]], b)
            if ("tcp", "compressed") in eps:
                wire["stream tcp, compressed states"] = wire_bytes(eps["tcp", "compressed"], b)
    finally:
        for s in streams.values():
            s.close()
        if feed is not None:
            feed.close()
            remote.close()
        parent.send("done")
        proc.join(30)
    ref = statistics.median(got["in-process get_batch"])
    print(
        f"Atari-like uint8{list(FRAME)}, stack {STACK}, B={b}, {args.fill} stored, "
        f"credit {args.credit}, depth {args.depth}, {args.rounds} rounds of {args.seconds} s "
        f"(medians; cpus: {os.cpu_count()}; loadavg at start {load}, at end {_loadavg()}; "
        f"{args.frames} frames)"
        + (f"; learner step {args.step_ms} ms (rates are steps/s)" if args.step_ms else "")
    )
    print(
        f"{'way':<28} {'batches/s':>10} {'ratio':>6} {'learner cpu ms/batch':>21} "
        f"{'server cpu ms/batch':>20}"
    )
    for name, rates in got.items():
        m = statistics.median(rates)
        print(
            f"{name:<28} {m:10.0f} {m / ref:6.2f} {statistics.median(cpu[name]):21.3f} "
            f"{statistics.median(server_cpu[name]):20.3f}"
            "   rounds: " + ", ".join(f"{r:.0f}" for r in rates)
        )
    for name, nbytes in wire.items():
        print(f"{name}: {nbytes / 1e3:,.0f} kB per batch on the wire")


if __name__ == "__main__":
    main()
