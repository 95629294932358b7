#!/usr/bin/env bash
# The learner crash seen on the device machine (a segmentation fault in a native thread of the
# learner at the start of the first rows stream of benchmarks/bench_remote_sampling.py; once in
# 5 full runs, never on 2 cores): the device_stream.sh build, then short full runs in a loop
# with a native fault tracer preloaded (benchmarks/_segv_trace.c), until one crashes or the time
# is up; the crashing run's log (backtrace and mappings) and the extension (for addr2line) are
# left in $OUT.
#
#   OUT=/tmp/out BUDGET=200 bash benchmarks/device_crash.sh    # carry build/device-wheels
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/_device_setup.sh
source benchmarks/_device_setup.sh
cp build/dev/_core*.so "$OUT/" 2>/dev/null
gcc -shared -fPIC -O1 -o "$OUT/segv_trace.so" benchmarks/_segv_trace.c || exit 1
end=$((SECONDS + ${BUDGET:-200}))
i=0
while [ $SECONDS -lt $end ]; do
  i=$((i + 1))
  LD_PRELOAD="$OUT/segv_trace.so" timeout 60 $PY -X faulthandler benchmarks/bench_remote_sampling.py \
    --fill 20000 --seconds 0.5 --rounds 1 --stream-threads 1,2,4 >"$OUT/try$i.log" 2>&1
  rc=$?
  echo "=== try $i: exit $rc ($(date -u +%T))"
  if [ $rc -ne 0 ]; then
    grep -v '^[0-9a-f]*-[0-9a-f]* ' "$OUT/try$i.log" | head -80
    grep -E '_core|zmq' "$OUT/try$i.log" | grep '^[0-9a-f]*-' | head -12
    break
  fi
  rm -f "$OUT/try$i.log"
done
