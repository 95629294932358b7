#!/usr/bin/env bash
# Builds the core with AddressSanitizer + UndefinedBehaviorSanitizer and runs the C++ unit tests;
# then builds the Python extension the same way and runs tests/unit/memoire/test_memory*.py, the codec and
# server tests, the feed's device path (host stand-in), the chunk ingest into every store, sampling streams, the rate limiter and the checkpoint-loading fuzz
# (tests/hostile/test_checkpoint_fuzz.py) against it (libasan preloaded into the interpreter, leak detection off: CPython's arenas look like leaks).
# Usage: scripts/sanitize.sh            (C++ tests, then Python tests)
#        SANITIZE_PYTHON=0 scripts/sanitize.sh   (C++ tests only)
#        SANITIZE_BUILD_ONLY=1 scripts/sanitize.sh   (the build alone; a later run reuses it)
set -euo pipefail
cd "$(dirname "$0")/.."
# Absolute (the Python tests run from another folder), without resolving a venv's symlink.
PY=$(command -v "${PYTHON:-python}")
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"

# One sanitized build for both: the core is compiled once, linked into the C++ tests and (unless
# SANITIZE_PYTHON=0) into the extension.
python_args=(-DMEMOIRE_PYTHON=OFF)
if [ "${SANITIZE_PYTHON:-1}" != "0" ]; then
  python_args=(-DMEMOIRE_PYTHON=ON
    -Dpybind11_DIR="$($PY -c 'import pybind11; print(pybind11.get_cmake_dir())')"
    -DPython_EXECUTABLE="$PY")
fi
cmake -S . -B build/asan -G Ninja -DMEMOIRE_SANITIZE=ON -DMEMOIRE_TESTS=ON "${python_args[@]}" \
  -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build/asan
if [ "${SANITIZE_BUILD_ONLY:-0}" = 1 ]; then exit 0; fi
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  ctest --test-dir build/asan --output-on-failure

if [ "${SANITIZE_PYTHON:-1}" = "0" ]; then exit 0; fi

# The tests import the sanitized extension from a private copy of the package so the developer
# build in memoire/ is untouched.
PKG=build/asan/pkg
rm -rf "$PKG" && mkdir -p "$PKG"
cp -r memoire "$PKG/memoire"
rm -f "$PKG"/memoire/_core*.so
cp build/asan/_core*.so "$PKG/memoire/"
LIBASAN=$(${CXX:-g++} -print-file-name=libasan.so)
LIBUBSAN=$(${CXX:-g++} -print-file-name=libubsan.so)
# The tests run from a copy too, so that pytest's rootdir import finds the sanitized package.
# Two pytest-xdist workers, a module each at a time, as `make test`.
# (The rate limiter's end-to-end training run is left to `make test`: it needs configs/ and a
# TensorFlow and JAX learner, not the sanitized core.)
# allocator_may_return_null: a mutated checkpoint (tests/hostile/test_checkpoint_fuzz.py) may ask
# for more memory than there is; malloc then returns NULL, as it does outside the sanitizer, and
# the load is refused with MemoryError, where ASan's default aborts the process (the worker died
# at safe_unpickle's load, and pytest-xdist then waited for it).
cp -r tests "$PKG/tests"
cd "$PKG"
LD_PRELOAD="$LIBASAN $LIBUBSAN" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
PYTHONPATH=. "$PY" -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
  tests/unit/memoire/test_memory.py tests/unit/memoire/test_memory_returns.py tests/unit/memoire/test_memory_properties.py \
  tests/unit/memoire/test_memory_threads.py tests/unit/memoire/test_codec.py tests/hostile/test_codec_fuzz.py tests/unit/memoire/server/test_replay_memory_server.py \
  tests/hostile/test_checkpoint_fuzz.py \
  tests/unit/memoire/test__core_chunk_ingest.py tests/unit/memoire/test_experience.py tests/unit/memoire/test_memory_checkpoint.py \
  tests/unit/memoire/test_stream.py tests/unit/memoire/test_rate_limiter.py tests/unit/memoire/test_memory_compression.py \
  tests/unit/memoire/feed/test_feed_device.py \
  -k "not test_a_distributed_learner_keeps_its_replay_ratio" "$@"
