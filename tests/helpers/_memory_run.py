"""Measures a memoire Dopamine buffer's resident memory (bytes, from /proc/self/status) while
it is built, filled with 84x84 frames, saved and loaded; prints one JSON line. Used by
test_replay_buffers_memory.py in a subprocess, so that nothing else shares the process's RSS."""

import json
import sys
import tempfile

import numpy as np

from memoire.bench.memory import proc_status as status
from memoire.bench.memory import reset_peak
from memoire.dopamine_compat import OutOfGraphPrioritizedReplayBuffer, OutOfGraphReplayBuffer

OBS = (84, 84)


def fill(buf, n, prioritized, chunk=500):
    """Adds n distinct frames in chunks (so the adding itself holds little memory)."""
    frames = np.empty((chunk,) + OBS, np.uint8)
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        frames[:k] = ((np.arange(k) + start) % 251 + 1)[:, None, None]
        args = [
            frames[:k],
            np.arange(k, dtype=np.int32) % 4,
            np.ones(k, np.float32),
            np.zeros(k, np.uint8),
        ]
        buf.add_batch(*args, priorities=np.ones(k) if prioritized else None)


def main_jax(capacity, n):
    """Dopamine's JAX buffer face: its store is built by the first add."""
    from memoire.dopamine_compat import jax_replay_buffer as jrb  # pylint: disable=g-import-not-at-top

    out = {"raw": n * OBS[0] * OBS[1]}
    base = status("VmRSS")
    buf = jrb.ReplayBuffer(
        jrb.TransitionAccumulator(4, 1, 0.99),
        jrb.UniformSamplingDistribution(seed=0),
        batch_size=32,
        max_capacity=capacity,
    )
    buf.add(jrb.TransitionElement(np.ones(OBS, np.uint8), 0, 0.0, False, False))
    out["construct"] = status("VmRSS") - base
    before = status("VmRSS")
    chunk = 500
    frames = np.empty((chunk,) + OBS, np.uint8)
    for start in range(0, n, chunk):
        frames[...] = ((np.arange(chunk) + start) % 251 + 1)[:, None, None]
        buf.add_batch(frames, np.zeros(chunk, np.int32), np.ones(chunk), np.zeros(chunk, bool))
    out["fill"] = status("VmRSS") - before
    print("RESULT " + json.dumps(out))


def main(capacity, n, prioritized, checkpoint):
    cls = OutOfGraphPrioritizedReplayBuffer if prioritized else OutOfGraphReplayBuffer
    out = {"raw": n * OBS[0] * OBS[1]}
    base = status("VmRSS")
    buf = cls(OBS, 4, capacity, 32, seed=0)
    out["construct"] = status("VmRSS") - base
    before = status("VmRSS")
    fill(buf, n, prioritized)
    out["fill"] = status("VmRSS") - before
    if checkpoint:
        with tempfile.TemporaryDirectory() as d:
            buf.save(d, 0)  # first save: imports and caches settle
            out["save_before"] = status("VmRSS")
            reset_peak()
            buf.save(d, 1)
            out["save_peak"] = status("VmHWM")
            indices = list(range(10, 10 + 64))
            expected = buf.sample_transition_batch(64, indices=indices)
            del buf
            loaded = cls(OBS, 4, capacity, 32, seed=0)
            out["load_before"] = status("VmRSS")
            reset_peak()
            loaded.load(d, 1)
            out["load_peak"] = status("VmHWM")
            out["load_after"] = status("VmRSS")
            got = loaded.sample_transition_batch(64, indices=indices)
            out["same_after_load"] = all(np.array_equal(a, b) for a, b in zip(expected, got))
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    if sys.argv[3] == "jax":
        main_jax(int(sys.argv[1]), int(sys.argv[2]))
        sys.exit(0)
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "prioritized", sys.argv[4] == "save")
