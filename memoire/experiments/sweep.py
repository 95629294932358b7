"""Hyperparameter sweeps over gin bindings: one file lists candidates, an index picks one.

A sweep file is written in gin syntax and parsed by gin's own parser (literals only: nothing
in it is evaluated as Python, and nothing is bound while reading it):

    include 'dqn_cartpole_jax_local.gin'          # the base experiment (path relative to
                                                  # this file); any number of includes
    JaxDQNAgent.target_update_period = [50, 100]  # candidates for one binding
    create_optimizer.learning_rate = [1e-3, 3e-4]

    JaxDQNAgent.gamma = [0.99, 0.9]               # these two vary together (zipped):
    JaxDQNAgent.update_horizon = [1, 3]           # (0.99, 1) then (0.9, 3)
    sweep.zip = [('JaxDQNAgent.gamma', 'JaxDQNAgent.update_horizon')]

Every binding's value must be a non-empty list; each element is one candidate, written as any
gin value (numbers, strings, tuples, ``@references``, ``%macros``). Bindings named together in
a ``sweep.zip`` group must list the same number of candidates. The groups (a lone binding is a
group of one) form a cartesian product of ``S`` settings, enumerated like ``itertools.product``
in the order the groups first appear in the file: the last group varies fastest.

An index ``N`` picks setting ``N mod S`` and run ``N div S``, so indices ``0..S-1`` are the
first run of every setting, ``S..2S-1`` the second, and so on. The run number seeds everything
(``seed = run``): the k-th run of every setting shares its seed, so settings are compared on
common random numbers. Each launch writes ``D/setting_<s>/run_<k>/setting.json``.

Command line (``memoire sweep ...``, parsed by :mod:`memoire.commands.sweep`):

    memoire sweep list SWEEP.gin [--runs R]
    memoire sweep run SWEEP.gin --base_dir D --indices 0-7 [--parallel 2] [--gin_bindings B]
    memoire sweep run SWEEP.gin --base_dir D --indices 0-7 --launcher ray [--ray_address A]
    memoire sweep slurm SWEEP.gin --base_dir D --indices 0-99 [--submit] [--cpus 4 --gpus 1]

``--launcher ray`` runs each index as a Ray task (:mod:`memoire.experiments.ray_launcher`);
``slurm`` writes (and submits) a SLURM job array (:mod:`memoire.experiments.slurm`). Every
launcher runs the same ``memoire train`` command per index, so the records are the same.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import logging
import os
import subprocess
import sys
import time
import tokenize
from typing import Any, Sequence

from gin import config_parser

from memoire import cli

log = logging.getLogger(__name__)

ZIP_KEY = "sweep.zip"
SETTING_FILE = "setting.json"


class SweepError(ValueError):
    """A sweep file or an index that does not make sense; the message says where and why."""


# ---------------------------------------------------------------------------------------------
# Parsing: gin's parser with a delegate that keeps references and macros as text.


@dataclasses.dataclass(frozen=True)
class _Reference:
    """A ``@name`` or ``@name()`` seen in a sweep file; ``repr`` gives it back as gin text."""

    name: str
    evaluate: bool

    def __repr__(self) -> str:
        return f"@{self.name}()" if self.evaluate else f"@{self.name}"


@dataclasses.dataclass(frozen=True)
class _Macro:
    """A ``%name`` seen in a sweep file; ``repr`` gives it back as gin text."""

    name: str

    def __repr__(self) -> str:
        return f"%{self.name}"


class _TextDelegate(config_parser.ParserDelegate):
    """Parses references and macros without resolving them: a sweep file binds nothing."""

    def configurable_reference(self, scoped_name, evaluate):
        return _Reference(scoped_name, evaluate)

    def macro(self, name):
        return _Macro(name)


def format_value(value: Any) -> str:
    """Writes one candidate value as gin text (the inverse of gin's literal parser).

    Python's ``repr`` of numbers, strings, ``None``, booleans, tuples, lists and dicts is valid
    gin, and references and macros format themselves, also inside containers.
    """
    return repr(value)


@dataclasses.dataclass(frozen=True)
class Group:
    """Bindings that vary together.

    Attributes:
      names: binding names, e.g. ``('JaxDQNAgent.gamma', 'JaxDQNAgent.update_horizon')``.
      rows: one tuple of gin-text values per candidate, aligned with ``names``.
    """

    names: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A parsed sweep: base gin files plus groups of candidate bindings.

    Attributes:
      gin_files: base gin files (from ``include`` statements), as paths usable from the current
        directory.
      groups: the groups in file order; empty for a sweep of one setting.
      path: the sweep file, or None for the trivial sweep.
    """

    gin_files: tuple[str, ...] = ()
    groups: tuple[Group, ...] = ()
    path: str | None = None

    @property
    def num_settings(self) -> int:
        """S, the number of distinct settings (1 for an empty sweep)."""
        n = 1
        for g in self.groups:
            n *= len(g.rows)
        return n

    def locate(self, index: int) -> tuple[int, int]:
        """Returns ``(setting, run) = (index mod S, index div S)``.

        Raises:
          SweepError: if ``index`` is negative or not an integer.
        """
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise SweepError(f"a sweep index must be an integer >= 0, got {index!r}")
        return index % self.num_settings, index // self.num_settings

    def bindings(self, setting: int) -> list[str]:
        """Gin binding strings (``'A.x = 1'``) of one setting, in file order.

        Raises:
          SweepError: if ``setting`` is not in ``[0, S)``.
        """
        if not 0 <= setting < self.num_settings:
            raise SweepError(f"setting must be in [0, {self.num_settings}), got {setting}")
        out = []
        # Mixed radix with the last group fastest, as itertools.product enumerates.
        rest = setting
        chosen = []
        for g in reversed(self.groups):
            rest, i = divmod(rest, len(g.rows))
            chosen.append((g, i))
        for g, i in reversed(chosen):
            out.extend(f"{n} = {v}" for n, v in zip(g.names, g.rows[i]))
        return out

    def settings(self) -> list[list[str]]:
        """The bindings of every setting, in index order (``settings()[s] == bindings(s)``)."""
        rows = itertools.product(*(g.rows for g in self.groups))
        out = []
        for combo in rows:
            out.append(
                [f"{n} = {v}" for g, row in zip(self.groups, combo) for n, v in zip(g.names, row)]
            )
        return out


def seed_for_run(run: int) -> int:
    """The seed of run ``run``: the run number itself, so run k of every setting matches."""
    return int(run)


def parse_sweep(text: str, base_dir: str = ".", path: str | None = None) -> Sweep:
    """Parses sweep text (see the module docstring).

    Args:
      text: the sweep file's content.
      base_dir: directory that relative ``include`` paths are resolved against.
      path: the file name, for messages.

    Raises:
      SweepError: on gin syntax errors, a statement other than an include or a binding, a
        value that is not a non-empty list, a binding given twice, or a zip group naming
        unknown bindings, a binding twice or one already in another group, or bindings of
        unequal lengths.
    """
    where = path or "<sweep>"
    try:
        statements = list(config_parser.ConfigParser(io.StringIO(text), _TextDelegate()))
    except (SyntaxError, tokenize.TokenError) as e:
        raise SweepError(f"{where}: not valid gin: {e}") from None

    gin_files: list[str] = []
    candidates: dict[str, list[str]] = {}
    zips: list[tuple[str, ...]] = []
    for st in statements:
        line = getattr(st.location, "line_num", "?")
        if isinstance(st, config_parser.IncludeStatement):
            f = st.filename
            gin_files.append(f if os.path.isabs(f) else os.path.join(base_dir, f))
            continue
        if not isinstance(st, config_parser.BindingStatement):
            raise SweepError(
                f"{where}:{line}: only include statements and bindings are "
                f"allowed in a sweep file, got {type(st).__name__}"
            )
        name = f"{st.selector}.{st.arg_name}"
        if st.scope:
            name = f"{st.scope}/{name}"
        if name == ZIP_KEY:
            zips.extend(_parse_zip(st.value, where, line))
            continue
        if name in candidates:
            raise SweepError(f"{where}:{line}: {name} is listed twice")
        if not isinstance(st.value, list) or not st.value:
            raise SweepError(
                f"{where}:{line}: {name} must be a non-empty list of candidate "
                f"values, got {format_value(st.value)}"
            )
        candidates[name] = [format_value(v) for v in st.value]

    zipped_of: dict[str, tuple[str, ...]] = {}
    for group in zips:
        for n in group:
            if n not in candidates:
                raise SweepError(f"{where}: {ZIP_KEY} names {n}, which lists no candidates")
            if n in zipped_of:
                raise SweepError(f"{where}: {n} appears in more than one zip group")
            zipped_of[n] = group
        lengths = {n: len(candidates[n]) for n in group}
        if len(set(lengths.values())) != 1:
            raise SweepError(
                f"{where}: zipped bindings must list equally many candidates, got {lengths}"
            )

    groups: list[Group] = []
    seen: set[str] = set()
    for n in candidates:  # dicts keep file order
        if n in seen:
            continue
        names = zipped_of.get(n, (n,))
        seen.update(names)
        rows = tuple(zip(*(candidates[m] for m in names)))
        groups.append(Group(tuple(names), rows))
    return Sweep(tuple(gin_files), tuple(groups), path)


def _parse_zip(value: Any, where: str, line: Any) -> list[tuple[str, ...]]:
    ok = isinstance(value, (list, tuple)) and all(
        isinstance(g, (list, tuple)) and len(g) >= 1 and all(isinstance(n, str) for n in g)
        for g in value
    )
    if not ok:
        raise SweepError(
            f"{where}:{line}: {ZIP_KEY} must be a list of tuples of binding "
            f"names, got {format_value(value)}"
        )
    out = []
    for g in value:
        if len(set(g)) != len(g):
            raise SweepError(f"{where}:{line}: zip group {tuple(g)} names a binding twice")
        out.append(tuple(g))
    return out


def load_sweep(path: str) -> Sweep:
    """Reads and parses a sweep file; includes are relative to the file's directory.

    Raises:
      SweepError: see :func:`parse_sweep`.
      FileNotFoundError: if ``path`` does not exist.
    """
    with open(path) as f:
        text = f.read()
    return parse_sweep(text, os.path.dirname(os.path.abspath(path)), path)


# ---------------------------------------------------------------------------------------------
# Records.


def run_dir(base_dir: str, setting: int, run: int) -> str:
    """``base_dir/setting_<setting>/run_<run>``: where one launch keeps everything."""
    return os.path.join(base_dir, f"setting_{setting}", f"run_{run}")


def write_setting_record(
    directory: str,
    *,
    index: int,
    setting: int,
    run: int,
    seed: int,
    bindings: Sequence[str],
    gin_files: Sequence[str],
    sweep_file: str | None,
    extra_bindings: Sequence[str] = (),
) -> str:
    """Writes ``directory/setting.json`` (atomically) and returns its path.

    The record names the setting's own bindings separately from the base gin files and the
    command-line bindings, so results can be grouped by setting without re-parsing gin.
    """
    os.makedirs(directory, exist_ok=True)
    record = {
        "index": index,
        "setting": setting,
        "run": run,
        "seed": seed,
        "bindings": list(bindings),
        "gin_files": [os.path.abspath(f) for f in gin_files],
        "gin_bindings": list(extra_bindings),
        "sweep_file": os.path.abspath(sweep_file) if sweep_file else None,
        "written_at": time.time(),
    }
    path = os.path.join(directory, SETTING_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------
# Command line.


def parse_indices(spec: str) -> list[int]:
    """Parses ``'0-7'``, ``'3'`` or ``'0,2,5-6'`` into a sorted list of distinct indices.

    Raises:
      SweepError: on anything else, or an empty or reversed range.
    """
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo_s, hi_s = part.split("-", 1)
                lo, hi = int(lo_s), int(hi_s)
            else:
                lo = hi = int(part)
        except ValueError:
            raise SweepError(f"indices must look like '0-7' or '0,3,5-6', got {spec!r}") from None
        if lo < 0 or hi < lo:
            raise SweepError(f"index range {part!r} in {spec!r} is empty or negative")
        out.update(range(lo, hi + 1))
    return sorted(out)


def format_table(sweep: Sweep, runs: int = 1) -> str:
    """The table ``memoire sweep list`` prints: one line per index of ``runs`` runs."""
    settings = sweep.settings()
    s_count = len(settings)
    lines = [
        f"# {s_count} setting(s) x {runs} run(s); index = run * {s_count} + setting",
        f"{'index':>5}  {'setting':>7}  {'run':>3}  {'seed':>4}  bindings",
    ]
    for index in range(s_count * runs):
        s, r = sweep.locate(index)
        lines.append(
            f"{index:>5}  {s:>7}  {r:>3}  {seed_for_run(r):>4}  "
            f"{'; '.join(settings[s]) or '(base config)'}"
        )
    return "\n".join(lines)


def _train_command(args, index: int) -> list[str]:
    # -P (Python 3.11+): do not put the working directory first on sys.path, so a source
    # checkout in it cannot shadow the installed memoire.
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    cmd = [
        sys.executable,
        *safe_path,
        "-m",
        "memoire.commands.train",
        "--sweep",
        args.sweep,
        "--base_dir",
        args.base_dir,
        "--index",
        str(index),
    ]
    for f in args.gin_files:
        cmd += ["--gin_files", f]
    for b in args.gin_bindings:
        cmd += ["--gin_bindings", b]
    return cmd


def run_indices(args) -> int:
    """Runs ``memoire train`` (``python -m memoire.commands.train``) for each index, at most ``args.parallel`` at once.

    Each child's output goes to ``run_dir/train.log``. Returns the number of failed children.
    Progress (runs finished, running, failed) is a bar on a terminal, log lines elsewhere
    (:class:`memoire.progress.Progress`).
    """
    from memoire.progress import Progress

    sweep = load_sweep(args.sweep)
    indices = parse_indices(args.indices)
    with Progress(len(indices), "memoire sweep", log, unit="run") as progress:
        if getattr(args, "launcher", "local") == "ray":
            return _run_on_ray(args, sweep, indices, progress)
        return _run_children(args, sweep, indices, progress)


def _run_children(args, sweep, indices: list[int], progress) -> int:
    pending = list(indices)
    running: dict[int, tuple[subprocess.Popen, Any]] = {}
    failed = 0
    while pending or running:
        while pending and len(running) < args.parallel:
            index = pending.pop(0)
            s, r = sweep.locate(index)
            d = run_dir(args.base_dir, s, r)
            os.makedirs(d, exist_ok=True)
            log_file = open(os.path.join(d, "train.log"), "ab")
            proc = subprocess.Popen(
                _train_command(args, index), stdout=log_file, stderr=subprocess.STDOUT
            )
            running[index] = (proc, log_file)
            log.info("started index %d (setting %d, run %d) -> %s", index, s, r, d)
        for index, (proc, log_file) in list(running.items()):
            code = proc.poll()
            if code is None:
                continue
            log_file.close()
            del running[index]
            failed += code != 0
            _finished(index, code, progress, f"done, {len(running)} running, {failed} failed")
        time.sleep(0.2)
    log.info("%d/%d succeeded", len(indices) - failed, len(indices))
    return failed


def _finished(index: int, code: int, progress, note: str) -> None:
    """Logs sweep index ``index``'s exit ``code`` and counts it in ``progress`` (either
    launcher)."""
    if code == 0:
        log.info("index %d done", index)
    else:
        log.error("index %d FAILED (exit %d)", index, code)
    progress.update(1, quiet=True)
    progress.note(note)


def _absolute(args):
    """``args`` with the sweep file, base_dir and gin files as absolute paths, for commands
    run from another directory or machine."""
    import copy

    out = copy.copy(args)
    out.sweep = os.path.abspath(args.sweep)
    out.base_dir = os.path.abspath(args.base_dir)
    out.gin_files = [os.path.abspath(f) for f in args.gin_files]
    return out


def _run_on_ray(args, sweep: Sweep, indices: list[int], progress) -> int:
    """:func:`run_indices` with each index a Ray task; returns the number that failed."""
    from memoire.experiments import ray_launcher

    args = _absolute(args)
    jobs = []
    for index in indices:
        s, r = sweep.locate(index)
        d = run_dir(args.base_dir, s, r)
        jobs.append((index, _train_command(args, index), os.path.join(d, "train.log")))
        log.info("submitted index %d (setting %d, run %d) -> %s", index, s, r, d)
    failed = 0
    for index, code in ray_launcher.run_sweep(
        jobs, address=args.ray_address or "", cpus=args.cpus, gpus=args.gpus
    ):
        failed += code != 0
        _finished(index, code, progress, f"done, {failed} failed")
    log.info("%d/%d succeeded", len(indices) - failed, len(indices))
    return failed


def write_slurm(args) -> str:
    """``memoire sweep slurm``: writes ``base_dir/sweep.sbatch`` (and submits it with
    ``--submit``); returns its path."""
    from memoire.experiments import slurm

    sweep = load_sweep(args.sweep)
    indices = parse_indices(args.indices)
    args = _absolute(args)
    command = _train_command(args, slurm.INDEX)
    if args.python:
        command[0] = args.python
    try:
        text = slurm.sbatch_script(
            command,
            indices=indices,
            num_settings=sweep.num_settings,
            base_dir=args.base_dir,
            workdir=os.getcwd(),
            job_name=args.job_name,
            cpus=args.cpus,
            gpus=args.gpus,
            mem=args.mem,
            time=args.time,
            partition=args.partition,
            max_parallel=args.max_parallel,
            options=args.sbatch_option,
        )
    except ValueError as e:
        raise cli.UsageError(e) from None
    os.makedirs(os.path.join(args.base_dir, "slurm"), exist_ok=True)
    path = os.path.join(args.base_dir, slurm.SCRIPT_NAME)
    with open(path, "w") as f:
        f.write(text)
    print(path)
    if args.submit:
        try:
            job = slurm.submit(path)
        except RuntimeError as e:
            raise cli.UsageError(e) from None
        log.info("submitted job array %s (%d task(s))", job, len(indices))
        print(job)
    return path
