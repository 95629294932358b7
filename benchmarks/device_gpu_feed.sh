#!/usr/bin/env bash
# The feed's device path on a GPU machine: build memoire, check it (C++ ring test, a CUDA smoke
# test of the feed) and measure a learner's step rate fed by it (benchmarks/bench_gpu_feed.py).
# Written for the device machine's image (Python 3.12, JAX with CUDA, PyTorch, no network, no
# Dopamine/TF/gin/pyzmq); run from the repository root. Every step prints a banner and its exit
# status, logs into $OUT, and the script goes on after a failed step.
#
#   OUT=/tmp/out bash benchmarks/device_gpu_feed.sh            # about 5 minutes on an H100
#   ROUNDS=3 SECONDS_PER=2 FILL=20000 BATCHES="32 256" ...      # the benchmark's settings
#   SKIP_BUILD=1 ...   # use the extension already in memoire/ (a check of the script on a CPU)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(pwd)/build/device-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
ROUNDS=${ROUNDS:-3}
SECONDS_PER=${SECONDS_PER:-2}
FILL=${FILL:-20000}
BATCHES=${BATCHES:-"32 256"}
export CXX=${CXX:-/usr/bin/g++} CC=${CC:-/usr/bin/gcc} CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
# JAX would take 75% of the GPU's memory up front; PyTorch runs in the same process.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1

step() {  # step NAME TIMEOUT_S COMMAND...: runs it, logs to $OUT/NAME.log, prints its status
  local name=$1 limit=$2
  shift 2
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s) ==="
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after $((SECONDS - t0)) s ==="
  echo "$name $rc $((SECONDS - t0))" >>"$OUT/steps.txt"
}

: >"$OUT/steps.txt"
step env 60 bash -c "
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
  $PY --version; cat /proc/loadavg; nproc
  $PY -c 'import numpy, jax; print(\"numpy\", numpy.__version__, \"jax\", jax.__version__, jax.devices())'
  $PY -c 'import torch; print(\"torch\", torch.__version__, torch.version.cuda, torch.cuda.is_available())'
  $PY -c 'import cupy; print(\"cupy\", cupy.__version__)'
  $PY - <<'EOF'
import glob, site, sys
for d in sys.path:
    for p in sorted(glob.glob(d + '/nvidia/*/lib/libcudart.so*')):
        print('cudart candidate:', p)
EOF
"

# pyzmq (for memoire.stream; the feed itself does not need it) from the carried wheels.
if ls build/device-wheels/*.whl >/dev/null 2>&1; then
  step wheels 120 $PY -m pip install --no-index --no-deps --target build/device-pydeps build/device-wheels/*.whl
  export PYTHONPATH="$(pwd)/build/device-pydeps${PYTHONPATH:+:$PYTHONPATH}"
fi

# The extension into build/dev (and memoire/), with the C++ tests.
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  rm -rf build/dev
  step build 300 env PYTHON="$PY" scripts/dev_build.sh
fi
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"

step import 60 $PY -c "
import sys
for m in ('gin', 'dopamine', 'tensorflow'):
    sys.modules[m] = None  # the device path must not need them
import memoire, memoire.feed, memoire.memory, memoire._cuda as c
print('memoire', memoire.__version__, memoire.__file__)
rt = c.runtime()
print('CUDA runtime:', rt.path, rt.version, rt.device_count, 'device(s)')
"
step ring_test 60 build/dev/device_ring_test
step prefetch_test 60 build/dev/prefetch_test
step smoke 240 $PY benchmarks/gpu_feed_smoke.py --batch 32
# shellcheck disable=SC2086
step bench 420 $PY benchmarks/bench_gpu_feed.py --batch $BATCHES --rounds "$ROUNDS" \
  --seconds "$SECONDS_PER" --fill "$FILL" --torch --out "$OUT/bench.json"
echo "=== steps (name, exit status, seconds) ==="
cat "$OUT/steps.txt"
