#!/usr/bin/env bash
# The core as a user gets it: now the wheel's test (scripts/build_wheel.sh builds, repairs and
# installs the wheel into a fresh venv without a compiler, newest numpy 2.x and pyzmq, no Dopamine,
# and runs every test that does not need Dopamine against it). Kept as the name the README uses.
# Usage: scripts/core_only.sh [pytest args]
exec "$(dirname "$0")/build_wheel.sh" "$@"
