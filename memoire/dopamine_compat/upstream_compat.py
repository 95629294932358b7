"""What Dopamine 4.1.2 needs to run on today's Python stack, applied once, only where needed.

Dopamine 4.1.2 (its last release) and tensorflow-probability 0.25 (its last release) predate
Keras 3.12 and JAX 0.7. On a stack that has those (constraints/current.txt: TensorFlow 2.21,
JAX 0.12), two steps make Dopamine's stock agents run unmodified; on the pinned stack
(constraints/dopamine.txt) neither is needed and neither is applied. Each step has a version
check (:func:`needed`) and a test (tests/unit/memoire/dopamine_compat/test_upstream_compat.py) that fails if the step stops
being needed or stops working:

``legacy_keras``
    Dopamine builds its TF networks as ``tf.keras.Model`` subclasses configured by gin. Under
    Keras 3.12+ as ``tf.keras`` (TensorFlow 2.16+ default) building one fails (``IndexError: list
    index out of range`` in keras/src/ops/operation.py, "In call to configurable
    'CartpoleDQNNetwork'"), and Dopamine's TF code hands Keras 3 variables to ``tf.Session``.
    The step sets ``TF_USE_LEGACY_KERAS=1``, TensorFlow's own switch to tf-keras (Keras 2, a
    dependency of dopamine-rl), which TensorFlow reads when it is first imported: so it is
    applied when this module is imported, where TensorFlow is not imported yet, and a warning
    says what to do when it already is. ``import keras`` still gives Keras 3.

``xla_pytype_aval_mappings``
    tensorflow-probability's JAX substrate (imported by every Dopamine JAX agent, through
    dopamine/jax/networks.py) registers its variable type in
    ``jax.interpreters.xla.pytype_aval_mappings``, deprecated in JAX 0.5 and removed in 0.7
    (tensorflow/probability#2010): the import fails with ``AttributeError``. The step restores
    the attribute as JAX's current mapping (``jax.core.pytype_aval_mappings``, the replacement
    JAX names) just before that substrate is first imported (a finder on ``sys.meta_path``
    that acts on that one package, then removes itself), so importing memoire imports no JAX.

:func:`apply` runs both (idempotent); ``memoire.dopamine_compat`` calls it on import, so every
memoire module that reaches Dopamine does (memoire train, the JAX and TF faces, gin_registry).
A script of one's own imports ``memoire.dopamine_compat`` before Dopamine or TensorFlow.
Dopamine's own runner, which imports Dopamine before any gin file names memoire, starts
through this module on such a stack::

    python -m memoire.dopamine_compat.upstream_compat dopamine.discrete_domains.train \\
        --base_dir runs/x --gin_files f.gin

(the steps, then ``python -m dopamine.discrete_domains.train --base_dir ...`` in this process).
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import logging
import os
import re
import sys
import warnings
from typing import Dict, Optional, Tuple

_log = logging.getLogger(__name__)

# The package whose import needs the JAX attribute (ops.py registers NumpyVariable on import).
_TFP_JAX_BACKEND = "tensorflow_probability.python.internal.backend.jax"


def _version(dist: str) -> Optional[Tuple[int, ...]]:
    """The installed distribution's release as integers (``"3.15.1"``: ``(3, 15, 1)``,
    ``"2.22.0rc0"``: ``(2, 22, 0)``); None if it is not installed."""
    try:
        text = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    release = re.match(r"\d+(\.\d+)*", text)
    return tuple(int(n) for n in release.group(0).split(".")) if release else None


def needed() -> Dict[str, bool]:
    """Which steps this environment needs, from installed versions (nothing is imported)."""
    keras, tf, tfp, jax = (
        _version(d) for d in ("keras", "tensorflow", "tensorflow-probability", "jax")
    )
    return {
        # TensorFlow 2.16+ makes tf.keras Keras 3; Dopamine's gin networks break from Keras 3.12
        # (3.6, the pinned stack's, works).
        "legacy_keras": tf is not None and tf >= (2, 16) and keras is not None and keras >= (3, 12),
        # tfp 0.25 is the last release and uses the attribute JAX 0.7 removed.
        "xla_pytype_aval_mappings": (
            tfp is not None and tfp < (0, 26) and jax is not None and jax >= (0, 7)
        ),
    }


def _apply_legacy_keras() -> None:
    if os.environ.get("TF_USE_LEGACY_KERAS") is not None:
        return  # the user chose; TensorFlow reads it as they set it
    if "tensorflow" in sys.modules:
        _log.warning(
            "TensorFlow was imported before memoire.dopamine_compat, with Keras 3 as tf.keras: "
            "Dopamine's TF networks will fail to build. Import memoire.dopamine_compat first, "
            "or set TF_USE_LEGACY_KERAS=1 in the environment."
        )
        return
    if _version("tf-keras") is None:
        _log.warning(
            "Dopamine's TF networks need tf-keras under Keras %s: pip install tf-keras",
            ".".join(map(str, _version("keras") or ())),
        )
        return
    os.environ["TF_USE_LEGACY_KERAS"] = "1"


def _restore_xla_pytype_aval_mappings() -> None:
    """Makes ``jax.interpreters.xla.pytype_aval_mappings`` JAX's current mapping."""
    import jax
    import jax.interpreters.xla as xla

    if not hasattr(xla, "pytype_aval_mappings"):
        # The name JAX's removal message gives as the replacement, itself deprecated since: its
        # DeprecationWarning would be memoire's line on every run (tfp's own access warns
        # from tfp's module, hidden by Python's default filters).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            xla.pytype_aval_mappings = jax.core.pytype_aval_mappings


class _BeforeTfpJaxBackend(importlib.abc.MetaPathFinder):
    """Runs the JAX step when tfp's JAX backend is first looked for, then leaves ``sys.meta_path``.

    It finds nothing itself (returns None): the import goes on through the usual finders."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TFP_JAX_BACKEND:
            return None
        sys.meta_path.remove(self)
        _restore_xla_pytype_aval_mappings()
        return None


_applied = False


def apply() -> Dict[str, bool]:
    """Applies the steps :func:`needed` names, once per process; returns that dict."""
    global _applied
    steps = needed()
    if _applied:
        return steps
    _applied = True
    if steps["legacy_keras"]:
        _apply_legacy_keras()
    if steps["xla_pytype_aval_mappings"]:
        if "jax" in sys.modules:
            _restore_xla_pytype_aval_mappings()  # JAX is loaded already: nothing to defer
        else:
            sys.meta_path.insert(0, _BeforeTfpJaxBackend())
    return steps


def _run_module(argv) -> None:
    """``python -m memoire.dopamine_compat.upstream_compat MODULE ARGS...``: the steps, then
    MODULE run as ``__main__`` with ARGS (``sys.argv[0]`` its file), as ``python -m MODULE``."""
    import runpy

    if not argv or argv[0].startswith("-"):
        sys.exit(
            "usage: python -m memoire.dopamine_compat.upstream_compat MODULE [ARGS...] "
            "(e.g. dopamine.discrete_domains.train --base_dir runs/x --gin_files f.gin)"
        )
    apply()
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    # The importable copy (memoire.dopamine_compat imported it, and applied the steps there):
    # one record of what was applied per process.
    from memoire.dopamine_compat import upstream_compat

    upstream_compat._run_module(sys.argv[1:])
