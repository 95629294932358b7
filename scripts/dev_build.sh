#!/usr/bin/env bash
# Incremental developer build: compiles the extension (and C++ tests) into build/dev and copies
# _core into memoire/ so that `PYTHONPATH=. python -c "import memoire"` uses it.
# Usage: scripts/dev_build.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
# File by file (no unity build, unless the first run's options say otherwise): a one-file change
# recompiles that file only.
if [ ! -f build/dev/build.ninja ]; then
  cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEMOIRE_TESTS=ON \
    -DMEMOIRE_UNITY_BUILD=OFF \
    -Dpybind11_DIR="$($PY -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
    -DPython_EXECUTABLE="$(command -v $PY)" "$@" >/dev/null
elif ! grep -q '^MEMOIRE_UNITY_BUILD:' build/dev/CMakeCache.txt; then
  cmake build/dev -DMEMOIRE_UNITY_BUILD=OFF >/dev/null  # configured before the option existed
fi
cmake --build build/dev
cp build/dev/_core*.so memoire/
