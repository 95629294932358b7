"""memoire.dopamine_compat.upstream_compat: each step is needed exactly where its version check
says so, and works there.

Per step, one script runs twice in fresh interpreters: bare (Dopamine and its frameworks alone,
TF_USE_LEGACY_KERAS unset) and after ``import memoire.dopamine_compat``. The bare run must fail
with the step's upstream error exactly where ``needed()`` names the step (so the test fails once
an upstream release makes the step unneeded, and on a stack where the check misses a breakage),
and the run with memoire must succeed everywhere.
"""

import subprocess
import sys
import textwrap

import pytest
from _subprocess_env import assert_clean_exit, run_script, subprocess_env

from memoire.dopamine_compat import upstream_compat

NEEDED = upstream_compat.needed()


def _run(script: str, tmp_path, with_memoire: bool) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter whose environment has no TF_USE_LEGACY_KERAS (this
    process's import of memoire.dopamine_compat may have set it), preceded by
    ``import memoire.dopamine_compat`` when ``with_memoire``."""
    head = "import memoire.dopamine_compat\n" if with_memoire else ""
    env = subprocess_env()
    env.pop("TF_USE_LEGACY_KERAS", None)
    return subprocess.run(
        [sys.executable, "-c", head + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=str(tmp_path),
    )


# Dopamine's gin-configured Keras network for CartPole, built and called, as its TF DQN agent does;
# it prints the module tf.keras is (tf-keras's is "tf_keras.api._v2.keras").
KERAS_SCRIPT = """
import os
import numpy as np
import tensorflow as tf
from dopamine.discrete_domains import gym_lib
net = gym_lib.CartpoleDQNNetwork(2)
q = net(tf.zeros([1, 4, 1])).q_values
assert q.shape == (1, 2), q.shape
print("tf.keras", tf.keras.__name__, "TF_USE_LEGACY_KERAS", os.environ.get("TF_USE_LEGACY_KERAS"))
print("OK")
"""

# What every Dopamine JAX agent imports (dopamine/jax/networks.py: tfp's JAX substrate), and a
# distribution of it used.
JAX_SCRIPT = """
import sys
assert "jax" not in sys.modules, "JAX loaded before Dopamine's JAX networks"
from dopamine.jax import networks
from tensorflow_probability.substrates import jax as tfp
import jax.numpy as jnp
d = tfp.distributions.Categorical(probs=jnp.array([0.25, 0.75]))
assert abs(float(d.prob(1)) - 0.75) < 1e-6
print("OK")
"""


@pytest.mark.dopamine
@pytest.mark.slow
def test_legacy_keras_needed_exactly_where_checked_and_works(tmp_path):
    pytest.importorskip("dopamine")
    pytest.importorskip("tensorflow")
    bare = _run(KERAS_SCRIPT, tmp_path, with_memoire=False)
    if NEEDED["legacy_keras"]:
        assert bare.returncode != 0, (
            "the bare run passed: the legacy_keras step is no longer needed"
        )
        assert "IndexError" in bare.stderr, bare.stderr[-3000:]
    else:
        assert_clean_exit(bare)
    fixed = _run(KERAS_SCRIPT, tmp_path, with_memoire=True)
    assert_clean_exit(fixed)
    if NEEDED["legacy_keras"]:
        assert "TF_USE_LEGACY_KERAS 1" in fixed.stdout and "tf.keras tf_keras." in fixed.stdout, (
            fixed.stdout
        )
    else:  # not applied where not needed
        assert "TF_USE_LEGACY_KERAS None" in fixed.stdout, fixed.stdout


@pytest.mark.dopamine
@pytest.mark.slow
def test_xla_pytype_aval_mappings_needed_exactly_where_checked_and_works(tmp_path):
    pytest.importorskip("dopamine")
    pytest.importorskip("tensorflow_probability")
    pytest.importorskip("jax")
    bare = _run(JAX_SCRIPT, tmp_path, with_memoire=False)
    if NEEDED["xla_pytype_aval_mappings"]:
        assert bare.returncode != 0, "the bare run passed: the JAX step is no longer needed"
        assert "pytype_aval_mappings" in bare.stderr, bare.stderr[-3000:]
    else:
        assert_clean_exit(bare)
    # With memoire: importing memoire.dopamine_compat loads no JAX (the script checks), and the
    # substrate imports and works.
    assert_clean_exit(_run(JAX_SCRIPT, tmp_path, with_memoire=True))


def test_needed_reads_versions_without_importing_the_frameworks(tmp_path):
    proc = run_script(
        """
        import sys
        from memoire.dopamine_compat import upstream_compat
        steps = upstream_compat.needed()
        assert set(steps) == {"legacy_keras", "xla_pytype_aval_mappings"}, steps
        loaded = [m for m in ("tensorflow", "jax", "keras", "tensorflow_probability") if m in sys.modules]
        assert not loaded, loaded
        print("OK")
        """,
        tmp_path,
    )
    assert_clean_exit(proc)


def test_version_parsing():
    versions = {"a": "3.15.1", "b": "2.22.0rc0", "c": "0.12.0.1", "d": "2.21.0+cpu"}
    original = upstream_compat.importlib.metadata.version
    try:
        upstream_compat.importlib.metadata.version = versions.__getitem__
        assert upstream_compat._version("a") == (3, 15, 1)
        assert upstream_compat._version("b") == (2, 22, 0)
        assert upstream_compat._version("c") == (0, 12, 0, 1)
        assert upstream_compat._version("d") == (2, 21, 0)
    finally:
        upstream_compat.importlib.metadata.version = original
    assert upstream_compat._version("no-such-distribution-here") is None


def test_run_module_applies_the_steps_then_runs_the_module_as_main(tmp_path):
    (tmp_path / "probe_main.py").write_text(
        textwrap.dedent(
            """
            import os, sys
            import memoire.dopamine_compat.upstream_compat as uc
            print("name", __name__, "argv", sys.argv[1:], "applied", uc._applied)
            print("keras", os.environ.get("TF_USE_LEGACY_KERAS"))
            """
        )
    )
    env = subprocess_env(str(tmp_path))
    env.pop("TF_USE_LEGACY_KERAS", None)
    run = [sys.executable, "-m", "memoire.dopamine_compat.upstream_compat"]
    proc = subprocess.run(
        run + ["probe_main", "--base_dir", "x"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "name __main__ argv ['--base_dir', 'x'] applied True" in proc.stdout, proc.stdout
    want = "1" if NEEDED["legacy_keras"] else "None"
    assert f"keras {want}" in proc.stdout, proc.stdout
    usage = subprocess.run(
        run, capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path)
    )
    assert usage.returncode != 0
    assert "usage: python -m memoire.dopamine_compat.upstream_compat MODULE" in usage.stderr
