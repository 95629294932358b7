#!/usr/bin/env bash
# The core's libFuzzer targets (cpp/fuzz/, docs/FUZZING.md), built with clang, AddressSanitizer
# and UndefinedBehaviorSanitizer into build/fuzz.
# Usage: scripts/fuzz.sh install               clang and its libFuzzer runtime (Debian, as root;
#                                              nothing when clang++ links a fuzzer already)
#        scripts/fuzz.sh build                 the targets and the corpus generator
#        scripts/fuzz.sh corpus                cpp/fuzz/corpus/<target>/seed-* rewritten by
#                                              make_corpus (the project's encoders)
#        scripts/fuzz.sh regress               every target over its committed corpus, each input
#                                              once (CI: a regression check, not a search)
#        scripts/fuzz.sh run TARGET [SECONDS] [libFuzzer flags...]
#                                              a campaign (default 600 s) on one target; its
#                                              corpus grows in build/fuzz/corpus/TARGET, crashes
#                                              land in build/fuzz/artifacts/TARGET/
#        scripts/fuzz.sh merge TARGET          the campaign's corpus minimised into the committed
#                                              one (cpp/fuzz/corpus/TARGET), new inputs only
#        scripts/fuzz.sh list                  the targets
# TARGET is a name of cpp/fuzz/<TARGET>_fuzz.cc (codec, lz4, chunk_ingest, ...). Clang: Debian's
# `apt-get install -y clang libclang-rt-14-dev` (or CXX=clang++-NN).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build/fuzz
CORPUS=cpp/fuzz/corpus
CXX=${CXX:-clang++}
CC=${CC:-${CXX/clang++/clang}}
# Leaks count as crashes; a UBSan report stops the run with its stack.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

targets() {
  for f in cpp/fuzz/*_fuzz.cc; do
    f=${f##*/}
    echo "${f%_fuzz.cc}"
  done
}

build() {
  if ! command -v "$CXX" >/dev/null; then
    echo "fuzz: $CXX not found (Debian: apt-get install -y clang libclang-rt-14-dev)" >&2
    exit 1
  fi
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
    -DMEMOIRE_FUZZ=ON -DMEMOIRE_PYTHON=OFF -DMEMOIRE_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$BUILD"
}

# The target's executable, built (a clear message if not).
exe() {
  local t=$1
  if [ ! -f "cpp/fuzz/${t}_fuzz.cc" ]; then
    echo "fuzz: no target '$t' (targets: $(targets | tr '\n' ' '))" >&2
    exit 2
  fi
  if [ ! -x "$BUILD/${t}_fuzz" ]; then
    echo "fuzz: $BUILD/${t}_fuzz is not built: run scripts/fuzz.sh build" >&2
    exit 1
  fi
  echo "$BUILD/${t}_fuzz"
}

# True when $CXX links a libFuzzer target.
has_libfuzzer() {
  command -v "$CXX" >/dev/null || return 1
  local dir
  dir=$(mktemp -d)
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
    >"$dir/t.cc"
  "$CXX" -fsanitize=fuzzer,address,undefined "$dir/t.cc" -o "$dir/t" 2>/dev/null
  local ok=$?
  rm -rf "$dir"
  return $ok
}

case "${1:-}" in
  install)
    if has_libfuzzer; then
      echo "fuzz: $CXX links libFuzzer targets"
      exit 0
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
    has_libfuzzer || { echo "fuzz: $CXX still cannot link libFuzzer targets" >&2; exit 1; }
    echo "fuzz: installed $($CXX --version | head -n 1)"
    ;;
  build) build ;;
  list) targets ;;
  corpus)
    [ -x "$BUILD/make_corpus" ] || build
    "$BUILD/make_corpus" "$CORPUS"
    ;;
  regress)
    # Each committed input once per target: a crash, leak or sanitizer report fails the run.
    total=0
    for t in $(targets); do
      bin=$(exe "$t")
      inputs=("$CORPUS/$t"/*)
      if [ ! -e "${inputs[0]}" ]; then
        echo "fuzz: no committed corpus for $t ($CORPUS/$t)" >&2
        exit 1
      fi
      "$bin" -timeout=20 -rss_limit_mb=2048 "${inputs[@]}" >"$BUILD/regress-$t.log" 2>&1 || {
        cat "$BUILD/regress-$t.log" >&2
        echo "fuzz: $t failed on its corpus (log above)" >&2
        exit 1
      }
      echo "fuzz: $t: ${#inputs[@]} inputs passed"
      total=$((total + ${#inputs[@]}))
    done
    echo "fuzz: every target passed its committed corpus ($total inputs)"
    ;;
  run)
    t=${2:?usage: scripts/fuzz.sh run TARGET [SECONDS] [libFuzzer flags...]}
    seconds=${3:-600}
    shift $(($# < 3 ? $# : 3))
    bin=$(exe "$t")
    mkdir -p "$BUILD/corpus/$t" "$BUILD/artifacts/$t"
    # The campaign's own corpus first (libFuzzer adds to the first folder), seeded by the
    # committed one.
    "$bin" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$BUILD/artifacts/$t/" "$@" "$BUILD/corpus/$t" "$CORPUS/$t"
    ;;
  merge)
    t=${2:?usage: scripts/fuzz.sh merge TARGET}
    bin=$(exe "$t")
    # Inputs of the campaign that add coverage to the committed corpus join it.
    "$bin" -merge=1 -timeout=20 -rss_limit_mb=2048 "$CORPUS/$t" "$BUILD/corpus/$t"
    ;;
  *)
    sed -n '2,22p' "$0" >&2
    exit 2
    ;;
esac
