"""Rate limiting with Reverb's semantics (memoire.rate_limiter, cpp/core/rate_limiter.h) and
on the server: minimum size, the samples-per-insert band, blocking on either side, timeouts
that name the limiter's state, the ratio held over many thousands of steps, and a server that
keeps serving while a remote sample waits. Counts only: no assertion on time."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import threading

import numpy as np
import pytest
import zmq
from _tiny_run import train_command
from _waiting import wait_until

from memoire import ReplayMemoryServer
from memoire.experience import ChunkStream
from memoire.rate_limiter import MinSize, SampleToInsertRatio
from memoire.remote import RemoteMemory

TEMPLATES = (
    np.zeros([4], np.float32),
    np.zeros([], np.int64),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([0], np.uint8),
)
EPISODE = 10  # rows per streamed episode


def _cursor(limiter) -> float:
    c = limiter.counters()
    return c["inserts"] * limiter.samples_per_insert - c["samples"]


# ---------------------------------------------------------------------------- in-process


def test_min_size_blocks_sampling_until_enough_is_stored():
    lim = MinSize(100)
    assert not lim.can_sample(1)
    assert not lim.await_sample(1, 0.0, raise_on_timeout=False)
    for _ in range(99):
        assert lim.await_insert(0.0)  # inserts never block
        lim.inserted(1)
    assert not lim.can_sample(1)
    lim.inserted(1)
    assert lim.await_sample(1_000_000, 0.0)  # no ratio: any batch
    assert lim.counters()["samples"] == 1_000_000


def test_ratio_blocks_inserts_above_the_band_and_samples_below_it():
    lim = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=6)
    assert (lim.min_diff, lim.max_diff) == (14.0, 26.0)
    lim.inserted(10)  # stage 1: free
    assert _cursor(lim) == 20
    assert lim.can_insert(1) and lim.can_insert(3) and not lim.can_insert(4)  # 28 > 26
    lim.inserted(3)
    assert not lim.await_insert(0.0, raise_on_timeout=False)
    assert lim.await_sample(10, 0.0)  # 26 - 10 = 16 >= 14
    assert lim.can_sample(2) and not lim.can_sample(3)  # 16 - 3 < 14
    assert lim.await_insert(0.0)  # 14 * 2 - 10 = 18 <= 26


def test_timeouts_raise_naming_the_limiter_and_its_state():
    lim = SampleToInsertRatio(1.0, 5, 2)
    with pytest.raises(
        TimeoutError,
        match=r"rate limiter: sample blocked .*inserts=0 "
        r"samples=0 .*min_size_to_sample=5",
    ):
        lim.await_sample(1, 0.05)
    lim.inserted(7)
    with pytest.raises(TimeoutError, match=r"rate limiter: insert blocked .*inserts=7"):
        lim.await_insert(0.05)
    c = lim.counters()
    assert c["sample_timeouts"] == 1 and c["insert_timeouts"] == 1
    assert c["sample_blocked"] == 1 and c["insert_blocked"] == 1
    assert c["sample_blocked_s"] > 0 and c["insert_blocked_s"] > 0


def test_a_blocked_sample_is_released_by_an_insert():
    lim = SampleToInsertRatio(1.0, 4, 2)
    got = []
    t = threading.Thread(target=lambda: got.append(lim.await_sample(2, 30.0)))
    t.start()
    wait_until(
        lambda: lim.counters()["samples_waiting"] == 1, "lim.counters()['samples_waiting'] == 1"
    )
    lim.inserted(4)
    t.join(30)
    assert got == [True] and lim.counters()["samples"] == 2


def test_cancel_fails_waiters():
    lim = MinSize(10)
    errors = []

    def wait():
        try:
            lim.await_sample(1, None)
        except TimeoutError as e:
            errors.append(str(e))

    t = threading.Thread(target=wait)
    t.start()
    wait_until(
        lambda: lim.counters()["samples_waiting"] == 1, "lim.counters()['samples_waiting'] == 1"
    )
    lim.cancel()
    t.join(30)
    assert len(errors) == 1 and "cancelled" in errors[0]


@pytest.mark.parametrize("spi,batch", [(8.0, 32), (0.5, 1), (3.0, 7)])
def test_two_threads_keep_the_cursor_in_its_band_over_many_steps(spi, batch):
    """A writer and a sampler, both as fast as they can: every snapshot of the cursor lies in
    the band (inserts come one at a time here, so there is no episode overshoot)."""
    lim = SampleToInsertRatio(spi, 64, error_buffer=max(batch + spi, 2 * max(1.0, spi)))
    lo, hi = lim.min_diff, lim.max_diff
    samples_target = 20000
    outside = []
    done = threading.Event()

    def sampler():
        while lim.counters()["samples"] < samples_target:
            lim.await_sample(batch, 30.0)
        done.set()

    t = threading.Thread(target=sampler)
    t.start()
    steps = 0
    while not done.is_set():
        if not lim.await_insert(0.05, raise_on_timeout=False):
            continue
        lim.inserted(1)
        steps += 1
        c = lim.counters()
        d = c["inserts"] * spi - c["samples"]
        if c["inserts"] > 64 and not lo <= d <= hi:
            outside.append(d)
    t.join(30)
    assert outside == []
    assert steps * spi >= samples_target - hi  # the sampler needed those inserts
    c = lim.counters()
    assert c["insert_blocked"] > 0 or c["sample_blocked"] > 0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (
            dict(samples_per_insert=-1.0, min_size_to_sample=10, error_buffer=5),
            "samples_per_insert",
        ),
        (dict(samples_per_insert=0.0, min_size_to_sample=10, error_buffer=5), "samples_per_insert"),
        (
            dict(samples_per_insert=math.nan, min_size_to_sample=10, error_buffer=5),
            "samples_per_insert",
        ),
        (dict(samples_per_insert=1.0, min_size_to_sample=0, error_buffer=5), "min_size_to_sample"),
        (dict(samples_per_insert=4.0, min_size_to_sample=10, error_buffer=3), "at least"),
        (dict(samples_per_insert=1.0, min_size_to_sample=10, error_buffer=(11.0, 30.0)), "above"),
        (dict(samples_per_insert=1.0, min_size_to_sample=10, error_buffer=-1), "error_buffer"),
    ],
)
def test_bad_settings_raise_clearly(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SampleToInsertRatio(**kwargs)


def test_a_batch_the_band_can_never_allow_is_refused():
    lim = SampleToInsertRatio(1.0, 10, 4)  # band 8 wide: batches up to 7
    lim.inserted(100)
    with pytest.raises(ValueError, match="can never be drawn"):
        lim.await_sample(8, 0.0)
    assert lim.counters()["samples"] == 0


def test_server_refuses_a_min_size_beyond_its_capacity():
    with pytest.raises(
        ValueError,
        match=r"min_size_to_sample=2000 is more than the server's "
        r"memory \(max_step\) holds \(1000",
    ):
        ReplayMemoryServer(*TEMPLATES, 1000, None, rate_limiter=MinSize(2000))


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], None),
        (["--min_size_to_sample", "50"], (1.0, 50, -math.inf, math.inf)),
        (
            [
                "--samples_per_insert",
                "4",
                "--min_size_to_sample",
                "10",
                "--rate_error_buffer",
                "80",
            ],
            (4.0, 10, -40.0, 120.0),
        ),
    ],
)
def test_memoire_serve_flags_set_the_servers_limiter(flags, expected):
    from memoire.commands import serve

    args = ["--max_step", "100", "--n_caches", "2"] + flags
    srv = serve.build_server(serve._config(serve.build_parser().parse_args(args)))
    try:
        lim = srv.rate_limiter
        got = (
            None
            if lim is None
            else (lim.samples_per_insert, lim.min_size_to_sample, lim.min_diff, lim.max_diff)
        )
        assert got == expected
    finally:
        srv.close()


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--samples_per_insert", "4"], "needs --rate_error_buffer"),
        (["--rate_error_buffer", "10"], "needs --samples_per_insert"),
        (["--min_size_to_sample", "500"], "min_size_to_sample=500"),
        (["--samples_per_insert", "-1", "--rate_error_buffer", "10"], "samples_per_insert"),
    ],
)
def test_memoire_serve_refuses_bad_limiter_flags_in_one_line(flags, match, capsys):
    from memoire.commands import serve

    assert serve.main(["--max_step", "100", "--duration", "0"] + flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memoire serve: error:") and match in err[0]


# ---------------------------------------------------------------------------- on the server


class _Writer:
    """An actor streaming EPISODE-row episodes at full speed into a server's PULL endpoint in
    a thread; a send that finds the queue full waits (the server's back-pressure)."""

    def __init__(self, srv, endpoint, max_episodes=10**9):
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.sndhwm = 4
        self._sock.sndtimeo = 50
        self._sock.linger = 0
        self._sock.connect(endpoint)
        self.stop = threading.Event()
        self.episodes = 0
        self._stream = ChunkStream(srv._central.ingest.row_spec, self._send, chunk_rows=EPISODE)
        self._max = max_episodes
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _send(self, frames) -> bool:
        while not self.stop.is_set():
            try:
                self._sock.send_multipart(frames)
                return True
            except zmq.Again:
                continue
        return False

    def _run(self):
        row = {
            "s": np.ones(4, np.float32),
            "a": 1,
            "r": 0.5,
            "p": 0.5,
            "v": 0.0,
            "i": np.zeros(0, np.uint8),
            "init_w": 1.0,
        }
        while not self.stop.is_set() and self.episodes < self._max:
            for _ in range(EPISODE - 1):
                self._stream.add(row)
            self._stream.add(row)
            if self._stream.end_episode(terminal=True):
                self.episodes += 1

    def close(self):
        self.stop.set()
        self._thread.join(30)
        self._sock.close(0)
        self._ctx.term()


def test_server_holds_the_ratio_against_a_full_speed_writer():
    spi, batch = 2.0, 16
    lim = SampleToInsertRatio(spi, 200, error_buffer=100)
    with ReplayMemoryServer(*TEMPLATES, 100000, None, rate_limiter=lim, seed=0) as srv:
        ep = srv.start()
        writer = _Writer(srv, ep["pull"])
        try:
            # No sampler yet: the ingest stops pulling once the band is full.
            wait_until(
                lambda: lim.counters()["inserts_waiting"] == 1 and lim.counters()["inserts"] >= 200,
                "lim.counters()['inserts_waiting'] == 1 and lim.counters()['inserts'] >= 200",
            )
            held = lim.counters()["inserts"]
            assert held * spi <= lim.max_diff + EPISODE * spi
            outside = []
            for _ in range(1500):  # 24,000 samples
                srv.sample(batch, timeout=30)
                d = _cursor(lim)
                if not lim.min_diff <= d <= lim.max_diff + EPISODE * spi:
                    outside.append(d)
            assert outside == []
            s = srv.stats()
            assert s["rate_limiter"]["samples"] == 1500 * batch
            assert s["rate_limiter"]["insert_blocked"] > 0  # the writer was held back
            assert s["rejected_total"] == 0  # and nothing it sent was dropped
            assert s["steps_in"] == s["rate_limiter"]["inserts"] >= 1500 * batch / spi
        finally:
            writer.close()


def test_a_remote_sample_waits_while_the_server_serves_other_peers():
    lim = SampleToInsertRatio(1.0, 30, 10)
    with ReplayMemoryServer(*TEMPLATES, 1000, None, rate_limiter=lim, seed=0) as srv:
        ep = srv.start()
        got = []
        learner = RemoteMemory(ep["rep"], timeout=30, retries=0)
        t = threading.Thread(target=lambda: got.append(learner.sample(8, timeout=20)))
        t.start()
        with RemoteMemory(ep["rep"], timeout=10, retries=0) as other:
            # The sample is parked, and the one worker answers another peer meanwhile.
            wait_until(
                lambda: other.stats().get("deferred", 0) == 1,
                "other.stats().get('deferred', 0) == 1",
            )
            assert other.stats()["rate_limiter"]["samples"] == 0
            assert not got
            writer = _Writer(srv, ep["pull"], max_episodes=3)  # 30 transitions
            try:
                t.join(30)
            finally:
                writer.close()
            assert len(got) == 1 and got[0].prev[0].shape == (8, 1, 4)
            s = other.stats()["rate_limiter"]
            assert s["samples"] == 8 and s["sample_blocked"] == 1
        learner.close()


def test_a_remote_sample_that_waits_too_long_gets_a_timeout_naming_the_limiter():
    with ReplayMemoryServer(*TEMPLATES, 1000, None, rate_limiter=MinSize(50)) as srv:
        ep = srv.start()
        with RemoteMemory(ep["rep"], timeout=10, retries=0) as rm:
            with pytest.raises(
                TimeoutError,
                match=r"memory.sample: rate limiter: blocked for "
                r"0.2 s \(inserts=0 .*min_size_to_sample=50",
            ):
                rm.sample(4, timeout=0.2)
            assert rm.stats()["rate_limiter"]["sample_timeouts"] == 1
        with pytest.raises(TimeoutError, match="rate limiter: sample blocked"):
            srv.sample(4, timeout=0.05)  # in-process: the same limiter


@pytest.mark.slow
@pytest.mark.dopamine
def test_a_distributed_learner_keeps_its_replay_ratio(tmp_path):
    """DistributedConfig.samples_per_insert: the learner trains as its rate limiter allows and
    the run completes."""
    base = str(tmp_path)
    cmd = train_command(
        base,
        "Runner.training_steps = 400",
        "DistributedConfig.num_actors = 1",
        "DistributedConfig.samples_per_insert = 64.0",
        "DistributedConfig.rate_error_buffer = 1280.0",
    )
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=base)
    assert out.returncode == 0, out.stderr[-3000:]
    run = os.path.join(base, "setting_0", "run_0")
    replay = list(csv.DictReader(open(os.path.join(run, "replay.csv"))))
    # 400 training steps at update_period 4 are 100 batches of 128: with 64 samples per
    # insert and a margin of 1280 samples the learner needed 51 + (12800 - 1280) / 64 = 231
    # transitions at least, and took about 51 + (12800 + 1280) / 64 = 271 at most (plus the
    # episodes of the last poll), where one training step per transition takes 400.
    # env_steps: the rows of the stored episodes, which the limiter counts as inserts.
    assert 231 <= int(replay[0]["env_steps"]) < 400
