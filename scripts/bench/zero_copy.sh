#!/usr/bin/env bash
# Benchmark: instruction counts (valgrind --tool=callgrind, which counts the same on a
# busy machine as on a quiet one) of one clock's SV batch path on one rank of a
# broadcast group of RANKS, for the 784-2048-2048-10 MLP (examples/mlp_wide.loss),
# BATCH examples, one BLAS thread (orpheus_bench_zero_copy, zero_copy_bench.cc):
#   exchange  encode the own batch, decode the RANKS-1 received records, rebuild W
#             from all RANKS batches (--path copy: one encoded buffer and decoded
#             copies; --path views: pieces, views into the receive buffer)
#   svg       computeSvg on one minibatch (forward, backward, SVs), its second call
# Only the part's second call is counted (the first warms up the buffers kept across clocks).
# With BASE_SRC (the source tree of an older commit) and BASE_BUILD (its build
# directory, built), the harness is also compiled against that tree with only the
# copy path (-DORPHEUS_BENCH_BASELINE) and measured: the "before" column.
# Prints markdown and writes it to RESULTS.
#
# Usage: scripts/bench/zero_copy.sh       (or scripts/bench/run.sh zero-copy)
# Environment (defaults in brackets): BATCH [100], RANKS [4], BUILD_DIR [build-release],
#   BASE_SRC, BASE_BUILD [unset: no before column], RESULTS [build-release/zero_copy.md].
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BATCH="${BATCH:-100}"; RANKS="${RANKS:-4}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-release}"
RESULTS="${RESULTS:-$BUILD_DIR/zero_copy.md}"
LOSS="$ROOT/examples/mlp_wide.loss"
BENCH="$BUILD_DIR/scripts/bench/orpheus_bench_zero_copy"

say() { echo "zero_copy: $*" >&2; }
command -v valgrind >/dev/null || { say "missing valgrind (apt-get install valgrind)"; exit 2; }
[ -x "$BENCH" ] || { say "missing $BENCH (build first)"; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The baseline harness: the same source against the older tree's libraries, with the
# compile and link lines CMake used there for orpheus_bench_step.
base=""
if [ -n "${BASE_SRC:-}" ] && [ -n "${BASE_BUILD:-}" ]; then
  flags="$(/usr/bin/python3 - "$BASE_BUILD" <<'PY'
import json, shlex, sys
for e in json.load(open(sys.argv[1] + "/compile_commands.json")):
    if e["file"].endswith("scripts/bench/step_bench.cc"):
        args = shlex.split(e["command"])[1:]
        out = []
        skip = False
        for a in args:
            if skip: skip = False; continue
            if a in ("-o", "-c"): skip = True; continue
            out.append(a)
        print(" ".join(shlex.quote(a) for a in out))
PY
)"
  link="$(sed 's/^[^ ]* //; s/CMakeFiles[^ ]*step_bench.cc.o//; s/-o orpheus_bench_step//' \
    "$BASE_BUILD/scripts/bench/CMakeFiles/orpheus_bench_step.dir/link.txt")"
  say "building the baseline harness against $BASE_BUILD"
  eval c++ $flags -DORPHEUS_BENCH_BASELINE -c "$ROOT/scripts/bench/zero_copy_bench.cc" -o "$work/base.o"
  (cd "$BASE_BUILD/scripts/bench" && eval c++ "$work/base.o" -o "$work/base_bench" $link)
  base="$work/base_bench"
fi

# count BINARY PATH PART: the instructions of the part's measured call (the harness
# turns collection on around it).
count() {
  local bin=$1 path=$2 part=$3
  (cd "$ROOT" && OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
    --collect-atstart=no "$bin" --loss "$LOSS" --batch "$BATCH" --ranks "$RANKS" --path "$path" \
    --parts "$part" >/dev/null 2>"$work/cg.log") || { cat "$work/cg.log" >&2; exit 1; }
  awk '/^(totals|summary):/ { print $2; exit }' "$work/cg.out"
}

{
  echo "# One clock's SV batch path in instructions (callgrind)"
  echo
  echo "MLP 784-2048-2048-10, batch $BATCH, $RANKS ranks (broadcast), one BLAS thread; the second call of each"
  echo "part (the first warms up what is kept across clocks)."
  echo
  echo "| part | before (copy path, older tree) | copy path | views path | views / before |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  for part in exchange svg; do
    b="-"; [ -n "$base" ] && b="$(count "$base" copy "$part")"
    c="-"; [ "$part" = exchange ] && c="$(count "$BENCH" copy "$part")"  # computeSvg has one path
    v="$(count "$BENCH" views "$part")"
    ratio="-"; [ "$b" != "-" ] && ratio="$(awk -v v="$v" -v b="$b" 'BEGIN { printf "%.3f", v / b }')"
    echo "| $part | $b | $c | $v | $ratio |"
  done
} | tee "$RESULTS"
