"""The layers of memoire/, read top-down: each imports only itself and the layers below it,
and no import runs in a circle.

Bottom to top:

0. ``memoire``: the core and the network (``memoire/*.py``, ``memoire.server``, ``memoire.feed``,
   the extension ``memoire._core``);
1. ``memoire.dopamine_compat``: Dopamine's faces;
2. the tools, ``memoire.experiments`` and ``memoire.bench``, side by side: neither imports the
   other;
3. ``memoire.commands``, one module per ``memoire <command>``: nothing imports them but
   memoire.cli, by name at run time (importlib, not an import statement). A library file that
   is also a script (``python -m memoire.dopamine_compat.jax_agents``) hands its command line
   to ``memoire.cli.main`` the same way, so it names no upper layer either.

The import graph is read from the source with ``ast`` (nothing is imported): one node per
module under memoire/ (a package is its ``__init__.py``), one edge per import of another of
them, anywhere in the file (at module level, inside a function, in a ``__main__`` block: a
script's imports are the file's too), absolute or relative. An import names its target only:
``from memoire.bench.systems import X`` is an edge to memoire.bench.systems, not to the
package memoire.bench whose ``__init__`` Python also runs (counting every parent package would
turn any package whose ``__init__`` imports a submodule into a cycle). ``from pkg import name``
is an edge to the submodule ``pkg.name`` when there is one, else to ``pkg``. A file importing
itself (a ``__main__`` block running the importable copy of its module) is no edge.

Import statements are not the only way up. A module may also reach a higher layer by name at
run time (``sys.modules["memoire.x"]``, ``sys.modules.get(...)``, ``importlib.import_module``,
``importlib.util.find_spec``, ``__import__`` with a string naming a module of a higher layer),
or through another module's privates: an attribute ``obj._name`` (``obj`` not ``self`` or
``cls``, ``_name`` no dunder) whose name no module of its own layer or below defines (as a
function, a class-level name, or ``self._name = ...``) but one above does. Both are read with
``ast`` too (:func:`reach_ups`). The CLI's dispatch to ``memoire.commands`` by name is the one
allowed reach up (its names are table values, not literal arguments).

A subprocess checks the one import the graph cannot show: ``import memoire`` (and the feed)
leaves the network layer's ZeroMQ unloaded until a network class is used.
"""

from __future__ import annotations

import ast
import os
from typing import Dict, List, Optional, Set, Tuple

from _subprocess_env import assert_clean_exit, run_script

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PACKAGE = os.path.join(ROOT, "memoire")

# The layers above the core and network (layer 0, every other module of memoire), bottom to
# top; packages on one line are side by side.
LAYERS = (
    ("memoire.dopamine_compat",),
    ("memoire.experiments", "memoire.bench"),
    ("memoire.commands",),
)


def module_files(package_dir: str) -> Dict[str, Optional[str]]:
    """``{dotted module name: path}`` of every ``.py`` file under ``package_dir`` (the folder
    of a top-level package), and ``{name: None}`` for each compiled extension, known by its
    ``.pyi`` stub or its ``.so`` (memoire._core: a module, though one without Python source;
    a fresh checkout has only the stub)."""
    top = os.path.basename(os.path.normpath(package_dir))
    out: Dict[str, Optional[str]] = {}
    for directory, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(directory, package_dir)
        parts = [top] + ([] if rel == "." else rel.split(os.sep))
        for f in sorted(files):
            stem, ext = os.path.splitext(f)
            if ext == ".py":
                name = parts if f == "__init__.py" else parts + [stem]
                out[".".join(name)] = os.path.join(directory, f)
            elif ext in (".pyi", ".so", ".pyd"):
                out.setdefault(".".join(parts + [stem.split(".")[0]]), None)
    return out


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node of ``tree``, at any depth."""
    return (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> Optional[str]:
    """The absolute module ``from ... import`` reads from (relative levels resolved)."""
    if node.level == 0:
        return node.module
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    if node.level > 1:
        if node.level - 1 > len(parts):
            return None
        parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def import_graph(files: Dict[str, Optional[str]]) -> Dict[str, Set[str]]:
    """``{module: modules of ``files`` it imports}`` (see the module docstring for the rules);
    a compiled extension imports nothing."""
    graph: Dict[str, Set[str]] = {}
    for module, path in files.items():
        if path is None:
            graph[module] = set()
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        is_package = os.path.basename(path) == "__init__.py"
        targets: Set[str] = set()
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in files)
                continue
            base = _resolve(module, is_package, node)
            if base is None:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in files:
                    targets.add(sub)
                elif base in files:
                    targets.add(base)
        graph[module] = targets - {module}  # a __main__ block importing its own module
    return graph


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import cycle as ``[a, b, ..., a]``, or None. Depth-first, in sorted order, so the
    same graph always reports the same cycle."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def all_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Cycles until none is left: after each one found, the edges among its modules are cut,
    so every group of modules that import each other shows at least once."""
    g = {k: set(v) for k, v in graph.items()}
    out = []
    while True:
        cycle = find_cycle(g)
        if cycle is None:
            return out
        out.append(cycle)
        members = set(cycle)
        for m in members:
            g[m] -= members


def in_layer(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def layer_of(module: str) -> Tuple[int, str]:
    """(level, package) of ``module``: its line of LAYERS counted from 1 and the package of
    that line it belongs to, or (0, "memoire") for the core and network."""
    for level, packages in enumerate(LAYERS, start=1):
        for package in packages:
            if in_layer(module, package):
                return level, package
    return 0, "memoire"


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
    """``module -> target`` edges, as text, that go up a layer or sideways between the
    packages of one layer (one tool importing the other)."""
    bad = []
    for m, targets in graph.items():
        level, package = layer_of(m)
        for t in targets:
            t_level, t_package = layer_of(t)
            if t_level > level or (t_level == level and t_package != package):
                bad.append(f"{m} -> {t}")
    return sorted(bad)


def command_importers(graph: Dict[str, Set[str]]) -> List[str]:
    """``module -> memoire.commands...`` edges from outside memoire.commands, as text."""
    return sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if not in_layer(m, "memoire.commands")
        for t in targets
        if in_layer(t, "memoire.commands")
    )


_BY_NAME = {"import_module", "find_spec", "__import__"}  # calls that import a module by name


def _named_module(node: ast.AST) -> Optional[str]:
    """The module a literal names: a str constant, or an f-string's constant start."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value.rstrip(".")
    return None


def _is_sys_modules(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "modules"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _modules_named(tree: ast.AST) -> List[Tuple[int, str]]:
    """(line, name) of every module looked up or imported by a literal name in ``tree``."""
    found = []
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Subscript) and _is_sys_modules(node.value):
            arg = node.slice
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in _BY_NAME or (
                isinstance(f, ast.Attribute) and name in ("get", "pop") and _is_sys_modules(f.value)
            ):
                arg = node.args[0]
        named = None if arg is None else _named_module(arg)
        if named is not None and named.startswith("memoire"):
            found.append((node.lineno, named))
    return found


def _defined_privates(tree: ast.AST) -> Set[str]:
    """Private names ``tree`` defines: functions, class-level names, ``self._x = ...``."""
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for leaf in ast.walk(t):
                    if isinstance(leaf, ast.Name):
                        names.add(leaf.id)
                    elif isinstance(leaf, ast.Attribute):
                        names.add(leaf.attr)
    return {n for n in names if n.startswith("_") and not n.endswith("__")}


def _private_reads(tree: ast.AST) -> List[Tuple[int, str]]:
    """(line, name) of each ``obj._name`` read of another object than ``self``/``cls``."""
    return [
        (node.lineno, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.endswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]


def reach_ups(files: Dict[str, Optional[str]]) -> List[str]:
    """``module:line ...`` for each reach up a layer that is no import statement (see the
    module docstring): a higher layer's module named at run time, or a private name that only
    a higher layer defines."""
    trees = {}
    for module, path in files.items():
        if path is not None:
            with open(path, encoding="utf-8") as f:
                trees[module] = ast.parse(f.read(), filename=path)
    lowest: Dict[str, int] = {}  # private name -> the lowest level defining it
    for module, tree in trees.items():
        level = layer_of(module)[0]
        for name in _defined_privates(tree):
            lowest[name] = min(level, lowest.get(name, level))
    bad = []
    for module, tree in trees.items():
        level, package = layer_of(module)
        for line, named in _modules_named(tree):
            t_level, t_package = layer_of(named)
            if t_level > level or (t_level == level and t_package != package):
                bad.append(f"{module}:{line} names {named}")
        for line, name in _private_reads(tree):
            if lowest.get(name, level) > level:
                bad.append(f"{module}:{line} reads ._{name.lstrip('_')} of a higher layer")
    return sorted(set(bad))


# ---------------------------------------------------------------------------------------------
# memoire/ itself.


def _memoire_graph():
    return import_graph(module_files(PACKAGE))


def test_memoire_has_no_import_cycles():
    cycles = all_cycles(_memoire_graph())
    assert not cycles, "import cycles in memoire/: " + "; ".join(" -> ".join(c) for c in cycles)


def test_each_layer_imports_only_itself_and_the_layers_below():
    graph = _memoire_graph()
    # The layers exist and are seen: the checks below would pass vacuously otherwise.
    assert "memoire.experiments.train" in graph and "memoire.bench" in graph
    assert layer_of("memoire.dopamine_compat.jax_agents") == (1, "memoire.dopamine_compat")
    assert layer_of("memoire.cli") == layer_of("memoire.server.workers") == (0, "memoire")
    assert layer_of("memoire.bench.systems") == (2, "memoire.bench")
    assert "memoire.experiments.trackers" in graph["memoire.experiments.runner"]
    # A script's imports count: this one hands its command line to the CLI.
    assert "memoire.cli" in graph["memoire.dopamine_compat.jax_agents"]
    bad = upward_imports(graph)
    assert not bad, "imports up a layer (or between the tools): " + "; ".join(bad)


def test_no_layer_reaches_up_by_name_or_through_privates():
    bad = reach_ups(module_files(PACKAGE))
    assert not bad, "reaches up a layer without an import: " + "; ".join(bad)


def test_the_core_and_network_import_no_dopamine():
    # Dopamine's types are the faces' to import (memoire.dopamine_compat): the feed builds
    # their batches through the faces' BatchSource.
    files = module_files(PACKAGE)
    bad = []
    for module, path in files.items():
        if path is None or layer_of(module)[0] != 0:
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        for node in _imports(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            bad += [
                f"{module}:{node.lineno} {n}" for n in names if (n or "").startswith("dopamine")
            ]
    assert not bad, "the bottom layer imports Dopamine: " + "; ".join(bad)


def test_importing_memoire_leaves_the_network_unloaded(tmp_path):
    """``import memoire`` (what ``from memoire import _core`` runs first) and the feed load no
    ZeroMQ; ``memoire.ReplayMemoryServer`` loads it on first use (PEP 562), and without pyzmq
    says so."""
    code = """
        import sys
        import memoire, memoire.feed
        from memoire import _core, memory
        assert "zmq" not in sys.modules, "zmq loaded by import memoire"
        assert not any(m.startswith(("memoire.server", "memoire.client")) for m in sys.modules)
        assert {"ReplayMemoryServer", "ReplayMemoryClient"} <= set(memoire.__all__)
        assert {"ReplayMemoryServer", "ReplayMemoryClient"} <= set(dir(memoire))
        from memoire import ReplayMemoryServer, ReplayMemoryClient
        from memoire.server import ReplayMemoryServer as server_class
        assert ReplayMemoryServer is server_class and memoire.ReplayMemoryClient is ReplayMemoryClient
        assert "zmq" in sys.modules
        try:
            memoire.NoSuchName
        except AttributeError as e:
            assert "NoSuchName" in str(e)
        else:
            raise AssertionError("memoire.NoSuchName")
        print("OK")
    """
    without_zmq = """
        import sys

        sys.modules["zmq"] = None  # as if pyzmq were not installed: importing it fails
        import memoire
        assert "ReplayMemoryServer" not in memoire.__all__
        exec("from memoire import *", {})  # works without the network
        try:
            from memoire import ReplayMemoryServer
        except ImportError as e:
            assert "pyzmq" in str(e), e
        else:
            raise AssertionError("imported without pyzmq")
        print("OK")
    """
    for program in (code, without_zmq):
        assert_clean_exit(run_script(program, tmp_path))


def test_every_command_is_a_module_of_memoire_commands_that_nothing_imports():
    from memoire import cli

    graph = _memoire_graph()
    modules = [module for module, _ in cli.COMMANDS.values()]
    assert sorted(modules) == sorted(m for m in graph if m.startswith("memoire.commands.")), (
        "memoire/commands/ holds exactly the modules of cli.COMMANDS"
    )
    bad = command_importers(graph)
    assert not bad, "memoire.commands is the top layer, yet: " + "; ".join(bad)


# ---------------------------------------------------------------------------------------------
# The checker catches what it must, on a small package written for the purpose.


def _write(root, files: Dict[str, str]) -> str:
    for rel, text in files.items():
        path = os.path.join(root, "memoire", rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return os.path.join(root, "memoire")


def test_checker_sees_relative_function_level_main_and_from_imports(tmp_path):
    pkg = _write(
        str(tmp_path),
        {
            "__init__.py": "from memoire.memory import Memory\n",
            "memory.py": "import numpy\nfrom memoire import _core\n",
            "_core.cpython-311-x86_64-linux-gnu.so": "",
            "server.py": (
                "def f():\n    from .experiments import train\n"
                "if __name__ == '__main__':\n    import memoire.bench\n    import memoire.server\n"
                "else:\n    from . import memory\n"
            ),
            "dopamine_compat/__init__.py": "",
            "dopamine_compat/buf.py": "from .. import Memory\nfrom ..bench import systems\n",
            "experiments/__init__.py": "",
            "experiments/train.py": (
                "import memoire.memory\nfrom memoire.dopamine_compat import buf\n"
                "from memoire.bench import systems\n"
            ),
            "bench/__init__.py": "",
            "bench/systems.py": "from memoire.commands import plot\n",
            "commands/__init__.py": "",
            "commands/plot.py": "import memoire.memory\n",
        },
    )
    graph = import_graph(module_files(pkg))
    assert command_importers(graph) == ["memoire.bench.systems -> memoire.commands.plot"]
    assert graph["memoire"] == {"memoire.memory"}
    assert graph["memoire.memory"] == {"memoire._core"}  # the extension, not the package
    # The __main__ block's imports count; its import of the file's own module does not.
    assert graph["memoire.server"] == {
        "memoire.experiments.train",
        "memoire.memory",
        "memoire.bench",
    }
    assert graph["memoire.dopamine_compat.buf"] == {"memoire", "memoire.bench.systems"}
    assert graph["memoire.experiments.train"] == {
        "memoire.memory",
        "memoire.dopamine_compat.buf",
        "memoire.bench.systems",
    }
    assert upward_imports(graph) == [
        "memoire.bench.systems -> memoire.commands.plot",
        "memoire.dopamine_compat.buf -> memoire.bench.systems",
        "memoire.experiments.train -> memoire.bench.systems",  # sideways: tool to tool
        "memoire.server -> memoire.bench",
        "memoire.server -> memoire.experiments.train",
    ]
    assert all_cycles(graph) == []


def test_checker_reports_each_cycle(tmp_path):
    pkg = _write(
        str(tmp_path),
        {
            "__init__.py": "from memoire.a import x\n",
            "_core.pyi": "",
            "a.py": "from memoire import b, _core\n",
            "b.py": "def f():\n    import memoire.c\n",
            "c.py": "from . import a\n",
            "d.py": "from memoire.e import x\n",
            "e.py": "from .d import y\n",
            "f.py": "import memoire.a\n",
        },
    )
    cycles = all_cycles(import_graph(module_files(pkg)))
    assert cycles == [
        ["memoire.a", "memoire.b", "memoire.c", "memoire.a"],
        ["memoire.d", "memoire.e", "memoire.d"],
    ]


def test_checker_sees_reaches_up_by_name_and_through_privates(tmp_path):
    pkg = _write(
        str(tmp_path),
        {
            "__init__.py": "",
            "_core.pyi": "",
            "feed.py": (
                "import importlib, sys\n"
                "def kind(b):\n"
                "    m = sys.modules.get('memoire.dopamine_compat.buf')\n"
                "    n = sys.modules['memoire.experiments.train']\n"
                "    importlib.import_module(f'memoire.bench.{b}')\n"
                "    sys.modules.get('memoire.memory')\n"  # its own layer: fine
                "    b._store, b._mine, self._store\n"  # ._store: only the face defines it
                "    return b.__class__\n"
            ),
            "memory.py": "class M:\n    def _mine(self):\n        pass\n",
            "dopamine_compat/__init__.py": "",
            "dopamine_compat/buf.py": (
                "class B:\n    def __init__(self):\n        self._store = None\n"
                "def f(m):\n    return m._mine\n"  # a lower layer's private: not upward
            ),
            "experiments/__init__.py": "",
            "experiments/train.py": "",
            "bench/__init__.py": "",
        },
    )
    assert reach_ups(module_files(pkg)) == [
        "memoire.feed:3 names memoire.dopamine_compat.buf",
        "memoire.feed:4 names memoire.experiments.train",
        "memoire.feed:5 names memoire.bench",
        "memoire.feed:7 reads ._store of a higher layer",
    ]
