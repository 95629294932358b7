"""TensorBoard scalars: memoire.tensorboard's writer (no TensorFlow), `memoire serve
--tensorboard`, and the replay figures a tracked Dopamine runner writes through Dopamine's
collector dispatcher. Event files are read back with TensorBoard's own reader where marked."""

import os
import re
import struct
import subprocess
import sys
import types

import numpy as np
import pytest
from _waiting import wait_until

from memoire import tensorboard as tb

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _accumulator(path):
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(path, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    return acc


def _tb_values(path):
    """tag -> [(step, value)] as TensorBoard reads a run's event files: ``simple_value``
    summaries (memoire's writer) and tf.summary tensors (Dopamine's collector)."""
    from tensorboard.util import tensor_util

    acc = _accumulator(path)
    out = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    for t in acc.Tags()["tensors"]:
        out[t] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(t)]
    return out


# ---------------------------------------------------------------------------------------------
# The writer (no TensorFlow).


def test_crc32c_and_record_framing_match_the_published_values():
    assert tb.crc32c(b"") == 0
    assert tb.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)
    assert tb.crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4: 32 bytes of zeros
    record = tb.frame_record(b"abc")
    assert record[:8] == struct.pack("<Q", 3) and record[12:15] == b"abc"
    assert struct.unpack("<I", record[8:12])[0] == tb.masked_crc32c(record[:8])
    assert len(record) == 8 + 4 + 3 + 4


def test_writer_round_trip_is_bit_exact(tmp_path):
    values = {
        "replay/size": 1234567.0,
        "a/neg": -0.15625,
        "a/tiny": float(np.float32(1e-30)),
        "a/int": np.int64(42),
        "a/f32": np.float32(3.1415927),
    }
    with tb.SummaryWriter(str(tmp_path / "run")) as w:
        w.scalars(7, values, wall_time=1700000000.123456)
        w.scalar("a/neg", float("inf"), step=-3, wall_time=2.5)
        w.scalars(2**40, {"a/int": 1.0}, wall_time=3.0)
        path = w.path
    assert os.path.basename(path).startswith("events.out.tfevents.")
    back = tb.read_scalars(str(tmp_path / "run"))
    for tag, v in values.items():
        first = back[tag][0]
        assert first.step == 7 and first.wall_time == 1700000000.123456
        assert struct.pack("<f", first.value) == struct.pack("<f", float(v))  # the float32 bits
    assert back["a/neg"][1] == (2.5, -3, float("inf"))
    assert back["a/int"][1] == (3.0, 2**40, 1.0)


def test_writer_refuses_bad_input_and_writes_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for bad in ("", str(blocker), str(blocker / "sub")):
        with pytest.raises(ValueError, match="expected a directory|is a file"):
            tb.SummaryWriter(bad)
    assert sorted(os.listdir(tmp_path)) == ["file"]
    with tb.SummaryWriter(str(tmp_path / "run")) as w:
        with pytest.raises(TypeError, match="'a': expected a number, got 'x'"):
            w.scalars(1, {"b": 1.0, "a": "x"})
        with pytest.raises(TypeError, match="non-empty strings"):
            w.scalars(1, {"": 1.0})
    assert tb.read_scalars(w.path) == {}  # the file version event only
    with pytest.raises(ValueError, match="closed"):
        w.scalar("a", 1.0, 1)


def test_reader_detects_corruption(tmp_path):
    with tb.SummaryWriter(str(tmp_path)) as w:
        w.scalar("a", 1.0, 1)
    data = bytearray(open(w.path, "rb").read())
    data[-6] ^= 1  # inside the last record's data
    open(w.path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match="bad data CRC"):
        tb.read_scalars(w.path)


@pytest.mark.dopamine  # TensorBoard's reader (installed with TensorFlow)
def test_tensorboard_reads_the_writer_files_bit_exact(tmp_path):
    values = {"replay/size": 1234567.0, "a/neg": -0.15625, "a/f32": np.float32(3.1415927)}
    with tb.SummaryWriter(str(tmp_path)) as w:
        w.scalars(7, values, wall_time=1700000000.123456)
        w.scalar("a/neg", 2.0, 8)
    acc = _accumulator(str(tmp_path))
    assert sorted(acc.Tags()["scalars"]) == sorted(values)
    for tag, v in values.items():
        e = acc.Scalars(tag)[0]
        assert (e.step, e.wall_time) == (7, 1700000000.123456)
        assert struct.pack("<f", e.value) == struct.pack("<f", float(v))
    assert [(e.step, e.value) for e in acc.Scalars("a/neg")] == [(7, -0.15625), (8, 2.0)]


# ---------------------------------------------------------------------------------------------
# memoire serve --tensorboard.


def _serve(args, cwd, **kw):
    cmd = [sys.executable, "-m", "memoire", "serve", *args]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(cwd), **kw
    )


def test_serve_writes_counters_that_read_back(tmp_path):
    from memoire.client import ReplayMemoryClient

    logdir = tmp_path / "tb"
    proc = _serve(
        [
            "--state_shape",
            "4",
            "--cache_size",
            "4",
            "--interval",
            "0.2",
            "--tensorboard",
            str(logdir),
        ],
        tmp_path,
    )
    try:
        first = proc.stdout.readline()
        m = re.match(r"memoire serve: pub (\S+)  rep (\S+)  pull (\S+)", first)
        assert m, first + proc.stderr.read() if proc.poll() is not None else first
        with ReplayMemoryClient(*m.groups(), input_uuid=3, timeout=5) as c:
            c.rem.new_episode()
            for k in range(9):
                c.rem.add_entry(np.zeros(4, np.float32), k, 1.0, 0.5, 0.0)
            c.rem.close_episode()
            c.update_counter()
            c.push_cache()  # 4 rows (cache mode)

        def counted():
            files = list(logdir.glob("events.out.tfevents.*"))
            caches = tb.read_scalars(str(logdir)).get("server/caches_held", []) if files else []
            return caches and caches[-1].value >= 1

        wait_until(counted, "the counters in the event file")
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert (
        "INFO memoire.commands.serve: inserts/s" in err
        and "INFO memoire.commands.serve: stopped" in err
    )
    back = tb.read_scalars(str(logdir))
    for tag in (
        "replay/size",
        "replay/inserts",
        "replay/samples",
        "replay/inserts_per_s",
        "replay/samples_per_s",
        "replay/batches_per_s",
        "replay/priority_mean",
        "server/caches_held",
        "server/episodes",
        "server/rejected",
    ):
        assert tag in back, tag
    steps = [e.step for e in back["replay/size"]]
    assert steps == list(range(1, len(steps) + 1))
    assert back["server/episodes"][-1].value == 1.0
    assert back["server/caches_held"][-1].value == 1.0 and back["replay/inserts"][-1].value == 4.0
    assert sum(e.value for e in back["replay/inserts_per_s"]) > 0


@pytest.mark.dopamine  # TensorBoard's reader
def test_serve_event_files_read_back_with_tensorboard(tmp_path):
    logdir = tmp_path / "tb"
    proc = _serve(
        [
            "--duration",
            "0.7",
            "--interval",
            "0.2",
            "--max_step",
            "100",
            "--tensorboard",
            str(logdir),
        ],
        tmp_path,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    values = _tb_values(str(logdir))
    assert {
        "replay/size",
        "replay/inserts_per_s",
        "replay/samples_per_s",
        "replay/priority_total",
        "server/rejected",
    } <= set(values)
    assert all(v == 0.0 for _, v in values["replay/size"]) and len(values["replay/size"]) >= 3


class _FakeServer:
    """What ServerCounters reads of a server: stats() (each call the next of ``stats``) and
    its memory's cache size and weights."""

    def __init__(self, stats):
        self._stats = iter(stats)
        self.rem = types.SimpleNamespace(cache_size=4, total_weight=6.0, num_sampleable=3)

    def stats(self):
        return next(self._stats)


def test_server_counters_take_each_interval_and_write_its_scalars(tmp_path):
    from memoire.server.counters import ServerCounters

    stats = [
        {"steps_in": 0, "caches": 0, "rows_sampled": 0},
        {"steps_in": 10, "caches": 1, "rows_sampled": 5, "memory_size": 10, "memory_episodes": 2},
        {"steps_in": 30, "caches": 1, "rows_sampled": 5, "memory_size": 30, "memory_episodes": 3},
    ]
    counters = ServerCounters(_FakeServer(stats), str(tmp_path / "tb"))
    first, second = counters.take(), counters.take()
    counters.close()
    counters.close()  # idempotent
    assert "stored 10 entries in 2 episodes" in first and "stored 30 entries in 3" in second
    back = tb.read_scalars(str(tmp_path / "tb"))
    assert [(e.step, e.value) for e in back["replay/inserts"]] == [(1, 14.0), (2, 34.0)]
    assert [e.value for e in back["replay/samples"]] == [5.0, 5.0]
    assert [e.value for e in back["replay/priority_mean"]] == [2.0, 2.0]
    # Without a folder it writes nothing and still gives the line.
    plain = ServerCounters(_FakeServer(stats))
    assert "stored 10 entries in 2 episodes" in plain.take()
    plain.close()
    assert os.listdir(tmp_path) == ["tb"]


@pytest.mark.parametrize(
    "bad,why",
    [("file", "is a file; expected a directory"), ("file/sub", "is a file; expected a directory")],
)
def test_serve_bad_tensorboard_dir_is_a_usage_error(tmp_path, bad, why):
    (tmp_path / "file").write_text("x")
    proc = _serve(["--duration", "0.1", "--tensorboard", str(tmp_path / bad)], tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == ""
    assert err.startswith("memoire serve: error: --tensorboard: ") and why in err, err
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_serve_buffer_refuses_tensorboard(tmp_path):
    proc = _serve(["--buffer", "circular", "--tensorboard", str(tmp_path / "tb")], tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == "" and "--buffer server has none" in err
    assert not (tmp_path / "tb").exists()


# ---------------------------------------------------------------------------------------------
# Dopamine runner: replay figures through the collector dispatcher.


@pytest.mark.dopamine
def test_replay_probe_reads_priorities_of_every_prioritized_buffer():
    from dopamine.jax.replay_memory import accumulator, elements, replay_buffer, samplers
    from dopamine.tf.replay_memory import prioritized_replay_buffer as dopamine_prb

    from memoire.dopamine_compat import OutOfGraphPrioritizedReplayBuffer
    from memoire.dopamine_compat import jax_replay_buffer as mj
    from memoire.experiments.trackers import ReplayProbe, priority_spread, replay_scalars

    def agent(replay):
        return types.SimpleNamespace(_replay=replay)

    set_to = np.array([2.0, 3.0, 4.0])
    jax_buffers = [
        replay_buffer.ReplayBuffer(
            accumulator.TransitionAccumulator(stack_size=1, update_horizon=1, gamma=0.9),
            samplers.PrioritizedSamplingDistribution(0, max_capacity=50, priority_exponent=1.0),
            batch_size=4,
            max_capacity=50,
        ),
        mj.ReplayBuffer(
            mj.TransitionAccumulator(1, 1, 0.9),
            mj.PrioritizedSamplingDistribution(0, max_capacity=50, priority_exponent=1.0),
            batch_size=4,
            max_capacity=50,
        ),
    ]
    for b in jax_buffers:
        for i in range(20):
            b.add(
                elements.TransitionElement(np.zeros(2, np.float32), 1, 1.0, False, i % 7 == 6),
                priority=1.0,
            )
        keys = np.asarray(b.keys() if hasattr(b, "keys") else list(b._memory))
        b.update(keys[:3], priorities=set_to)
        p = ReplayProbe(agent(b)).priorities()
        assert len(p) == len(keys)
        np.testing.assert_array_equal(p[:3], set_to)
        assert (p[3:] == 1.0).all()
    for cls in (OutOfGraphPrioritizedReplayBuffer, dopamine_prb.OutOfGraphPrioritizedReplayBuffer):
        b = cls((2,), 1, 20, 4)
        for _ in range(5):
            b.add(np.zeros(2, np.uint8), 0, 0.0, False, 1.0)
        b.set_priority(np.array([1, 2], np.int32), np.array([0.5, 8.0]))
        p = ReplayProbe(agent(types.SimpleNamespace(memory=b))).priorities()
        np.testing.assert_array_equal(p, [1.0, 0.5, 8.0, 1.0, 1.0])
        assert priority_spread(p) == {"min": 0.5, "mean": 2.3, "max": 8.0, "std": float(np.std(p))}
    uniform = mj.ReplayBuffer(
        mj.TransitionAccumulator(1, 1, 0.9),
        mj.UniformSamplingDistribution(0),
        batch_size=4,
        max_capacity=50,
    )
    assert ReplayProbe(agent(uniform)).priorities() is None
    row = {
        "replay_size": 5,
        "add_count": 6,
        "inserts_per_s": float("nan"),
        "samples_per_s": 2.0,
        "env_steps": 9,
    }
    assert replay_scalars(row, None, 11) == {
        "replay/size": 5.0,
        "replay/inserts": 6.0,
        "replay/samples_per_s": 2.0,
        "replay/env_steps": 9.0,
        "replay/samples": 11.0,
    }


@pytest.mark.slow
@pytest.mark.dopamine
@pytest.mark.parametrize("debug_mode", [False, True])
def test_cartpole_run_writes_replay_scalars_beside_dopamines(tmp_path, debug_mode):
    """A short `memoire train` CartPole run: its TensorBoard event files hold the replay
    scalars, one per iteration, equal to replay.csv's, beside Dopamine's own summaries. In
    debug_mode the JAX agent turns TF2 behaviour on and Dopamine's collector writes them (as
    tensors); otherwise TF runs in graph mode, where Dopamine's collector would write nothing,
    and memoire's TF-free collector takes its place."""
    import csv

    base = tmp_path / "exp"
    cmd = [
        sys.executable,
        "-m",
        "memoire",
        "--log-level",
        "warning",
        "train",
        "--gin_files",
        os.path.join(ROOT, "configs", "dqn_cartpole_jax_local.gin"),
        "--base_dir",
        str(base),
    ]
    for b in (
        "Runner.num_iterations = 2",
        "Runner.training_steps = 120",
        "Runner.evaluation_steps = 30",
        "Runner.max_steps_per_episode = 12",
        "Runner.fine_grained_print_to_console = False",
        "JaxDQNAgent.min_replay_history = 40",
        "JaxDQNAgent.update_period = 2",
        "ClassicControlDQNNetwork.hidden_units = 16",
        f"create_agent.debug_mode = {debug_mode}",
    ):
        cmd += ["--gin_bindings", b]
    out = subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "INFO memoire" not in out.stderr  # --log-level warning reached the command
    run = base / "setting_0" / "run_0"
    values = _tb_values(str(run / "metrics" / "tensorboard"))  # the collectors' run
    assert len(values["Train/AverageReturns"]) == 2  # written once, by one collector
    assert {"Train/AverageReturns", "Eval/AverageReturns"} <= set(values)  # Dopamine's own
    rows = list(csv.DictReader(open(run / "replay.csv")))
    assert len(rows) == 2
    for tag, column in (
        ("replay/size", "replay_size"),
        ("replay/inserts", "add_count"),
        ("replay/env_steps", "env_steps"),
        ("replay/samples_per_s", "samples_per_s"),
    ):
        assert [s for s, _ in values[tag]] == [0, 1], tag
        np.testing.assert_allclose(
            [v for _, v in values[tag]], [float(r[column]) for r in rows], rtol=1e-6, err_msg=tag
        )
    samples = [v for _, v in values["replay/samples"]]
    assert samples[1] > samples[0] > 0
    assert "replay/priority_mean" not in values  # DQN samples uniformly
