#!/usr/bin/env bash
# The feed's device path on a GPU machine: build memoire, check it (C++ ring test, a CUDA smoke
# test of the feed) and measure a learner's step rate fed by it (benchmarks/bench_gpu_feed.py).
# Written for the device machine's image (Python 3.12, JAX with CUDA, PyTorch, no network, no
# Dopamine/TF/gin/pyzmq); run from the repository root. Every step prints a banner and its exit
# status, logs into $OUT, and the script goes on after a failed step.
#
#   bash benchmarks/device_wheels.sh                            # here, first: the cp312 wheels
#   OUT=/tmp/out bash benchmarks/device_gpu_feed.sh            # there, about 5 minutes
# (with the device tool: run(command="OUT=$OUT bash benchmarks/device_gpu_feed.sh",
#  carry=["build/device-wheels"], timeout_s=600))
#   ROUNDS=3 SECONDS_PER=2 FILL=20000 BATCHES="32 256" ...      # the benchmark's settings
#   SKIP_BUILD=1 ...   # use the extension already in memoire/ (a check of the script on a CPU)
# (The setup shared with the other device scripts: benchmarks/_device_setup.sh.)
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SECONDS_PER=${SECONDS_PER:-2}
FILL=${FILL:-20000}
BATCHES=${BATCHES:-"32 256"}
# shellcheck source=benchmarks/_device_setup.sh
source benchmarks/_device_setup.sh

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
