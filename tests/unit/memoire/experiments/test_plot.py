"""memoire plot: learning curves from synthetic trackers."""

import json
import os

import numpy as np
import pytest

from memoire.commands import plot as plot_command
from memoire.experiments import plot, trackers


def _fake_run(base, setting, run, slope, episodes=40):
    d = os.path.join(base, f"setting_{setting}", f"run_{run}")
    t = trackers.EpisodeTracker(d)
    for i in range(episodes):
        t.record(
            iteration=i // 10,
            phase="train",
            episode_return=slope * i + run,
            length=50,
            terminated=i % 3 != 0,
        )
    t.close()
    with open(os.path.join(d, "setting.json"), "w") as f:
        json.dump({"bindings": [f"A.x = {slope}"]}, f)


@pytest.mark.dopamine
def test_plot_writes_png_with_one_line_per_setting(tmp_path):
    base = str(tmp_path)
    for s, slope in enumerate((1.0, 2.0)):
        for r in range(3):
            _fake_run(base, s, r, slope)
    runs = plot.find_runs(base)
    assert sorted(runs) == [0, 1] and all(len(v) == 3 for v in runs.values())
    out = plot.plot(base, bin_steps=500)
    assert out == os.path.join(base, "learning_curves.png")
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(out) > 5000
    # --raw draws the runs' own curves too: another picture, written where --out says.
    raw_out = str(tmp_path / "raw.png")
    assert plot_command.main([base, "--bin", "500", "--raw", "--out", raw_out]) == 0
    with open(raw_out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(out, "rb") as f1, open(raw_out, "rb") as f2:
        assert f1.read() != f2.read()


def test_align_puts_runs_on_common_x_with_nan_where_a_run_stopped():
    a = (np.array([1, 2, 3]), np.array([1.0, 2.0, 3.0]))
    b = (np.array([1, 2]), np.array([3.0, 4.0]))
    x, table = plot.align([a, b])
    assert list(x) == [1, 2, 3]
    np.testing.assert_array_equal(table, [[1.0, 2.0, 3.0], [3.0, 4.0, np.nan]])


def test_iqm_of_known_sets_equals_hand_computation():
    # 8 runs: drop the 2 lowest and 2 highest, mean of the middle 4 (rliable's IQM).
    eight = [10.0, 0.0, 7.0, 1.0, 100.0, 3.0, 5.0, -50.0]  # sorted: -50 0 1 3 5 7 10 100
    assert plot.iqm(eight) == pytest.approx((1 + 3 + 5 + 7) / 4)
    # 3 runs: the middle 50% of the quantiles holds 1/4 of the lowest and highest run's mass
    # and all of the median's: weights 1/6, 2/3, 1/6.
    assert plot.iqm([9.0, 0.0, 3.0]) == pytest.approx(0 / 6 + 3 * 2 / 3 + 9 / 6)
    # 2-D: per point; NaN (a run without that point) is left out, one run is its own IQM.
    table = np.array([[1.0, 5.0], [2.0, np.nan], [3.0, np.nan], [4.0, np.nan]])
    np.testing.assert_allclose(plot.iqm(table), [2.5, 5.0])


def test_iqm_matches_trimmed_mean_when_runs_divide_by_four():
    stats = pytest.importorskip("scipy.stats", reason="scipy is the reference, not a dependency")
    scores = np.random.default_rng(1).normal(size=(12, 7))
    np.testing.assert_allclose(plot.iqm(scores), stats.trim_mean(scores, 0.25, axis=0))


def test_iqm_ci_contains_iqm_narrows_with_more_runs_and_is_reproducible():
    rng = np.random.default_rng(7)
    few = rng.normal(100.0, 20.0, size=(5, 30))
    many = rng.normal(100.0, 20.0, size=(80, 30))
    widths = {}
    for name, scores in (("few", few), ("many", many)):
        low, high = plot.iqm_ci(scores, reps=1000, seed=3)
        center = plot.iqm(scores)
        assert low.shape == high.shape == (30,)
        assert np.all(low <= center) and np.all(center <= high)
        widths[name] = np.mean(high - low)
    assert widths["many"] < 0.5 * widths["few"]
    first = plot.iqm_ci(few, reps=500, seed=11)
    np.testing.assert_array_equal(first, plot.iqm_ci(few, reps=500, seed=11))
    assert not np.array_equal(first, plot.iqm_ci(few, reps=500, seed=12))
    # Evaluated in blocks to bound memory: the blocks change nothing.
    np.testing.assert_array_equal(first, plot.iqm_ci(few, reps=500, seed=11, max_elements=64))


def test_iqm_ci_of_identical_runs_is_a_point_and_wider_confidence_is_wider():
    same = np.tile([1.0, 2.0, 3.0], (4, 1))
    low, high = plot.iqm_ci(same, reps=50)
    np.testing.assert_array_equal(low, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(high, [1.0, 2.0, 3.0])
    scores = np.random.default_rng(0).normal(size=(6, 5))
    lo90, hi90 = plot.iqm_ci(scores, confidence=0.9)
    lo99, hi99 = plot.iqm_ci(scores, confidence=0.99)
    assert np.all(lo99 <= lo90) and np.all(hi90 <= hi99)


def test_bad_input_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="no runs"):
        plot.align([])
    with pytest.raises(ValueError, match=r"run 1: x and y must be 1-D arrays of one length"):
        plot.align(
            [(np.array([1, 2]), np.array([1.0, 2.0])), (np.array([1, 2, 3]), np.array([1.0, 2.0]))]
        )
    with pytest.raises(ValueError, match="distinct"):
        plot.align([(np.array([1, 1]), np.array([1.0, 2.0]))])
    for bad in ([], np.zeros((0, 3)), np.zeros((2, 2, 2)), 5.0):
        with pytest.raises(ValueError, match="at least one run"):
            plot.iqm(bad)
        with pytest.raises(ValueError, match="at least one run"):
            plot.iqm_ci(bad)
    with pytest.raises(ValueError, match="reps must be >= 1"):
        plot.iqm_ci([1.0, 2.0], reps=0)
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\)"):
        plot.iqm_ci([1.0, 2.0], confidence=95)


def test_binned_curve_groups_train_steps(tmp_path):
    _fake_run(str(tmp_path), 0, 0, 1.0, episodes=4)  # env_steps 50, 100, 150, 200
    x, y = plot.binned_curve(os.path.join(str(tmp_path), "setting_0", "run_0"), "train", 100)
    assert list(x) == [100, 200]
    np.testing.assert_allclose(y, [0.5, 2.5])


def test_eval_points_align_on_iterations_not_on_drifting_steps(tmp_path):
    # Train phases end on episode boundaries: run 0 trains 120 steps an iteration, run 1 180,
    # so their eval rows' env steps drift apart; each iteration is still one point.
    for run, (length, scale) in enumerate(((40, 1.0), (60, 10.0))):
        t = trackers.EpisodeTracker(str(tmp_path / "setting_0" / f"run_{run}"))
        for it in range(3):
            for _ in range(3):
                t.record(
                    iteration=it, phase="train", episode_return=1.0, length=length, terminated=True
                )
            t.record(
                iteration=it, phase="eval", episode_return=scale * it, length=200, terminated=False
            )
            t.record(
                iteration=it,
                phase="eval",
                episode_return=scale * (it + 1),
                length=200,
                terminated=False,
            )
        t.close()
    dirs = plot.find_runs(str(tmp_path))[0]
    it, steps, ret = plot.iteration_curve(dirs[0], "eval")
    assert list(it) == [0, 1, 2]
    np.testing.assert_allclose(steps, [120, 240, 360])
    np.testing.assert_allclose(ret, [0.5, 1.5, 2.5])
    x, table = plot.run_table(dirs, "eval", 100)
    np.testing.assert_allclose(x, [150, 300, 450])  # the runs' mean training steps
    np.testing.assert_allclose(table, [[0.5, 1.5, 2.5], [5.0, 15.0, 25.0]])
    assert plot.run_table(dirs, "nothing", 100) is None


@pytest.mark.dopamine
def test_plot_main_errors_without_runs(tmp_path, capsys):
    assert plot_command.main([str(tmp_path)]) == 2
    assert "no setting_" in capsys.readouterr().err


@pytest.mark.dopamine
def test_plot_main_refuses_bad_reps(tmp_path, capsys):
    _fake_run(str(tmp_path), 0, 0, 1.0)
    assert plot_command.main([str(tmp_path), "--reps", "0"]) == 2
    assert "reps must be >= 1" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "learning_curves.png")


@pytest.mark.dopamine  # matplotlib
def test_legend_sits_below_the_axes_whole_and_inside_the_saved_picture(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    base = str(tmp_path)
    long = [f"SomeVeryLongConfigurableName.parameter_{k} = {k}" for k in range(6)]
    for s, slope in enumerate((1.0, 2.0)):
        for r in range(2):
            _fake_run(base, s, r, slope)
        with open(os.path.join(base, f"setting_{s}", "run_0", "setting.json"), "w") as f:
            json.dump({"bindings": long}, f)
    drawn = {
        s: (dirs, plot.run_table(dirs, "train", 500)) for s, dirs in plot.find_runs(base).items()
    }
    fig = plot.draw(drawn, "train", raw=False, reps=50, seed=0, title="t")
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    legend = ax.get_legend()
    box, axes_box = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert box.y1 < axes_box.y0  # below the axes: off the data
    # Each setting's name is whole: every binding is in its entry (wrapped, never cut).
    texts = [" ".join(t.get_text().split()) for t in legend.get_texts()]
    assert len(texts) == 2
    for text in texts:
        for b in long:
            assert b.replace(" ", "") in text.replace(" ", ""), text
    # The saved picture ("tight") holds the whole legend.
    tight = fig.get_tightbbox(renderer)
    inches = box.transformed(fig.dpi_scale_trans.inverted())
    assert tight.x0 <= inches.x0 and inches.x1 <= tight.x1 and tight.y0 <= inches.y0
    out = plot.plot(base, bin_steps=500, reps=50)
    from PIL import Image

    width, height = Image.open(out).size
    assert height > 500 and width > 700  # taller than 8x5 in at 100 dpi: the legend below
