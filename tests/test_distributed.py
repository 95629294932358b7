"""Distributed training pieces: chunks, per-actor episode assembly, transports, a tiny run."""

import csv
import multiprocessing as mp
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from memoire.experiments import distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _chunk(start, n, ends=(), terminal=()):
    end = np.zeros(n, bool)
    end[list(ends)] = True
    term = np.zeros(n, bool)
    term[list(terminal)] = True
    return dist.Chunk(observation=np.arange(start, start + n, dtype=np.float64)[:, None],
                      action=np.zeros(n, np.int32), reward=np.ones(n, np.float32),
                      terminal=term, episode_end=end,
                      episodes=np.tile([1.0, 1.0, 0.0], (len(ends), 1)))


def test_assembler_releases_whole_episodes_per_actor():
    a = dist.EpisodeAssembler()
    assert a.add(0, _chunk(0, 4)) is None  # actor 0: half an episode
    done = a.add(1, _chunk(100, 3, ends=[1]))  # actor 1: one episode and a bit
    assert list(done.observation[:, 0]) == [100, 101] and len(done.episodes) == 1
    assert a.pending(1) == 1 and a.pending(0) == 4
    done = a.add(0, _chunk(4, 3, ends=[0, 2]))
    assert list(done.observation[:, 0]) == [0, 1, 2, 3, 4, 5, 6]  # never spliced with actor 1
    assert len(done.episodes) == 2 and a.pending(0) == 0


def test_chunk_validation_names_the_field():
    _chunk(0, 3, ends=[2], terminal=[2]).validate()
    bad = _chunk(0, 3, ends=[2])
    bad.reward = np.ones(2, np.float32)
    with pytest.raises(ValueError, match="reward"):
        bad.validate()
    with pytest.raises(ValueError, match="terminal step must also be an episode end"):
        _chunk(0, 3, ends=[2], terminal=[1]).validate()
    bad = _chunk(0, 3, ends=[2])
    bad.episodes = np.zeros((0, 3))
    with pytest.raises(ValueError, match="episodes"):
        bad.validate()


def test_queue_transport_latest_parameters_and_backpressure():
    ctx = mp.get_context("spawn")
    t = dist.make_transport(dist.DistributedConfig(num_actors=2, queue_chunks=1), ctx)
    try:
        for v in range(5):
            t.publisher.publish(v, bytes([v]))
        ends = t.actor_args[1][0]
        exp_q, param_q, stop = ends.exp_q, ends.param_q, ends.stop
        src = dist.QueueParameterSource(param_q)
        got = None
        for _ in range(100):  # the queue's feeder thread delivers asynchronously
            got = src.latest() or got
            if got and got[0] == 4:
                break
            time.sleep(0.02)
        assert got == (4, bytes([4]))  # the newest wins, older ones were dropped
        sink = dist.QueueExperienceSink(exp_q, stop, poll_s=0.05)
        assert sink.add_chunk(1, _chunk(0, 2, ends=[1]))
        stop.set()
        assert sink.add_chunk(1, _chunk(0, 2, ends=[1])) is False  # full queue, stopping
        actor_id, chunk = t.source.get_chunk(timeout=5)
        assert actor_id == 1 and len(chunk) == 2
    finally:
        t.shutdown([])


@pytest.mark.dopamine
def test_params_round_trip_without_pickle():
    params = {"params": {"dense": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}}}
    payload = dist.params_to_bytes(params)
    assert b"pickle" not in payload
    back = dist.params_from_bytes(params, payload)
    np.testing.assert_array_equal(back["params"]["dense"]["kernel"],
                                  params["params"]["dense"]["kernel"])
    with pytest.raises(ValueError, match="does not match"):
        dist.params_from_bytes(params, b"\x00garbage")


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="num_actors"):
        dist.DistributedConfig(num_actors=-1)
    with pytest.raises(ValueError, match="publish_period"):
        dist.DistributedConfig(publish_period=0)
    with pytest.raises(ValueError, match="transport"):
        dist.DistributedConfig(num_actors=1, transport="carrier pigeon")


def test_queue_transport_ends_carry_chunks_and_parameters():
    import multiprocessing as mp

    t = dist.make_transport(dist.DistributedConfig(num_actors=1, queue_chunks=4), mp.get_context("spawn"))
    try:
        sink, params, should_stop, close = t.actor_args[0][0].open()
        n = 3
        chunk = dist.Chunk(np.zeros((n, 4), np.float32), np.arange(n, dtype=np.int32),
                           np.ones(n, np.float32), np.zeros(n, bool), np.zeros(n, bool),
                           np.zeros((0, 3)))
        assert sink.add_chunk(0, chunk)
        actor_id, got = t.source.get_chunk(timeout=10)
        assert actor_id == 0 and got.action.tolist() == [0, 1, 2]
        t.publisher.publish(7, b"params")
        deadline = time.monotonic() + 10
        latest = None
        while latest is None and time.monotonic() < deadline:
            latest = params.latest()
        assert latest == (7, b"params") and not should_stop()
        close()
    finally:
        t.shutdown([])


@pytest.mark.dopamine
def test_tiny_distributed_run_two_actors(tmp_path):
    base = str(tmp_path)
    cmd = [sys.executable, "-m", "memoire.experiments.train", "--base_dir", base, "--gin_files",
           os.path.join(ROOT, "configs", "dqn_cartpole_jax_distributed.gin")]
    for b in ("Runner.num_iterations = 1", "Runner.training_steps = 300",
              "Runner.evaluation_steps = 50", "JaxDQNAgent.min_replay_history = 50",
              "ClassicControlDQNNetwork.hidden_units = 32",
              "DistributedConfig.publish_period = 20", "DistributedConfig.chunk_size = 8"):
        cmd += ["--gin_bindings", b]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=170, cwd=base)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "learner with 2 actor(s)" in out.stdout
    assert "over zmq" in out.stdout  # the config's transport: the embedded memoire server
    run = os.path.join(base, "setting_0", "run_0")
    assert os.path.exists(os.path.join(run, "checkpoints", "sentinel_checkpoint_complete.0"))
    rows = list(csv.DictReader(open(os.path.join(run, "episodes.csv"))))
    train = [r for r in rows if r["phase"] == "train"]
    assert sum(int(r["length"]) for r in train) >= 300
    assert {r["actor"] for r in rows if r["phase"] == "eval"} == {"-1"}
    assert {r["actor"] for r in train} <= {"0", "1"} and train
    replay = list(csv.DictReader(open(os.path.join(run, "replay.csv"))))
    assert int(replay[0]["add_count"]) >= 250
    # The learner trained on memoire's buffer (filled by add_batch) and sampled from it.
    assert replay[0]["memory"] == "memoire.dopamine_compat.jax_replay_buffer.ReplayBuffer"
    assert float(replay[0]["samples_per_s"]) > 0


# --- The learner's bulk ingestion equals one add and one training step at a time. -----------


def _agent(kind):
    import functools

    import gin
    from dopamine.jax import networks

    from memoire.dopamine_compat import jax_agents

    gin.clear_config()
    gin.bind_parameter("dopamine.jax.replay_memory.replay_buffer.ReplayBuffer.max_capacity", 500)
    gin.bind_parameter("dopamine.jax.replay_memory.replay_buffer.ReplayBuffer.batch_size", 16)
    gin.bind_parameter(
        "dopamine.jax.replay_memory.samplers.PrioritizedSamplingDistribution.max_capacity", 500)
    common = dict(num_actions=2, observation_shape=(4,), observation_dtype=np.float32,
                  stack_size=1, min_replay_history=30, update_period=3,
                  target_update_period=10, seed=5)
    if kind == "dqn":
        net = functools.partial(networks.ClassicControlDQNNetwork, hidden_units=8)
        return jax_agents.MemoireJaxDQNAgent(network=net, **common)
    net = functools.partial(networks.ClassicControlRainbowNetwork, hidden_units=8)
    return jax_agents.MemoireJaxRainbowAgent(network=net, num_atoms=11, update_horizon=2,
                                             replay_scheme="prioritized", **common)


def _episodes(rng, n):
    ends = np.zeros(n, bool)
    ends[rng.choice(n - 1, n // 9, replace=False)] = True
    ends[-1] = True
    term = ends & (rng.random(n) < 0.5)
    return dist.Chunk(observation=rng.normal(size=(n, 4)).astype(np.float32),
                      action=rng.integers(2, size=n).astype(np.int32),
                      reward=rng.normal(size=n).astype(np.float32), terminal=term,
                      episode_end=ends, episodes=np.zeros((int(ends.sum()), 3)))


@pytest.mark.dopamine
@pytest.mark.parametrize("kind", ["dqn", "rainbow"])
def test_bulk_ingest_equals_one_step_at_a_time(kind):
    import gin
    import jax

    rng = np.random.default_rng(3)
    chunks = [_episodes(rng, n) for n in (40, 7, 55, 1, 23)]
    try:
        ref = _agent(kind)
        ref.eval_mode = False
        steps = []
        for c in chunks:  # what the learner did before: add, then train, per transition
            for i in range(len(c)):
                ref._store_transition(c.observation[i], c.action[i], c.reward[i],
                                      bool(c.terminal[i]), episode_end=bool(c.episode_end[i]))
                ref._train_step()
                steps.append(ref.training_steps)
        bulk = _agent(kind)
        bulk.eval_mode = False
        calls = []
        batches = []
        add_batch = bulk._replay.add_batch
        bulk._replay.add_batch = lambda *a, **k: batches.append(len(a[0])) or add_batch(*a, **k)
        for c in chunks:
            dist.ingest(bulk, c, lambda: calls.append(bulk.training_steps))
    finally:
        gin.clear_config()
    assert calls == steps  # one training step (and callback) per transition
    assert max(batches) > 1 and sum(batches) == sum(len(c) for c in chunks)
    assert bulk.training_steps == ref.training_steps and ref.training_steps > 100
    a, b = ref._replay, bulk._replay
    assert a.add_count == b.add_count and a.sample_count == b.sample_count > 0
    np.testing.assert_array_equal(a.keys(), b.keys())
    ea, eb = a.get_elements(a.keys()), b.get_elements(b.keys())
    for f in ("state", "action", "reward", "next_state", "is_terminal", "episode_end"):
        np.testing.assert_array_equal(getattr(ea, f), getattr(eb, f), err_msg=f)
    np.testing.assert_array_equal(a.priorities(a.keys()), b.priorities(b.keys()))
    assert a.max_recorded_priority == b.max_recorded_priority
    # Same samples in the same order: the trained networks are identical.
    for x, y in zip(jax.tree_util.tree_leaves(ref.online_params),
                    jax.tree_util.tree_leaves(bulk.online_params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.dopamine
def test_learner_trains_from_actors_started_by_endpoint(tmp_path):
    """The roles started separately: a learner that spawns no actor, and `memoire actor`
    processes that join it by its printed endpoints (as they would from other machines)."""
    import re

    base = str(tmp_path)
    gin = os.path.join(ROOT, "configs", "dqn_cartpole_jax_distributed.gin")
    small = ["Runner.num_iterations = 1", "Runner.training_steps = 200",
             "Runner.evaluation_steps = 20", "JaxDQNAgent.min_replay_history = 50",
             "ClassicControlDQNNetwork.hidden_units = 16", "DistributedConfig.publish_period = 20"]
    cmd = [sys.executable, "-m", "memoire.experiments.train", "--base_dir", base,
           "--gin_files", gin,
           "--gin_bindings", "DistributedConfig.spawn_actors = False"]
    for b in small:
        cmd += ["--gin_bindings", b]
    learner = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               cwd=base)
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
            endpoints = re.search(r"actors started by endpoint over zmq \(server rep (\S+), pub (\S+)\)",
                                  line)
        assert endpoints, "".join(lines[-30:])
        for k in range(2):
            acmd = [sys.executable, "-m", "memoire.cli", "actor", "--gin_files", gin,
                    "--rep", endpoints.group(1), "--pub", endpoints.group(2).rstrip(")"),
                    "--actor_id", str(k), "--seed", str(k), "--max_steps", "2000",
                    "--chunk_size", "16"]
            for b in small:
                acmd += ["--gin_bindings", b]
            actors.append(subprocess.Popen(acmd, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, cwd=base))
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
