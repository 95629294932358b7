#!/usr/bin/env bash
# Creates .venv (CPython 3.10+), installs the pinned environment once, then builds and installs
# memoire into it. Safe to re-run: dependencies are reinstalled only when a pin file changes;
# the extension rebuilds incrementally from build/<wheel tag> (a plain `pip install .` builds in a
# temporary folder instead, leaving the checkout clean).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MEMOIRE_VENV:-.venv}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[bootstrap] creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.memoire-deps-$(cat constraints/dopamine.txt constraints/dev.txt | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "[bootstrap] installing pinned dependencies (first run: a few minutes, ~3 GB)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -c constraints/dopamine.txt -r constraints/dev.txt
  # Dopamine imports baselines.common.atari_wrappers without declaring it.
  "$VENV/bin/python" -m pip install -q -c constraints/dopamine.txt --no-deps baselines==0.1.5
  touch "$stamp"
fi
echo "[bootstrap] building and installing memoire"
"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation \
  --config-settings=build-dir='build/{wheel_tag}' .
