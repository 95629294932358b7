"""Sweep files: parsing, zipped groups, index arithmetic, records and the list table."""

import json
import logging
import os
import sys
import types

import pytest

from memoire.commands import sweep as sweep_command
from memoire.experiments import sweep as sw

SPEC = """
include 'base.gin'
A.x = [1, 2, 3]
B.lr = [0.1, 0.01]
B.eps = [1e-3, 1e-4]
s/C.fn = [@foo.bar, @baz(), %MACRO]
sweep.zip = [('B.lr', 'B.eps')]
"""


def test_parse_groups_and_settings_count(tmp_path):
    s = sw.parse_sweep(SPEC, str(tmp_path))
    assert s.gin_files == (os.path.join(str(tmp_path), "base.gin"),)
    assert [g.names for g in s.groups] == [("A.x",), ("B.lr", "B.eps"), ("s/C.fn",)]
    assert s.num_settings == 3 * 2 * 3  # the zipped pair counts once


def test_settings_enumerate_like_product_last_group_fastest():
    s = sw.parse_sweep(SPEC)
    settings = s.settings()
    assert len(settings) == 18
    assert settings[0] == ["A.x = 1", "B.lr = 0.1", "B.eps = 0.001", "s/C.fn = @foo.bar"]
    assert settings[1] == ["A.x = 1", "B.lr = 0.1", "B.eps = 0.001", "s/C.fn = @baz()"]
    assert settings[2][-1] == "s/C.fn = %MACRO"
    assert settings[3][1:3] == ["B.lr = 0.01", "B.eps = 0.0001"]  # zipped: move together
    assert settings[6][0] == "A.x = 2"
    for i in range(18):
        assert s.bindings(i) == settings[i]
    assert len({tuple(b) for b in settings}) == 18


def test_index_arithmetic():
    s = sw.parse_sweep(SPEC)
    assert s.locate(0) == (0, 0)
    assert s.locate(17) == (17, 0)
    assert s.locate(18) == (0, 1)
    assert s.locate(18 * 4 + 5) == (5, 4)
    assert sw.seed_for_run(4) == 4
    with pytest.raises(sw.SweepError, match=">= 0"):
        s.locate(-1)
    with pytest.raises(sw.SweepError, match="setting must be in"):
        s.bindings(18)


def test_empty_sweep_is_one_setting():
    s = sw.Sweep()
    assert s.num_settings == 1 and s.locate(3) == (0, 3) and s.bindings(0) == []


@pytest.mark.parametrize(
    "text, message",
    [
        ("A.x = 3", "non-empty list"),
        ("A.x = []", "non-empty list"),
        ("A.x = [1]\nA.x = [2]", "listed twice"),
        ("A.x = [1, 2]\nB.y = [1]\nsweep.zip = [('A.x', 'B.y')]", "equally many"),
        ("A.x = [1]\nsweep.zip = [('A.x', 'Q.z')]", "lists no candidates"),
        ("A.x = [1]\nB.y = [2]\nsweep.zip = [('A.x', 'B.y'), ('A.x',)]", "more than one zip"),
        ("sweep.zip = 'A.x'", "list of tuples"),
        ("A.x = [1, 2", "not valid gin"),
    ],
)
def test_bad_sweeps_raise(text, message):
    with pytest.raises(sw.SweepError, match=message):
        sw.parse_sweep(text)


def test_no_code_is_evaluated():
    # A call expression is not a gin literal: the parser rejects it instead of running it.
    with pytest.raises(sw.SweepError):
        sw.parse_sweep("A.x = [__import__('os').system('false')]")


def test_parse_indices():
    assert sw.parse_indices("0-3") == [0, 1, 2, 3]
    assert sw.parse_indices("5,0-1,1") == [0, 1, 5]
    for bad in ("a", "3-1", "-2", ""):
        with pytest.raises(sw.SweepError):
            sw.parse_indices(bad)


def test_records(tmp_path):
    d = sw.run_dir(str(tmp_path), 2, 3)
    assert d.endswith(os.path.join("setting_2", "run_3"))
    path = sw.write_setting_record(
        d,
        index=11,
        setting=2,
        run=3,
        seed=3,
        bindings=["A.x = 1"],
        gin_files=["base.gin"],
        sweep_file=None,
        extra_bindings=["B.y = 2"],
    )
    rec = json.load(open(path))
    assert (rec["index"], rec["setting"], rec["run"], rec["seed"]) == (11, 2, 3, 3)
    assert rec["bindings"] == ["A.x = 1"] and rec["gin_bindings"] == ["B.y = 2"]


def test_list_command_prints_table(tmp_path, capsys):
    f = tmp_path / "s.gin"
    f.write_text("A.x = [1, 2]\nB.y = ['a', 'b', 'c']\n")
    assert sweep_command.main(["list", str(f), "--runs", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# 6 setting(s) x 2 run(s)")
    rows = [line.split(None, 4) for line in out[2:]]
    assert len(rows) == 12
    assert rows[7][:4] == ["7", "1", "1", "1"]
    assert rows[7][4] == "A.x = 1; B.y = 'b'"


def test_run_indices_runs_each_index_and_logs_the_outcome(tmp_path, monkeypatch, caplog):
    # Children that stand in for memoire train: odd indices fail with exit 3.
    code = "import sys; print('child', sys.argv[1]); sys.exit(3 * (int(sys.argv[1]) % 2))"
    monkeypatch.setattr(
        sw, "_train_command", lambda args, index: [sys.executable, "-c", code, str(index)]
    )
    (tmp_path / "s.gin").write_text("A.x = [1, 2]\n")
    args = types.SimpleNamespace(
        sweep=str(tmp_path / "s.gin"),
        base_dir=str(tmp_path / "runs"),
        indices="0-3",
        parallel=2,
        gin_files=[],
        gin_bindings=[],
    )
    with caplog.at_level(logging.INFO, logger="memoire.experiments.sweep"):
        assert sw.run_indices(args) == 2
    for index in range(4):
        log_path = tmp_path / "runs" / f"setting_{index % 2}" / f"run_{index // 2}" / "train.log"
        assert log_path.read_text() == f"child {index}\n"
    messages = [r.getMessage() for r in caplog.records if r.name == "memoire.experiments.sweep"]
    assert "index 0 done" in messages and "index 2 done" in messages
    assert "index 1 FAILED (exit 3)" in messages and "index 3 FAILED (exit 3)" in messages
    assert messages[-1] == "2/4 succeeded"
    # Progress (no terminal here: log lines): one line per finished run, counting up.
    counts = [m.split("/")[0] for m in messages if m.endswith(" failed") and "/4 done" in m]
    assert counts == ["1", "2", "3", "4"]
    assert sum(m.startswith("started index") for m in messages) == 4


def test_cli_errors_are_clean(tmp_path, capsys):
    f = tmp_path / "s.gin"
    f.write_text("A.x = 3\n")
    assert sweep_command.main(["list", str(f)]) == 2
    assert "non-empty list" in capsys.readouterr().err


@pytest.mark.dopamine
def test_shipped_sweeps_load_and_replay_sweep_selects_each_buffer():
    import gin

    from memoire.experiments import replay_routing, runner

    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
    sw.load_sweep(os.path.join(root, "configs", "sweep_dqn_cartpole.gin"))
    s = sw.load_sweep(os.path.join(root, "configs", "sweep_replay_cartpole.gin"))
    chosen = []
    try:
        for setting in range(2):
            gin.clear_config()
            runner.load_gin(list(s.gin_files), s.bindings(setting))
            chosen.append(replay_routing.replay_backend())
    finally:
        gin.clear_config()
    assert chosen == ["memoire", "dopamine"]
