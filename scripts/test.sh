#!/usr/bin/env bash
# Installs what is missing, builds Orpheus with its tests and runs the whole suite
# (unit, multi-rank under mpiexec, end to end on Fashion-MNIST) with ctest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$ROOT/scripts/setup.sh"
build "${BUILD_DIR:-$ROOT/build}" RelWithDebInfo
cd "${BUILD_DIR:-$ROOT/build}"
# The "long" tier (minutes of np-8 training) runs only when asked for.
if [ "${ORPHEUS_LONG_TESTS:-0}" = 1 ]; then
  ctest --output-on-failure -j "$JOBS" "$@"
else
  ctest --output-on-failure -j "$JOBS" -LE long "$@"
fi
