"""Every code block of README.md runs as written.

Convention: the line above each fenced block is an HTML comment (invisible on GitHub) saying
how this test runs it; a block without one fails ``test_every_block_says_how_it_is_tested``.

    <!-- readme-test: MODE [FLAGS] [; needs=PATH,PATH] [; xfail=WHY] [; reason=WHY] -->

MODE:
  python   the block is a script, run by a fresh interpreter.
  shell    the block runs in bash (``set -e``) as written, ``memoire`` and ``python`` being
           this test's interpreter. Flag ``tiny``: every ``memoire train``, ``memoire sweep
           run``, ``python -m memoire.dopamine_compat.jax_agents`` and ``python -m
           dopamine.discrete_domains.train`` line gets :data:`TINY` appended (one iteration of
           a few steps, small memories) instead of its full budget. Flag ``stock``: the block
           runs from the root of a google/dopamine checkout, i.e. ``dopamine/`` holds
           Dopamine's stock gin files (``$MEMOIRE_DOPAMINE_STOCK_GIN``, default
           /work/shared/dopamine-stock-gin; skipped with the reason when absent).
  help     each command is run with ``--help`` appended (for commands that bind real network
           interfaces or wait for other machines); it must exit 0 and its help must list
           every ``--option`` the command uses.
  gin-tf   the block is gin: its lines are added to Dopamine's TF DQN CartPole settings
           (``configs/dqn_cartpole_tf.gin`` without its memoire lines) and Dopamine's own
           ``python -m dopamine.discrete_domains.train`` runs that for a TINY budget.
  skip     not run; ``reason=`` is required.

``needs=`` lists repository files the block uses; while one is missing the block is skipped
with that reason. ``xfail=`` marks a block known to fail, strictly (it must fail; once fixed,
the marker must go). Shell and gin blocks run in a scratch directory where ``configs/`` is the
repository's; shell blocks run two at a time (tests/_two_at_a_time.py).
"""

import functools
import os
import re
import shlex
import subprocess
import sys

import pytest
from _two_at_a_time import TwoAtATime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
STOCK_GIN = os.environ.get("MEMOIRE_DOPAMINE_STOCK_GIN", "/work/shared/dopamine-stock-gin")
MODES = ("python", "shell", "help", "gin-tf", "skip")
MARKER = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->$")
TRAINING = re.compile(
    r"^(memoire train|memoire sweep run|python -m memoire\.dopamine_compat\."
    r"jax_agents|python -m dopamine\.discrete_domains\.train)\b"
)

# One iteration of a few steps with small memories, for any of the repository's or Dopamine's
# configurations (gin accepts bindings of configurables a run does not use).
TINY = [
    "Runner.num_iterations = 1",
    "Runner.training_steps = 100",
    "Runner.evaluation_steps = 20",
    "Runner.max_steps_per_episode = 20",
    "JaxDQNAgent.min_replay_history = 40",
    "DQNAgent.min_replay_history = 40",
    "dopamine.jax.replay_memory.replay_buffer.ReplayBuffer.max_capacity = 1000",
    "WrappedReplayBuffer.replay_capacity = 1000",
    "WrappedPrioritizedReplayBuffer.replay_capacity = 1000",
]


class Block:
    def __init__(self, line, lang, text, spec):
        self.line, self.lang, self.text = line, lang, text
        self.spec = spec  # the marker's text, None without one
        parts = [p.strip() for p in (spec or "").split(";")]
        words = parts[0].split()
        self.mode = words[0] if words else None
        self.flags = set(words[1:])
        self.options = dict(p.split("=", 1) for p in parts[1:] if "=" in p)

    @property
    def id(self):
        return f"line{self.line}-{self.mode}"


def readme_blocks():
    """The fenced blocks of README.md with the marker just above each (or None)."""
    lines = open(README).read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = i + 1
        while not lines[end].startswith("```"):
            end += 1
        above = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(above)
        blocks.append(
            Block(
                i + 1,
                fence.group(1),
                "\n".join(lines[i + 1 : end]) + "\n",
                marker.group(1) if marker else None,
            )
        )
        i = end + 1
    return blocks


BLOCKS = readme_blocks()


def test_every_block_says_how_it_is_tested():
    assert len(BLOCKS) >= 10
    for b in BLOCKS:
        assert b.spec is not None, f"README.md line {b.line}: no <!-- readme-test: ... --> above"
        assert b.mode in MODES, f"README.md line {b.line}: unknown mode {b.mode!r}"
        if b.mode == "skip":
            assert b.options.get("reason"), f"README.md line {b.line}: skip needs reason="
        assert b.flags <= {"tiny", "stock"} and set(b.options) <= {
            "needs",
            "imports",
            "xfail",
            "reason",
        }


def test_readme_names_the_entry_points_and_the_atari_configs():
    text = open(README).read()
    assert "## Migrating from Dopamine" in text
    for name in (
        "python -m memoire.dopamine_compat.jax_agents",
        "configs/atari/dqn.gin",
        "configs/atari/rainbow.gin",
        "configs/atari/dqn_distributed.gin",
        "memoire serve --buffer",
    ):
        assert name in text, name


# ---------------------------------------------------------------------------------------------
# Running blocks.


def _commands(text):
    """The block's commands, backslash continuations joined, comments and blanks left out."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [
        line.strip()
        for line in joined.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


# TensorFlow's GPU probe on a machine with CUDA libraries and no driver (this CI's machines)
# logs this at ERROR level for any TF program, Dopamine's runner and a bare
# `tf.config.list_physical_devices()` included: the machine's, not memoire's.
_TF_GPU_PROBE = re.compile(r"cuda_driver\.cc:\d+\] failed call to cuInit")


# A distributed configuration's actors (configs/atari/dqn_distributed.gin: 4, each importing
# TensorFlow and JAX and compiling an Atari network) become one: what more actors do (episodes
# interleaving in the learner) is tested in test_distributed and test_atari.
ONE_ACTOR = "DistributedConfig.num_actors = 1"
_ACTORS = re.compile(r"^\s*DistributedConfig\.num_actors\s*=\s*(\d+)", re.M)


def _actors(command, cwd):
    """The most actors a gin file of ``command`` (``--gin_files F``, relative to ``cwd``) binds
    (a file the block writes itself, not there yet, is not read)."""
    words = shlex.split(command, comments=True)
    files = [
        os.path.join(cwd, words[i + 1]) for i, w in enumerate(words[:-1]) if w == "--gin_files"
    ]
    texts = [open(f).read() for f in files if os.path.exists(f)]
    counts = [int(n) for text in texts for n in _ACTORS.findall(text)]
    return max(counts, default=0)


def _with_tiny(command, cwd):
    """``command`` with TINY bindings (and ONE_ACTOR where its gin files bind more actors)
    inserted before any trailing comment; ``cwd``: the folder it runs in."""
    if not TRAINING.match(command):
        return command
    code, sep, comment = command.partition("  #")
    bindings = TINY + ([ONE_ACTOR] if _actors(code, cwd) > 1 else [])
    extra = " ".join(f"--gin_bindings {shlex.quote(b)}" for b in bindings)
    return f"{code.rstrip()} {extra}" + (f"  #{comment}" if sep else "")


def _scratch(tmp_path, block):
    """A working directory like the one the README's commands expect, and its environment."""
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(os.path.join(ROOT, "configs"), work / "configs")
    if "stock" in block.flags:
        os.symlink(os.path.join(STOCK_GIN, "dopamine"), work / "dopamine")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `memoire` and `python` are the interpreter (and memoire) under test.
    (bin_dir / "memoire").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m memoire.cli "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for f in ("memoire", "python"):
        os.chmod(bin_dir / f, 0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return work, env


def _run_bash(script, cwd, env, timeout):
    out = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, f"{script}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _params(mode):
    out = []
    for b in BLOCKS:
        if b.mode != mode:
            continue
        marks = []
        if mode in ("shell", "gin-tf"):
            marks += [pytest.mark.dopamine, pytest.mark.slow]
        if mode == "help":
            marks.append(pytest.mark.dopamine)  # memoire train and actor import Dopamine's gin
        if b.options.get("xfail"):
            marks.append(pytest.mark.xfail(strict=True, reason=b.options["xfail"]))
        out.append(pytest.param(b, id=b.id, marks=marks))
    return out


def _skip_unless_present(block):
    for path in filter(None, block.options.get("needs", "").split(",")):
        if not os.path.exists(os.path.join(ROOT, path.strip())):
            pytest.skip(
                f"README.md line {block.line} uses {path.strip()}, which this checkout "
                "does not have yet (the Atari configurations arrive with the atari "
                "work)"
            )
    # Optional packages a block uses (JAX, Dopamine): the pinned environment has them all; the
    # wheel check's bare venv does not.
    for module in filter(None, block.options.get("imports", "").split(",")):
        pytest.importorskip(module.strip())
    if "stock" in block.flags and not os.path.isdir(os.path.join(STOCK_GIN, "dopamine")):
        pytest.skip(
            f"Dopamine's stock gin files are not at {STOCK_GIN} (set MEMOIRE_DOPAMINE_STOCK_GIN)"
        )


@pytest.mark.parametrize("block", _params("python"))
def test_python_block(block, tmp_path):
    _skip_unless_present(block)
    out = subprocess.run(
        [sys.executable, "-c", block.text],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr[-3000:]


def _run_shell_block(block, tmp_path):
    """Runs a shell block in a scratch folder under ``tmp_path`` (in a worker thread: see
    shell_runs); returns the folder, the commands as run and bash's CompletedProcess."""
    _skip_unless_present(block)
    work, env = _scratch(tmp_path, block)
    commands = _commands(block.text)
    if "tiny" in block.flags:
        assert any(TRAINING.match(c) for c in commands), "tiny: no training command in block"
        commands = [_with_tiny(c, work) for c in commands]
    return work, commands, _run_bash("\n".join(commands), work, env, timeout=900)


@pytest.fixture(scope="module")
def shell_runs(request, tmp_path_factory):
    """The selected shell blocks, two at a time (most of their commands are single training
    processes); ``shell_runs(request)`` waits for the requesting test's block."""
    root = tmp_path_factory.mktemp("shell")
    jobs = {}
    for b in BLOCKS:
        if b.mode == "shell":
            (root / b.id).mkdir()
            jobs[f"test_shell_block[{b.id}]"] = functools.partial(_run_shell_block, b, root / b.id)
    runs = TwoAtATime(request, jobs)
    yield lambda test_request: runs.result(test_request.node.name)
    runs.close()


@pytest.mark.parametrize("block", _params("shell"))
def test_shell_block(block, shell_runs, request):
    work, commands, out = shell_runs(request)
    log = out.stdout + out.stderr
    assert [
        line for line in log.splitlines() if "ERROR" in line and not _TF_GPU_PROBE.search(line)
    ] == [], log[-3000:]
    # What the block's commands say they make is there.
    for c in commands:
        m = re.search(r"--base_dir (\S+)", c)
        if m and TRAINING.match(c):
            assert (work / m.group(1)).is_dir(), c
        if c.startswith("memoire plot "):
            assert (work / c.split()[2] / "learning_curves.png").is_file()


@pytest.mark.parametrize("block", _params("help"))
def test_help_block(block, tmp_path):
    _skip_unless_present(block)
    work, env = _scratch(tmp_path, block)
    for c in _commands(block.text):
        out = _run_bash(f"{c} --help", work, env, timeout=120)
        for option in set(re.findall(r"(?<=\s)--\w+", c)):
            assert option in out.stdout, f"{c}: --help does not list {option}"


@pytest.mark.parametrize("block", _params("gin-tf"))
def test_gin_tf_block(block, tmp_path):
    _skip_unless_present(block)
    work, env = _scratch(tmp_path, block)
    # Dopamine's TF DQN CartPole settings, none of memoire's lines.
    own = open(os.path.join(ROOT, "configs", "dqn_cartpole_tf.gin")).read().splitlines()
    dopamine_only = [line for line in own if "emoire" not in line]
    (work / "tf.gin").write_text("\n".join(dopamine_only) + "\n" + block.text)
    cmd = [
        sys.executable,
        "-m",
        "dopamine.discrete_domains.train",
        "--base_dir",
        "runs/tf",
        "--gin_files",
        "tf.gin",
    ]
    for b in TINY:
        cmd += ["--gin_bindings", b]
    out = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (work / "runs" / "tf" / "checkpoints").is_dir()
