"""The type stubs of memoire._core name exactly what the module defines, and mypy's stubtest
finds them consistent with it (signatures, defaults, types of constants)."""

import ast
import pathlib
import subprocess
import sys

import memoire
from memoire import _core
from _subprocess_env import subprocess_env

# The stub beside the module under test: the installed one under `make test` and in the wheel.
STUB = pathlib.Path(memoire.__file__).parent / "_core.pyi"
# What stubtest may report and why (each entry: a regex of the name, a comment saying why).
# Names only the stub has: pybind11's metaclass, declared for stubtest's metaclass check.
STUB_ONLY = {"_pybind11_type"}
ALLOWLIST = pathlib.Path(__file__).parent / "data" / "stubtest_allowlist.txt"


def _stub_tree():
    return ast.parse(STUB.read_text())


def test_stub_classes_match_module():
    tree = _stub_tree()
    stub_classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)} - STUB_ONLY
    stub_funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    stub_consts = {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    public = {n for n in dir(_core) if not n.startswith("__")}
    assert stub_classes | stub_funcs | stub_consts == public


def test_stub_members_match_module():
    for cls in (n for n in _stub_tree().body
                if isinstance(n, ast.ClassDef) and n.name not in STUB_ONLY):
        runtime = getattr(_core, cls.name)
        names = set()
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name != "__init__":
                names.add(node.name)
            elif isinstance(node, ast.AnnAssign):
                names.add(node.target.id)
        if issubclass(runtime, Exception):
            continue
        runtime_names = {n for n in dir(runtime) if not n.startswith("__") and "pybind11" not in n}
        assert names == runtime_names, (cls.name, names ^ runtime_names)


def test_version_is_set():
    assert memoire.__version__.count(".") == 2


def test_stubtest(tmp_path):
    """mypy's stubtest (the `stubs` extra) of memoire/_core.pyi against the built module."""
    out = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "memoire._core", "--allowlist", str(ALLOWLIST)],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
