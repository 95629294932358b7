"""memoire.cli keeps other packages' chatter out of a command's output unless --log-level
debug (memoire.cli.third_party): what imports print to file descriptor 2 (held by
memoire.cli.stderr_hold), developer warnings, known log notices, repeats. The commands
themselves are counted in test_train.py and test_train_atari.py."""

import gc
import logging
import os
import sys
import warnings

import pytest

from memoire.cli import stderr_hold, third_party

ABSL_PREAMBLE = b"WARNING: All log messages before absl::InitializeLog() is called are written\n"
CUDNN = b"E0000 00:00:1795753770.779694   26393 cuda_dnn.cc:8310] Unable to register cuDNN\n"
TF_INFO = b"2026-11-27 04:29:30.806536: I tensorflow/core/platform/cpu_feature_guard.cc:210] x\n"
GYM = b"Gym has been unmaintained since 2022 and does not support NumPy 2.0\n"


@pytest.fixture
def quiet(monkeypatch):
    """third_party's switch, set by the test and restored after it."""
    monkeypatch.setattr(third_party, "_quiet", True)
    return monkeypatch


def test_filtered_stderr_drops_known_chatter_and_passes_the_rest(quiet, capfd):
    with third_party.filtered_stderr():
        os.write(2, ABSL_PREAMBLE + CUDNN + b"a line the user should see\n" + TF_INFO + GYM)
        os.write(2, b"another one\n")
    assert capfd.readouterr().err == "a line the user should see\nanother one\n"


def test_filtered_stderr_passes_everything_when_the_block_fails(quiet, capfd):
    with pytest.raises(ImportError):
        with third_party.filtered_stderr():
            os.write(2, CUDNN + b"why the import failed\n")
            raise ImportError("no")
    assert capfd.readouterr().err == (CUDNN + b"why the import failed\n").decode()


def test_filtered_stderr_holds_nothing_at_debug(quiet, capfd):
    quiet.setattr(third_party, "_quiet", False)
    with third_party.filtered_stderr():
        os.write(2, CUDNN)
        assert capfd.readouterr().err == CUDNN.decode()  # written at once, not held


def test_hold_stderr_hands_the_whole_text_to_said_and_writes_what_is_not_dropped(capfd):
    said = []
    with stderr_hold.hold_stderr(lambda line: line.startswith("noise"), said=said):
        os.write(2, b"noise 1\nkept\nnoise 2\n")
        assert capfd.readouterr().err == ""  # held, not yet written
    assert said == ["noise 1\nkept\nnoise 2\n"]
    assert capfd.readouterr().err == "kept\n"


def test_hold_stderr_filters_after_an_error_unless_told_not_to(capfd):
    for drop_after_error, expected in ((True, "why\n"), (False, "noise\nwhy\n")):
        with pytest.raises(RuntimeError):
            with stderr_hold.hold_stderr(
                lambda line: line == "noise\n", drop_after_error=drop_after_error
            ):
                os.write(2, b"noise\nwhy\n")
                raise RuntimeError("failed")
        assert capfd.readouterr().err == expected


def test_noisy_module_imports_through_the_filter(quiet, capfd, tmp_path):
    (tmp_path / "_noisy_for_test.py").write_text(
        "import os\nos.write(2, %r)\nos.write(2, b'kept\\n')\nVALUE = 7\n" % (CUDNN + GYM)
    )
    quiet.syspath_prepend(str(tmp_path))
    quiet.setitem(third_party._NOISY_IMPORTS, "_noisy_for_test", None)
    # Two of them (one a command installed already, say) find the module once, not forever.
    quiet.setattr(
        sys,
        "meta_path",
        [third_party._ThirdPartyImporter(), third_party._ThirdPartyImporter(), *sys.meta_path],
    )
    quiet.delitem(sys.modules, "_noisy_for_test", raising=False)
    import _noisy_for_test

    assert _noisy_for_test.VALUE == 7
    assert _noisy_for_test.__loader__.__class__.__name__ != "_ThirdPartyLoader"  # its own loader
    assert capfd.readouterr().err == "kept\n"


def test_developer_warnings_of_other_packages_go_to_debug(quiet, caplog):
    shown = []
    router = third_party._WarningRouter(lambda *args: shown.append(args[1]))
    elsewhere = os.path.join(os.sep, "site-packages", "gymnasium", "registration.py")
    with caplog.at_level(logging.DEBUG, logger="py.warnings"):
        router("CartPole-v0 is out of date", DeprecationWarning, elsewhere, 517)
        router("old", FutureWarning, elsewhere, 1)
        router("a real problem", UserWarning, elsewhere, 2)
        router("memoire's own", DeprecationWarning, third_party.__file__, 3)
    assert shown == [UserWarning, DeprecationWarning]  # the last: raised by memoire's code
    assert [r.levelno for r in caplog.records] == [logging.DEBUG, logging.DEBUG]
    assert "CartPole-v0 is out of date" in caplog.records[0].getMessage()
    quiet.setattr(third_party, "_quiet", False)
    router("old", DeprecationWarning, elsewhere, 1)
    assert shown[-1] is DeprecationWarning  # debug: shown as Python would


def _record(name, message, level=logging.WARNING):
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


def test_log_filter_drops_known_notices_and_says_other_messages_once(quiet):
    f = third_party._ChatterFilter()
    assert not f.filter(_record("absl", "DEPRECATION WARNING: Logger is being deprecated. X"))
    assert not f.filter(_record("tensorflow", "From x.py:98: f (from m) is deprecated and ..."))
    assert f.filter(_record("jax._src.xla_bridge", "a GPU may be present"))
    assert not f.filter(_record("jax._src.xla_bridge", "a GPU may be present"))  # said once
    assert f.filter(_record("memoire.x", "mine")) and f.filter(_record("memoire.x", "mine"))
    quiet.setattr(third_party, "_quiet", False)
    assert f.filter(_record("absl", "DEPRECATION WARNING: Logger is being deprecated. X"))


def test_tf_log_level_is_set_for_quiet_and_taken_back_for_debug(monkeypatch):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    monkeypatch.setattr(third_party, "_env_set", {})
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(third_party, "_quiet", third_party._quiet)
    third_party.quiet_third_party(True)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"
    third_party.quiet_third_party(False)
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    # A value the user set is theirs, at any level.
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    third_party.quiet_third_party(True)
    third_party.quiet_third_party(False)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"
    # Installed once however often it is called.
    assert sum(isinstance(f, third_party._ThirdPartyImporter) for f in sys.meta_path) == 1
    assert isinstance(warnings.showwarning, third_party._WarningRouter)


def test_heavy_imports_run_with_the_collector_paused_and_freeze_what_they_built(
    monkeypatch, tmp_path
):
    """The outermost import of a heavy package's module runs with the cyclic collector off
    (nested ones inside it too); afterwards the collector is back on and what the import built
    is frozen. With the collector off already (a program's own choice), it stays off."""
    pkg = tmp_path / "_heavy_for_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import gc\nON_AT_IMPORT = gc.isenabled()\n")
    (pkg / "sub.py").write_text(
        "import gc\nfrom _heavy_for_test import inner\nON_AT_IMPORT = gc.isenabled()\n"
        "BUILT = [[i] for i in range(1000)]\n"
    )
    (pkg / "inner.py").write_text("import gc\nON_AT_IMPORT = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        third_party, "_HEAVY_PACKAGES", third_party._HEAVY_PACKAGES | {"_heavy_for_test"}
    )
    monkeypatch.setattr(sys, "meta_path", [third_party._ThirdPartyImporter(), *sys.meta_path])
    for name in ("_heavy_for_test", "_heavy_for_test.sub", "_heavy_for_test.inner"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert gc.isenabled()
    gc.unfreeze()
    frozen = gc.get_freeze_count()
    try:
        import _heavy_for_test.sub as sub

        assert not sub.ON_AT_IMPORT and not sub.inner.ON_AT_IMPORT
        assert not sys.modules["_heavy_for_test"].ON_AT_IMPORT
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + len(sub.BUILT)
    finally:
        gc.unfreeze()

    monkeypatch.delitem(sys.modules, "_heavy_for_test.inner")
    gc.disable()
    try:
        import _heavy_for_test.inner  # noqa: F401

        assert not gc.isenabled()  # the program's choice, kept
    finally:
        gc.enable()


def test_a_finished_progress_bar_leaves_no_line_behind(capsys):
    """A bar on a terminal goes at its end: no line of its own (blank where log lines cleared
    it) is left on stderr after the command's last log line."""
    pytest.importorskip("tqdm")
    from memoire import progress

    with progress.Progress(2, "iterations", logging.getLogger("memoire.test"), bar=True) as bar:
        bar.update(1)
        bar.update(1)
    err = capsys.readouterr().err
    assert err.startswith("\riterations:") and "\n" not in err, repr(err)
