#!/usr/bin/env bash
# Benchmark: the communication co-design of the Orpheus paper, Figures 9–12, for the
# 784-1024-1024-10 MLP (examples/mlp.loss) on Fashion-MNIST:
#   fig9   SV selection: C = 10, 25, 50 and no selection (all 100), random multicast Q = 3;
#   fig10  random multicast: Q = 1, 3, 7 (7 = every other rank at np 8), C = 25;
#   fig11  multicast schedule: fixed, ring and random, C = 25, Q = 3;
#   fig12  the same three schedules with 10% of the directed links broken each clock,
#          as the relative increase of convergence time over fig11's runs.
# Each run is judged by clocks and seconds to a target test accuracy, final accuracy,
# bytes per clock and the split of the mean clock time. A run shared by several figures
# (C = 25, Q = 3, random) is trained once.
# Writes markdown tables (also printed) and one PNG per figure (accuracy against clock
# and against training seconds) under scripts/bench/results/.
#
# Usage: scripts/bench/comm_codesign.sh [fig9] [fig10] [fig11] [fig12]   (none: all four)
# Environment (defaults in brackets): NP [8], REPS [1] runs per configuration, interleaved
#   (A B … A B …), CLOCKS [1000], EVAL_EVERY [50], BATCH [100] per rank, TARGET [0.85] test
#   accuracy, ALSO_TARGETS ["0.80 0.83"] lower accuracies also reported (clocks and seconds to
#   reach them; more settings reach them, and they sit where the curves are steeper), BUILD_DIR [build] (its engine/orpheus is used as built, never rebuilt here),
#   FASHION_MNIST [/usr/share/datasets/fashion-mnist], OUT_DIR [scripts/bench/results],
#   RAW_DIR [build/bench-raw/comm_codesign_raw] metrics, logs and command line of every run,
#   RESULTS [$OUT_DIR/comm_codesign.md for all four figures, comm_codesign_<figs>.md otherwise],
#   REUSE [0]: 1 keeps a run whose metrics file in RAW_DIR is complete and was made with the
#   same command line (e.g. to redraw the report, or fig12 after fig11, without retraining).
set -euo pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/common.sh"  # ROOT, mpirun environment
cd "$ROOT"

NP="${NP:-8}"
REPS="${REPS:-1}"
CLOCKS="${CLOCKS:-1000}"
EVAL_EVERY="${EVAL_EVERY:-50}"
BATCH="${BATCH:-100}"
TARGET="${TARGET:-0.85}"
ALSO_TARGETS="${ALSO_TARGETS:-0.80 0.83}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
FASHION_MNIST="${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}"
OUT_DIR="${OUT_DIR:-$ROOT/scripts/bench/results}"
RAW_DIR="${RAW_DIR:-$ROOT/build/bench-raw/comm_codesign_raw}"
REUSE="${REUSE:-0}"
PYTHON=/usr/bin/python3
# Open MPI refuses root without these (common.sh sets them too); one BLAS thread per rank.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1

say() { echo "comm_codesign: $*" >&2; }

# --- which figures ---------------------------------------------------------------
FIGS=()
for arg in "$@"; do
  case "$arg" in
    fig9 | fig10 | fig11 | fig12) FIGS+=("$arg") ;;
    all) FIGS+=(fig9 fig10 fig11 fig12) ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) say "unknown figure '$arg' (fig9, fig10, fig11, fig12 or all)"; exit 2 ;;
  esac
done
[ ${#FIGS[@]} -gt 0 ] || FIGS=(fig9 fig10 fig11 fig12)
# Deduplicate, keep figure order.
mapfile -t FIGS < <(printf '%s\n' "${FIGS[@]}" | sort -t g -k2 -n -u)

# --- configurations ----------------------------------------------------------------
# key -> flags on top of COMMON. c25 (C = 25, Q = 3, random) is shared by fig9–fig12.
declare -A CONF=(
  [c10]="--select 10 --multicast random --fanout 3"
  [c25]="--select 25 --multicast random --fanout 3"
  [c50]="--select 50 --multicast random --fanout 3"
  [c100]="--select 0 --multicast random --fanout 3"
  [q1]="--select 25 --multicast random --fanout 1"
  [q7]="--select 25 --multicast random --fanout 7"
  [fixed]="--select 25 --multicast fixed --fanout 3"
  [ring]="--select 25 --multicast ring --fanout 3"
  [drop_random]="--select 25 --multicast random --fanout 3 --drop-links 0.1"
  [drop_fixed]="--select 25 --multicast fixed --fanout 3 --drop-links 0.1"
  [drop_ring]="--select 25 --multicast ring --fanout 3 --drop-links 0.1"
)
declare -A FIG_KEYS=(
  [fig9]="c10 c25 c50 c100"
  [fig10]="q1 c25 q7"
  [fig11]="fixed ring c25"
  # The no-failure runs are the baselines of the relative increase.
  [fig12]="drop_fixed drop_ring drop_random fixed ring c25"
)
KEYS=()
for fig in "${FIGS[@]}"; do
  for key in ${FIG_KEYS[$fig]}; do
    [[ " ${KEYS[*]-} " == *" $key "* ]] || KEYS+=("$key")
  done
done

# --- checks -------------------------------------------------------------------------
FMNIST_TRAIN="$FASHION_MNIST/train-images-idx3-ubyte.gz"
FMNIST_TEST="$FASHION_MNIST/t10k-images-idx3-ubyte.gz"
for f in "$FMNIST_TRAIN" "$FMNIST_TEST"; do
  [ -r "$f" ] || { say "missing $f (scripts/setup.sh installs it)"; exit 2; }
done
command -v mpirun >/dev/null || { say "missing mpirun (scripts/setup.sh installs it)"; exit 2; }
[ -x "$PYTHON" ] || { say "missing $PYTHON"; exit 2; }
if ! "$PYTHON" -c 'import matplotlib' 2>/dev/null; then
  say "installing python3-matplotlib (Debian package) for the plots"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-matplotlib >/dev/null 2>&1; then
    apt-get update -q >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-matplotlib >/dev/null ||
      { say "could not install python3-matplotlib; tables only"; }
  fi
fi
ORPHEUS_BUILT="$BUILD_DIR/engine/orpheus"
[ -x "$ORPHEUS_BUILT" ] || {
  say "missing $ORPHEUS_BUILT; build it first (cmake --build $BUILD_DIR --target orpheus)"
  exit 2
}
build_type="$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null || true)"
[ "$build_type" = Release ] || say "warning: $BUILD_DIR is a '${build_type:-unknown}' build, not Release"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/orpheus-codesign.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# A private copy, so a rebuild of BUILD_DIR during the suite cannot mix two binaries.
ORPHEUS="$WORK/orpheus"
cp "$ORPHEUS_BUILT" "$ORPHEUS"
binary_info="$(sha256sum "$ORPHEUS" | cut -c1-12), built $(date -u -r "$ORPHEUS_BUILT" '+%Y-%m-%d %H:%M UTC')"
mkdir -p "$RAW_DIR" "$OUT_DIR"
# The tree the binary was copied from, taken now: the tree may move on during the suite.
commit="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ "$commit" != unknown ] && [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit (with uncommitted changes)"
fi

COMMON=(--model examples/mlp.loss --train "$FMNIST_TRAIN" --test "$FMNIST_TEST"
  --batch "$BATCH" --clocks "$CLOCKS" --eval-every "$EVAL_EVERY" --seed 1
  --consistency ssp --staleness 4 --progress off --log-level warn)
MPIRUN=(mpirun -np "$NP" --oversubscribe)

# A complete metrics file ends with the summary line.
complete() { [ -s "$1" ] && tail -n 1 "$1" | grep -q '"summary": *true'; }

FAILED=()
train() {  # key rep
  local key="$1" rep="$2"
  local base="$RAW_DIR/${key}__${rep}"
  # shellcheck disable=SC2206
  local conf=(${CONF[$key]})
  local cmd=("${MPIRUN[@]}" orpheus train "${COMMON[@]}" "${conf[@]}" --metrics "${key}__${rep}.jsonl")
  if [ "$REUSE" = 1 ] && complete "$base.jsonl" && [ -f "$base.cmd" ] &&
      [ "$(cat "$base.cmd")" = "${cmd[*]}" ]; then
    say "  reusing $base.jsonl"
    return 0
  fi
  rm -f "$base.jsonl" "$base.load"
  echo "${cmd[*]}" >"$base.cmd"
  local t0=$SECONDS rc=0
  "${MPIRUN[@]}" "$ORPHEUS" train "${COMMON[@]}" "${conf[@]}" --metrics "$base.jsonl" >"$base.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ] || ! complete "$base.jsonl"; then
    say "  FAILED: $key rep $rep (exit $rc) after $((SECONDS - t0)) s; its output ($base.log):"
    tail -n 30 "$base.log" >&2
    FAILED+=("$key/$rep")
    return 0
  fi
  local acc
  acc="$(tail -n 1 "$base.jsonl" | "$PYTHON" -c 'import json, sys; print("%.4f" % json.load(sys.stdin).get("test_accuracy", float("nan")))')"
  cut -d' ' -f1 /proc/loadavg >"$base.load"
  say "  done in $((SECONDS - t0)) s, final test accuracy $acc, load average $(cut -d' ' -f1-3 /proc/loadavg)"
}

load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
if awk -v l="${load_start%% *}" -v c="$(nproc)" 'BEGIN { exit !(l > 0.5 * c) }'; then
  say "warning: load average $load_start on $(nproc) cores; the timings will be skewed by other work"
fi
total=$((${#KEYS[@]} * REPS))
say "figures ${FIGS[*]}: ${#KEYS[@]} configurations × $REPS reps = $total runs of $CLOCKS clocks at np $NP"
say "(about $((CLOCKS * 15 / 100 + 20)) s each on a 2-core machine)"

# Configurations interleaved (A B C …, A B C …) so drift in the machine's speed hits all alike.
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

cpu="$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n 1)"
if [ ${#FIGS[@]} -eq 4 ]; then
  RESULTS="${RESULTS:-$OUT_DIR/comm_codesign.md}"
else
  RESULTS="${RESULTS:-$OUT_DIR/comm_codesign_$(IFS=_; echo "${FIGS[*]}").md}"
fi
if [ "$REPS" = 1 ]; then
  reps_note="1 per configuration: repetitions were not affordable on this machine (8 ranks on $(nproc) cores, \
about 2.5 min per run), so run-to-run noise is not measured; REPS=n repeats them, interleaved"
else
  reps_note="$REPS per configuration, interleaved (A B … A B …); medians with min–max"
fi
runs_arg=()
for key in "${KEYS[@]}"; do runs_arg+=(--conf "$key=${CONF[$key]}"); done
for t in $ALSO_TARGETS; do runs_arg+=(--also-target "$t"); done

"$PYTHON" -B "$ROOT/scripts/bench/plot_comm_codesign.py" \
  --raw "$RAW_DIR" --reps "$REPS" --target "$TARGET" --out "$RESULTS" --png-dir "$OUT_DIR" \
  "${runs_arg[@]}" $(printf -- '--fig %s ' "${FIGS[@]}") \
  --header "date=$(date -u '+%Y-%m-%d %H:%M UTC')" \
  --header "machine=${cpu:-unknown CPU}, $(nproc) cores, $(uname -sr)" \
  --header "ranks=np $NP (\`mpirun -np $NP --oversubscribe\`), batch $BATCH per rank, OPENBLAS_NUM_THREADS=1" \
  --header "Orpheus=commit $commit when the suite started, ${build_type:-unknown} build, binary sha256 $binary_info" \
  --header "MPI=$(mpirun --version 2>/dev/null | head -n 1)" \
  --header "common flags=\`orpheus train ${COMMON[*]} --metrics FILE\`" \
  --header "data=Fashion-MNIST from $FASHION_MNIST (60,000 train, sharded over the ranks; 10,000 test, each rank scores its replica on its shard)" \
  --header "target=test accuracy ≥ $TARGET, checked every $EVAL_EVERY clocks" \
  --header "repetitions=$reps_note" \
  --header "load average (1/5/15 min)=$load_start at start, $(cut -d' ' -f1-3 /proc/loadavg) at end; \
training took $((elapsed / 60)) min $((elapsed % 60)) s"
tar -C "$(dirname "$RAW_DIR")" -cJf "$OUT_DIR/comm_codesign_raw.tar.xz" "$(basename "$RAW_DIR")"
say "wrote $RESULTS and the PNGs in $OUT_DIR; raw metrics in $RAW_DIR (archived in $OUT_DIR/comm_codesign_raw.tar.xz)"
if [ ${#FAILED[@]} -gt 0 ]; then
  say "failed runs: ${FAILED[*]} (logs in $RAW_DIR)"
  exit 1
fi
