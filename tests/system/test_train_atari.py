"""Dopamine's stock Atari gin files, unmodified, through ``memoire train`` on memoire's buffers.

The stock files are read from ``<repo>/../shared/dopamine-stock-gin/`` (Dopamine's own copies,
not part of the project; ``MEMOIRE_STOCK_GIN`` names another folder); without that folder, or
without ale-py and its Pong ROM, these tests skip and say why. Budgets are cut with
``--gin_bindings`` only (a few hundred agent steps, small replay capacity and batch, training
from step 100), so each run is seconds of play after the imports; learning is not tested here.
"""

import ast
import csv
import functools
import os
import re
import subprocess
import sys

import pytest
from _chatter import check_quiet
from _subprocess_env import subprocess_env
from _two_at_a_time import TwoAtATime

pytestmark = pytest.mark.dopamine

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# MEMOIRE_STOCK_GIN overrides the folder (a checkout elsewhere, e.g. a git worktree).
STOCK = os.path.join(
    os.environ.get("MEMOIRE_STOCK_GIN")
    or os.path.join(os.path.dirname(ROOT), "shared", "dopamine-stock-gin"),
    "dopamine",
)
ATARI = os.path.join(ROOT, "configs", "atari")

pytest.importorskip("dopamine")
_ale = pytest.importorskip("ale_py", reason="Atari needs ale-py (pip install ale-py)")


def _rom_missing() -> str | None:
    from ale_py import roms

    try:
        path = roms.get_rom_path("pong")
    except Exception as e:  # older ale-py raise when a ROM is not installed
        return f"the Pong ROM is not installed ({e})"
    return None if path and os.path.exists(path) else "the Pong ROM is not installed"


if not os.path.isdir(STOCK):
    pytest.skip(f"Dopamine's stock gin files are not at {STOCK}", allow_module_level=True)
if _rom_missing():
    pytest.skip(_rom_missing(), allow_module_level=True)

# name -> (stock file under STOCK, the agent class whose min_replay_history the file binds,
#          whether the replay is prioritized)
JAX_CONFIGS = {
    "dqn": ("jax/agents/dqn/configs/dqn.gin", "JaxDQNAgent", False),
    "c51": ("jax/agents/rainbow/configs/c51.gin", "JaxRainbowAgent", False),
    "rainbow": ("jax/agents/rainbow/configs/rainbow.gin", "JaxRainbowAgent", True),
    "full_rainbow": ("jax/agents/full_rainbow/configs/full_rainbow.gin", "JaxDQNAgent", True),
    "quantile": ("jax/agents/quantile/configs/quantile.gin", "JaxQuantileAgent", True),
    "implicit_quantile": (
        "jax/agents/implicit_quantile/configs/implicit_quantile.gin",
        "JaxImplicitQuantileAgent",
        False,
    ),
}
TF_CONFIGS = {
    "tf_dqn": "tf/agents/dqn/configs/dqn.gin",
    "tf_rainbow": "tf/agents/rainbow/configs/rainbow.gin",
    "tf_c51": "tf/agents/rainbow/configs/c51.gin",
    "tf_implicit_quantile": "tf/agents/implicit_quantile/configs/implicit_quantile.gin",
}
JAX_MEMORY = "memoire.dopamine_compat.jax_replay_buffer.ReplayBuffer"
# The older entry point (it runs memoire train).
ENTRY_POINT = ("-m", "memoire.dopamine_compat.jax_agents")

TRAINING_STEPS = 200


def _short(agent_class: str, prioritized: bool) -> list[str]:
    """Bindings that shrink a stock Atari run to a couple of hundred agent steps."""
    out = [
        "Runner.num_iterations = 1",
        f"Runner.training_steps = {TRAINING_STEPS}",
        "Runner.evaluation_steps = 50",
        "Runner.max_steps_per_episode = 50",
        f"{agent_class}.min_replay_history = 100",
        "ReplayBuffer.max_capacity = 1000",
        "ReplayBuffer.batch_size = 8",
    ]
    if prioritized:
        out.append("PrioritizedSamplingDistribution.max_capacity = 1000")
    return out


def _env() -> dict:
    env = subprocess_env()
    env.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    return env


# A bound on each run, far above a quiet machine's 20-40 s: the single runs go two at a time
# beside the distributed ones (up to four processes on two cores), and a loaded developer
# machine is slower still.
def _run(args: list[str], cwd, timeout: float = 480) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        env=_env(),
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _train(gin_file: str, base, bindings: list[str], entry=("-m", "memoire.cli", "train")):
    args = [*entry, "--gin_files", gin_file, "--base_dir", str(base)]
    for b in bindings:
        args += ["--gin_bindings", b]
    out = _run(args, base.parent)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # One iteration: memoire's few lines only (setting, learner, GPU placement, the iteration,
    # a phase line if a phase outlasts a minute), none of TensorFlow's, gym's or the ALE's.
    lines = check_quiet(out, most_lines=7)
    assert all(line.startswith(("INFO memoire.", "WARNING memoire.")) for line in lines), lines
    return out


def _rows(path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _check_run(base, *, memory: str, actors: bool, game: str = "Pong") -> None:
    """The run under ``base`` played the gin file's game on ``memory``, trained, and left
    records ``memoire plot`` draws."""
    run = base / "setting_0" / "run_0"
    episodes = _rows(run / "episodes.csv")
    train_rows = [r for r in episodes if r["phase"] == "train"]
    assert train_rows and int(train_rows[-1]["env_steps"]) >= TRAINING_STEPS
    # Max 50 steps per episode: every Pong episode here is cut by the runner's limit.
    assert all(int(r["length"]) <= 50 for r in train_rows)
    who = {int(r["actor"]) for r in train_rows}
    assert (who <= {0, 1} and who) if actors else who == {-1}
    (replay,) = _rows(run / "replay.csv")
    assert replay["memory"] == memory
    assert int(replay["add_count"]) >= TRAINING_STEPS - 50
    assert float(replay["samples_per_s"]) > 0  # the agent sampled: training ran
    config = (run / "config.gin").read_text()
    assert re.search(rf"create_atari_environment.game_name = '{game}'", config), config
    from memoire.experiments import plot

    assert os.path.exists(plot.plot(str(base), phase="train", bin_steps=50))


def _train_locally(name: str, base):
    """Trains stock JAX config ``name`` in one process under ``base``: DQN through ``python -m
    memoire.dopamine_compat.jax_agents`` (the older entry point, which is memoire train: same
    run layout and trackers) on Breakout, the others through ``memoire train`` on the file's
    Pong."""
    rel, agent_class, prioritized = JAX_CONFIGS[name]
    bindings = _short(agent_class, prioritized)
    if name == "dqn":
        bindings.append("atari_lib.create_atari_environment.game_name = 'Breakout'")
        _train(os.path.join(STOCK, rel), base, bindings, entry=ENTRY_POINT)
    else:
        _train(os.path.join(STOCK, rel), base, bindings)
    return base


@pytest.fixture(scope="module")
def single_runs(request, tmp_path_factory):
    """The single-process runs of this module's tests (every one but the distributed runs),
    two at a time; ``single_runs(request)`` waits for the requesting test's run and returns
    what its job returns."""
    root = tmp_path_factory.mktemp("single")

    def folder(name):  # each run in a folder of its own, its working directory the parent
        (root / name).mkdir()
        return root / name / "run"

    jobs = {
        f"test_stock_jax_config_trains_locally[{n}]": functools.partial(
            _train_locally, n, folder(f"local_{n}")
        )
        for n in JAX_CONFIGS
    }
    jobs["test_stock_file_runs_on_dopamines_buffer_for_comparison"] = functools.partial(
        _train_on_dopamines_buffer, folder("dopamine_replay")
    )
    jobs["test_stock_tf_file_fails_in_one_line_naming_the_equivalent"] = functools.partial(
        _stock_tf_file, folder("stock_tf")
    )
    jobs["test_tf_dqn_trains_through_configs_atari"] = functools.partial(
        _train_tf_dqn, folder("tf_dqn")
    )
    for n in FEEDS:
        jobs[f"test_tf_feed_configs_train_from_the_prefetching_feed[{n}]"] = functools.partial(
            _train_feed, n, folder(n)
        )
    runs = TwoAtATime(request, jobs)
    yield lambda test_request: runs.result(test_request.node.name)
    runs.close()


@pytest.mark.parametrize("name", sorted(JAX_CONFIGS))
def test_stock_jax_config_trains_locally(single_runs, request, name):
    """Every stock JAX agent trains in one process on memoire's JAX buffer (DQN's run through
    the jax_agents entry point, on Breakout: _train_locally)."""
    base = single_runs(request)
    _check_run(base, memory=JAX_MEMORY, actors=False, game="Breakout" if name == "dqn" else "Pong")


# Every agent class of the stock files, in a distributed run. C51 is left out: its agent is
# Rainbow's JaxRainbowAgent (run here by "rainbow") and its uniform memory is DQN's and
# implicit quantile's (run here); its own file trains in test_stock_jax_config_trains_locally.
DISTRIBUTED = sorted(set(JAX_CONFIGS) - {"c51"})


@pytest.mark.parametrize("name", DISTRIBUTED)
def test_stock_jax_config_trains_with_actors(tmp_path, name):
    """Every stock agent class trains from an actor process (its network's parameters
    published, its own action selection in the actor); DQN's run has two actors, whose
    episodes interleave in the learner. (One actor for the others: a third process compiling
    an Atari network on a 2-core CI machine costs about a third of the test and checks nothing
    agent-specific.)"""
    rel, agent_class, prioritized = JAX_CONFIGS[name]
    base = tmp_path / name
    actors = 2 if name == "dqn" else 1
    # Nothing in the stock file names an environment: the actors build Dopamine's default,
    # Atari with the file's game, as the learner's runner does.
    out = _train(
        os.path.join(STOCK, rel),
        base,
        _short(agent_class, prioritized)
        + [
            "import memoire.experiments.distributed",
            f"DistributedConfig.num_actors = {actors}",
            "DistributedConfig.chunk_size = 25",
            "DistributedConfig.publish_period = 10",
        ],
    )
    logged = f"INFO memoire.experiments.distributed: learner with {actors} actor(s)"
    assert logged in out.stderr
    _check_run(base, memory=JAX_MEMORY, actors=True)


def _train_on_dopamines_buffer(base):
    rel, agent_class, prioritized = JAX_CONFIGS["rainbow"]
    _train(
        os.path.join(STOCK, rel),
        base,
        _short(agent_class, prioritized),
        entry=("-m", "memoire.cli", "train", "--replay", "dopamine"),
    )
    return base


def test_stock_file_runs_on_dopamines_buffer_for_comparison(single_runs, request):
    base = single_runs(request)
    _check_run(base, memory="dopamine.jax.replay_memory.replay_buffer.ReplayBuffer", actors=False)


def _stock_tf_file(base) -> subprocess.CompletedProcess:
    args = ["-m", "memoire.cli", "train", "--gin_files", os.path.join(STOCK, TF_CONFIGS["tf_dqn"])]
    return _run(args + ["--base_dir", str(base)], base.parent, timeout=120)


def test_stock_tf_file_fails_in_one_line_naming_the_equivalent(single_runs, request):
    out = single_runs(request)
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("memoire train: ") and "tf.estimator" in last
    assert "configs/atari/" in last and "Traceback" not in out.stderr


def _train_tf_dqn(base):
    return base, _train(
        os.path.join(ATARI, "tf_dqn.gin"),
        base,
        [
            "Runner.num_iterations = 1",
            f"Runner.training_steps = {TRAINING_STEPS}",
            "Runner.evaluation_steps = 50",
            "Runner.max_steps_per_episode = 50",
            "DQNAgent.min_replay_history = 100",
            "WrappedReplayBuffer.replay_capacity = 1000",
            "WrappedReplayBuffer.batch_size = 8",
        ],
    )


def test_tf_dqn_trains_through_configs_atari(single_runs, request):
    base, out = single_runs(request)
    _check_run(
        base,
        memory="memoire.dopamine_compat.circular_replay_buffer.OutOfGraphReplayBuffer",
        actors=False,
    )
    config = (base / "setting_0" / "run_0" / "config.gin").read_text()
    # The stock optimizer, set from gin without gin.tf.
    assert "RMSPropOptimizer.centered = True" in config
    # The file asks for '/gpu:0': without a GPU, one line says where the agent went instead of
    # TensorFlow's placement complaints (none: _train counted the lines).
    placed = [line for line in out.stderr.splitlines() if "tf_device" in line]
    assert len(placed) <= 1
    if placed:
        assert "DQNAgent.tf_device '/gpu:0' placed on '/cpu:*'" in placed[0]
        assert "DQNAgent.tf_device = '/cpu:*'" in config


FEEDS = {
    "tf_dqn_feed": ("WrappedReplayBuffer", "MemoireOutOfGraphReplayBuffer"),
    "tf_rainbow_feed": (
        "WrappedPrioritizedReplayBuffer",
        "MemoireOutOfGraphPrioritizedReplayBuffer",
    ),
}


def _train_feed(name, base):
    wrapper = FEEDS[name][0]
    agent = "DQNAgent" if "dqn" in name else "RainbowAgent"
    _train(
        os.path.join(ATARI, f"{name}.gin"),
        base,
        [
            "Runner.num_iterations = 1",
            f"Runner.training_steps = {TRAINING_STEPS}",
            "Runner.evaluation_steps = 50",
            "Runner.max_steps_per_episode = 50",
            f"{agent}.min_replay_history = 100",
            f"{wrapper}.replay_capacity = 1000",
            f"{wrapper}.batch_size = 8",
        ],
    )
    return base


@pytest.mark.parametrize("name", sorted(FEEDS))
def test_tf_feed_configs_train_from_the_prefetching_feed(single_runs, request, name):
    memory = FEEDS[name][1]
    base = single_runs(request)
    prioritized = "Prioritized" if "rainbow" in name else ""
    _check_run(
        base,
        memory=f"memoire.dopamine_compat.{'prioritized' if prioritized else 'circular'}"
        f"_replay_buffer.OutOfGraph{prioritized}ReplayBuffer",
        actors=False,
    )
    # The operative config lists what the buffer was built with: the feed's depth.
    config = (base / "setting_0" / "run_0" / "config.gin").read_text()
    assert re.search(rf"{memory}\.prefetch_depth = 4", config), config


# --- configs/atari/ mirrors the stock files. --------------------------------------------------

_BINDING = re.compile(r"^([A-Za-z_][\w.]*)\s*=\s*(.+?)\s*(#.*)?$")


def _bindings(path: str) -> dict:
    """``{selector: value}`` of a gin file's plain bindings (values as Python literals where
    they are literals: 20000 and 20_000 compare equal)."""
    out = {}
    for line in open(path):
        m = _BINDING.match(line.strip())
        if m:
            text = m.group(2)
            try:
                out[m.group(1)] = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                out[m.group(1)] = text
    return out


@pytest.mark.parametrize("name", sorted(JAX_CONFIGS) + sorted(TF_CONFIGS))
def test_configs_atari_bind_what_the_stock_files_bind(name):
    stock = os.path.join(STOCK, JAX_CONFIGS[name][0] if name in JAX_CONFIGS else TF_CONFIGS[name])
    ours = _bindings(os.path.join(ATARI, f"{name}.gin"))
    assert ours == _bindings(stock)
    text = open(os.path.join(ATARI, f"{name}.gin")).read()
    assert "gin.tf.external_configurables" not in text.replace(
        "`import gin.tf.external_configurables`", ""
    )


def test_atari_sweep_and_distributed_configs_parse(tmp_path):
    out = _run(
        ["-m", "memoire.cli", "sweep", "list", os.path.join(ATARI, "sweep_games.gin")],
        tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for game in ("Pong", "Breakout", "SpaceInvaders"):
        assert f"game_name = '{game}'" in out.stdout
    code = (
        "from memoire.experiments import distributed, runner; "
        f"runner.load_gin([{os.path.join(ATARI, 'dqn_distributed.gin')!r}], []); "
        "print(distributed.DistributedConfig().num_actors, runner.environment_fn().__name__)"
    )
    out = _run(["-c", code], tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["4", "create_atari_environment"]
