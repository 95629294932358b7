"""Probing Ray actors from a test (tests/system/test_ray_local.py, tests/system/test_ray_cluster.py); tests wait
with tests/helpers/_waiting.wait_until."""

import csv
import os


def _call(handle, method, default=None):
    """``handle.method()`` through Ray, or ``default`` when the actor is not there (yet)."""
    import ray

    try:
        return ray.get(getattr(handle, method).remote(), timeout=10)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return default


def _named(name):
    import ray

    try:
        return ray.get_actor(name, namespace="memoire")
    except ValueError:
        return None


def _rows(path):
    """The rows of a CSV file ([] while it does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
