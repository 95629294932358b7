"""`memoire train --launcher ray` started from a source checkout keeps the checkout off its
workers' sys.path: Ray adds the driver's working directory unless the job has a working_dir,
so connect() gives it an empty one there (checked by hand against a local Ray 2.60 cluster:
a worker's sys.path held the checkout without it, not with it)."""

import os

from memoire.experiments import ray_launcher


def test_a_checkout_gets_an_empty_working_dir(tmp_path, monkeypatch):
    (tmp_path / "memoire").mkdir()
    monkeypatch.chdir(tmp_path)
    env = ray_launcher._off_the_checkout()["runtime_env"]
    assert os.path.isdir(env["working_dir"]) and not os.listdir(env["working_dir"])
    assert not os.path.samefile(env["working_dir"], tmp_path)


def test_elsewhere_ray_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ray_launcher._off_the_checkout() == {}
