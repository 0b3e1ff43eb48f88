#!/usr/bin/env bash
# scripts/bench/elastic.sh: elastic restart (README: elastic runs), MLR on
# Fashion-MNIST, BSP, batch $BATCH per rank, to $TARGET test accuracy. Writes
# scripts/bench/results/elastic.md (and elastic.png, plot_elastic.py).
#
#  1. static: $NP ranks, uninterrupted: seconds and clocks to the target.
#  2. restart: the same job, one rank killed (kill -9) once $KILL_AT clocks are
#     logged, then relaunched by scripts/elastic_run.sh on the $((NP-1)) ranks left
#     (--resume --elastic): clocks lost, seconds from the kill to the resumed job's
#     first clock (relaunch, data loading, restore, redistribution), total seconds and clocks to the
#     target, ratio to static. Medians of $REPS runs.
#  3. balance: rank 1 slowed by --inject-delay 1:$DELAY_MS (with --balance: per
#     $BATCH examples), $BAL_CLOCKS clocks of BSP: seconds per clock (rank 0's, over
#     the second half, once decisions have settled) with and without --balance,
#     against the unslowed job and the balanced ideal P / ((P-1)/t0 + 1/(t0 + d)),
#     t0 the unslowed seconds per clock and d the delay. Medians of $REPS runs.
#  4. live scale-in (runs with part 2): the same job, SIGTERM to rank $((NP-1)) once
#     $LIVE_AT clocks are logged; it leaves at the next clock boundary and the job goes on with $((NP-1))
#     ranks without a restart (engine/membership/live.h): release latency (notice -> replica,
#     data and buffers freed, the job's `left` line), notice -> the process ended
#     (Open MPI's MPI_Finalize waits for the whole job: about the job's remaining
#     time), total seconds and clocks to the target. Medians of $REPS runs.
#  5. scaleout (Litz, papers/000_…): $SO_CLOCKS clocks of MLR and $SO_MLP_CLOCKS of the MLP
#     of examples/mlp.loss (batch $BATCH per rank, no target: a fixed amount of work),
#     static on $NP ranks, static on $((2*NP)), and $NP -> $((2*NP)) live: `orpheus ctl DIR grow $NP`
#     once 30% of the clocks are done (the ranks join at the next clock boundary C).
#     Litz's ideal: the job had it run on $((2*NP)) ranks from C on,
#       ideal = t_C + T_2NP(C..N),
#     t_C the scale-out run's wall seconds from launch to the request, T_2NP(C..N) the
#     static $((2*NP))-rank run's training seconds over clocks C+1..N (its `seconds` at N
#     minus at C); scale-out / ideal - 1 is the overhead Litz reports (< 1% for MLR).
#     Wall seconds, launch to exit, medians of $REPS runs.
#  6. preempt (resource-elastic ML, papers/004_…): MLR to $TARGET on $NP ranks; half
#     the ranks (the upper half) leave at the first clock boundary after clock $PRE_AT
#     (`orpheus ctl DIR shrink`) and as many come back after clock $BACK_AT (`ctl grow`):
#     wall seconds and clocks to the target against the static job, and the test accuracy
#     every 25 clocks of both (the first run). Medians of $REPS runs.
#
# Options (environment): NP=4 BATCH=100 TARGET=0.8 KILL_AT=100 LIVE_AT=$KILL_AT REPS=3 CLOCKS=3000
#   ROWS="restart balance scaleout preempt" (the parts to run) DELAY_MS=50 BAL_CLOCKS=400
#   BALANCE_EVERY=20 CHUNK_ROWS=250 SO_CLOCKS=1000 SO_MLP_CLOCKS=200 MLP=examples/mlp.loss
#   PRE_AT=100 BACK_AT=200
#   SMOKE=1 (tiny settings: a check that the script runs, not a measurement)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/scripts/common.sh"
ORPHEUS=${ORPHEUS:-$ROOT/build-release/engine/orpheus}
DATA=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
NP=${NP:-4}; BATCH=${BATCH:-100}; TARGET=${TARGET:-0.8}; KILL_AT=${KILL_AT:-100}; REPS=${REPS:-3}
CLOCKS=${CLOCKS:-3000}
ROWS=${ROWS:-restart balance scaleout preempt}; DELAY_MS=${DELAY_MS:-50}; BAL_CLOCKS=${BAL_CLOCKS:-400}
BALANCE_EVERY=${BALANCE_EVERY:-20}; CHUNK_ROWS=${CHUNK_ROWS:-250}; LIVE_AT=${LIVE_AT:-$KILL_AT}
SO_CLOCKS=${SO_CLOCKS:-1000}; SO_MLP_CLOCKS=${SO_MLP_CLOCKS:-200}; MLP=${MLP:-$ROOT/examples/mlp.loss}
PRE_AT=${PRE_AT:-100}; BACK_AT=${BACK_AT:-200}
if [ "${SMOKE:-0}" = 1 ]; then
  NP=3; BATCH=20; TARGET=0.76; KILL_AT=50; LIVE_AT=5; REPS=1; CLOCKS=1500; DELAY_MS=10; BAL_CLOCKS=40; BALANCE_EVERY=5
  SO_CLOCKS=60; SO_MLP_CLOCKS=20; PRE_AT=10; BACK_AT=30
fi
runs() { [[ " $ROWS " == *" $1 "* ]]; }
RES=${RES:-$ROOT/scripts/bench/results}; RAW="$ROOT/build/bench-raw/elastic"
mkdir -p "$RES" "$RAW"
flags=(--train "$DATA/train-images-idx3-ubyte.gz" --test "$DATA/t10k-images-idx3-ubyte.gz" --batch "$BATCH"
       --clocks "$CLOCKS" --eval-every 25 --target-accuracy "$TARGET" --progress off --ckpt sv)
summary() { grep -o "\"$2\": [0-9.e+-]*" "$1" | tail -n 1 | awk '{print $2}'; }
# Each part appends its table to the results file, emptied once here.
: >"$RES/elastic.md"
now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

static_s=(); static_c=(); lost=(); gap=(); total_s=(); total_c=(); release=(); exited=(); live_s=(); live_c=()
rankPid() {
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$p"; return; fi
  done
}
for rep in $(runs restart && seq "$REPS"); do
  d="$RAW/static-$rep"; rm -rf "$d"; mkdir -p "$d"
  t0=$(now)
  mpirun -n "$NP" --oversubscribe "$ORPHEUS" train "${flags[@]}" --ckpt-dir "$d/ckpt" --metrics "$d/m.jsonl" >/dev/null 2>&1
  static_s+=("$(echo "$(now) - $t0" | bc -l)"); static_c+=("$(summary "$d/m.jsonl" clocks)")

  d="$RAW/restart-$rep"; rm -rf "$d"; mkdir -p "$d"
  start=$(now)
  ORPHEUS="$ORPHEUS" "$ROOT/scripts/elastic_run.sh" --np "$NP" --retries 1 -- "${flags[@]}" --ckpt-dir "$d/ckpt" \
    --metrics "$d/m.jsonl" >"$d/run.log" 2>&1 &
  launcher=$!
  seg=$(( (KILL_AT + 49) / 50 ))
  until [ "$(ls "$d"/ckpt/replica-$((NP - 1))/seg-*.h5 2>/dev/null | wc -l)" -ge "$seg" ]; do
    kill -0 "$launcher" 2>/dev/null || { echo "elastic.sh: the job ended before clock $KILL_AT (raise TARGET)" >&2; exit 1; }
    sleep 0.05
  done
  killedAt=$(grep -o '"clock": [0-9]*' "$d/m.jsonl" | tail -n 1 | awk '{print $2}' || true)
  mpirunPid=$(pgrep -P "$launcher" -f mpirun | head -n 1)
  killTime=$(now); kill -9 "$(pgrep -P "$mpirunPid" | tail -n 1)"
  # The relaunched job says where it resumed once its replicas are restored and redistributed.
  until grep -q 'resumed from clock' "$d/run.log"; do
    sleep 0.05; kill -0 "$launcher" 2>/dev/null || break
  done
  firstTime=$(now)
  wait "$launcher"
  from=$(grep -o 'resumed from clock [0-9]*' "$d/run.log" | awk '{print $4}')
  lost+=("$((killedAt - from))"); gap+=("$(echo "$firstTime - $killTime" | bc -l)")
  total_s+=("$(echo "$(now) - $start" | bc -l)")
  total_c+=("$(summary "$d/m.jsonl" clocks)")

  d="$RAW/live-$rep"; rm -rf "$d"; mkdir -p "$d"
  start=$(now)
  mpirun -n "$NP" --oversubscribe "$ORPHEUS" train "${flags[@]}" --ckpt-dir "$d/ckpt" --metrics "$d/m.jsonl" \
    >"$d/run.log" 2>&1 &
  job=$!
  until [ "$(grep -o '"clock": [0-9]*' "$d/m.jsonl" 2>/dev/null | tail -n 1 | awk '{print $2}')" -ge "$LIVE_AT" ] 2>/dev/null; do
    kill -0 "$job" 2>/dev/null || { echo "elastic.sh: the job ended before clock $LIVE_AT (raise TARGET)" >&2; exit 1; }
    sleep 0.05
  done
  victim=$(rankPid "$job" $((NP - 1)))
  noticeTime=$(now); kill -TERM "$victim"
  while kill -0 "$victim" 2>/dev/null; do sleep 0.02; done
  exited+=("$(echo "$(now) - $noticeTime" | bc -l)")
  wait "$job"
  live_s+=("$(echo "$(now) - $start" | bc -l)")
  live_c+=("$(summary "$d/m.jsonl" clocks)")
  r=$(summary "$d/m.jsonl" release_seconds || true)
  [ -n "$r" ] || { echo "elastic.sh: the job ended before rank $((NP - 1)) left (raise TARGET)" >&2; exit 1; }
  release+=("$r")
done

m() { printf '%s\n' "$@" | median; }
runs restart && {
  echo "# Elastic restart (MLR, Fashion-MNIST, batch $BATCH per rank, target $TARGET; medians of $REPS)"
  echo
  echo "| run | ranks | clocks to target | wall seconds to target (with data loading) | clocks lost | kill → resumed (s) |"
  echo "| --- | --- | --- | --- | --- | --- |"
  echo "| static | $NP | $(m "${static_c[@]}") | $(m "${static_s[@]}") | | |"
  echo "| kill one at ~$KILL_AT, resume on $((NP - 1)) | $NP → $((NP - 1)) | $(m "${total_c[@]}") | $(m "${total_s[@]}") | $(m "${lost[@]}") | $(m "${gap[@]}") |"
  echo "| live: SIGTERM to one at ~$LIVE_AT, it leaves | $NP → $((NP - 1)) | $(m "${live_c[@]}") | $(m "${live_s[@]}") | 0 | |"
  echo
  echo "live scale-in, notice → the leaving rank's replica, data and buffers freed (release latency): $(m "${release[@]}") s;"
  echo "notice → its process ended: $(m "${exited[@]}") s (MPI_Finalize waits for the whole job)"
  echo
  echo "restart / static seconds: $(echo "$(m "${total_s[@]}") / $(m "${static_s[@]}")" | bc -l | cut -c1-5)"
} | tee -a "$RES/elastic.md"

if runs balance; then
# Seconds per clock over the second half of a run: rank 0's train seconds.
perClock() {
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
clocks = [r for r in rows if "clock" in r and "seconds" in r and not r.get("summary") and not r.get("rebalance")]
half = clocks[len(clocks) // 2 - 1]
print("%.6f" % ((clocks[-1]["seconds"] - half["seconds"]) / (clocks[-1]["clock"] - half["clock"])))
PY
}
bflags=(--train "$DATA/train-images-idx3-ubyte.gz" --batch "$BATCH" --clocks "$BAL_CLOCKS" --progress off
        --log-level warn --eval-every 0)
plain=(); slowed=(); balanced=(); slowShare=()
for rep in $(seq "$REPS"); do
  d="$RAW/balance-$rep"; rm -rf "$d"; mkdir -p "$d"
  mpirun -n "$NP" --oversubscribe "$ORPHEUS" train "${bflags[@]}" --metrics "$d/plain.jsonl" >/dev/null
  mpirun -n "$NP" --oversubscribe "$ORPHEUS" train "${bflags[@]}" --inject-delay "1:$DELAY_MS" \
    --metrics "$d/slowed.jsonl" >/dev/null
  mpirun -n "$NP" --oversubscribe "$ORPHEUS" train "${bflags[@]}" --inject-delay "1:$DELAY_MS" --balance \
    --balance-every "$BALANCE_EVERY" --chunk-rows "$CHUNK_ROWS" --metrics "$d/balanced.jsonl" >/dev/null
  plain+=("$(perClock "$d/plain.jsonl")"); slowed+=("$(perClock "$d/slowed.jsonl")")
  balanced+=("$(perClock "$d/balanced.jsonl")")
  slowShare+=("$(grep '"rebalance"' "$d/balanced.jsonl" | tail -n 1 | grep -o '"batch": \[[0-9, ]*\]' |
                 tr -d '[],' | awk '{print $3}')")
done
t0=$(m "${plain[@]}")
ideal=$(printf '%.6f' "$(echo "$NP / (($NP - 1) / $t0 + 1 / ($t0 + $DELAY_MS / 1000))" | bc -l)")
{
  echo
  echo "# Load balancing (MLR, Fashion-MNIST, BSP, $NP ranks, batch $BATCH per rank, rank 1 slowed by $DELAY_MS ms per $BATCH examples; medians of $REPS)"
  echo
  echo "| run | seconds per clock | / balanced ideal | rank 1's batch at the end |"
  echo "| --- | --- | --- | --- |"
  echo "| unslowed | $t0 | | $BATCH |"
  echo "| balanced ideal | $ideal | 1 | |"
  echo "| slowed | $(m "${slowed[@]}") | $(echo "$(m "${slowed[@]}") / $ideal" | bc -l | cut -c1-5) | $BATCH |"
  echo "| slowed, --balance (every $BALANCE_EVERY clocks, $CHUNK_ROWS rows per chunk) | $(m "${balanced[@]}") | $(echo "$(m "${balanced[@]}") / $ideal" | bc -l | cut -c1-5) | $(m "${slowShare[@]}") |"
} | tee -a "$RES/elastic.md"
fi

# Waits until the metrics $1 have a line of clock $2 or later; false once the job $3 has ended.
untilClock() {
  until [ "$(grep -o '^{"clock": [0-9]*' "$1" 2>/dev/null | tail -n 1 | awk '{print $2}')" -ge "$2" ] 2>/dev/null; do
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.005  # MLR clocks take milliseconds: the change lands a few clocks after the one asked for
  done
}
# Rank 0's training seconds at the end of clock $2 of the metrics $1.
secondsAt() { grep "^{\"clock\": $2," "$1" | grep -o '"seconds": [0-9.e+-]*' | head -n 1 | awk '{print $2}'; }

if runs scaleout; then
  big=$((2 * NP))
  {
    echo
    echo "# Scale-out $NP → $big ranks at 30% of the clocks (Litz; Fashion-MNIST, BSP, batch $BATCH per rank; medians of $REPS)"
    echo
    echo "ideal = t_C + T_$big(C..N): t_C the scale-out run's wall seconds from launch to the grow request, T_$big(C..N)"
    echo "the static $big-rank run's training seconds over clocks C+1..N; overhead = scale-out / ideal - 1."
    echo "On 2 cores $big ranks cannot be faster than $NP: static $big measures the cost of more ranks, and the ideal"
    echo "is that of a job that ran on $big from C on, so scale-out / ideal isolates the change itself."
    echo
    echo "| model | clocks N | static $NP (s) | static $big (s) | $NP → $big live (s) | change after clock C | spawn (s) | ideal (s) | scale-out / ideal |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  } | tee -a "$RES/elastic.md"
  for model in mlr mlp; do
    if [ "$model" = mlr ]; then n=$SO_CLOCKS; mflags=(); else n=$SO_MLP_CLOCKS; mflags=(--model "$MLP" --lr 0.1); fi
    sflags=(--train "$DATA/train-images-idx3-ubyte.gz" --batch "$BATCH" --clocks "$n" --eval-every 0 --progress off
            --log-level warn --ckpt sv "${mflags[@]}")
    s4=(); s8=(); grown=(); ideal=(); ratio=(); at=(); spawn=()
    for rep in $(seq "$REPS"); do
      d="$RAW/scaleout-$model-$rep"; rm -rf "$d"; mkdir -p "$d"
      t0=$(now)
      mpirun -n "$NP" --oversubscribe "$ORPHEUS" train "${sflags[@]}" --ckpt-dir "$d/s4" --metrics "$d/s4.jsonl" >/dev/null
      s4+=("$(echo "$(now) - $t0" | bc -l)")
      t0=$(now)
      mpirun -n "$big" --oversubscribe "$ORPHEUS" train "${sflags[@]}" --ckpt-dir "$d/s8" --metrics "$d/s8.jsonl" >/dev/null
      s8+=("$(echo "$(now) - $t0" | bc -l)")
      start=$(now)
      mpirun -n "$NP" --oversubscribe "$ORPHEUS" train "${sflags[@]}" --ckpt-dir "$d/live" --metrics "$d/live.jsonl" \
        >"$d/live.log" 2>&1 &
      job=$!
      untilClock "$d/live.jsonl" $((n * 3 / 10)) "$job" || { echo "elastic.sh: the $model job ended early" >&2; exit 1; }
      tC=$(echo "$(now) - $start" | bc -l)
      "$ORPHEUS" ctl "$d/live" grow "$NP" >/dev/null
      wait "$job"
      wall=$(echo "$(now) - $start" | bc -l)
      c=$(grep -o '"joined": [0-9]*, "clock": [0-9]*' "$d/live.jsonl" | awk '{print $4}')
      [ -n "$c" ] || { echo "elastic.sh: no rank joined the $model job ($d/live.log)" >&2; exit 1; }
      id=$(echo "$tC + $(secondsAt "$d/s8.jsonl" "$n") - $(secondsAt "$d/s8.jsonl" "$c")" | bc -l)
      grown+=("$wall"); ideal+=("$id"); ratio+=("$(echo "$wall / $id" | bc -l)"); at+=("$c")
      spawn+=("$(summary "$d/live.jsonl" spawn_seconds)")
      rm -rf "$d/s4" "$d/s8" "$d/live"  # the SV logs: gigabytes for the MLP
    done
    echo "| $model | $n | $(m "${s4[@]}") | $(m "${s8[@]}") | $(m "${grown[@]}") | $(m "${at[@]}") | $(m "${spawn[@]}") | $(m "${ideal[@]}") | $(m "${ratio[@]}" | cut -c1-5) |" |
      tee -a "$RES/elastic.md"
  done
fi

if runs preempt; then
  half=$((NP / 2))
  leavers=$(seq $((NP - half)) $((NP - 1)) | tr '\n' ' ')
  # The test accuracy by clock of the metrics $1 and $2, side by side.
  curve() {
    /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
def accuracy(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "clock" in r and "test_accuracy" in r and not r.get("summary"):
            out[r["clock"]] = r["test_accuracy"]
    return out
a, b = accuracy(sys.argv[1]), accuracy(sys.argv[2])
for c in sorted(set(a) | set(b)):
    f = lambda d: "%.4f" % d[c] if c in d else ""
    print("| %d | %s | %s |" % (c, f(a), f(b)))
PY
  }
  st_s=(); st_c=(); pre_s=(); pre_c=(); left=(); back=()
  for rep in $(seq "$REPS"); do
    d="$RAW/preempt-$rep"; rm -rf "$d"; mkdir -p "$d"
    t0=$(now)
    mpirun -n "$NP" --oversubscribe "$ORPHEUS" train "${flags[@]}" --ckpt-dir "$d/static" --metrics "$d/static.jsonl" \
      >/dev/null 2>&1
    st_s+=("$(echo "$(now) - $t0" | bc -l)"); st_c+=("$(summary "$d/static.jsonl" clocks)")
    start=$(now)
    mpirun -n "$NP" --oversubscribe "$ORPHEUS" train "${flags[@]}" --ckpt-dir "$d/pre" --metrics "$d/pre.jsonl" \
      >"$d/pre.log" 2>&1 &
    job=$!
    # A job that reaches the target first is not preempted (or not given its ranks back): the table says so.
    if untilClock "$d/pre.jsonl" "$PRE_AT" "$job"; then
      # shellcheck disable=SC2086
      "$ORPHEUS" ctl "$d/pre" shrink $leavers >/dev/null
      if untilClock "$d/pre.jsonl" "$BACK_AT" "$job"; then "$ORPHEUS" ctl "$d/pre" grow "$half" >/dev/null; fi
    fi
    wait "$job"
    pre_s+=("$(echo "$(now) - $start" | bc -l)"); pre_c+=("$(summary "$d/pre.jsonl" clocks)")
    l=$(grep -o '"left": true, "rank": [0-9]*, "clock": [0-9]*' "$d/pre.jsonl" | head -n 1 | awk '{print $6}')
    b=$(grep -o '"joined": [0-9]*, "clock": [0-9]*' "$d/pre.jsonl" | awk '{print $4}')
    left+=("${l:-none}"); back+=("${b:-none}")
  done
  {
    echo
    echo "# Preemption: half the ranks leave after clock ~$PRE_AT, come back after ~$BACK_AT (resource-elastic ML; MLR, Fashion-MNIST, BSP, $NP ranks, batch $BATCH per rank, to test accuracy $TARGET; medians of $REPS)"
    echo
    echo "| run | clocks to target | wall seconds to target | / static | left after clock | back after clock |"
    echo "| --- | --- | --- | --- | --- | --- |"
    echo "| static, $NP ranks | $(m "${st_c[@]}") | $(m "${st_s[@]}") | 1 | | |"
    echo "| $NP → $((NP - half)) → $NP live | $(m "${pre_c[@]}") | $(m "${pre_s[@]}") | $(echo "$(m "${pre_s[@]}") / $(m "${st_s[@]}")" | bc -l | cut -c1-5) | ${left[*]} | ${back[*]} |"
    echo
    echo "Test accuracy by clock (the first run of each):"
    echo
    echo "| clock | static | preempted |"
    echo "| --- | --- | --- |"
    curve "$RAW/preempt-1/static.jsonl" "$RAW/preempt-1/pre.jsonl"
  } | tee -a "$RES/elastic.md"
fi

# The accuracy around the preemption and the scale-out seconds, from the report.
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 "$ROOT/scripts/bench/plot_elastic.py" "$RES/elastic.md" "$RES/elastic.png"
fi
