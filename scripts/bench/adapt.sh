#!/usr/bin/env bash
# Benchmark: --adapt against the best hand-tuned setting of the co-design sweep and
# against the defaults, np 4, the 784-2048-2048-10 MLP (examples/mlp_wide.loss) on
# Fashion-MNIST to a target test accuracy, on the emulated cluster
# (scripts/netcluster.sh, needs root):
#   1gbit    every link at 1 Gbit/s;
#   10gbit   every link at 10 Gbit/s;
#   drop     10 Gbit/s, dropped to 1 Gbit/s (`netcluster.sh rate 1gbit`) DROP_AT seconds into
#            each run (default: a third of the hand-tuned run's time to target at 10gbit).
# Every setting runs REPS times, interleaved (rep 1 of every scenario and setting, then
# rep 2, ...), so that a slow spell of the machine does not fall on one setting alone.
# Reports the median seconds and clocks to the target [min-max over the reps] per
# scenario and setting, and the ratios of the medians adapt/hand and adapt/defaults, in
# scripts/bench/results/adapt.md (also printed), and adapt.png: the knobs --adapt chose
# over time against the link rate, per scenario (every rep).
#
# Usage: scripts/bench/adapt.sh [1gbit] [10gbit] [drop]   (none: all three)
# Environment (defaults in brackets): REPS [2], NP [4], CLOCKS [3000] at most, TARGET [0.85],
#   EVAL_EVERY [50], BATCH [100], ADAPT_EVERY [25],
#   DEFAULTS ["--sync sv"], HAND ["--sync sv --select 25 --consistency ssp --staleness 4
#   --average-every 50"] (the vs-ddp suite's best), ADAPT ["--adapt --consistency ssp --multicast
#   random --fanout 3 --average-every 50"], DROP_AT [see above] seconds,
#   LOOPBACK [0]: 1 runs on shared memory without the cluster (no root; for a smoke run, the
#   rate changes are then only recorded), BUILD_DIR [build], FASHION_MNIST, OUT_DIR
#   [scripts/bench/results], RAW_DIR [build/bench-raw/adapt_raw] (rep N under RAW_DIR/repN).
set -euo pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/common.sh"  # ROOT, mpirun environment
cd "$ROOT"

REPS="${REPS:-2}"
NP="${NP:-4}"
CLOCKS="${CLOCKS:-3000}"
TARGET="${TARGET:-0.85}"
EVAL_EVERY="${EVAL_EVERY:-50}"
BATCH="${BATCH:-100}"
ADAPT_EVERY="${ADAPT_EVERY:-25}"
DEFAULTS="${DEFAULTS:---sync sv}"
HAND="${HAND:---sync sv --select 25 --consistency ssp --staleness 4 --average-every 50}"
ADAPT="${ADAPT:---adapt --consistency ssp --multicast random --fanout 3 --average-every 50}"
LOOPBACK="${LOOPBACK:-0}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
FASHION_MNIST="${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}"
OUT_DIR="${OUT_DIR:-$ROOT/scripts/bench/results}"
RAW_DIR="${RAW_DIR:-$ROOT/build/bench-raw/adapt_raw}"
ORPHEUS="$BUILD_DIR/engine/orpheus"
NETCLUSTER="$ROOT/scripts/netcluster.sh"
PYTHON=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1

say() { echo "adapt: $*" >&2; }

SCENARIOS=()
for arg in "$@"; do
  case "$arg" in
    1gbit | 10gbit | drop) SCENARIOS+=("$arg") ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) say "unknown scenario '$arg' (1gbit, 10gbit, drop)"; exit 2 ;;
  esac
done
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(1gbit 10gbit drop)
[ -x "$ORPHEUS" ] || { say "no $ORPHEUS (build first, or set BUILD_DIR)"; exit 2; }
if [ "$LOOPBACK" != 1 ] && [ "$(id -u)" -ne 0 ]; then
  say "the emulated cluster needs root (LOOPBACK=1 runs on shared memory)"; exit 2
fi
mkdir -p "$OUT_DIR" "$RAW_DIR"

common=(--model "$ROOT/examples/mlp_wide.loss"
  --train "$FASHION_MNIST/train-images-idx3-ubyte.gz" --test "$FASHION_MNIST/t10k-images-idx3-ubyte.gz"
  --clocks "$CLOCKS" --batch "$BATCH" --eval-every "$EVAL_EVERY" --target-accuracy "$TARGET"
  --progress off --log-level warn)
declare -A FLAGS=([defaults]="$DEFAULTS" [hand]="$HAND" [adapt]="$ADAPT --adapt-every $ADAPT_EVERY")

launch=()
cluster_up() {  # RATE
  if [ "$LOOPBACK" = 1 ]; then launch=(); return; fi
  "$NETCLUSTER" up "$NP" --rate "$1" >&2
  # shellcheck disable=SC2207
  launch=($("$NETCLUSTER" mpirun-args))
}
cluster_rate() { [ "$LOOPBACK" = 1 ] || "$NETCLUSTER" rate "$1" >&2; }
cluster_down() { [ "$LOOPBACK" = 1 ] || "$NETCLUSTER" down >&2 || true; }
trap cluster_down EXIT

# One run: REP SCENARIO CONFIG START_RATE [DROP_AT]; the rate's changes go to CONFIG.rates
# as "seconds rate" lines, from the run's start.
run() {
  local rep=$1; shift
  local scenario=$1 config=$2 rate=$3 drop=${4-} dir="$RAW_DIR/rep$rep/$1" watcher=""
  mkdir -p "$dir"
  cluster_rate "$rate"
  echo "0 $rate" >"$dir/$config.rates"
  if [ -n "$drop" ]; then
    (sleep "$drop"; cluster_rate 1gbit; echo "$drop 1gbit" >>"$dir/$config.rates") &
    watcher=$!
  fi
  say "rep $rep: $scenario $config"
  # A launch in the emulated cluster that fails before any rank starts (no metrics
  # file; netcluster.sh bounds it) is tried once more; a run that started and failed is not.
  # orte_startup_timeout does not cover every stall: a launch with no metrics after
  # LAUNCH_TIMEOUT seconds is killed here, and counts as one that never started.
  local try guard ok
  for try in 1 2; do
    rm -f "$dir/$config.jsonl"
    (sleep "${LAUNCH_TIMEOUT:-150}"; [ -e "$dir/$config.jsonl" ] || pkill -f -- "--metrics $dir/$config.jsonl") &
    guard=$!
    ok=0
    # shellcheck disable=SC2086
    mpirun -np "$NP" --oversubscribe "${launch[@]}" "$ORPHEUS" train "${common[@]}" ${FLAGS[$config]} \
      --metrics "$dir/$config.jsonl" >"$dir/$config.log" 2>&1 && ok=1
    kill "$guard" 2>/dev/null || true
    wait "$guard" 2>/dev/null || true
    [ "$ok" = 1 ] && break
    if [ "$try" = 2 ] || [ -e "$dir/$config.jsonl" ]; then say "$scenario $config failed: $dir/$config.log"; exit 1; fi
    say "$scenario $config: the launch failed before any rank started; launching again"
  done
  if [ -n "$watcher" ]; then kill "$watcher" 2>/dev/null || true; wait "$watcher" 2>/dev/null || true; fi
}

seconds_to_target() {  # METRICS: the summary's seconds, when the run reached the target
  "$PYTHON" - "$1" <<'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
print(last["seconds"] if last.get("reached_target") else "")
PY
}

[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || { say "REPS must be a positive integer, not '$REPS'"; exit 2; }
drop="${DROP_AT:-}"
for rep in $(seq "$REPS"); do
  for scenario in "${SCENARIOS[@]}"; do
    case "$scenario" in
      1gbit) cluster_up 1gbit; for c in defaults hand adapt; do run "$rep" 1gbit "$c" 1gbit; done ;;
      10gbit) cluster_up 10gbit; for c in defaults hand adapt; do run "$rep" 10gbit "$c" 10gbit; done ;;
      drop)
        cluster_up 10gbit
        if [ -z "$drop" ]; then
          # A third of the hand-tuned time to target at 10gbit, from rep 1 (measured once).
          hand="$RAW_DIR/rep1/10gbit/hand.jsonl"
          [ -f "$hand" ] || run 1 10gbit hand 10gbit
          t=$(seconds_to_target "$hand")
          drop=$("$PYTHON" -c "print(round(float('${t:-60}') / 3, 1))")
        fi
        say "drop: 10gbit -> 1gbit after ${drop}s"
        for c in defaults hand adapt; do run "$rep" drop "$c" 10gbit "$drop"; done
        ;;
    esac
    cluster_down
  done
done

"$PYTHON" "$ROOT/scripts/bench/plot_adapt.py" --raw "$RAW_DIR" --out "$OUT_DIR" --target "$TARGET" --np "$NP" \
  --scenarios "$(IFS=,; echo "${SCENARIOS[*]}")" --reps "$REPS"
