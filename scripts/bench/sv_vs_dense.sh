#!/usr/bin/env bash
# Benchmark: SV broadcast (--sync sv) against dense allreduce (--sync dense), in one run.
#   (a) time and bytes per clock for MLR on Fashion-MNIST and for a synthetic MLR with
#       one 2048 x 2048 matrix, configurations interleaved over several repetitions;
#   (b) the rate of the rebuild GEMM (ops::applySvBatches) as a fraction of the
#       machine's single-core sgemm rate (orpheus_bench_rebuild).
# Prints markdown tables and writes them to scripts/bench/results/sv_vs_dense.md.
#
# Usage: scripts/bench/sv_vs_dense.sh
# Environment (defaults in brackets): NP [4], REPS [3], WARMUP [5] clocks skipped per run,
#   FMNIST_CLOCKS [500], SYNTH_CLOCKS [60], BATCH [100] per rank, BUILD_DIR [build],
#   FASHION_MNIST [/usr/share/datasets/fashion-mnist], RESULTS [scripts/bench/results/sv_vs_dense.md],
#   KEEP_RAW [0]: 1 keeps the metrics files and prints where they are.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NP="${NP:-4}"
REPS="${REPS:-3}"
WARMUP="${WARMUP:-5}"
FMNIST_CLOCKS="${FMNIST_CLOCKS:-500}"
SYNTH_CLOCKS="${SYNTH_CLOCKS:-60}"
BATCH="${BATCH:-100}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
FASHION_MNIST="${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}"
RESULTS="${RESULTS:-$ROOT/scripts/bench/results/sv_vs_dense.md}"
PYTHON=/usr/bin/python3

# Open MPI refuses root without these; one BLAS thread per rank, since ranks share the cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1

say() { echo "sv_vs_dense: $*" >&2; }

FMNIST_TRAIN="$FASHION_MNIST/train-images-idx3-ubyte.gz"
[ -r "$FMNIST_TRAIN" ] || { say "missing $FMNIST_TRAIN (scripts/setup.sh installs it)"; exit 2; }
[ -x "$PYTHON" ] || { say "missing $PYTHON"; exit 2; }
command -v mpirun >/dev/null || { say "missing mpirun (scripts/setup.sh installs it)"; exit 2; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/orpheus-bench.XXXXXX")"
if [ "${KEEP_RAW:-0}" = 1 ]; then
  trap 'say "raw results kept in $WORK"' EXIT
else
  trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK/runs"

# Build (incremental, so a stale binary never gets measured).
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  say "configuring $BUILD_DIR (Release)"
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >"$WORK/build.log" 2>&1 || {
    cat "$WORK/build.log" >&2
    exit 1
  }
fi
build_type="$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")"
[ "$build_type" = Release ] || say "warning: $BUILD_DIR is a '$build_type' build, not Release"
say "building orpheus and orpheus_bench_rebuild"
cmake --build "$BUILD_DIR" -j"$(nproc)" --target orpheus orpheus_bench_rebuild >"$WORK/build.log" 2>&1 || {
  grep -E ': error|\*\*\*' "$WORK/build.log" | head -n 20 >&2
  say "build failed (full log above is abridged; rerun cmake --build $BUILD_DIR for all of it)"
  exit 1
}
ORPHEUS="$BUILD_DIR/engine/orpheus"
BENCH="$BUILD_DIR/scripts/bench/orpheus_bench_rebuild"

COMMON=(--model mlr --batch "$BATCH" --seed 1 --blas-threads 1 --progress off --log-level warn)
FMNIST_ARGS=(--train "$FMNIST_TRAIN" --clocks "$FMNIST_CLOCKS")
SYNTH_ARGS=(--train "synthetic:examples=8000,features=2048,classes=2048" --clocks "$SYNTH_CLOCKS")
MPIRUN=(mpirun -np "$NP" --oversubscribe)

train() {  # workload sync rep args...
  local workload="$1" sync="$2" rep="$3"
  shift 3
  local metrics="$WORK/runs/${workload}__${sync}__${rep}.jsonl"
  if ! "${MPIRUN[@]}" "$ORPHEUS" train "$@" "${COMMON[@]}" --sync "$sync" --metrics "$metrics" \
      >"$WORK/run.log" 2>&1; then
    say "run $workload/$sync/$rep failed:"
    cat "$WORK/run.log" >&2
    exit 1
  fi
}

load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
if awk -v l="${load_start%% *}" -v c="$(nproc)" 'BEGIN { exit !(l > 0.5 * c) }'; then
  say "warning: load average $load_start on $(nproc) cores; the timings will be skewed by other work"
fi

# Configurations interleaved (sv, dense, sv, dense, ...) so drift in the machine's
# speed over the run hits both alike.
start=$SECONDS
for rep in $(seq 1 "$REPS"); do
  for sync in sv dense; do
    say "rep $rep/$REPS: fashion-mnist --sync $sync"
    train fmnist "$sync" "$rep" "${FMNIST_ARGS[@]}"
  done
  for sync in sv dense; do
    say "rep $rep/$REPS: synthetic 2048x2048 --sync $sync"
    train synth "$sync" "$rep" "${SYNTH_ARGS[@]}"
  done
done
say "training runs took $((SECONDS - start)) s; measuring the rebuild GEMM"
"$BENCH" --ranks "$NP" --columns "$BATCH" >"$WORK/rebuild.jsonl"

commit="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ "$commit" != unknown ] && [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit (with uncommitted changes)"
fi
cpu="$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n 1)"
flags_of() { echo "orpheus train $* ${COMMON[*]} --sync {sv,dense}"; }

mkdir -p "$(dirname "$RESULTS")"
"$PYTHON" "$ROOT/scripts/bench/summarize.py" \
  --runs "$WORK/runs" --bench "$WORK/rebuild.jsonl" --warmup "$WARMUP" --out "$RESULTS" \
  --label "fmnist=MLR Fashion-MNIST (10×784)" \
  --label "synth=synthetic MLR (2048×2048)" \
  --header "date=$(date -u '+%Y-%m-%d %H:%M UTC')" \
  --header "machine=${cpu:-unknown CPU}, $(nproc) cores, $(uname -sr)" \
  --header "ranks=np $NP (mpirun -np $NP --oversubscribe), batch $BATCH per rank, OPENBLAS_NUM_THREADS=1" \
  --header "Orpheus=$("$ORPHEUS" --version 2>/dev/null | head -n 1), commit $commit, $build_type build" \
  --header "MPI=$(mpirun --version 2>/dev/null | head -n 1)" \
  --header "Fashion-MNIST flags=\`$(flags_of "${FMNIST_ARGS[@]}")\`" \
  --header "synthetic flags=\`$(flags_of "${SYNTH_ARGS[@]}")\`" \
  --header "rebuild flags=\`orpheus_bench_rebuild --ranks $NP --columns $BATCH\`" \
  --header "load average (1/5/15 min)=$load_start at start, $(cut -d' ' -f1-3 /proc/loadavg) at end; \
other processes on the cores skew the timings" \
  --header "repetitions=$REPS per configuration, interleaved; first $WARMUP clocks of each run skipped"
say "wrote $RESULTS"
