#!/usr/bin/env bash
# fuzz.sh [SECONDS_PER_TARGET]: builds the libFuzzer targets (tests/fuzz/) with
# clang, AddressSanitizer and UndefinedBehaviorSanitizer in build-fuzz/, then runs
# each for SECONDS_PER_TARGET (default 30), one after another, starting from its
# seed corpus in tests/fuzz/corpus/<target>/. New inputs go to
# build-fuzz/corpus/<target>/; a crash leaves its input in build-fuzz/findings/.
# Exits non-zero when any target finds a crash, a leak, a timeout or an
# out-of-memory. FUZZ_TARGETS="libsvm idx" runs only those targets.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

seconds=${1:-30}
dir="$ROOT/build-fuzz"
read -r -a targets <<<"${FUZZ_TARGETS:-libsvm csv idx hdf5 loss_parser sv_batch}"

if [ ! -f "$dir/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DORPHEUS_FUZZ=ON -DORPHEUS_SANITIZE=ON -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link \
    ${CMAKE_CXX_COMPILER_LAUNCHER:+-DCMAKE_CXX_COMPILER_LAUNCHER=$CMAKE_CXX_COMPILER_LAUNCHER}
fi
cmake --build "$dir" -j "$JOBS" --target "${targets[@]/#/fuzz_}"

mkdir -p "$dir/findings"
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$dir/corpus/$t"
  echo "== fuzz_$t for ${seconds}s"
  # Inputs stay small: each reader's behaviour shows in a few KiB. A malloc over
  # 2 GiB counts as a finding: sizes from input must be checked before allocating.
  if ! "$dir/tests/fuzz/fuzz_$t" "$dir/corpus/$t" "$ROOT/tests/fuzz/corpus/$t" \
      -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=2048 \
      -artifact_prefix="$dir/findings/$t-" -print_final_stats=1 2>"$dir/fuzz_$t.log"; then
    failed+=("$t")
    tail -n 40 "$dir/fuzz_$t.log"
  fi
  grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$dir/fuzz_$t.log" || true
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]} (inputs in $dir/findings/)" >&2
  exit 1
fi
echo "fuzz.sh: no findings in ${targets[*]} (${seconds}s each)"
