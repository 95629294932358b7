#!/usr/bin/env bash
# The core as a user gets it from `pip install .`: a fresh virtual environment (CPython 3.12 where
# present, else python3) with the newest numpy 2.x and pyzmq that pip picks today, no Dopamine,
# TensorFlow, JAX or gym; then every test that does not need Dopamine (-m "not dopamine").
# Usage: scripts/core_only.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CORE_VENV:-build/core-venv}
if [ -z "${CORE_PYTHON:-}" ]; then
  # pyenv installs a shim for every version it has; only a runnable one counts.
  for CORE_PYTHON in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 python3; do
    "$CORE_PYTHON" -c "" 2>/dev/null && break
  done
fi
PY=$CORE_PYTHON
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# A private build folder: the developer build in build/ belongs to the main interpreter.
"$VENV/bin/python" -m pip install -q ".[test]" --config-settings=build-dir=build/core-{wheel_tag}
"$VENV/bin/python" - <<'PY'
import importlib.util, sys, numpy, zmq
absent = [m for m in ("dopamine", "tensorflow", "jax", "gym", "gymnasium", "matplotlib")
          if importlib.util.find_spec(m) is not None]
if absent:
    sys.exit(f"core-only environment unexpectedly has {absent}")
print(f"[core-only] python {sys.version.split()[0]}, numpy {numpy.__version__}, pyzmq {zmq.__version__}")
PY
# pytest, not `python -m pytest`, so that the source tree does not shadow the installed extension.
"$VENV/bin/pytest" -q -p no:cacheprovider -m "not dopamine" "$@"
