"""The type stubs of memoire._core name exactly what the module defines, and mypy's stubtest
finds them consistent with it (signatures, defaults, types of constants)."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest
from _subprocess_env import subprocess_env

import memoire
from memoire import _core

# The stub beside the module under test: the installed one under `make test` and in the wheel.
STUB = pathlib.Path(memoire.__file__).parent / "_core.pyi"
# What stubtest may report and why (each entry: a regex of the name, a comment saying why).
# Names only the stub has: pybind11's metaclass, declared for stubtest's metaclass check.
STUB_ONLY = {"_pybind11_type"}
ALLOWLIST = pathlib.Path(__file__).parents[2] / "data" / "stubtest_allowlist.txt"


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
    for cls in (
        n for n in _stub_tree().body if isinstance(n, ast.ClassDef) and n.name not in STUB_ONLY
    ):
        runtime = getattr(_core, cls.name)
        names = set()
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
                names.add(node.name)
            elif isinstance(node, ast.AnnAssign):
                names.add(node.target.id)
        if issubclass(runtime, Exception):
            continue
        runtime_names = {n for n in dir(runtime) if not n.startswith("__") and "pybind11" not in n}
        assert names == runtime_names, (cls.name, names ^ runtime_names)


def _split_params(text):
    """`a: int, b: tuple[int, int] = (1, 2)` -> ['a: int', 'b: tuple[int, int] = (1, 2)']."""
    out, depth, quote, current = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
            continue
        current += ch
    return out + ([current.strip()] if current.strip() else [])


def _runtime_signatures(obj, name):
    """The signatures pybind11 writes on the first lines of a docstring (one per overload), each
    a tuple of parameter names without self, `=` appended where there is a default; pybind11 names
    unnamed arguments arg0, arg1, ..."""
    sigs = set()
    for line in (obj.__doc__ or "").splitlines():
        m = re.match(rf"(?:\d+\. )?{re.escape(name)}\((.*)\) -> ", line)
        if m:
            params = []
            for p in _split_params(m.group(1)):
                has_default = "=" in p.split(":", 1)[1] if ":" in p else "=" in p
                params.append(re.match(r"[*/]|\*{0,2}\w+", p).group(0) + "=" * has_default)
            sigs.add(tuple(p for p in params if p != "self"))
    return sigs


def _stub_signature(fn):
    """The same tuple for a stub's def; positional-only parameters are pybind11's arg0, arg1..."""
    a = fn.args
    positional = [x.arg for x in a.posonlyargs + a.args]
    defaults = [False] * (len(positional) - len(a.defaults)) + [True] * len(a.defaults)
    named = [n + "=" * d for n, d in zip(positional, defaults)]
    if positional and positional[0] == "self":
        named, a_posonly = named[1:], a.posonlyargs[1:] if a.posonlyargs else []
    else:
        a_posonly = a.posonlyargs
    named[: len(a_posonly)] = [
        f"arg{i}" + "=" * n.endswith("=") for i, n in enumerate(named[: len(a_posonly)])
    ]
    if a.vararg:
        named.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        named.append("*")
    named += [x.arg + "=" * (d is not None) for x, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        named.append("**" + a.kwarg.arg)
    return tuple(named)


def test_stub_signatures_match_module():
    """Parameter names, order, keyword-only markers and which have defaults: the stub's against
    the signatures pybind11 writes into the docstrings (stubtest cannot read those: pybind11
    functions have no __text_signature__)."""

    def functions(body):
        out = {}
        for node in body:
            is_property = any(
                isinstance(d, ast.Name) and d.id == "property"
                for d in getattr(node, "decorator_list", [])
            )
            if isinstance(node, ast.FunctionDef) and not is_property:
                out.setdefault(node.name, set()).add(_stub_signature(node))
        return out

    owners = [(_core, "", _stub_tree().body)] + [
        (getattr(_core, c.name), c.name + ".", c.body)
        for c in _stub_tree().body
        if isinstance(c, ast.ClassDef)
        and c.name not in STUB_ONLY
        and not issubclass(getattr(_core, c.name), Exception)
    ]
    mismatches, checked = [], 0
    for owner, prefix, body in owners:
        for name, stub in functions(body).items():
            runtime = _runtime_signatures(getattr(owner, name), name)
            checked += 1
            if runtime != stub:
                mismatches.append(f"{prefix}{name}: stub {sorted(stub)}, module {sorted(runtime)}")
    assert checked > 50 and not mismatches, "\n".join(mismatches)


def test_version_is_set():
    assert memoire.__version__.count(".") == 2


@pytest.mark.slow
def test_stubtest(tmp_path):
    """mypy's stubtest (the `stubs` extra) of memoire/_core.pyi against the built module."""
    pytest.importorskip(
        "mypy.stubtest",
        reason="needs mypy's stubtest (the stubs extra: pip install 'memoire[stubs]')",
    )
    out = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "memoire._core", "--allowlist", str(ALLOWLIST)],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
