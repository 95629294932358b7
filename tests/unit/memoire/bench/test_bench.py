"""Smoke tests of the benchmark suite: structure and ratios, never speed."""

import re

import numpy as np
import pytest

from memoire import bench
from memoire.bench import harness, report, systems
from memoire.bench.systems import Config

TINY = dict(obs_shape=(84, 84), obs_dtype=np.uint8, stack=4, capacity=3000, episode_length=500)


def test_compare_alternates_and_keeps_one_time_per_repetition():
    calls = []
    ops = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    ms = harness.compare("w", ops, repeats=3, calls={"a": 2, "b": 2}, items_per_op=4)
    assert [m.system for m in ms] == ["a", "b"]
    assert all(len(m.seconds) == 3 and m.items_per_op == 4 for m in ms)
    # Repetition 1 starts with b: the order rotates.
    assert calls == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]


def test_table_rows_and_ratios_against_the_first_system():
    ms = [
        harness.Measurement("w1", "memoire x", [1e-3, 2e-3, 3e-3], 32),
        harness.Measurement("w1", "other", [4e-3, 4e-3, 4e-3], 32),
        harness.Measurement("w2", "memoire x", [1e-6], 1),
    ]
    text = report.table(ms)
    lines = text.splitlines()
    assert lines[0].startswith("| workload | system |") and len(lines) == 2 + 3
    assert "| w1 | memoire x | 2.00 ms | 16.00k transitions/s | 1.00x |" in lines
    assert "| w1 | other | 4.00 ms | 8.00k transitions/s | 2.00x |" in lines
    assert report.ratio(ms, "w1", "other") == pytest.approx(2.0)
    assert report.ratio(ms, "w2", "other") is None


@pytest.mark.slow
@pytest.mark.parametrize("n_step", [1, 3])
def test_sample_workload_two_systems_same_content(n_step):
    cfg = Config(**TINY, n_step=n_step)
    built = bench._build(
        cfg,
        2000,
        [systems.NumpyRing, systems.Cpprb]
        if _has_cpprb()
        else [systems.NumpyRing, systems.MemoireCore],
    )
    for s in built.values():
        s.sample()
        state, action, reward, next_state, terminal = s.content()
        assert state.shape[0] == next_state.shape[0] == cfg.batch
        assert sorted(state.shape[1:]) == sorted((84, 84, 4))
        assert len(action) == len(reward) == len(terminal) == cfg.batch
    bench._close(built)
    ms = bench.sample_workload(
        cfg, 2000, repeats=1, batches=(32,), classes=[systems.NumpyRing, systems.MemoireCore]
    )
    names = [m.system for m in ms]
    assert names == [
        "numpy ring",
        "memoire (ReplayMemory)",
        "ceiling: numpy gather",
        "ceiling: memcpy",
    ]
    assert len({m.workload for m in ms}) == 1 and all(m.median > 0 for m in ms)
    table = report.table(ms)
    ratios = re.findall(r"\| ([0-9.]+)x \|", table)
    assert len(ratios) == 4 and ratios[0] == "1.00"


def test_numpy_ring_n_step_reward_stops_at_terminal():
    cfg = Config(
        obs_shape=(4,),
        obs_dtype=np.float32,
        stack=1,
        capacity=100,
        n_step=3,
        episode_length=10,
        batch=256,
    )
    ring = systems.NumpyRing(cfg)
    ring.add(100)
    ring.sample()
    _, _, reward, _, terminal = ring.content()
    idx = ring.last
    # Steps 9, 19, ... are terminal: from index 8 the return is 1 + 0.99 (two steps), from 9
    # just 1, elsewhere the full three steps.
    expected = np.where(idx % 10 == 9, 1.0, np.where(idx % 10 == 8, 1.99, 1 + 0.99 + 0.99**2))
    np.testing.assert_allclose(reward, expected, rtol=1e-6)
    np.testing.assert_array_equal(terminal, (idx % 10 >= 7).astype(np.uint8))


def test_dopamine_layout_and_dopamine_return_the_same_content():
    dop = pytest.importorskip("memoire.bench.dopamine")
    cfg = Config(**TINY, n_step=3)
    ours, theirs = dop.MemoireOutOfGraph(cfg), dop.DopamineOutOfGraph(cfg)
    ours.add(1200)
    theirs.add(1200)
    idx = np.arange(10, 1100, 37)
    a = ours.buf.sample_transition_batch(len(idx), indices=idx)
    b = theirs.buf.sample_transition_batch(len(idx), indices=idx)
    for x, y in zip(a[:8], b[:8]):
        np.testing.assert_allclose(x, y, rtol=1e-6)


def _has_cpprb():
    try:
        import cpprb  # noqa: F401
    except ImportError:
        return False
    return True


def test_targets_read_ratios_of_the_right_rows():
    a, p = "A", "P"
    M = harness.Measurement
    ms = [
        M(f"sample {a}", "memoire (Dopamine layout)", [1.0]),
        M(f"sample {a}", "cpprb", [1.5]),
        M(f"sample {a}", "dopamine (OutOfGraph)", [10.0]),
        M(f"sample {a}", "ceiling: numpy gather", [0.5]),
        M(f"sample+update {p}", "memoire (Dopamine layout)", [1.0]),
        M(f"sample+update {p}", "cpprb", [0.8]),
        M("ingest x 2 actors", "memoire", [1.0]),
        M("ingest x 2 actors", "raw pyzmq PUSH/PULL", [0.9]),
    ]
    rows = report.targets(ms, a, p, 1.05).splitlines()
    assert rows[2] == "| sample 32 stacked Atari transitions vs cpprb | >= 1.0x | 1.50x | yes |"
    assert rows[3].endswith("| 10.00x | **no** |")
    assert rows[4].endswith("| 50% | **no** |")  # memoire reaches half the gather's throughput
    assert rows[5].endswith("| 0.80x | **no** |")
    assert rows[6].endswith("| not measured | - |")
    assert rows[7].endswith("| 90% | yes |")
    assert rows[8].endswith("| 1.05x | yes |")


@pytest.mark.slow
def test_ingest_rows_for_memoire_and_raw_pyzmq_in_both_modes():
    from memoire.bench import ingest

    ms = ingest.ingest_workload(actors=(1,), repeats=1, seconds=0.2, states=(ingest.FLOAT,))
    assert [m.system for m in ms] == ["memoire", "raw pyzmq PUSH/PULL"] * 2
    assert "cache128" in ms[0].workload and "central chunk256 spi0" in ms[2].workload
    # Both sides received messages in every 0.2 s window (none would read as 0.2 s per row).
    assert all(len(m.seconds) == 1 and 0 < m.median < 0.1 for m in ms)
    assert report.ratio(ms, ms[0].workload, "raw pyzmq") is not None


def test_raw_frames_are_memoires_own_messages():
    from memoire import codec
    from memoire.bench import ingest

    for mode, rows in (("cache", 128), ("central", 256)):
        msg = codec.decode(ingest.raw_frames(ingest.Setup(mode=mode)))
        assert msg.type == (codec.Msg.CACHE if mode == "cache" else codec.Msg.CHUNK)
        assert len(msg["weight" if mode == "cache" else "init_w"]) == rows


@pytest.mark.slow
def test_bench_vs_reverb_help_and_quick_memoire_only():
    import os
    import subprocess
    import sys

    from _subprocess_env import subprocess_env

    script = os.path.join(
        os.path.dirname(__file__), "..", "..", "..", "..", "benchmarks", "bench_vs_reverb.py"
    )

    def run(*args):
        return subprocess.run(
            [sys.executable, script, *args],
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert "--reverb-python" in run("--help").stdout
    out = run("--quick")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # One line says how to get Reverb's columns; memoire's rows have numbers, Reverb's none.
    assert [x for x in lines if "Reverb columns skipped" in x] == [lines[0]]
    rows = [x for x in lines if x.startswith("| ingest") or x.startswith("| sample")]
    assert len(rows) == 2 and all(r.endswith("| - | - |") for r in rows)
    assert all(float(r.split("|")[3].replace(",", "")) > 0 for r in rows)
