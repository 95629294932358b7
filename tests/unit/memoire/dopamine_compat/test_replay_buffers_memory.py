"""Resident memory of memoire's Dopamine buffers follows what is stored, not the capacity, and
save/load stream (no second copy). Measured in bytes in a fresh subprocess (tests/helpers/_memory_run.py).
"""

import gzip
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _subprocess_env import subprocess_env

from memoire.dopamine_compat import OutOfGraphPrioritizedReplayBuffer, OutOfGraphReplayBuffer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
MiB = 1 << 20
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/status"
)


def measure(capacity, n, kind="uniform", save=False):
    env = subprocess_env()
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "tests", "helpers", "_memory_run.py"),
            str(capacity),
            str(n),
            kind,
            "save" if save else "-",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@linux_only
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_atari_capacity_costs_nothing_until_frames_arrive(kind):
    # Dopamine's stock Atari buffer: 1,000,000 slots of 84x84 frames (7 GB if committed).
    r = measure(1_000_000, 3000, kind)
    # Per-slot bookkeeping (episode flags, the prioritized tree) is all that construction takes.
    assert r["construct"] < 32 * MiB, r
    # 3,000 frames are 21 MB; resident memory grows by about that (page rounding aside).
    assert 0.9 * r["raw"] <= r["fill"] <= r["raw"] + 12 * MiB, r


@linux_only
@pytest.mark.dopamine
def test_jax_buffer_capacity_costs_nothing_until_frames_arrive():
    pytest.importorskip("dopamine.jax.replay_memory.replay_buffer")
    r = measure(1_000_000, 3000, "jax")
    assert r["construct"] < 32 * MiB, r  # per-element records are reserved, not committed
    assert 0.9 * r["raw"] <= r["fill"] <= r["raw"] + 12 * MiB, r


@pytest.mark.slow
@linux_only
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_save_and_load_stream_without_a_second_copy(kind):
    # 30,000 slots: a second copy of the observation column (211 MB) or its zeros committed on
    # load would overshoot every bound below several times over; more slots only cost time.
    r = measure(30_000, 3000, kind, save=True)
    # Saving writes the whole 30,000-slot file (Dopamine's format) from the columns in place.
    assert r["save_peak"] <= 1.1 * r["save_before"], r
    # Loading commits only the slices holding data (the file's zeros take no pages), and streams.
    assert r["load_after"] - r["load_before"] <= r["raw"] + 16 * MiB, r
    assert r["load_peak"] - r["load_before"] <= r["raw"] + 24 * MiB, r
    assert r["same_after_load"]


@pytest.mark.parametrize("cls", [OutOfGraphReplayBuffer, OutOfGraphPrioritizedReplayBuffer])
def test_streamed_store_files_hold_exactly_what_np_save_writes(tmp_path, cls):
    # Dopamine writes np.save of each column; the streamed writer must produce the same bytes.
    buf = cls((5, 3), 2, 40, 4, action_shape=(2,), action_dtype=np.float64)
    rng = np.random.default_rng(1)
    for i in range(57):  # wraps around the ring
        args = [rng.integers(0, 255, (5, 3), np.uint8), rng.normal(size=2), float(i), i % 9 == 8]
        buf.add(*args, **({"priority": 1.0 + i % 3} if cls._PRIORITIZED else {}))  # pylint: disable=protected-access
    buf.save(str(tmp_path), 7)
    for name, column in buf._store.items():  # pylint: disable=protected-access
        with gzip.open(tmp_path / "$store$_{}_ckpt.7.gz".format(name), "rb") as f:
            written = f.read()
        expected = io.BytesIO()
        np.save(expected, column, allow_pickle=False)
        assert written == expected.getvalue(), name
    again = cls((5, 3), 2, 40, 4, action_shape=(2,), action_dtype=np.float64)
    again.load(str(tmp_path), 7)
    for name, column in buf._store.items():  # pylint: disable=protected-access
        np.testing.assert_array_equal(again._store[name], column)  # pylint: disable=protected-access
    if cls._PRIORITIZED:  # pylint: disable=protected-access
        every = np.arange(40, dtype=np.int32)
        np.testing.assert_array_equal(again.get_priority(every), buf.get_priority(every))
