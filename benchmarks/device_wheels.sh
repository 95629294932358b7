#!/usr/bin/env bash
# Fetches the cp312 wheels the device machine's image lacks (it reaches no registry) into
# build/device-wheels/, where benchmarks/_device_setup.sh installs them: pyzmq (memoire's
# network layer, imported by `import memoire`) and gin-config, at the project's pins. Run here,
# then carry the folder: the device tool's run(carry=["build/device-wheels"], ...).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pin() { grep -h "^$1==" constraints/dev.txt | head -1 | cut -d' ' -f1; }
mkdir -p build/device-wheels
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d build/device-wheels "$(pin pyzmq)" "$(pin gin-config)"
ls build/device-wheels
