#!/usr/bin/env bash
# fault_matrix.sh [BUILD_DIR] [CASE...]: runs the failure-injection matrix
# (tests/e2e/fault_matrix.sh) against a build: killed, stopped and terminated ranks,
# damaged checkpoints, a full and a read-only disk. Prints one line per case.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
build=${1:-$ROOT/build}
[ $# -gt 0 ] && shift
for f in "$build/engine/orpheus" "$build/tests/compare_params"; do
  [ -x "$f" ] || { echo "$f is missing: build first (cmake --build $build)"; exit 2; }
done
exec "$ROOT/tests/e2e/fault_matrix.sh" "$build/engine/orpheus" "$build/tests/compare_params" mpiexec "$@"
