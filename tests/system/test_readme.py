"""Every code block of README.md and docs/*.md runs as written.

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
  cluster  the block starts a Ray cluster with ``ray start`` (token authentication included):
           its commands run as written, as processes of this test on 127.0.0.1, each node a
           home of its own (``ssh NODE ... scp`` becomes a copy between homes), then the next
           block's ``memoire train`` command runs on it (TINY), and the nodes are stopped
           however the test ends. See :func:`test_cluster_block`.
  skip     not run; ``reason=`` is required.

``needs=`` lists repository files the block uses; while one is missing the block is skipped
with that reason. ``xfail=`` marks a block known to fail, strictly (it must fail; once fixed,
the marker must go). Blocks run as from the repository root, the folder the README's commands
are written for: python blocks run there (where Python finds the checkout's memoire/ first),
and shell and gin blocks in a scratch folder where ``configs/`` and ``memoire/`` are the
repository's (so what they write stays out of the checkout). Where the checkout's memoire/
does not import (a wheel tested in a fresh environment: tests/helpers/_checkout.py), they run in a
folder without it, against the memoire under test. Shell blocks run two at a time
(tests/helpers/_two_at_a_time.py).
"""

import functools
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest
from _checkout import checkout_imports, root_env
from _subprocess_env import environ
from _two_at_a_time import TwoAtATime

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
README = os.path.join(ROOT, "README.md")
# The files whose blocks run: the README, then every page of docs/.
DOCS = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
STOCK_GIN = os.environ.get("MEMOIRE_DOPAMINE_STOCK_GIN", "/work/shared/dopamine-stock-gin")
MODES = ("python", "shell", "help", "gin-tf", "cluster", "skip")
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
    def __init__(self, doc, line, lang, text, spec):
        self.doc = doc  # the file, relative to the root: README.md, docs/FEED.md
        self.line, self.lang, self.text = line, lang, text
        self.spec = spec  # the marker's text, None without one
        parts = [p.strip() for p in (spec or "").split(";")]
        words = parts[0].split()
        self.mode = words[0] if words else None
        self.flags = set(words[1:])
        self.options = dict(p.split("=", 1) for p in parts[1:] if "=" in p)

    @property
    def id(self):
        page = "" if self.doc == "README.md" else os.path.basename(self.doc) + "-"
        return f"{page}line{self.line}-{self.mode}"


def doc_blocks(path):
    """The fenced blocks of the Markdown file ``path`` with the marker just above each (or
    None)."""
    doc = os.path.relpath(path, ROOT)
    lines = open(path).read().splitlines()
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
                doc,
                i + 1,
                fence.group(1),
                "\n".join(lines[i + 1 : end]) + "\n",
                marker.group(1) if marker else None,
            )
        )
        i = end + 1
    return blocks


BLOCKS = [b for path in DOCS for b in doc_blocks(path)]


def test_every_block_says_how_it_is_tested():
    assert len(BLOCKS) >= 10
    for b in BLOCKS:
        where = f"{b.doc} line {b.line}"
        assert b.spec is not None, f"{where}: no <!-- readme-test: ... --> above"
        assert b.mode in MODES, f"{where}: unknown mode {b.mode!r}"
        if b.mode == "skip":
            assert b.options.get("reason"), f"{where}: skip needs reason="
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
# interleaving in the learner) is tested in test_distributed and test_train_atari.
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


def _with_tiny(command, cwd, one_actor=True):
    """``command`` with TINY bindings (and ONE_ACTOR where its gin files bind more actors,
    unless not ``one_actor``) inserted before any trailing comment; ``cwd``: the folder it
    runs in."""
    if not TRAINING.match(command):
        return command
    code, sep, comment = command.partition("  #")
    bindings = TINY + ([ONE_ACTOR] if one_actor and _actors(code, cwd) > 1 else [])
    extra = " ".join(f"--gin_bindings {shlex.quote(b)}" for b in bindings)
    return f"{code.rstrip()} {extra}" + (f"  #{comment}" if sep else "")


def _scratch(tmp_path, block):
    """A working directory like the one the README's commands expect, and its environment."""
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(os.path.join(ROOT, "configs"), work / "configs")
    if checkout_imports()[0]:  # as at the root: `python -m ...` finds the checkout's memoire/
        os.symlink(os.path.join(ROOT, "memoire"), work / "memoire")
    if "stock" in block.flags:
        os.symlink(os.path.join(STOCK_GIN, "dopamine"), work / "dopamine")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `memoire` and `python` are the interpreter (and memoire) under test.
    (bin_dir / "memoire").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m memoire.cli "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for f in ("memoire", "python"):
        os.chmod(bin_dir / f, 0o755)
    inherited = environ()  # a worker thread's (shell_runs): never os.environ itself
    env = dict(inherited, PATH=f"{bin_dir}{os.pathsep}{inherited.get('PATH', '')}")
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
        if mode == "cluster":
            marks += [pytest.mark.dopamine, pytest.mark.ray, pytest.mark.slow]
        if b.options.get("xfail"):
            marks.append(pytest.mark.xfail(strict=True, reason=b.options["xfail"]))
        out.append(pytest.param(b, id=b.id, marks=marks))
    return out


def _skip_unless_present(block):
    for path in filter(None, block.options.get("needs", "").split(",")):
        if not os.path.exists(os.path.join(ROOT, path.strip())):
            pytest.skip(
                f"{block.doc} line {block.line} uses {path.strip()}, which this checkout "
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
    at_root = checkout_imports()[0]
    out = subprocess.run(
        [sys.executable, "-c", block.text],
        cwd=ROOT if at_root else tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=root_env() if at_root else environ(),
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
    from _subprocess_env import dopamine_runner_module

    cmd = [
        sys.executable,
        "-m",
        *dopamine_runner_module(),  # through upstream_compat where needed, as the README says
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


# ---------------------------------------------------------------------------------------------
# The multi-node Ray recipe, with `ray start` processes of the test's own.


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Flags a node needs beside others on one machine, on 127.0.0.1: ports the OS chose for what Ray
# would put on fixed ports (they would collide with other clusters here), no dashboard (one
# process less per node), one CPU per node (a known number of places for actors), and --block,
# so that each node is one process group of this test's, stopped however the test ends.
def _one_machine_flags(head, temp_dir):
    flags = ["--block", "--node-ip-address", "127.0.0.1", "--temp-dir", temp_dir]
    flags += ["--dashboard-agent-listen-port", str(_free_port())]
    if head:
        flags += ["--include-dashboard", "false", "--ray-client-server-port", str(_free_port())]
    return flags


def _cluster_env(tmp_path):
    """The environment of every node and of the driver: the memoire under test, `ray` and
    `memoire` on PATH, no address or token of the tester's own, nothing reported to ray.io.
    (Ray names a node started on 127.0.0.1 by this machine's address, as it must for nodes
    that join: its own traffic stays on this machine, memoire's binds 127.0.0.1.)"""
    from _subprocess_env import subprocess_env

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -c "import sys; from ray.scripts.scripts import '
        f'main; sys.argv[0] = \'ray\'; sys.exit(main())" "$@"\n'
    )
    (bin_dir / "memoire").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m memoire.cli "$@"\n')
    for f in ("ray", "memoire"):
        os.chmod(bin_dir / f, 0o755)
    env = subprocess_env()
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", RAY_USAGE_STATS_ENABLED="0")
    return env


@pytest.mark.parametrize("block", _params("cluster"))
def test_cluster_block(block, tmp_path):
    """The README's recipe for a Ray cluster of several nodes, run as a user runs it on three
    machines, here three homes on 127.0.0.1: token authentication on, a token made on the head
    and copied to the others, the head, the learner's node and an actor node started with
    `ray start`; then the next block's `memoire train --launcher ray --ray_address auto` (TINY)
    on the learner's machine. It asks for 8 actors where the nodes have room for 2: the command
    says so (2 placed, 6 pending, and why), trains with those 2 and counts them at the end, and
    nothing of Ray's reaches its output. The nodes are stopped however the test ends."""
    pytest.importorskip("ray")
    import shutil
    import signal
    import tempfile

    from _waiting import wait_until

    after = BLOCKS[BLOCKS.index(block) + 1]
    train = next(c for c in _commands(after.text) if c.startswith("memoire train"))
    env = _cluster_env(tmp_path)
    homes = {name: tmp_path / name for name in ("head", "learner", "actor")}
    for home in homes.values():
        home.mkdir()
    port = _free_port()
    # Each node's files (its sockets among them: a short path, as AF_UNIX paths are 107 bytes at
    # most) in a folder of its own, as on machines of their own: nodes sharing one would each
    # forward every node's worker output to the driver.
    temp_dirs = []
    nodes, logs = [], []

    def run(line, home, **kw):
        return subprocess.run(
            ["bash", "-e", "-c", line],
            env=dict(env, HOME=str(home)),
            cwd=home,
            capture_output=True,
            text=True,
            timeout=60,
            **kw,
        )

    try:
        for line in _commands(block.text):
            words = shlex.split(line, comments=True)
            line = shlex.join(words) if ">" not in words else line.split("#")[0]
            if words[0] == "export":
                env.update(w.split("=", 1) for w in words[1:])
            elif words[:2] == ["ssh", "NODE"]:  # the token file, to each other node's home
                for name in ("learner", "actor"):
                    (homes[name] / ".ray").mkdir()
                    shutil.copy(homes["head"] / ".ray" / "auth_token", homes[name] / ".ray")
            elif words[:2] == ["ray", "start"]:
                head = "--head" in words
                name = "head" if head else ("learner" if "--resources" in words else "actor")
                words = [w.replace("HEAD:6379", f"127.0.0.1:{port}") for w in words]
                words = [str(port) if w == "6379" else w for w in words]
                if "--num-cpus" not in words:
                    words += ["--num-cpus", "1"]
                log = open(tmp_path / f"{name}.log", "w")
                logs.append(log)
                temp_dirs.append(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
                nodes.append(
                    subprocess.Popen(
                        words + _one_machine_flags(head, temp_dirs[-1]),
                        env=dict(env, HOME=str(homes[name])),
                        cwd=homes[name],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # a process group: stopped as one
                    )
                )
                # One node at a time (a node that takes over 30 s to register gives up).
                wait_until(
                    lambda name=name: (
                        "Ray runtime started" in (tmp_path / f"{name}.log").read_text()
                        or nodes[-1].poll() is not None
                    ),
                    f"the {name} node",
                    timeout=120,
                )
                assert nodes[-1].poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
            else:
                out = run(line, homes["head"])
                assert out.returncode == 0, f"{line}\n{out.stderr[-3000:]}"
        assert (homes["head"] / ".ray" / "auth_token").is_file()

        def active_nodes():
            out = run(f"ray status --address 127.0.0.1:{port}", homes["learner"])
            return out.stdout.count(" node_") if out.returncode == 0 else 0

        wait_until(lambda: active_nodes() == 3, "3 nodes in the cluster", timeout=180)

        # The training command, on the learner's machine; `auto` is this cluster (RAY_ADDRESS:
        # another cluster of this machine, a tester's own, must not be taken for it).
        (tmp_path / "driver").mkdir()
        work, _ = _scratch(tmp_path / "driver", after)
        # (The learner binds 127.0.0.1, not its node's address: every node is this machine.)
        train = _with_tiny(train, work, one_actor=False)  # the README's 8 actors: 2 have room
        train += " --gin_bindings \"RayConfig.learner_host = '127.0.0.1'\""
        done = subprocess.run(
            ["bash", "-e", "-c", train],
            env=dict(env, HOME=str(homes["learner"]), RAY_ADDRESS=f"127.0.0.1:{port}"),
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        for node in reversed(nodes):  # `ray stop` would stop every Ray of this machine
            try:
                os.killpg(node.pid, signal.SIGTERM)
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait(timeout=30)
            except ProcessLookupError:
                pass
        for log in logs:
            log.close()
        for folder in temp_dirs:
            shutil.rmtree(folder, ignore_errors=True)
    (tmp_path / "train.err").write_text(done.stderr)  # kept for a look after a failure
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.stdout == "" and all(
        line.startswith(("INFO memoire.", "WARNING memoire.")) for line in lines
    ), done.stdout[-2000:] + done.stderr[-3000:]
    said = "WARNING memoire.experiments.ray_launcher: ray: "
    assert (
        f"{said}2 of 8 actors placed, 6 pending: each asks for 1 CPU and the cluster has 0 CPU "
        "free of 3; they start when room frees or a node joins"
    ) in lines, done.stderr[-3000:]
    assert lines[-1].endswith("; Ray actors: 2 of 8 placed, 0 lost, 0 restarted"), lines[-1]
