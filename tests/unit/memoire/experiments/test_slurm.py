"""``memoire sweep slurm``: the sbatch array script, read back by parsing it and by running its
body with bash as SLURM would (the task id set), and its submission through a stand-in sbatch."""

import os
import shlex
import stat
import subprocess
import sys

import pytest
from _sbatch import _directives

from memoire.commands import sweep as sweep_command
from memoire.experiments import slurm
from memoire.experiments import sweep as sw


def _sweep(tmp_path):
    (tmp_path / "base.gin").write_text("")
    path = tmp_path / "s.gin"
    path.write_text("include 'base.gin'\nA.x = [1, 2, 3]\n")  # S = 3 settings
    return str(path)


def test_array_spec_compresses_indices():
    assert slurm.array_spec([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert slurm.array_spec([3]) == "3"
    assert slurm.array_spec(sw.parse_indices("0-99")) == "0-99"
    with pytest.raises(ValueError, match="indices >= 0"):
        slurm.array_spec([])


def test_script_names_the_array_resources_and_each_index_run(tmp_path, capsys):
    path = _sweep(tmp_path)
    base = str(tmp_path / "runs")
    assert (
        sweep_command.main(
            [
                "slurm",
                path,
                "--base_dir",
                base,
                "--indices",
                "0-4,9",
                "--cpus",
                "4",
                "--gpus",
                "1",
                "--mem",
                "8G",
                "--time",
                "4:00:00",
                "--partition",
                "gpu",
                "--max_parallel",
                "2",
                "--sbatch_option=--account=rl",
                "--gin_bindings",
                "B.y = 'two words'",
            ]
        )
        == 0
    )
    script = capsys.readouterr().out.strip()
    assert script == os.path.join(base, "sweep.sbatch")
    text = open(script).read()
    assert text.startswith("#!/bin/bash\n")
    d = _directives(text)
    assert d == {
        "--job-name": "memoire-sweep",
        "--array": "0-4,9%2",
        "--cpus-per-task": "4",
        "--ntasks": "1",
        "--chdir": os.getcwd(),
        "--output": f"{base}/slurm/%A_%a.out",
        "--gres": "gpu:1",
        "--mem": "8G",
        "--time": "4:00:00",
        "--partition": "gpu",
        "--account": "rl",
    }
    exec_line = [line for line in text.splitlines() if line.startswith("exec ")]
    assert len(exec_line) == 1
    argv = shlex.split(exec_line[0])
    assert argv[1:] == [
        sys.executable,
        "-P",
        "-m",
        "memoire.commands.train",
        "--sweep",
        path,
        "--base_dir",
        base,
        "--index",
        "$SLURM_ARRAY_TASK_ID",
        "--gin_bindings",
        "B.y = 'two words'",
        ">>",
        "$RUN_DIR/train.log",
        "2>&1",
    ]


@pytest.mark.parametrize("index", [0, 4, 9])
def test_each_task_runs_its_index_into_the_local_launchers_run_dir(tmp_path, capsys, index):
    # The script's body, run by bash as SLURM runs a task, with a Python that only prints.
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    path = _sweep(tmp_path)
    base = str(tmp_path / "runs")
    assert (
        sweep_command.main(
            ["slurm", path, "--base_dir", base, "--indices", "0-9", "--python", str(fake)]
        )
        == 0
    )
    script = capsys.readouterr().out.strip()
    out = subprocess.run(
        ["bash", script],
        env=dict(os.environ, SLURM_ARRAY_TASK_ID=str(index)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    log = os.path.join(sw.run_dir(base, index % 3, index // 3), "train.log")
    assert open(log).read() == (
        f"-P -m memoire.commands.train --sweep {path} --base_dir {base} --index {index}\n"
    )


def test_submit_runs_sbatch_and_prints_the_job_id(tmp_path, capsys, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"  # a stand-in that records its arguments
    sbatch.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/sbatch.args\necho '4242;local'\n")
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    base = str(tmp_path / "runs")
    assert (
        sweep_command.main(
            ["slurm", _sweep(tmp_path), "--base_dir", base, "--indices", "0-1", "--submit"]
        )
        == 0
    )
    assert capsys.readouterr().out.split() == [os.path.join(base, "sweep.sbatch"), "4242"]
    assert (tmp_path / "sbatch.args").read_text().split() == [
        "--parsable",
        os.path.join(base, "sweep.sbatch"),
    ]


def test_mistakes_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch):
    path = _sweep(tmp_path)
    base = tmp_path / "runs"
    for tail, message in (
        (["0-1", "--time", "soon"], "--time must look like"),
        (["0-1", "--sbatch_option", "account=rl"], "--name=value"),
        (["0-1", "--cpus", "0"], "expected cpus >= 1"),
        (["3-1"], "empty or negative"),
    ):
        assert sweep_command.main(["slurm", path, "--base_dir", str(base), "--indices", *tail]) == 2
        err = capsys.readouterr().err
        assert err.startswith("memoire sweep: error: ") and message in err, err
        assert err.count("\n") == 1
        assert not base.exists()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no sbatch
    assert (
        sweep_command.main(["slurm", path, "--base_dir", str(base), "--indices", "0", "--submit"])
        == 2
    )
    assert "sbatch is not on PATH" in capsys.readouterr().err
