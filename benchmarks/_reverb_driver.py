"""Reverb's side of ``benchmarks/bench_vs_reverb.py``, run by Reverb's own interpreter (dm-reverb
0.14.0 with TensorFlow 2.15, a virtual environment of its own), never imported by memoire's.

Protocol: JSON lines. The benchmark writes one request per line on this process's stdin and
reads one reply per line on its stdout (``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``);
everything else (TensorFlow's and Reverb's logs) goes to stderr. Requests:

  {"op": "ingest", "actors": n, "seconds": s, "layout": L}     -> {"items_per_s": ...}
  {"op": "sample", "writer": bool, "limiter": bool, "seconds": s, "fill": n,
   "rate": r, "inprocess": bool, "layout": L}                   -> {"batches_per_s": ...}
  {"op": "memory", "items": n, "frames": "random"|"compressible"|"ale", "source": path}
                                                        -> {"bytes_per_item": ..., "rss_delta": ...}
  {"op": "quit"}

Layouts (L): "atari", uint8[84,84] frames stacked 4, and "small", CartPole-like float32[4]
observations stacked 1. The server lives in this process (for "memory", in a process of its
own); actors, the writer and the learner are worker processes of their own (spawned once, each
imports Reverb), driven over pipes; with "inprocess" the learner's dataset runs in this process,
beside the server. A writer with "rate" > 0 paces itself to about that many items per second.
Items follow Acme's pattern: ``trajectory_writer(num_keep_alive_refs=stack + 1)``, one
``append`` per step and one ``create_item`` per step whose ``obs`` is the last stack + 1
observations (a stack and the next one, frames shared between items through chunks),
``end_episode()`` every EPISODE steps. No per-step ``flush`` (Reverb's best case: its docs'
per-step flush cost 40-45% of ingest on this machine).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np

FRAME = (84, 84)
STACK = 4
BATCH = 32
EPISODE = 256
CAPACITY = 20000
TABLE = "replay"
SAMPLES_PER_INSERT = 8.0  # DQN's replay ratio (batch 32 every 4 steps), as memoire's side
# layout -> (observation shape, dtype, frame stack): Atari screens, or CartPole-like vectors.
LAYOUTS = {"atari": (FRAME, "uint8", STACK), "small": ((4,), "float32", 1)}


def frames(kind: str, n: int, rng, layout: str = "atari", source=None) -> np.ndarray:
    """[n, *shape] observations of `layout`, both systems' (bench_vs_reverb imports this):
    "random" (nothing compresses); for "atari" also "compressible", a synthetic Breakout-like
    screen (bands of bricks and a floor that never change, a 2x2 ball and a 12-pixel paddle
    that move each frame), or "ale", n consecutive frames of the uint8[N, 84, 84] .npy file
    `source` (screens recorded from ALE games, ``benchmarks/_ale_frames.py``) from a random
    start."""
    shape, dtype, _ = LAYOUTS[layout]
    if layout == "small":
        return rng.standard_normal((n, *shape)).astype(dtype)
    if kind == "random":
        return rng.integers(0, 255, (n, *FRAME), dtype=np.uint8)
    if kind == "ale":
        recorded = np.load(source, mmap_mode="r")
        start = int(rng.integers(0, len(recorded) - n + 1))
        return np.array(recorded[start : start + n])
    out = np.zeros((n, *FRAME), np.uint8)
    out[:, 10:30] = np.arange(20, dtype=np.uint8)[:, None] * 7 + 40  # bricks: bands of grey
    out[:, 80:82] = 200  # the paddle's floor
    t = np.arange(n) + int(rng.integers(0, 1000))
    for k in range(n):  # the ball and the paddle move
        y, x = 32 + (t[k] * 3) % 44, (t[k] * 5) % 80
        out[k, y : y + 2, x : x + 2] = 255
        out[k, 78:80, (t[k] * 2) % 70 : (t[k] * 2) % 70 + 12] = 180
    return out


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


# ---------------------------------------------------------------------------- workers


def _end_episode(w, stop) -> None:
    """Ends the episode, waiting (in 1 s steps) until its items are confirmed; gives up once
    `stop` is set: a rate limiter holds inserts back for ever once the learner has stopped."""
    import reverb

    try:
        w.end_episode(timeout_ms=1000)  # buffers reset even when it times out
        return
    except reverb.DeadlineExceededError:
        pass
    while True:
        try:
            w.flush(timeout_ms=1000)
            return
        except reverb.DeadlineExceededError:
            if stop.is_set():
                return


def _write(
    address: str,
    items,
    stop,
    kind: str,
    seed: int,
    layout: str = "atari",
    rate: float = 0.0,
    source=None,
) -> int:
    """Writes episodes until `items` items are written (None: until `stop`), at about `rate`
    items per second when `rate` > 0; returns items."""
    import reverb

    client = reverb.Client(address)
    rng = np.random.default_rng(seed)
    stack = LAYOUTS[layout][2]
    done, start = 0, time.monotonic()
    # No `with`: its exit flushes without a timeout, which a rate limiter can hold for ever.
    w = client.trajectory_writer(num_keep_alive_refs=stack + 1)
    try:
        while not stop.is_set() and (items is None or done < items):
            obs = frames(kind, EPISODE, rng, layout, source)
            for t in range(EPISODE):
                w.append({"obs": obs[t], "action": np.int64(t % 4), "reward": np.float32(0.5)})
                if t >= stack:
                    w.create_item(
                        TABLE,
                        1.0,
                        {
                            "obs": w.history["obs"][-(stack + 1) :],
                            "action": w.history["action"][-2],
                            "reward": w.history["reward"][-2],
                        },
                    )
                    done += 1
                    if rate > 0:
                        ahead = start + done / rate - time.monotonic()
                        if ahead > 0.002:
                            time.sleep(ahead)
                    if (items is not None and done >= items) or (t % 16 == 0 and stop.is_set()):
                        break
            _end_episode(w, stop)
    finally:
        w.close()
    return done


def _sample(address: str, seconds: float) -> float:
    """Batches of BATCH per second from Reverb's training path, TrajectoryDataset.batch."""
    import reverb

    ds = reverb.TrajectoryDataset.from_table_signature(
        address, TABLE, max_in_flight_samples_per_worker=2 * BATCH
    )
    it = iter(ds.batch(BATCH, drop_remainder=True).prefetch(4))
    end = time.monotonic() + 0.5  # warm-up
    while time.monotonic() < end:
        next(it)
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        next(it)
        n += 1
    return n / (time.monotonic() - t0)


def _worker(conn, stop, index: int) -> None:
    import reverb  # noqa: F401  (the import, several seconds, before the first timing)

    conn.send("ready")
    while True:
        cmd = conn.recv()
        if cmd is None:
            return
        try:
            if cmd["op"] == "write":
                out = _write(
                    cmd["address"],
                    cmd.get("items"),
                    stop,
                    cmd["frames"],
                    index,
                    cmd.get("layout", "atari"),
                    cmd.get("rate", 0.0),
                    cmd.get("source"),
                )
            else:
                out = _sample(cmd["address"], cmd["seconds"])
            conn.send(("ok", out))
        except Exception as e:  # reported to the driver, which reports it to the benchmark
            conn.send(("error", f"{type(e).__name__}: {e}"))


class Workers:
    """Processes 0 and 1 write (actors, writer), process 2 samples (the learner)."""

    def __init__(self, n: int = 3):
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self.conns, self.procs = [], []
        for k in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child, self.stop, k), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:
            if not c.poll(600):
                raise RuntimeError("a Reverb worker process did not start within 600 s")
            c.recv()

    def send(self, k: int, **cmd) -> None:
        self.conns[k].send(cmd)

    def result(self, k: int, timeout: float = 600):
        if not self.conns[k].poll(timeout):
            raise RuntimeError(f"Reverb worker {k} gave no result within {timeout} s")
        status, out = self.conns[k].recv()
        if status != "ok":
            raise RuntimeError(f"Reverb worker {k}: {out}")
        return out

    def close(self) -> None:
        self.stop.set()
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


# ---------------------------------------------------------------------------- server


def _server(max_size: int, min_size_to_sample: int = 0, layout: str = "atari"):
    """A Reverb server on an OS-picked port with one uniform FIFO table of `layout` items;
    `min_size_to_sample` > 0: SampleToInsertRatio(SAMPLES_PER_INSERT, min_size_to_sample,
    100 * BATCH), else MinSize(1)."""
    import reverb
    import tensorflow as tf

    if min_size_to_sample:
        rate = reverb.rate_limiters.SampleToInsertRatio(
            samples_per_insert=SAMPLES_PER_INSERT,  # items, i.e. rows of a batch, per insert
            min_size_to_sample=min_size_to_sample,
            error_buffer=100 * BATCH,
        )
    else:
        rate = reverb.rate_limiters.MinSize(1)
    shape, dtype, stack = LAYOUTS[layout]
    signature = {
        "obs": tf.TensorSpec([stack + 1, *shape], tf.as_dtype(dtype)),
        "action": tf.TensorSpec([], tf.int64),
        "reward": tf.TensorSpec([], tf.float32),
    }
    table = reverb.Table(
        TABLE,
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        max_size=max_size,
        rate_limiter=rate,
        signature=signature,
    )
    server = reverb.Server(tables=[table])
    return server, f"localhost:{server.port}"


def _inserts(client) -> int:
    """Items inserted into the table so far (the rate limiter's count)."""
    return int(client.server_info()[TABLE].rate_limiter_info.insert_stats.completed)


def ingest(workers: Workers, actors: int, seconds: float, layout: str = "atari") -> dict:
    import reverb

    server, address = _server(CAPACITY, layout=layout)
    client = reverb.Client(address)
    workers.stop.clear()
    for k in range(actors):
        workers.send(k, op="write", address=address, frames="random", layout=layout)
    time.sleep(1.0)  # warm-up: clients connect, first chunks
    n0, t0 = _inserts(client), time.monotonic()
    time.sleep(seconds)
    n1, t1 = _inserts(client), time.monotonic()
    workers.stop.set()
    for k in range(actors):
        workers.result(k)
    server.stop()
    return {"items_per_s": (n1 - n0) / (t1 - t0)}


def sample(
    workers: Workers,
    writer: bool,
    limiter: bool,
    seconds: float,
    fill: int,
    rate: float = 0.0,
    inprocess: bool = False,
    layout: str = "atari",
) -> dict:
    """Batches per second of a learner's TrajectoryDataset, in a worker process (or, with
    `inprocess`, in this one, beside the server), over a table prefilled with `fill` items;
    with `writer`, while a writer adds more (at `rate` items per second; 0: full speed)."""
    server, address = _server(CAPACITY, fill if limiter else 0, layout)
    workers.stop.clear()
    workers.send(0, op="write", address=address, items=fill, frames="random", layout=layout)
    workers.result(0)
    if writer:
        workers.send(0, op="write", address=address, frames="random", layout=layout, rate=rate)
    if inprocess:
        batches_per_s = _sample(address, seconds)
    else:
        workers.send(2, op="sample", address=address, seconds=seconds)
        batches_per_s = workers.result(2, timeout=seconds + 600)
    workers.stop.set()
    if writer:
        workers.result(0)
    server.stop()
    return {"batches_per_s": batches_per_s}


def _memory_server(items: int, conn) -> None:
    """A process of its own holding only a server (the driver's has held earlier servers,
    whose freed memory would blur an RSS delta): replies its RSS to each request."""
    server, address = _server(items + 10)
    conn.send(address)
    while conn.recv() is not None:
        conn.send(_rss())
    server.stop()


def memory(workers: Workers, items: int, frames: str, source=None) -> dict:
    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_memory_server, args=(items, child))
    proc.start()
    try:
        if not parent.poll(600):
            raise RuntimeError("the Reverb server process did not start within 600 s")
        address = parent.recv()
        parent.send("rss")
        before = parent.recv()
        workers.stop.clear()
        workers.send(0, op="write", address=address, items=items, frames=frames, source=source)
        written = workers.result(0)
        time.sleep(0.5)
        parent.send("rss")
        after = parent.recv()
        parent.send(None)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return {"bytes_per_item": (after - before) / written, "rss_delta": after - before}


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # the protocol's stream carries replies only
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    workers = Workers()
    out.write(json.dumps({"ok": True, "ready": True}) + "\n")
    out.flush()
    try:
        for line in sys.stdin:
            req = json.loads(line)
            op = req.pop("op")
            if op == "quit":
                break
            try:
                reply = {"ingest": ingest, "sample": sample, "memory": memory}[op](workers, **req)
                reply["ok"] = True
            except Exception as e:
                reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            out.write(json.dumps(reply) + "\n")
            out.flush()
    finally:
        workers.close()


if __name__ == "__main__":
    main()
