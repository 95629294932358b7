"""Sweeps as SLURM job arrays: ``memoire sweep slurm``.

``memoire sweep slurm SWEEP.gin --base_dir D --indices 0-99 [--submit]`` writes
``D/sweep.sbatch``, a job array whose task id is the sweep index: task ``N`` runs ``memoire
train --sweep SWEEP.gin --base_dir D --index N``, appending its output to
``D/setting_<N mod S>/run_<N div S>/train.log``, so records are laid out exactly as the local
launcher lays them out. ``--submit`` hands the script to ``sbatch``. A task that is run again
(``sbatch`` the same script, or ``scontrol requeue``) resumes from its last checkpoint.

Resources are sbatch options: ``--cpus`` (``--cpus-per-task``), ``--gpus`` (``--gres=gpu:N``),
``--mem``, ``--time``, ``--partition``, ``--max_parallel`` (``--array=...%P``) and any other
``--sbatch_option``. Tasks run the Python that wrote the script (``--python`` to change it), in
the directory it was written from, with the submitting shell's environment (sbatch's default);
the base directory must be on storage the compute nodes share.

This module only writes text; :mod:`memoire.experiments.sweep` holds the command line.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from typing import Optional, Sequence

INDEX = "$SLURM_ARRAY_TASK_ID"  # the task id; stands for the index in a train command
SCRIPT_NAME = "sweep.sbatch"
TIME_FORMAT = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")  # sbatch's: M, M:S, H:M:S, D-H[:M[:S]]


def array_spec(indices: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``'0-2,5,7-8'`` (sbatch's ``--array`` syntax).

    Raises:
      ValueError: on an empty list or a negative index.
    """
    values = sorted(set(int(i) for i in indices))
    if not values or values[0] < 0:
        raise ValueError(f"expected one or more indices >= 0, got {list(indices)}")
    parts, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def check_option(option: str) -> None:
    """Checks one extra ``#SBATCH`` option.

    Raises:
      ValueError: when it does not start with ``--`` or holds a line break.
    """
    if (
        not isinstance(option, str)
        or not option.startswith("--")
        or "\n" in option
        or "\r" in option
    ):
        raise ValueError(f"an sbatch option must look like --name=value, got {option!r}")


def sbatch_script(
    command: Sequence[str],
    *,
    indices: Sequence[int],
    num_settings: int,
    base_dir: str,
    workdir: str,
    job_name: str = "memoire-sweep",
    cpus: int = 1,
    gpus: int = 0,
    mem: str | None = None,
    time: str | None = None,
    partition: str | None = None,
    max_parallel: int | None = None,
    options: Sequence[str] = (),
) -> str:
    """The text of an sbatch array script.

    Args:
      command: the train command, with :data:`INDEX` as the argument that is the index.
      indices: the sweep indices (task ids).
      num_settings: S, so the task can name its run directory (setting N mod S, run N div S).
      base_dir: the sweep's base directory (absolute); logs of SLURM itself go to
        ``base_dir/slurm/``.
      workdir: where tasks run (``--chdir``).
      cpus, gpus, mem, time, partition, max_parallel: resources per task (see the module).
      options: further ``#SBATCH`` options, as ``--name=value``.

    Raises:
      ValueError: on a count below its minimum, a malformed time, an option that does not
        start with ``--`` or has a line break, or a command without :data:`INDEX`.
    """
    if INDEX not in command:
        raise ValueError(f"the command must contain {INDEX} as the index")
    if cpus < 1 or gpus < 0 or num_settings < 1 or (max_parallel is not None and max_parallel < 1):
        raise ValueError(
            f"expected cpus >= 1, gpus >= 0, max_parallel >= 1, got cpus={cpus}, "
            f"gpus={gpus}, max_parallel={max_parallel}"
        )
    if time is not None and not TIME_FORMAT.match(time):
        raise ValueError(f"--time must look like 30, 4:00:00 or 1-12:00:00, got {time!r}")
    for o in options:
        check_option(o)
    array = array_spec(indices) + (f"%{max_parallel}" if max_parallel else "")
    lines = [
        "#!/bin/bash",
        "# Written by `memoire sweep slurm`: one array task per sweep index.",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --array={array}",
        f"#SBATCH --cpus-per-task={cpus}",
        "#SBATCH --ntasks=1",
        f"#SBATCH --chdir={workdir}",
        f"#SBATCH --output={base_dir}/slurm/%A_%a.out",
    ]
    if gpus:
        lines.append(f"#SBATCH --gres=gpu:{gpus}")
    if mem:
        lines.append(f"#SBATCH --mem={mem}")
    if time:
        lines.append(f"#SBATCH --time={time}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines += [f"#SBATCH {o}" for o in options]
    argv = " ".join('"$SLURM_ARRAY_TASK_ID"' if a == INDEX else shlex.quote(a) for a in command)
    lines += [
        "set -euo pipefail",
        # The index's run directory, as memoire.experiments.sweep.run_dir names it.
        f"S={num_settings}",
        f"RUN_DIR={shlex.quote(base_dir)}/setting_$((SLURM_ARRAY_TASK_ID % S))"
        "/run_$((SLURM_ARRAY_TASK_ID / S))",
        'mkdir -p "$RUN_DIR"',
        f'exec {argv} >> "$RUN_DIR/train.log" 2>&1',
        "",
    ]
    return "\n".join(lines)


def submit(path: str, env: Optional[dict] = None) -> str:
    """Runs ``sbatch --parsable path`` (with environment ``env``, by default this process's:
    sbatch hands it to the job) and returns the job id.

    Raises:
      RuntimeError: when sbatch is not installed or refuses the script (its message).
    """
    if shutil.which("sbatch") is None:
        raise RuntimeError(
            f"sbatch is not on PATH (is this a SLURM login node?); the script is at {path}"
        )
    out = subprocess.run(
        ["sbatch", "--parsable", path], capture_output=True, text=True, timeout=60, env=env
    )
    if out.returncode != 0:
        raise RuntimeError(f"sbatch refused {path}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip().split(";")[0]
