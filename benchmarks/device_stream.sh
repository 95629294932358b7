#!/usr/bin/env bash
# The sampling stream on the device machine's 16 cores: build memoire, run the stream's C++
# tests, and measure a learner in its own process against the same learner in the server's
# process (benchmarks/bench_remote_sampling.py: every way, then with a learner's step) and the
# stream idle and under a writer (memoire's rows of benchmarks/bench_vs_reverb.py; Reverb is not
# on that machine). Needs only memoire, numpy, pyzmq and gin-config (carried wheels); run from the
# repository root. Every step prints a banner and its exit status, logs into $OUT, and the
# script goes on after a failed step.
#
#   OUT=/tmp/out bash benchmarks/device_stream.sh       # about 6 minutes on 16 cores
#   ROUNDS=3 SECONDS_PER=2 FILL=20000 THREADS=1,2,4 CONNECTIONS=1,2,4 ...  # the settings
#   FRAMES=build/device-screens.npy ...  # recorded screens (a .npy of uint8[m, 84, 84], e.g.
#       3,000 of benchmarks/_ale_frames.py's, carried): adds a rows stream from a memory that
#       compresses its states (the image has no Dopamine to record them)
#   SKIP_BUILD=1 ...   # use the extension already in memoire/ (a check of the script on a CPU)
# (The setup shared with the other device scripts: benchmarks/_device_setup.sh.)
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SECONDS_PER=${SECONDS_PER:-2}
FILL=${FILL:-20000}
THREADS=${THREADS:-1,2,4}
CONNECTIONS=${CONNECTIONS:-1,2,4}
FRAMES=${FRAMES:-random}
# shellcheck source=benchmarks/_device_setup.sh
source benchmarks/_device_setup.sh

step import 60 $PY -c "
import memoire, memoire.stream, memoire.server
from memoire.server.sampling_service import default_stream_threads
print('memoire', memoire.__file__, 'default stream threads:', default_stream_threads())
"
step stream_batch_test 120 build/dev/stream_batch_test
step remote_sampling 300 $PY -X faulthandler benchmarks/bench_remote_sampling.py --fill "$FILL" \
  --seconds "$SECONDS_PER" --rounds "$ROUNDS" --stream-threads "$THREADS" --frames "$FRAMES" \
  --connections "$CONNECTIONS"
step remote_sampling_step 200 $PY -X faulthandler benchmarks/bench_remote_sampling.py --fill "$FILL" \
  --seconds "$SECONDS_PER" --rounds "$ROUNDS" --stream-threads "$THREADS" --shm-only --step-ms 0.25
step stream_vs_writer 300 $PY -X faulthandler benchmarks/bench_vs_reverb.py --only SamplingStream \
  --ale-frames none --repeats 2 --seconds "$SECONDS_PER"
echo "=== steps (name, exit status, seconds) ==="
cat "$OUT/steps.txt"
