"""Packaging conventions: `python -m memoire`, one version source, and a core that imports
without the extras (gin-config, matplotlib, Dopamine and its frameworks)."""

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest
from _checkout import checkout_imports, root_env
from _subprocess_env import subprocess_env

import memoire

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

# Modules that need an extra (gin, plot, dopamine) by design; every other module of the package
# is core and must import with none of the extras installed.
NEEDS_EXTRAS = {
    "memoire.dopamine_compat.gin_registry",  # gin
    "memoire.dopamine_compat.jax_agents",  # dopamine
    "memoire.dopamine_compat.tf_configurables",  # dopamine
    "memoire.bench.dopamine",  # dopamine
    # the commands of the experiment tools (memoire.experiments): gin, dopamine, plot
    "memoire.commands.train",
    "memoire.commands.sweep",
    "memoire.commands.plot",
    "memoire.commands.actor",
}
NEEDS_EXTRAS_PACKAGES = (
    "memoire.experiments",  # `memoire train/sweep/plot`: gin, dopamine, plot
    "memoire.dopamine_compat.jax_replay_buffer",  # dopamine
)
EXTRAS = ("gin", "matplotlib", "dopamine", "tensorflow", "jax", "flax", "gym", "gymnasium")


def _run(code, tmp_path):
    # cwd: not ROOT, whose memoire/ would shadow the package under test for `python -c`.
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_python_dash_m_memoire(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "memoire", "--help"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: memoire <command>") and "serve" in out.stdout


def test_the_checkout_imports_from_its_root():
    """From the repository root, where Python finds the checkout's memoire/ before the installed
    package, `import memoire` and `python -m memoire serve --help` work (make bootstrap puts the
    extension beside the sources), as a user's shell there runs them: nothing on PYTHONPATH."""
    ok, why = checkout_imports()
    if not ok:
        pytest.skip(why)

    def at_root(*args):
        return subprocess.run(
            [sys.executable, *args],
            cwd=ROOT,
            env=root_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    imported = at_root("-c", "import memoire; print(memoire.__file__)")
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert imported.stdout.strip() == os.path.join(ROOT, "memoire", "__init__.py")
    served = at_root("-m", "memoire", "serve", "--help")
    assert served.returncode == 0, served.stderr[-2000:]
    assert served.stdout.startswith("usage: memoire serve") and served.stderr == ""


def test_version_is_the_distributions():
    assert memoire.__version__ == importlib.metadata.version("memoire")


def test_version_written_once():
    """pyproject.toml reads the version from memoire/__init__.py instead of writing its own."""
    lines = open(os.path.join(ROOT, "pyproject.toml")).read().splitlines()
    start = lines.index("[project]") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("["))
    project = [line.split("=")[0].strip() for line in lines[start:end] if "=" in line]
    assert "version" not in project and 'dynamic = ["version"]' in "\n".join(lines[start:end])


def test_core_imports_without_extras(tmp_path):
    """Every core module imports, and `memoire --help` runs, with the extras' packages
    unimportable (a meta-path hook refuses them): a core-only install needs none of them."""
    code = textwrap.dedent(f"""
        import importlib, os, sys

        EXTRAS = {EXTRAS!r}

        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in EXTRAS:
                    raise ImportError(f"{{name}} is blocked (not a core dependency)")
                return None

        sys.meta_path.insert(0, Refuse())
        import memoire
        top = os.path.dirname(memoire.__file__)
        names = []
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if os.path.exists(os.path.join(folder, d, "__init__.py"))]
            rel = os.path.relpath(folder, top)
            package = "memoire" if rel == "." else "memoire." + rel.replace(os.sep, ".")
            names += [package if f == "__init__.py" else package + "." + f[:-3]
                      for f in sorted(files) if f.endswith(".py") and f != "__main__.py"]
        core = [n for n in names if n not in {sorted(NEEDS_EXTRAS)!r}
                and not n.startswith({NEEDS_EXTRAS_PACKAGES!r})]
        for name in core:
            importlib.import_module(name)
        from memoire.dopamine_compat import OutOfGraphReplayBuffer
        OutOfGraphReplayBuffer((4,), 1, replay_capacity=100, batch_size=2)
        from memoire.cli import main
        assert main(["--help"]) == 0
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in EXTRAS)
        assert not loaded, loaded
        print("CORE", " ".join(core))
    """)
    out = _run(code, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    core = out.stdout.split("CORE", 1)[1].split()
    assert {
        "memoire",
        "memoire.dopamine_compat",
        "memoire.server",
        "memoire.client",
        "memoire.commands.serve",
        "memoire.dopamine_compat.remote",
        "memoire.gin_query",
    } <= set(core), core


def test_hung_test_fails(tmp_path):
    """pytest-timeout with the project's settings (thread method) ends a test that hangs:
    here a recv on a socket nobody sends to, with the timeout lowered to 1 s."""
    (tmp_path / "test_hang.py").write_text(
        textwrap.dedent("""
        import socket

        def test_hang():
            a, b = socket.socketpair()
            a.recv(1)
    """)
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            os.path.join(ROOT, "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-o",
            "timeout=1",
            str(tmp_path / "test_hang.py"),
        ],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The thread method's report: the hung test's stack, between "+++ Timeout +++" rules.
    assert out.returncode != 0, out.stdout[-2000:]
    assert "+ Timeout +" in out.stdout and "a.recv(1)" in out.stdout, out.stdout[-2000:]
