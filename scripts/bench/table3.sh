#!/usr/bin/env bash
# Benchmark: the Orpheus paper's Table 3 (convergence time as techniques are added one
# at a time) for the 784-1024-1024-10 MLP (examples/mlp.loss) on Fashion-MNIST:
#   r1  dense allreduce                       --sync dense            (paper: Matrix+PS)
#   r2  SV broadcast (SVB)                    --sync sv, BSP, multicast all, every SVG sent
#   r3  + SV selection (SVS)                  --select 25
#   r4  + random multicast (RM)               --multicast random --fanout 3 --consistency ssp --staleness 4
#   r5  + periodic centralized sync (PCS)     --average-every 50
#   r6  + parameter-replica rotation (PRR)    --rotate-every 25 (so half the rotations fall between averages)
# Each run is judged by clocks and seconds to a target test accuracy, final accuracy,
# bytes per clock and mean clock time, plus replica divergence: the in-run
# divergence_mean/max of the averaging clocks (r5, r6), and the divergence of the final
# replicas (every row), saved with --save-replicas and compared pairwise with
# compare_params (see table3.py for exactly what each number is).
# Writes scripts/bench/results/table3.md (also printed) and table3.png (test accuracy
# against training seconds and against clocks).
#
# Usage: scripts/bench/table3.sh
# Environment (defaults in brackets): NP [8], REPS [1] runs per configuration, interleaved
#   (r1 … r6, r1 … r6, …), CLOCKS [1000], EVAL_EVERY [50], BATCH [100] per rank,
#   TARGET [0.85] test accuracy, STOP [1]: 1 ends each run at its first eval clock that
#   reaches TARGET (--target-accuracy), so CLOCKS is only a cap, ORPHEUS [build-dev/engine/orpheus] and
#   COMPARE [build-dev/tests/compare_params] (copied at the start, never rebuilt here),
#   FASHION_MNIST [/usr/share/datasets/fashion-mnist], OUT_DIR [scripts/bench/results],
#   RAW_DIR [build/bench-raw/table3_raw] metrics, logs, command lines and replica divergences,
#   RESULTS [$OUT_DIR/table3.md], PNG [$OUT_DIR/table3.png],
#   WAIT_FOR [comm_codesign.sh]: before every run, wait (polling every 30 s) while a
#   process whose command line contains this is running ('' disables),
#   REUSE [0]: 1 keeps a run whose metrics file in RAW_DIR is complete and was made with
#   the same command line (e.g. to redraw the report without retraining, or to retrain
#   only the runs whose files were removed), NOTE ['']: a line added to the report's header.
set -euo pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/common.sh"  # ROOT, mpirun environment
cd "$ROOT"

NP="${NP:-8}"
REPS="${REPS:-1}"
CLOCKS="${CLOCKS:-1000}"
EVAL_EVERY="${EVAL_EVERY:-50}"
BATCH="${BATCH:-100}"
TARGET="${TARGET:-0.85}"
STOP="${STOP:-1}"
ORPHEUS_BUILT="${ORPHEUS:-$ROOT/build-dev/engine/orpheus}"
COMPARE_BUILT="${COMPARE:-$ROOT/build-dev/tests/compare_params}"
FASHION_MNIST="${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}"
OUT_DIR="${OUT_DIR:-$ROOT/scripts/bench/results}"
RAW_DIR="${RAW_DIR:-$ROOT/build/bench-raw/table3_raw}"
RESULTS="${RESULTS:-$OUT_DIR/table3.md}"
PNG="${PNG:-$OUT_DIR/table3.png}"
WAIT_FOR="${WAIT_FOR-comm_codesign.sh}"
REUSE="${REUSE:-0}"
NOTE="${NOTE:-}"
PYTHON=/usr/bin/python3
# Open MPI refuses root without these (common.sh sets them too); one BLAS thread per rank.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1

say() { echo "table3: $*" >&2; }
case "${1-}" in -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac

# --- configurations (each row adds one technique to the previous one) -----------------
KEYS=(r1 r2 r3 r4 r5 r6)
RM="--sync sv --select 25 --multicast random --fanout 3 --consistency ssp --staleness 4"
declare -A CONF=(
  [r1]="--sync dense"
  [r2]="--sync sv"
  [r3]="--sync sv --select 25"
  [r4]="$RM"
  [r5]="$RM --average-every 50"
  [r6]="$RM --average-every 50 --rotate-every 25"
)

# --- checks -----------------------------------------------------------------------------
FMNIST_TRAIN="$FASHION_MNIST/train-images-idx3-ubyte.gz"
FMNIST_TEST="$FASHION_MNIST/t10k-images-idx3-ubyte.gz"
for f in "$FMNIST_TRAIN" "$FMNIST_TEST"; do
  [ -r "$f" ] || { say "missing $f (scripts/setup.sh installs it)"; exit 2; }
done
command -v mpirun >/dev/null || { say "missing mpirun (scripts/setup.sh installs it)"; exit 2; }
[ -x "$PYTHON" ] || { say "missing $PYTHON"; exit 2; }
if ! "$PYTHON" -c 'import matplotlib' 2>/dev/null; then
  say "installing python3-matplotlib (Debian package) for the plot"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-matplotlib >/dev/null 2>&1; then
    apt-get update -q >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-matplotlib >/dev/null ||
      say "could not install python3-matplotlib; table only"
  fi
fi
for bin in "$ORPHEUS_BUILT" "$COMPARE_BUILT"; do
  [ -x "$bin" ] || { say "missing $bin (build it, or point ORPHEUS / COMPARE elsewhere)"; exit 2; }
done
cache="$(dirname "$(dirname "$ORPHEUS_BUILT")")/CMakeCache.txt"
build_type="$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$cache" 2>/dev/null || true)"
[ "$build_type" = Release ] || say "warning: $ORPHEUS_BUILT is a '${build_type:-unknown}' build, not Release"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/orpheus-table3.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# Private copies, so a rebuild of the build tree during the suite cannot mix two binaries.
ORPHEUS_BIN="$WORK/orpheus"
COMPARE_BIN="$WORK/compare_params"
cp -p "$ORPHEUS_BUILT" "$ORPHEUS_BIN"
cp "$COMPARE_BUILT" "$COMPARE_BIN"
binary_info="$(sha256sum "$ORPHEUS_BIN" | cut -c1-12), built $(date -u -r "$ORPHEUS_BUILT" '+%Y-%m-%d %H:%M UTC')"
mkdir -p "$RAW_DIR" "$OUT_DIR"

COMMON=(--model examples/mlp.loss --train "$FMNIST_TRAIN" --test "$FMNIST_TEST"
  --batch "$BATCH" --clocks "$CLOCKS" --eval-every "$EVAL_EVERY" --seed 1
  --progress off --log-level warn)
[ "$STOP" = 1 ] && COMMON+=(--target-accuracy "$TARGET")
MPIRUN=(mpirun -np "$NP" --oversubscribe)

# A complete metrics file ends with the summary line.
complete() { [ -s "$1" ] && tail -n 1 "$1" | grep -q '"summary": *true'; }

wait_for_cpu() {
  [ -n "$WAIT_FOR" ] || return 0
  local waited=0
  while pgrep -f -- "$WAIT_FOR" >/dev/null; do
    [ "$waited" = 0 ] && say "  waiting: a '$WAIT_FOR' process is running (polling every 30 s)"
    sleep 30
    waited=$((waited + 30))
  done
  [ "$waited" = 0 ] || say "  waited $waited s for '$WAIT_FOR' to finish"
}

FAILED=()
TRAINED=0
REUSED=0
train() {  # key rep
  local key="$1" rep="$2"
  local base="$RAW_DIR/${key}__${rep}"
  # shellcheck disable=SC2206
  local conf=(${CONF[$key]})
  local cmd=("${MPIRUN[@]}" orpheus train "${COMMON[@]}" "${conf[@]}" --metrics "${key}__${rep}.jsonl"
    --save-replicas DIR)
  if [ "$REUSE" = 1 ] && complete "$base.jsonl" && [ -s "$base.divergence.json" ] && [ -f "$base.cmd" ] &&
      [ "$(cat "$base.cmd")" = "${cmd[*]}" ]; then
    say "  reusing $base.jsonl"
    REUSED=$((REUSED + 1))
    return 0
  fi
  wait_for_cpu
  TRAINED=$((TRAINED + 1))
  rm -f "$base.jsonl" "$base.divergence.json"
  echo "${cmd[*]}" >"$base.cmd"
  local replicas="$WORK/replicas"
  rm -rf "$replicas" && mkdir -p "$replicas"
  local t0=$SECONDS rc=0
  {
    echo "binary sha256: $binary_info"
    echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  } >"$base.log"
  "${MPIRUN[@]}" "$ORPHEUS_BIN" train "${COMMON[@]}" "${conf[@]}" --metrics "$base.jsonl" \
    --save-replicas "$replicas" >>"$base.log" 2>&1 || rc=$?
  echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$base.log"
  if [ "$rc" -ne 0 ] || ! complete "$base.jsonl"; then
    say "  FAILED: $key rep $rep (exit $rc) after $((SECONDS - t0)) s; its output ($base.log):"
    tail -n 30 "$base.log" >&2
    FAILED+=("$key/$rep")
    return 0
  fi
  # Divergence of the final replicas (pairwise compare_params); the files themselves are
  # 8 × 7.5 MB, so they are not kept.
  if ! "$PYTHON" "$ROOT/scripts/bench/table3.py" divergence --compare "$COMPARE_BIN" --dir "$replicas" \
      --ranks "$NP" --out "$base.divergence.json" 2>>"$base.log"; then
    say "  divergence of $key rep $rep failed (see $base.log)"
  fi
  rm -rf "$replicas"
  local acc
  acc="$(tail -n 1 "$base.jsonl" | "$PYTHON" -c 'import json, sys; print("%.4f" % json.load(sys.stdin).get("test_accuracy", float("nan")))')"
  say "  done in $((SECONDS - t0)) s, final test accuracy $acc"
}

wait_for_cpu  # so the load average below is the one the runs start under
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
if awk -v l="${load_start%% *}" -v c="$(nproc)" 'BEGIN { exit !(l > 0.5 * c) }'; then
  say "warning: load average $load_start on $(nproc) cores; the timings will be skewed by other work"
fi
total=$((${#KEYS[@]} * REPS))
say "${#KEYS[@]} configurations × $REPS reps = $total runs of $CLOCKS clocks at np $NP"
say "(about $((CLOCKS * 22 / 100 + 20)) s each on a 2-core machine)"

# Configurations interleaved (r1 … r6, r1 … r6, …) so drift in the machine's speed hits all alike.
start=$SECONDS
n=0
for rep in $(seq 1 "$REPS"); do
  for key in "${KEYS[@]}"; do
    n=$((n + 1))
    say "[$n/$total] $(date '+%H:%M:%S') $key rep $rep: ${CONF[$key]}"
    train "$key" "$rep"
  done
done
elapsed=$((SECONDS - start))
say "training runs took $elapsed s"

commit="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ "$commit" != unknown ] && [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit (with uncommitted changes)"
fi
# The binary of every run (REUSE can mix runs of several invocations).
binaries="$(for key in "${KEYS[@]}"; do for rep in $(seq 1 "$REPS"); do
  sed -n 's/^binary sha256: //p' "$RAW_DIR/${key}__${rep}.log" 2>/dev/null | head -n 1 || true; done; done | sort -u)"
if [ "$(printf '%s\n' "$binaries" | grep -c .)" -gt 1 ]; then
  binary_note="WARNING: the runs used different binaries: $(echo "$binaries" | paste -sd ';' | sed 's/;/; /g')"
else
  binary_note="every run: binary sha256 ${binaries:-$binary_info}"
fi
cpu="$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n 1)"
if [ "$REPS" = 1 ]; then
  reps_note="1 per configuration: repetitions were not affordable (8 ranks on $(nproc) cores, 2–11 min \
per run, 35 min budget for the whole table), so run-to-run noise is not measured and differences of a few \
percent in time are within it; REPS=n repeats them, interleaved"
else
  reps_note="$REPS per configuration, interleaved (r1 … r6, r1 … r6, …); medians with min–max"
fi
if [ "$TRAINED" -gt 0 ]; then
  load_line="$load_start at start, $(cut -d' ' -f1-3 /proc/loadavg) at end; this invocation trained $TRAINED \
runs in $((elapsed / 60)) min $((elapsed % 60)) s"
  [ "$REUSED" = 0 ] || load_line="$load_line and reused $REUSED"
else
  load_line="not measured by this invocation, which only redrew the report from $REUSED earlier runs"
fi
runs_arg=()
for key in "${KEYS[@]}"; do runs_arg+=(--conf "$key=${CONF[$key]}"); done

"$PYTHON" "$ROOT/scripts/bench/table3.py" report \
  --raw "$RAW_DIR" --reps "$REPS" --target "$TARGET" --eval-every "$EVAL_EVERY" --out "$RESULTS" --png "$PNG" \
  "${runs_arg[@]}" \
  ${NOTE:+--header "notes=$NOTE"} \
  --header "date=$(date -u '+%Y-%m-%d %H:%M UTC')" \
  --header "machine=${cpu:-unknown CPU}, $(nproc) cores, $(uname -sr)" \
  --header "ranks=np $NP (\`mpirun -np $NP --oversubscribe\`, $NP ranks on $(nproc) cores), batch $BATCH per rank, OPENBLAS_NUM_THREADS=1" \
  --header "Orpheus=${build_type:-unknown} build ($ORPHEUS_BUILT); $binary_note; HEAD at report time $commit (the build time, not HEAD, dates the binary's source)" \
  --header "MPI=$(mpirun --version 2>/dev/null | head -n 1)" \
  --header "common flags=\`orpheus train ${COMMON[*]} --metrics FILE --save-replicas DIR\`" \
  --header "data=Fashion-MNIST from $FASHION_MNIST (60,000 train, sharded over the ranks; 10,000 test, each rank scores the replica it holds on its test shard)" \
  --header "target=test accuracy ≥ $TARGET, checked every $EVAL_EVERY clocks" \
  --header "repetitions=$reps_note" \
  --header "load average (1/5/15 min)=$load_line; \
each run's load is in the split table; other work on the cores (builds, other benchmarks) skews the timings"
tar -C "$(dirname "$RAW_DIR")" -cJf "$OUT_DIR/table3_raw.tar.xz" "$(basename "$RAW_DIR")"
say "wrote $RESULTS and $PNG; raw metrics in $RAW_DIR (archived in $OUT_DIR/table3_raw.tar.xz)"
if [ ${#FAILED[@]} -gt 0 ]; then
  say "failed runs: ${FAILED[*]} (logs in $RAW_DIR)"
  exit 1
fi
