"""memoire.progress: a tqdm bar on a terminal, log lines without one (or without tqdm)."""

import io
import logging

import pytest

from memoire import progress

LOG = logging.getLogger("memoire.test_progress")


def _messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOG.name]


@pytest.mark.parametrize("no_tqdm", [False, True])
def test_log_lines_count_stages_without_a_bar(caplog, monkeypatch, no_tqdm):
    if no_tqdm:  # tqdm is optional: its absence gives the same log lines
        monkeypatch.setattr(progress, "_tqdm", lambda: None)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        with progress.Progress(3, "work", LOG, bar=None if no_tqdm else False) as p:
            p.stage("first")
            p.stage("second")
            p.stage("third")
        assert p.done == 3
    assert _messages(caplog) == ["0/3 first", "1/3 second", "2/3 third"]


def test_update_logs_and_an_error_leaves_the_stage_unfinished(caplog):
    with caplog.at_level(logging.INFO, logger=LOG.name):
        with pytest.raises(RuntimeError):
            with progress.Progress(2, "runs", LOG, bar=False) as p:
                p.update(1)
                p.stage("second")
                raise RuntimeError("stop")
    assert p.done == 1
    assert _messages(caplog) == ["1/2 ", "1/2 second"]


def test_bar_draws_on_stderr_and_keeps_log_lines_out_of_it(monkeypatch, caplog):
    pytest.importorskip("tqdm")
    err = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", err)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        with progress.Progress(2, "bench", LOG, unit="stage", bar=True) as p:
            p.stage("atari")
            p.stage("vector")
    assert p.done == 2
    # The bar drew the stages, and went at the end (no line of its own left behind).
    shown = err.getvalue()
    assert "bench" in shown and "atari" in shown and "vector" in shown
    assert shown.endswith("\r") and "\n" not in shown, repr(shown)
    assert _messages(caplog) == []  # the bar shows the stages; no log lines besides


@pytest.mark.parametrize("quick", [True, False])
def test_bench_counts_every_stage_and_prints_only_its_report(monkeypatch, capsys, caplog, quick):
    """memoire bench's stages (workloads stubbed out): the count reaches its total exactly, the
    stages are log lines (no terminal here), and stdout holds the report alone."""
    from memoire import bench
    from memoire.bench import ingest
    from memoire.commands import bench as bench_command

    for name in ("sample_workload", "add_workload", "checkpoint_workload"):
        monkeypatch.setattr(bench, name, lambda *a, **k: [])
    monkeypatch.setattr(bench, "scaling_plot", lambda *a, **k: [])
    monkeypatch.setattr(bench, "memory_workload", lambda *a, **k: ([], {}))
    monkeypatch.setattr(ingest, "ingest_workload", lambda *a, **k: [])
    totals = []
    real = progress.Progress

    class Counted(real):
        def close(self, finished=True):
            super().close(finished)
            totals.append((self.done, self.total))

    monkeypatch.setattr(bench, "Progress", Counted)
    with caplog.at_level(logging.INFO, logger="memoire.bench"):
        assert bench_command.main(["--quick"] if quick else []) == 0
    ((done, total),) = totals
    assert done == total == (8 if quick else 10)
    stages = [r.getMessage() for r in caplog.records if r.name == "memoire.bench"]
    assert stages[0] == f"0/{total} atari uniform n1"
    assert stages[-1] == f"{total - 1}/{total} memory"
    out = capsys.readouterr().out
    assert out.startswith("# memoire benchmark results") and "[bench]" not in out
