"""Distributed training: the learner's and actors' sockets, experience streamed into the
learner's buffer, tiny runs with spawned actors and with actors started by endpoint."""

import csv
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq
from _subprocess_env import run_script
from _tiny_run import DIST_GIN, TINY, train_command
from _waiting import wait_until

from memoire.experiments import distributed as dist
from memoire.experiments.distributed.params import params_from_bytes, params_to_bytes
from memoire.experiments.distributed.sockets import STORED_TOPIC


def _link_pair(**config):
    sockets = dist.LearnerSockets(dist.DistributedConfig(num_actors=1, **config))
    ends = dist.ActorEndpoints(
        sockets.endpoints["experience"],
        sockets.endpoints["params"],
        queue_chunks=config.get("queue_chunks", 32),
    )
    return sockets, ends


@pytest.mark.parametrize("transport", ["multiprocessing", "zmq"])
def test_actor_link_gets_newest_parameters_and_the_stop_notice(transport):
    sockets, ends = _link_pair(transport=transport)
    link = ends.open()
    try:
        assert sockets.endpoints["experience"].startswith(
            "ipc://" if transport == "multiprocessing" else "tcp://127.0.0.1:"
        )
        # PUB drops what it sends before the subscription lands: publish until one arrives.
        got = wait_until(lambda: sockets.publish(1, b"x") or link.latest(), "the first parameters")
        assert got == (1, b"x")
        for v in range(2, 6):
            sockets.publish(v, bytes([v]))
        newest = wait_until(
            lambda: (lambda g: g if g and g[0] == 5 else None)(link.latest()), "parameters 5"
        )
        assert newest == (5, bytes([5]))  # the newest wins
        assert not link.should_stop()
        sockets.stop_actors()
        wait_until(link.should_stop, "the stop notice")
        assert link.send([b"anything"]) is False  # told to stop: nothing more goes out
    finally:
        link.close()
        sockets.close()


def test_actor_link_waits_for_a_slow_learner_then_gives_up():
    sockets, ends = _link_pair(queue_chunks=1)
    link = dist.ActorLink(ends, give_up_s=0.3)
    try:
        sent = 0
        for _ in range(1000):  # bounded: HWMs of 1 fill after a few messages
            if not link.send([b"chunk"]):
                break
            sent += 1
        assert 1 <= sent < 1000
        got = 0
        while sockets.pull.poll(100):
            sockets.pull.recv_multipart()
            got += 1
        assert got == sent  # what was queued arrives; nothing was lost silently
    finally:
        link.close()
        sockets.close()


def test_an_actor_starts_episodes_only_while_the_learner_keeps_up():
    sockets, ends = _link_pair()
    ends.episodes_ahead = 1
    link = dist.ActorLink(ends, actor_id=3, give_up_s=0.3)
    other = dist.ActorLink(ends, actor_id=4)
    try:
        assert link.uuid & 0xFFFFFFFF == 3
        assert link.wait_for_learner(0) and link.wait_for_learner(1)  # 0 and 1 episode out
        # two finished episodes, none stored: nothing for 0.3 s, so it gives up
        assert link.wait_for_learner(2) is False
        link = dist.ActorLink(ends, actor_id=3, give_up_s=10)
        # the learner stores episodes 0..4 of this actor and 7 of another one
        # (PUB drops what it sends before a subscription lands: the learner repeats the table)
        got = wait_until(
            lambda: (
                sockets.acknowledge([(link.uuid, 4, 10, None), (other.uuid, 7, 3, None)])
                or link.should_stop()
                or link.stored_episode == 4
            ),
            "the learner's table of stored episodes",
        )
        assert got and link.stored_episode == 4
        assert link.wait_for_learner(6)  # 6 finished, 5 stored: 1 out
        wait_until(
            lambda: other.should_stop() or other.stored_episode == 7,
            "the other actor's stored episode 7",
        )
        # a learner that restarted knows less: what an actor learned stays
        sockets.acknowledge([(link.uuid, 1, 1, None)])
        assert link.wait_for_learner(6) and link.stored_episode == 4
        # garbage on the table's topic is ignored
        sockets.pub.send_multipart([STORED_TOPIC, b"odd"])
        assert not link.should_stop() and link.stored_episode == 4
    finally:
        link.close()
        other.close()
        sockets.close()


@pytest.mark.dopamine
def test_streamed_episodes_land_in_the_learners_buffer_with_their_info():
    from memoire.dopamine_compat import jax_replay_buffer as mj
    from memoire.experience import ChunkStream, ExperienceReceiver

    sockets, ends = _link_pair()
    link = ends.open()
    try:
        buf = mj.ReplayBuffer(
            mj.TransitionAccumulator(1, 1, 0.99),
            mj.UniformSamplingDistribution(0),
            batch_size=4,
            max_capacity=100,
        )
        ingest = buf.chunk_ingest(np.zeros((4, 1), np.float32), np.int32(0))
        receiver = ExperienceReceiver(ingest, sockets.pull)
        stream = ChunkStream(ingest.row_spec, link.send, chunk_rows=3, uuid=(9 << 32) | 1)
        for length in (5, 2):
            for i in range(length):
                assert stream.add(
                    {
                        "observation": np.full((4, 1), i, np.float32),
                        "action": i,
                        "reward": 1.0,
                        "terminal": i == length - 1,
                    }
                )
            assert stream.end_episode(True, info=(float(length), length, True))
        stored = []
        wait_until(lambda: stored.extend(receiver.poll(0.1)) or len(stored) >= 2, "2 episodes")
        assert [(u & 0xFFFFFFFF, e, r, i) for u, e, r, i in stored] == [
            (1, 0, 5, (5.0, 5.0, 1.0)),
            (1, 1, 2, (2.0, 2.0, 1.0)),
        ]
        ref = mj.ReplayBuffer(
            mj.TransitionAccumulator(1, 1, 0.99),
            mj.UniformSamplingDistribution(0),
            batch_size=4,
            max_capacity=100,
        )
        for length in (5, 2):
            ends = np.arange(length) == length - 1
            ref.add_batch(
                np.arange(length, dtype=np.float32)[:, None, None].repeat(4, 1),
                np.arange(length, dtype=np.int32),
                np.ones(length),
                ends,
                ends,
            )
        assert buf.add_count == ref.add_count > 0
        np.testing.assert_array_equal(
            buf.get_elements(buf.keys()).state, ref.get_elements(ref.keys()).state
        )
        count = buf.add_count
        # a peer's garbage is counted and dropped; the receiver lives on
        push = sockets._ctx.socket(zmq.PUSH)
        push.connect(sockets.endpoints["experience"])
        push.send_multipart([b"garbage", b"more"])
        wait_until(lambda: receiver.poll(0.05) or receiver.not_chunk, "the garbage counted")
        push.close(0)
        assert receiver.not_chunk == 1 and buf.add_count == count
    finally:
        link.close()
        sockets.close()


@pytest.mark.dopamine
def test_params_round_trip_without_pickle():
    params = {"params": {"dense": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}}}
    payload = params_to_bytes(params)
    assert b"pickle" not in payload
    back = params_from_bytes(params, payload)
    np.testing.assert_array_equal(
        back["params"]["dense"]["kernel"], params["params"]["dense"]["kernel"]
    )
    with pytest.raises(ValueError, match="does not match"):
        params_from_bytes(params, b"\x00garbage")


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="num_actors"):
        dist.DistributedConfig(num_actors=-1)
    with pytest.raises(ValueError, match="publish_period"):
        dist.DistributedConfig(publish_period=0)
    with pytest.raises(ValueError, match="transport"):
        dist.DistributedConfig(num_actors=1, transport="carrier pigeon")


@pytest.mark.dopamine
def test_local_actors_start_with_their_imports_done_and_no_backend(tmp_path):
    # In a process of its own (the context's server lives as long as the process that made it).
    script = """
        import json, os
        from memoire.experiments.distributed import local_launch
        import _actor_probe
        ctx = local_launch._actor_context()
        queue = ctx.Queue()
        procs = [ctx.Process(target=_actor_probe.report, args=(queue,)) for _ in range(2)]
        for p in procs:
            p.start()
        found = [queue.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(30)
        print(json.dumps({"learner": os.getpid(), "actors": found}))
    """
    out = run_script(script, tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    for actor in found["actors"]:
        # Forked from the server that imported TensorFlow, JAX and Dopamine once, not from the
        # learner, and with no JAX backend started before the fork.
        assert actor["parent"] != found["learner"]
        assert actor["imported"] == [
            "tensorflow",
            "jax",
            "dopamine.discrete_domains.run_experiment",
        ]
        assert actor["jax_backends"] == 0
    assert len({a["parent"] for a in found["actors"]}) == 1


@pytest.mark.dopamine
def test_tiny_distributed_run_two_actors(tmp_path):
    base = str(tmp_path)
    cmd = train_command(base)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=170, cwd=base)
    assert out.returncode == 0, out.stderr[-3000:]
    said = out.stdout + out.stderr
    assert "learner with 2 actor(s) (experience tcp://127.0.0.1:" in said  # the config's 'zmq'
    run = os.path.join(base, "setting_0", "run_0")
    assert os.path.exists(os.path.join(run, "checkpoints", "sentinel_checkpoint_complete.0"))
    rows = list(csv.DictReader(open(os.path.join(run, "episodes.csv"))))
    train = [r for r in rows if r["phase"] == "train"]
    assert sum(int(r["length"]) for r in train) >= 300
    assert {r["actor"] for r in rows if r["phase"] == "eval"} == {"-1"}
    assert {r["actor"] for r in train} <= {"0", "1"} and train
    replay = list(csv.DictReader(open(os.path.join(run, "replay.csv"))))
    assert int(replay[0]["add_count"]) >= 250
    # The learner trained on memoire's buffer (filled by the native ingest) and sampled from it.
    assert replay[0]["memory"] == "memoire.dopamine_compat.jax_replay_buffer.ReplayBuffer"
    assert float(replay[0]["samples_per_s"]) > 0


@pytest.mark.dopamine
def test_learner_trains_from_actors_started_by_endpoint(tmp_path):
    """The roles started separately: a learner that spawns no actor, and `memoire actor`
    processes that join it by its printed endpoints (as they would from other machines)."""
    import re

    base = str(tmp_path)
    cmd = train_command(
        base, "Runner.training_steps = 200", "DistributedConfig.spawn_actors = False"
    )
    learner = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=base
    )
    actors = []
    try:
        endpoints = None
        deadline = time.monotonic() + 150
        lines = []
        while endpoints is None and time.monotonic() < deadline:
            line = learner.stdout.readline()
            if not line:
                break
            lines.append(line)
            endpoints = re.search(
                r"actors started by endpoint \(experience (\S+), "
                r"parameters (\S+)\)",
                line,
            )
        assert endpoints, "".join(lines[-30:])
        for k in range(2):
            acmd = [sys.executable, "-m", "memoire.cli", "actor", "--gin_files", DIST_GIN]
            acmd += ["--experience", endpoints.group(1).rstrip(","), "--params", endpoints.group(2)]
            acmd += ["--actor_id", str(k), "--seed", str(k), "--max_steps", "2000"]
            acmd += ["--chunk_size", "16"]
            for b in TINY + ("Runner.training_steps = 200",):
                acmd += ["--gin_bindings", b]
            actors.append(
                subprocess.Popen(
                    acmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=base
                )
            )
        rest, _ = learner.communicate(timeout=170)
        assert learner.returncode == 0, rest[-3000:]
    finally:
        for p in [learner] + actors:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
    run = os.path.join(base, "setting_0", "run_0")
    rows = list(csv.DictReader(open(os.path.join(run, "episodes.csv"))))
    train = [r for r in rows if r["phase"] == "train"]
    assert {r["actor"] for r in train} <= {"0", "1"} and sum(int(r["length"]) for r in train) >= 200
    assert os.path.exists(os.path.join(run, "checkpoints", "sentinel_checkpoint_complete.0"))
