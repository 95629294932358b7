"""The command line's contract with its users (memoire.cli).

A mistake a user makes is one line on stderr (``<prog>: error: ...``), no traceback, exit
status 2, and nothing left behind; every option of every entry point has a help text; a
successful run logs no error; ``memoire plot`` with nothing to draw says so and fails.
"""

import argparse
import os
import re
import subprocess
import sys

import pytest
from _subprocess_env import subprocess_env

from memoire import cli
from memoire.experiments.distributed import LEARNER_WAIT_S

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
LOCAL_GIN = os.path.join(ROOT, "configs", "dqn_cartpole_jax_local.gin")
EPISODE_HEADER = "iteration,phase,episode,env_steps,return,length,terminated,truncated\n"


def _run(args, cwd, timeout=180):
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(),
    )


def _error_line(out, prog, *, alone=True):
    """The one error line of ``out`` (asserting exit 2, no traceback). ``prog``: the name
    the line starts with (or a tuple of names). ``alone``: stderr holds nothing else;
    otherwise it may start with third-party import noise (TensorFlow's, gym's) printed before
    the mistake was found, and the error line must be the last."""
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    progs = (prog,) if isinstance(prog, str) else prog
    ours = [line for line in lines if line.startswith(tuple(f"{p}: error: " for p in progs))]
    assert len(ours) == 1 and lines[-1] == ours[0], out.stderr[-3000:]
    if alone:
        assert lines == ours, out.stderr
    return ours[0]


def _tree(path):
    """Every file and folder under ``path``, relative to it."""
    return sorted(
        os.path.relpath(os.path.join(d, name), path)
        for d, ds, fs in os.walk(path)
        for name in ds + fs
    )


# ---------------------------------------------------------------------------------------------
# Mistakes: one line, exit 2, nothing written.

TRAIN = ["-m", "memoire.cli", "train"]


@pytest.mark.dopamine
@pytest.mark.parametrize(
    "case", ["gin path", "base_dir is a file", "base_dir under a file", "sweep path", "no base_dir"]
)
def test_train_mistakes_before_gin_are_one_line_and_write_nothing(tmp_path, case):
    (tmp_path / "afile").write_text("x")
    args, expect = {
        "gin path": (["--gin_files", "nope.gin", "--base_dir", "runs"], "'nope.gin': no such"),
        "base_dir is a file": (
            ["--gin_files", LOCAL_GIN, "--base_dir", "afile"],
            "is a file; expected a directory",
        ),
        "base_dir under a file": (
            ["--gin_files", LOCAL_GIN, "--base_dir", "afile/runs"],
            "is a file; expected a directory",
        ),
        "sweep path": (["--sweep", "nope.gin", "--base_dir", "runs"], "'nope.gin': no such"),
        "no base_dir": (["--gin_files", LOCAL_GIN], "required: --base_dir"),
    }[case]
    before = _tree(tmp_path)
    line = _error_line(_run(TRAIN + args, tmp_path), "memoire train")
    assert expect in line
    assert _tree(tmp_path) == before


@pytest.mark.slow
@pytest.mark.dopamine
@pytest.mark.parametrize(
    "case", ["unknown agent", "unknown configurable", "missing include", "no agent bound"]
)
def test_train_gin_mistakes_are_one_line_and_write_nothing(tmp_path, case):
    (tmp_path / "inc.gin").write_text("include 'not_there.gin'\n")
    args, expect = {
        # Before the fix: a misleading "has no memoire replay variant" line, then a traceback
        # from Dopamine's create_agent after the run folder was made.
        "unknown agent": (
            ["--gin_files", LOCAL_GIN, "--gin_bindings", "create_agent.agent_name = 'foo'"],
            "create_agent.agent_name: expected one of dqn",
        ),
        "unknown configurable": (
            ["--gin_files", LOCAL_GIN, "--gin_bindings", "Foo.bar = 1"],
            "No configurable matching 'Foo'",
        ),
        "missing include": (["--gin_files", "inc.gin"], "not_there.gin"),
        "no agent bound": (
            ["--gin_bindings", "Runner.num_iterations = 1"],
            "create_agent.agent_name is not bound",
        ),
    }[case]
    before = _tree(tmp_path)
    out = _run(TRAIN + args + ["--base_dir", "runs"], tmp_path)
    line = _error_line(out, "memoire train", alone=False)
    assert expect in line
    assert "no memoire replay variant" not in out.stderr + out.stdout
    assert _tree(tmp_path) == before  # no runs/ folder


def test_plot_with_nothing_to_draw_fails_and_says_so(tmp_path):
    # A run that failed before finishing an episode: the tracker's header only.
    run = tmp_path / "setting_0" / "run_0"
    run.mkdir(parents=True)
    (run / "episodes.csv").write_text(EPISODE_HEADER)
    line = _error_line(_run(["-m", "memoire.cli", "plot", str(tmp_path)], tmp_path), "memoire plot")
    assert "nothing to draw" in line and "1 run(s)" in line
    assert not (tmp_path / "learning_curves.png").exists()
    # No run at all, and no such directory.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no setting_*/run_*/episodes.csv" in _error_line(
        _run(["-m", "memoire.cli", "plot", str(empty)], tmp_path), "memoire plot"
    )
    assert "no such directory" in _error_line(
        _run(["-m", "memoire.cli", "plot", str(tmp_path / "nope")], tmp_path), "memoire plot"
    )


@pytest.mark.parametrize(
    "args,prog,expect",
    [
        (["-m", "memoire.cli", "nosuch"], "memoire", "unknown command 'nosuch'"),
        (
            ["-m", "memoire.cli", "serve", "--state_dtype", "foo"],
            "memoire serve",
            "data type 'foo' not understood",
        ),
        (
            ["-m", "memoire.cli", "serve", "--max_step", "many"],
            "memoire serve",
            "argument --max_step: invalid int value",
        ),
        (
            ["-m", "memoire.cli", "serve", "--gin_file", "nope.gin"],
            "memoire serve",
            "'nope.gin': no such file",
        ),
        (
            ["-m", "memoire.cli", "serve", "--max_ste", "5"],
            "memoire serve",
            "unrecognized arguments: --max_ste 5; --max_ste: did you mean --max_step?",
        ),
        (["-m", "memoire.cli", "sweep", "list", "nope.gin"], "memoire sweep", "no such file"),
        (
            [
                "-m",
                "memoire.cli",
                "sweep",
                "run",
                os.path.join(ROOT, "configs", "sweep_dqn_cartpole.gin"),
                "--base_dir",
                "afile",
                "--indices",
                "0",
            ],
            "memoire sweep",
            "is a file",
        ),
        (
            ["-m", "memoire.cli", "sweep", "run", "x.gin", "--base_dir", "r", "--indices", "7-3"],
            "memoire sweep",
            "empty or negative",
        ),
        (
            ["-m", "memoire.cli", "bench", "--repeats", "0"],
            "memoire bench",
            "--repeats must be >= 1",
        ),
        (
            [
                "-m",
                "memoire.cli",
                "actor",
                "--gin_files",
                "nope.gin",
                "--rep",
                "tcp://127.0.0.1:1",
                "--pub",
                "tcp://127.0.0.1:2",
            ],
            "memoire actor",
            "'nope.gin': no such file",
        ),
        (
            ["-m", "memoire.cli", "serve", "--buffer", "circular", "--arg", "nokey"],
            "memoire serve",
            "--arg: expected KEY=VALUE",
        ),
        (
            ["-m", "memoire.cli", "serve", "--buffer", "circular", "--allow_nonfinite", "2"],
            "memoire serve",
            "allow_nonfinite: expected 0 or 1",
        ),
        (
            ["-m", "memoire.cli", "serve", "--compress_states", "lz4"],
            "memoire serve",
            "compress_states: expected 0 or 1",
        ),
        (
            ["-m", "memoire.cli", "serve", "--buffer", "circular", "--compress_states"],
            "memoire serve",
            "--compress_states: compresses the replay memory server's states",
        ),
        # The buffer server's old entry is the same command.
        (
            ["-m", "memoire.dopamine_compat.remote", "--serve", "circular", "--arg", "nokey"],
            "memoire serve",
            "--arg: expected KEY=VALUE",
        ),
        (
            [
                "-m",
                "memoire.dopamine_compat.remote",
                "--serve",
                "circular",
                "--gin_files",
                "no.gin",
            ],
            "memoire serve",
            "'no.gin': no such file",
        ),
    ],
)
def test_other_commands_mistakes_are_one_line(tmp_path, args, prog, expect):
    (tmp_path / "afile").write_text("x")
    if args[-1] == "7-3":
        (tmp_path / "x.gin").write_text("")
    before = _tree(tmp_path)
    assert expect in _error_line(_run(args, tmp_path, timeout=60), prog)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("flag", ["rep", "pub", "pull", "stream"])
def test_serve_on_a_port_in_use_names_the_endpoint(tmp_path, flag):
    """An endpoint in use stops memoire serve at once (not after the workers' start timeout):
    one line naming the option, its endpoint and the fix, status 2, nothing on stdout."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = "tcp://127.0.0.1:%d" % taken.getsockname()[1]
        out = _run(["-m", "memoire.cli", "serve", f"--{flag}", endpoint], tmp_path, timeout=60)
    assert _error_line(out, "memoire serve") == (
        f"memoire serve: error: --{flag} {endpoint}: Address already in use; another process "
        f"listens there: stop it, or give another port (--{flag} tcp://HOST:* lets the OS "
        "choose)"
    )
    assert out.stdout == ""


def test_an_actor_without_a_learner_says_so_and_fails(tmp_path):
    """memoire actor pointed at an endpoint where no learner listens: one line within seconds
    (before it imports anything heavy), status 2."""
    import socket

    with socket.socket() as s:  # a port nothing listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        experience = "tcp://127.0.0.1:%d" % s.getsockname()[1]
        args = ["-m", "memoire.cli", "actor", "--gin_files", LOCAL_GIN]
        out = _run(args + ["--experience", experience, "--params", experience], tmp_path)
    assert _error_line(out, "memoire actor") == (
        f"memoire actor: error: no learner at {experience}: nothing accepted a connection in "
        f"{LEARNER_WAIT_S:g} s; start the learner first, or check the endpoint"
    )
    assert out.stdout == ""


@pytest.mark.slow
@pytest.mark.dopamine
def test_jax_agents_entry_point_mistakes_are_one_line(tmp_path):
    prog = "memoire train"  # the entry point is memoire train under Dopamine's module name
    out = _run(
        [
            "-m",
            "memoire.dopamine_compat.jax_agents",
            "--base_dir",
            "runs",
            "--gin_files",
            LOCAL_GIN,
            "--gin_bindings",
            "create_agent.agent_name = 'no_such_agent'",
        ],
        tmp_path,
    )
    assert "'no_such_agent'" in _error_line(out, prog, alone=False)
    out = _run(
        [
            "-m",
            "memoire.dopamine_compat.jax_agents",
            "--base_dir",
            "runs",
            "--gin_files",
            "nope.gin",
        ],
        tmp_path,
    )
    assert "'nope.gin': no such file" in _error_line(out, prog, alone=False)
    assert _tree(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# Help: every option of every entry point says what it is.


def _entry_points():
    from memoire.commands import actor, bench, plot, serve, sweep, train

    eps = [
        ("memoire train", train.main),
        ("memoire plot", plot.main),
        ("memoire serve", serve.main),
        ("memoire sweep", sweep.main),
        ("memoire bench", bench.main),
        ("memoire actor", actor.main),
    ]
    return eps


class _Captured(Exception):
    pass


def _parser_of(main, monkeypatch):
    """The parser ``main`` builds: its parse_args is stopped before anything runs."""
    seen = []

    def capture(self, args=None, namespace=None):
        seen.append(self)
        raise _Captured

    monkeypatch.setattr(cli.ArgumentParser, "parse_args", capture)
    with pytest.raises(_Captured):
        main([])
    monkeypatch.undo()
    return seen[0]


def _actions(parser, where=""):
    """(where, action) for every action of ``parser`` and of its sub-parsers."""
    for action in parser._actions:
        yield where, action
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{where} {name}")


def _check_help(prog, main, monkeypatch, capsys):
    parser = _parser_of(main, monkeypatch)
    assert isinstance(parser, cli.ArgumentParser)
    assert prog is None or parser.prog == prog
    actions = list(_actions(parser))
    assert len(actions) > 1
    for where, action in actions:
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help.strip() and action.help != argparse.SUPPRESS, (
            f"{prog}{where}: {name} has no help text"
        )
    # And the help a user sees lists each option with its text.
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    # Plain text: no Sphinx markup left from the docstrings the help is made of.
    assert not re.search(r"``|:[a-z]+:`|`\w", text), text
    for where, action in actions:
        if not where:
            for option in action.option_strings:
                assert option in text
            assert " ".join(action.help.split()[:3]) in text, action.help
    return actions


@pytest.mark.parametrize("index", range(6))
def test_every_option_has_a_help_text(index, monkeypatch, capsys):
    prog, main = _entry_points()[index]
    actions = _check_help(prog, main, monkeypatch, capsys)
    if prog == "memoire serve":  # the 26 options, the 6 limits of docs/LIMITS.md,
        # the buffer server's --buffer, --name, --arg, --checkpoint_root, --seed, --tensorboard,
        # the memory's --checkpoint_dir, --checkpoint_every, every parser's --log-level,
        # --stream, the rate limiter's --samples_per_insert, --min_size_to_sample and
        # --rate_error_buffer, --compress_states, the stream's --stream_threads, and liveness's
        # --peer_timeout and --max_message_bytes
        assert sum(1 for w, a in actions if a.option_strings and a.dest != "help") == 49
    # Every command takes --log-level (memoire.cli.ArgumentParser).
    assert any("--log-level" in a.option_strings for w, a in actions if not w)


def _parsers(parser):
    """``parser`` and every sub-parser under it."""
    yield parser
    for _, action in _actions(parser):
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


@pytest.mark.parametrize("index", range(6))
def test_help_says_each_default_once(index, monkeypatch):
    """An option whose help says its default itself ("(default 2000)") gets no second one
    from the formatter: over the help of every command and sub-command."""
    prog, main = _entry_points()[index]
    for parser in _parsers(_parser_of(main, monkeypatch)):
        text = " ".join(parser.format_help().split())
        assert "(default" in text, parser.prog  # each shows some default: the check has teeth
        twice = re.findall(r"\(default\b[^()]*\)\s*\(default\b[^()]*\)", text)
        assert not twice, (parser.prog, twice)


def test_help_formatter_adds_a_default_only_where_the_help_has_none():
    p = cli.ArgumentParser(prog="p")
    p.add_argument("--a", type=int, default=5, help="says it (default 5)")
    p.add_argument("--b", type=int, default=5, help="says it (Default: five)")
    p.add_argument("--c", type=int, default=5, help="says nothing")
    p.add_argument("--d", type=int, default=0, help="zero (default 0: off)")
    text = " ".join(p.format_help().split())
    assert "says it (default 5) --b" in text and "(Default: five) --c" in text
    assert "says nothing (default: 5)" in text and text.count("(default") == 4  # a, c, d, log


@pytest.mark.dopamine
def test_an_option_is_spelled_out_or_refused(tmp_path):
    """argparse would take --gin_file for memoire train's --gin_files (a prefix) without a
    word; memoire's parsers take no prefixes and name the option meant."""
    out = _run(TRAIN + ["--gin_file", LOCAL_GIN, "--base_dir", "runs"], tmp_path)
    assert _error_line(out, "memoire train") == (
        f"memoire train: error: unrecognized arguments: --gin_file {LOCAL_GIN}; --gin_file: "
        "did you mean --gin_files? (see memoire train --help)"
    )
    assert _tree(tmp_path) == []


def test_serve_help_is_short_and_its_numbers_are_the_codes(capsys):
    """The help of memoire serve fits a screen or two, says each default the server uses from
    the constant the server uses, and no text breaks off."""
    from memoire.commands import serve
    from memoire.server.rpc_host import DEFAULT_MAX_BATCH
    from memoire.transport import KEEPALIVE_S, PEER_TIMEOUT_S, RECEIVE_HWM

    with pytest.raises(SystemExit):
        serve.main(["--help"])
    text = capsys.readouterr().out
    assert len(text.splitlines()) <= 110
    flat = " ".join(text.split())
    assert f"receive queues hold {RECEIVE_HWM} per connection" in flat
    assert f"(default {PEER_TIMEOUT_S:g}; longer than clients' keepalive, {KEEPALIVE_S:g})" in flat
    assert f"(default {DEFAULT_MAX_BATCH})" in flat
    for help_ in serve.HELP.values():
        assert help_.count("(") == help_.count(")"), help_


@pytest.mark.dopamine
def test_jax_agents_entry_point_is_memoire_train(tmp_path):
    # Dopamine's JAX entry point under memoire is memoire train: same parser, same help.
    jax = _run(["-m", "memoire.dopamine_compat.jax_agents", "--help"], tmp_path)
    train = _run(["-m", "memoire.commands.train", "--help"], tmp_path)
    assert jax.returncode == train.returncode == 0, (jax.stderr[-2000:], train.stderr[-2000:])
    assert jax.stdout.startswith("usage: memoire train") and "--gin_files" in jax.stdout
    assert jax.stdout == train.stdout


def test_memoire_help_lists_every_command(tmp_path):
    out = _run(["-m", "memoire.cli", "--help"], tmp_path, timeout=60)
    assert out.returncode == 0
    for name in cli.COMMANDS:
        assert f"  {name} " in out.stdout


# ---------------------------------------------------------------------------------------------
# The shared pieces.


def test_one_line_folds_gin_errors():
    assert (
        cli.one_line("No configurable matching 'Foo'.\n  In bindings string line 1\n    Foo.x = 1")
        == "No configurable matching 'Foo'. (In bindings string line 1: Foo.x = 1)"
    )
    assert cli.one_line("plain") == "plain" and cli.one_line("") == ""


def test_check_output_dir_writes_nothing(tmp_path):
    (tmp_path / "f").write_text("")
    cli.check_output_dir(str(tmp_path / "a" / "b"), "--x")  # may be made: fine
    for bad in ("f", "f/a/b"):
        with pytest.raises(cli.UsageError, match=r"--x: .*'.*/f' is a file"):
            cli.check_output_dir(str(tmp_path / bad), "--x")
    with pytest.raises(cli.UsageError, match="empty path"):
        cli.check_output_dir("", "--x")
    assert sorted(os.listdir(tmp_path)) == ["f"]


def test_entry_point_turns_usage_errors_into_one_line(capsys):
    @cli.entry_point("prog")
    def main(argv):
        if argv:
            raise cli.UsageError("bad\n  detail")
        return None

    assert main([]) == 0
    assert main(["x"]) == 2
    assert capsys.readouterr().err == "prog: error: bad (detail)\n"


# ---------------------------------------------------------------------------------------------
# A missing optional package is one line naming the extra to install.

# Put on a child's PYTHONPATH as sitecustomize: the modules named in $MEMOIRE_TEST_UNIMPORTABLE
# (comma-separated top-level names) cannot be imported, as if not installed.
_UNIMPORTABLE = """\
import os
import sys

_NAMES = set(filter(None, os.environ["MEMOIRE_TEST_UNIMPORTABLE"].split(",")))


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _NAMES:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""

# What `pip install memoire` lacks that the dopamine extra brings (gin among them).
_DOPAMINE_EXTRA = "dopamine,absl,tensorflow,tensorflow_probability,gin,jax,flax,optax,orbax,gym"


def _run_without(modules, args, tmp_path):
    """``python args`` in ``tmp_path/cwd`` with ``modules`` (comma-separated) unimportable."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_UNIMPORTABLE)
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(str(site), MEMOIRE_TEST_UNIMPORTABLE=modules),
    )


def test_the_blocker_makes_its_modules_unimportable(tmp_path):
    out = _run_without("json", ["-c", "import json"], tmp_path)
    assert out.returncode == 1 and "No module named 'json'" in out.stderr, out.stderr


@pytest.mark.parametrize(
    "modules, missing",
    [(_DOPAMINE_EXTRA, "gin"), ("dopamine,absl,tensorflow", "absl")],
    ids=["no dopamine extra", "gin but no dopamine"],
)
@pytest.mark.parametrize("entry", ["memoire train", "jax_agents"])
def test_train_without_the_dopamine_extra_names_it(tmp_path, modules, missing, entry):
    args = ["--gin_files", LOCAL_GIN, "--base_dir", "runs"]
    if entry == "memoire train":
        args = TRAIN + args
    else:
        args = ["-m", "memoire.dopamine_compat.jax_agents"] + args
    line = _error_line(_run_without(modules, args, tmp_path), "memoire train")
    assert line == (
        f"memoire train: error: No module named '{missing}' (a package of the dopamine extra): "
        'pip install "memoire[dopamine]"'
    )
    assert _tree(tmp_path / "cwd") == []


def test_actor_without_the_dopamine_extra_names_it(tmp_path):
    out = _run_without(_DOPAMINE_EXTRA, ["-m", "memoire.cli", "actor", "--help"], tmp_path)
    assert _error_line(out, "memoire actor").endswith('pip install "memoire[dopamine]"')


def test_serve_gin_file_without_gin_names_the_gin_extra(tmp_path):
    gin_file = tmp_path / "serve.gin"
    gin_file.write_text("serve_config.max_step = 100\n")
    args = ["-m", "memoire.cli", "serve", "--gin_file", str(gin_file), "--duration", "0"]
    line = _error_line(_run_without("gin", args, tmp_path), "memoire serve")
    assert line == (
        "memoire serve: error: No module named 'gin' (a package of the gin extra): "
        'pip install "memoire[gin]"'
    )


def test_serve_jax_buffer_without_dopamine_names_the_dopamine_extra(tmp_path):
    args = ["-m", "memoire.cli", "serve", "--buffer", "jax", "--rep", "tcp://127.0.0.1:*"]
    line = _error_line(_run_without(_DOPAMINE_EXTRA, args, tmp_path), "memoire serve")
    assert line.endswith('(a package of the dopamine extra): pip install "memoire[dopamine]"')


def test_missing_extra_names_only_optional_packages():
    def missing(name):
        return ModuleNotFoundError(f"No module named {name!r}", name=name)

    assert cli.missing_extra(missing("matplotlib.pyplot")).endswith('"memoire[plot]"')
    assert cli.missing_extra(missing("gin")).endswith('"memoire[gin]"')
    assert cli.missing_extra(missing("gin"), "dopamine").endswith('"memoire[dopamine]"')
    assert cli.missing_extra(missing("ray"), "dopamine").endswith('"memoire[ray]"')
    assert cli.missing_extra(missing("memoire._core")) is None  # memoire's own: a real bug
    assert cli.missing_extra(missing("zmq")) is None  # a dependency, not an extra
    assert cli.missing_extra(ImportError("cannot import name 'x'", name="gin")) is None

    @cli.entry_point("prog")
    def main(argv):
        import memoire._not_a_module  # noqa: F401

    with pytest.raises(ModuleNotFoundError):  # not an extra: the traceback stays
        main([])


# ---------------------------------------------------------------------------------------------
# A successful run logs no error.


@pytest.mark.slow
@pytest.mark.dopamine
def test_successful_tiny_run_logs_no_error(tmp_path):
    # The config includes a file beside it and runs from another directory: gin searches the
    # working directory first and used to log "ERROR:root:Path not found" for it.
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "base.gin").write_text(open(LOCAL_GIN).read())
    (cfg / "tiny.gin").write_text(
        "\n".join(
            [
                "include 'base.gin'",
                "Runner.num_iterations = 1",
                "Runner.training_steps = 120",
                "Runner.evaluation_steps = 30",
                "Runner.max_steps_per_episode = 12",
                "Runner.fine_grained_print_to_console = False",
                "JaxDQNAgent.min_replay_history = 40",
                "ClassicControlDQNNetwork.hidden_units = 16",
            ]
        )
        + "\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "memoire.cli",
            "train",
            "--gin_files",
            os.path.join("cfg", "tiny.gin"),
            "--base_dir",
            "runs",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert "INFO memoire.experiments.runner: iteration 1/1" in out.stderr  # logged, once
    assert out.stderr.count("iteration 1/1") == 1
    assert [line for line in log.splitlines() if "ERROR" in line] == []
    episodes = tmp_path / "runs" / "setting_0" / "run_0" / "episodes.csv"
    assert len(episodes.read_text().splitlines()) > 1


@pytest.mark.slow
def test_log_level_is_one_option_of_every_command(tmp_path, monkeypatch):
    """--log-level before the command (memoire's global option), after it (every parser), or
    $MEMOIRE_LOG_LEVEL (what child processes inherit) sets the level of memoire's messages."""
    serve = ["serve", "--duration", "0.3", "--interval", "0.1"]
    quiet = _run(["-m", "memoire", "--log-level", "warning", *serve], tmp_path)
    loud = _run(["-m", "memoire", *serve, "--log-level=DEBUG"], tmp_path)
    assert quiet.returncode == loud.returncode == 0, (quiet.stderr, loud.stderr)
    assert quiet.stdout.startswith("memoire serve: pub ")  # the result stays on stdout
    assert "INFO memoire" not in quiet.stderr
    assert "INFO memoire.commands.serve: inserts/s" in loud.stderr
    monkeypatch.setenv("MEMOIRE_LOG_LEVEL", "error")
    env = _run(["-m", "memoire", *serve], tmp_path)
    assert env.returncode == 0 and "INFO memoire" not in env.stderr
    monkeypatch.setenv("MEMOIRE_LOG_LEVEL", "loud")
    assert "expected one of debug, info" in _error_line(
        _run(["-m", "memoire", *serve], tmp_path), "memoire serve"
    )
    monkeypatch.delenv("MEMOIRE_LOG_LEVEL")
    assert "expected one of debug" in _error_line(
        _run(["-m", "memoire", "--log-level", "loud", "version"], tmp_path), "memoire"
    )
    assert "invalid choice: 'loud'" in _error_line(
        _run(["-m", "memoire", "sweep", "list", "x.gin", "--log-level", "loud"], tmp_path),
        "memoire sweep list",
    )


def test_plain_text_strips_sphinx_markup():
    text = cli.plain_text(
        """``memoire serve``: see :mod:`memoire.tensorboard`, :func:`~memoire.a.run`,
        :data:`the table <HELP>` and `seed`::

            memoire serve --x

        keeps a'b and `` alone at line end"""
    )
    assert text.splitlines() == [
        "memoire serve: see memoire.tensorboard, run,",
        "the table and seed:",
        "",
        "    memoire serve --x",
        "",
        "keeps a'b and `` alone at line end",
    ]
