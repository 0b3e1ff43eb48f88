#!/usr/bin/env bash
# tests/cmake/backend_options.sh SOURCE_DIR: an optional backend asked for with ON but absent
# from the tree (or its libraries) is a configure error that names it; OFF configures.
set -uo pipefail
src=$1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail=0

# expect_configure_error OPTION CODE_DIR: configuring with OPTION=ON fails naming CODE_DIR
# when the tree lacks it, and succeeds (or fails only for missing libraries) otherwise.
expect_configure_error() {
  local option=$1 dir=$2
  if [ -f "$src/$dir/CMakeLists.txt" ]; then
    echo "skip $option: $dir exists in this tree"
    return
  fi
  local out
  out="$(cmake -S "$src" -B "$work/$option" -DORPHEUS_BUILD_TESTS=OFF "-D$option=ON" 2>&1)"
  if [ $? -eq 0 ]; then
    echo "FAIL: $option=ON configured although $dir/ is missing"
    fail=1
  elif ! grep -q "$option=ON, but this tree has no such backend ($dir/" <<<"$out"; then
    echo "FAIL: $option=ON failed without naming the missing backend:"
    echo "$out" | tail -5
    fail=1
  else
    echo "ok: $option=ON refused: $dir/ is missing"
  fi
}

expect_configure_error ORPHEUS_WITH_IBVERBS comm/ibverbs
expect_configure_error ORPHEUS_WITH_CUDA ops/cuda

out="$(cmake -S "$src" -B "$work/off" -DORPHEUS_BUILD_TESTS=OFF -DORPHEUS_WITH_CUDA=OFF -DORPHEUS_WITH_IBVERBS=OFF 2>&1)"
if [ $? -ne 0 ] || ! grep -q "Orpheus backends: CUDA 0, InfiniBand verbs 0" <<<"$out"; then
  echo "FAIL: configuring with both backends OFF:"
  echo "$out" | tail -5
  fail=1
else
  echo "ok: OFF builds neither backend"
fi
exit $fail
