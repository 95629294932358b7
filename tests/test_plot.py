"""memoire plot: learning curves from synthetic trackers."""

import json
import os

import numpy as np
import pytest

from memoire.experiments import plot, trackers


def _fake_run(base, setting, run, slope, episodes=40):
    d = os.path.join(base, f"setting_{setting}", f"run_{run}")
    t = trackers.EpisodeTracker(d)
    for i in range(episodes):
        t.record(iteration=i // 10, phase="train", episode_return=slope * i + run,
                 length=50, terminated=i % 3 != 0)
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


def test_aggregate_mean_and_spread():
    a = (np.array([1, 2, 3]), np.array([1.0, 2.0, 3.0]))
    b = (np.array([1, 2]), np.array([3.0, 4.0]))
    x, mean, std, count = plot.aggregate([a, b])
    assert list(x) == [1, 2, 3]
    np.testing.assert_allclose(mean, [2.0, 3.0, 3.0])
    np.testing.assert_allclose(std, [1.0, 1.0, 0.0])
    assert list(count) == [2, 2, 1]


def test_binned_curve_groups_train_steps(tmp_path):
    _fake_run(str(tmp_path), 0, 0, 1.0, episodes=4)  # env_steps 50, 100, 150, 200
    x, y = plot.binned_curve(os.path.join(str(tmp_path), "setting_0", "run_0"), "train", 100)
    assert list(x) == [100, 200]
    np.testing.assert_allclose(y, [0.5, 2.5])


@pytest.mark.dopamine
def test_plot_main_errors_without_runs(tmp_path, capsys):
    assert plot.main([str(tmp_path)]) == 2
    assert "no setting_" in capsys.readouterr().err
