# Sourced by the device machine's scripts (device_gpu_feed.sh, device_stream.sh), from the
# repository root: the log folder, the step runner, the machine's description, the carried wheels
# and memoire's build. The image has Python 3.12, JAX with CUDA, PyTorch and no network; pyzmq
# and gin-config come as cp312 wheels carried in build/device-wheels/.
#
#   OUT           where each step's log goes (default build/device-out)
#   PYTHON        the interpreter (default python3)
#   SKIP_BUILD=1  use the extension already in memoire/ (a check of a script on a CPU machine)
OUT=${OUT:-$(pwd)/build/device-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
# The image's default compiler (the CXX its environment sets) links libstdc++ statically, and
# that extension crashes the first time it formats a number into a message: the learner's
# receiving thread did so per batch (a segmentation fault in std::ostream under
# ReadErrorMessage, stop 34). So Ubuntu's own GCC, always, whatever CXX says; the build step
# below stops the script if the extension still carries its own libstdc++.
export CXX=/usr/bin/g++ CC=/usr/bin/gcc CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
# JAX would take 75% of the GPU's memory up front; PyTorch runs in the same process.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1

step() {  # step NAME TIMEOUT_S COMMAND...: runs it, logs to $OUT/NAME.log, prints its status
  local name=$1 limit=$2
  shift 2
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s, load $(cut -d' ' -f1-3 /proc/loadavg)) ==="
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
  $PY - <<'PYEOF'
import glob, site, sys
for d in sys.path:
    for p in sorted(glob.glob(d + '/nvidia/*/lib/libcudart.so*')):
        print('cudart candidate:', p)
PYEOF
"

if ls build/device-wheels/*.whl >/dev/null 2>&1; then
  step wheels 120 $PY -m pip install --no-index --no-deps --target build/device-pydeps build/device-wheels/*.whl
  export PYTHONPATH="$(pwd)/build/device-pydeps${PYTHONPATH:+:$PYTHONPATH}"
fi

# The extension into build/dev (and memoire/), with the C++ tests.
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  rm -rf build/dev
  step build 300 env PYTHON="$PY" scripts/dev_build.sh
  if ! readelf -d build/dev/_core*.so | grep -q 'NEEDED.*libstdc++'; then
    echo "=== the extension links libstdc++ statically (compiler: $CXX): stopping ==="
    exit 1
  fi
fi
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
