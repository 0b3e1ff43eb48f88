#!/usr/bin/env bash
# Installs what is missing, builds Orpheus with its tests and runs the whole suite
# (unit, multi-rank under mpiexec, end to end on Fashion-MNIST) with ctest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$ROOT/scripts/setup.sh"
build "${BUILD_DIR:-$ROOT/build}" RelWithDebInfo
cd "${BUILD_DIR:-$ROOT/build}"
ctest --output-on-failure -j "$JOBS" "$@"
