#!/usr/bin/env bash
# Creates .venv (CPython 3.10+), installs the pinned environment once, then builds and installs
# memoire into it. Safe to re-run: dependencies are reinstalled only when a pin file changes;
# the extension rebuilds incrementally from build/<wheel tag> (a plain `pip install .` builds in a
# temporary folder instead, leaving the checkout clean).
#
# Each stage says when it starts and how long it took; the long ones show their own progress,
# one short line per step (pip's and uv's packages, scikit-build-core's stages, ninja's compile
# steps). Their whole output goes to build/bootstrap.log (build/bootstrap-current.log for the
# current stack); a failure prints its last lines.
#
# STACK picks the environment: `pinned` (the default: constraints/dopamine.txt, Dopamine 4.1.2's era,
# CPython 3.10-3.11, into .venv) or `current` (constraints/current.txt, the newest releases that
# work, CPython 3.13, into .venv-current). MEMOIRE_VENV and PYTHON override the folder and the
# interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=${STACK:-pinned}
case "$STACK" in
  pinned)
    CONSTRAINTS=constraints/dopamine.txt
    VENV=${MEMOIRE_VENV:-.venv}
    PY=${PYTHON:-python3}
    ;;
  current)
    CONSTRAINTS=constraints/current.txt
    VENV=${MEMOIRE_VENV:-.venv-current}
    if [ -z "${PYTHON:-}" ]; then
      # pyenv installs a shim for every version it has; only a runnable one counts.
      for PYTHON in python3.13 /root/.pyenv/versions/3.13*/bin/python3.13; do
        "$PYTHON" -c "" 2>/dev/null && break
      done
    fi
    PY=$PYTHON
    ;;
  *)
    echo "[bootstrap] STACK must be 'pinned' or 'current', not '$STACK'" >&2
    exit 2
    ;;
esac
LOG=build/bootstrap$([ "$STACK" = pinned ] || echo "-$STACK").log
mkdir -p build
: > "$LOG"

say() { echo "[bootstrap] $*"; }

# Keeps pip's output in $LOG and shows one line per 20 packages it collects.
pip_progress() {
  local line n=0 t0=$SECONDS
  while IFS= read -r line; do
    printf '%s\n' "$line" >> "$LOG"
    case "$line" in
      Collecting\ *)
        n=$((n + 1))
        if ((n % 20 == 0)); then say "  $n packages collected ($((SECONDS - t0)) s)"; fi
        ;;
      Installing\ collected\ packages:*)
        say "  installing $n packages ($((SECONDS - t0)) s)"
        ;;
    esac
  done
}

# Keeps uv's output in $LOG and shows its summary lines (resolved, prepared, installed, bytecode).
uv_progress() {
  local line t0=$SECONDS
  while IFS= read -r line; do
    printf '%s\n' "$line" >> "$LOG"
    case "$line" in
      Resolved\ * | Prepared\ * | Installed\ * | Bytecode\ *) say "  $line ($((SECONDS - t0)) s)" ;;
    esac
  done
}

# Keeps the build's output in $LOG and shows scikit-build-core's stages (`*** Configuring
# CMake...`) and ninja's steps (`[2/9] core files, batch 2`), one line each, with the time
# so far.
build_progress() {
  local line t0=$SECONDS re='^ *\[([0-9]+/[0-9]+)\] (Building|Linking) [A-Z]+ [a-z ]+ (.*)$'
  while IFS= read -r line; do
    printf '%s\n' "$line" >> "$LOG"
    if [[ $line =~ $re ]]; then
      local step=${BASH_REMATCH[1]} verb=${BASH_REMATCH[2]} what=${BASH_REMATCH[3]}
      # A unity batch (CMakeLists.txt) is named for its target: the core's or the bindings'.
      if [[ $what =~ CMakeFiles/(memoire_core|_core)\.dir/Unity/unity_([0-9]+)_cxx ]]; then
        local part=binding
        [[ ${BASH_REMATCH[1]} == memoire_core ]] && part=core
        what="$part files, batch $((BASH_REMATCH[2] + 1))"
      fi
      what=${what#CMakeFiles/*.dir/}
      [[ $verb == Linking ]] && what="linking $what"
      say "  [$step] ${what%.o} ($((SECONDS - t0)) s)"
    elif [[ $line == *"*** "* ]]; then
      say "  ${line#*\*\*\* } ($((SECONDS - t0)) s)"
    fi
  done
}

# stage NAME FILTER COMMAND...: runs COMMAND through FILTER, says how long it took; on failure
# prints the end of $LOG and stops.
stage() {
  local name=$1 filter=$2 t0=$SECONDS
  shift 2
  say "$name"
  if ! "$@" 2>&1 | "$filter"; then
    say "$name failed; the last lines of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
  say "$name: done in $((SECONDS - t0)) s"
}

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.memoire-deps-$(cat "$CONSTRAINTS" constraints/dev.txt | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  say "installing the $STACK stack's dependencies ($CONSTRAINTS; first run: a few minutes, ~3 GB)"
  stage "upgrading pip" pip_progress "$VENV/bin/python" -m pip install --upgrade pip
  # uv (pinned in constraints/dev.txt) installs the ~3 GB in parallel, where pip took about
  # 160 s on 2 cores. The same pins, so the same packages. Compiled to bytecode here, as pip
  # does: uv does not by default, and where PYTHONDONTWRITEBYTECODE is set every process would
  # compile TensorFlow's thousands of modules again.
  stage "installing uv" pip_progress \
    "$VENV/bin/python" -m pip install "$(grep '^uv==' constraints/dev.txt)"
  # --system-certs: uv trusts the system's certificate store, as pip does (pip's truststore),
  # not only the roots uv carries: an index behind a TLS-intercepting proxy whose CA is in the
  # system store works for both. (uv's older name for it: --native-tls, UV_NATIVE_TLS.)
  stage "installing dependencies" uv_progress \
    "$VENV/bin/uv" pip install --system-certs --compile-bytecode --python "$VENV/bin/python" \
    -c "$CONSTRAINTS" -r constraints/dev.txt
  # Dopamine imports baselines.common.atari_wrappers without declaring it.
  stage "installing baselines (no dependencies)" pip_progress \
    "$VENV/bin/python" -m pip install -c "$CONSTRAINTS" --no-deps baselines==0.1.5
  touch "$stamp"
fi
stage "building and installing memoire (C++ extension: a minute or two on 2 cores)" build_progress \
  "$VENV/bin/python" -m pip install -v --no-deps --no-build-isolation \
  --config-settings=build-dir='build/{wheel_tag}' .
# The installed extension, also beside the sources: from the repository root, Python finds the
# checkout's memoire/ before the installed package (`python -c`, `python -m memoire`, a script
# run there), and that folder must import too. The tests still import the installed package
# (pytest puts the tests' folders and tests/helpers/, not the root, on sys.path); scripts/build_wheel.sh builds from the files
# git does not ignore (*.so is ignored), so a wheel never takes this copy. -I: the interpreter's own
# sys.path, without the working directory.
installed=$("$VENV/bin/python" -I -c 'import memoire._core as c; print(c.__file__)')
cmp -s "$installed" "memoire/${installed##*/}" || cp -f "$installed" memoire/
say "memoire/${installed##*/}: the extension beside the sources (the checkout imports from its root)"
