#!/usr/bin/env bash
# Incremental developer build: compiles the extension (and C++ tests) into build/dev and copies
# _core into memoire/ so that `PYTHONPATH=. python -c "import memoire"` uses it.
# Usage: scripts/dev_build.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if [ ! -f build/dev/build.ninja ]; then
  cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEMOIRE_TESTS=ON \
    -Dpybind11_DIR="$($PY -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
    -DPython_EXECUTABLE="$(command -v $PY)" "$@" >/dev/null
fi
# File by file (no unity build): a one-file change recompiles that file only. Set on every run,
# so a folder configured before the option existed gets it too.
cmake build/dev -DMEMOIRE_UNITY_BUILD=OFF >/dev/null
cmake --build build/dev
cp build/dev/_core*.so memoire/
