"""ReplayMemory.save / load speed on an Atari-like memory, beside plain numpy file I/O of the
same number of bytes in the same folder.

Usage: PYTHONPATH=. python benchmarks/bench_memory_checkpoint.py [--transitions 100000]
           [--folder DIR] [--repeats 3]

The memory: uint8[84,84] frames, int64 actions, float32 r/p/v/q, no info, max_step =
transitions, filled with episodes of 1,000 random frames. Save: ``memory.save`` (streamed from
C++, checksummed, fsync-ed, renamed). Baseline save: ``ndarray.tofile`` of a uint8 array of the
file's size, then fsync. Load: ``memory.load`` into a second memory (every byte checksummed and
checked, read into a staging memory whose pages then move in). Baseline load: ``readinto`` a
preallocated array of the file's size. Loads read what the page cache holds (the file was just
written); MB = 10**6 bytes. Best of `repeats`.
"""

import argparse
import os
import tempfile
import time

import numpy as np

from memoire import ReplayMemory


def _memory(n):
    return ReplayMemory(
        np.zeros([84, 84], np.uint8),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([0], np.uint8),
        n,
    )


def _fill(m, n, episode=1000):
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (episode, 84, 84), dtype=np.uint8)
    for start in range(0, n, episode):
        k = min(episode, n - start)
        frames[:, 0, 0] = start // episode  # episodes differ
        m.new_episode()
        m.add_entries(
            frames[:k],
            rng.integers(0, 4, k),
            rng.random(k, np.float32),
            np.ones(k, np.float32),
            rng.random(k, np.float32),
            np.zeros((k, 0), np.uint8),
            np.ones(k, np.float32),
        )
        m.close_episode()


def _best(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transitions", type=int, default=100_000)
    p.add_argument(
        "--folder",
        default=None,
        help="where the files go (default: a temporary folder under the system's)",
    )
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    folder = tempfile.mkdtemp(dir=a.folder)
    src = _memory(a.transitions)
    _fill(src, a.transitions)
    path = os.path.join(folder, "memory.ckpt")
    base = os.path.join(folder, "baseline.bin")
    t_save = _best(lambda: src.save(path), a.repeats)
    size = os.path.getsize(path)
    blob = np.ones(size, np.uint8)

    def baseline_save(blob=blob):
        with open(base, "wb") as f:
            blob.tofile(f)
            f.flush()
            os.fsync(f.fileno())

    t_base_save = _best(baseline_save, a.repeats)
    del blob
    dst = _memory(a.transitions)
    t_load = _best(lambda: dst.load(path), a.repeats)
    assert dst.size == src.size and dst.total_weight == src.total_weight
    out = np.empty(size, np.uint8)

    def baseline_load():
        with open(base, "rb") as f:
            f.readinto(memoryview(out))

    t_base_load = _best(baseline_load, a.repeats)
    mb = size / 1e6
    print(f"{a.transitions} transitions of uint8[84,84], file {mb:.1f} MB, folder {folder}")
    print(
        f"save  {mb / t_save:8.0f} MB/s ({t_save:.2f} s)   numpy tofile+fsync "
        f"{mb / t_base_save:8.0f} MB/s   ratio {t_base_save / t_save:.2f}x"
    )
    print(
        f"load  {mb / t_load:8.0f} MB/s ({t_load:.2f} s)   readinto "
        f"{mb / t_base_load:8.0f} MB/s   ratio {t_base_load / t_load:.2f}x"
    )
    for f in (path, base):
        os.remove(f)
    os.rmdir(folder)


if __name__ == "__main__":
    main()
