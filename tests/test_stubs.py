"""The type stubs of memoire._core name exactly what the module defines."""

import ast
import pathlib

import memoire
from memoire import _core


def _stub_tree():
    path = pathlib.Path(__file__).resolve().parents[1] / "memoire" / "_core.pyi"
    return ast.parse(path.read_text())


def test_stub_classes_match_module():
    tree = _stub_tree()
    stub_classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    stub_funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    stub_consts = {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    public = {n for n in dir(_core) if not n.startswith("__")}
    assert stub_classes | stub_funcs | stub_consts == public


def test_stub_members_match_module():
    for cls in (n for n in _stub_tree().body if isinstance(n, ast.ClassDef)):
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
