#!/usr/bin/env bash
# elastic_live_changes.sh ORPHEUS COMPARE MPIEXEC MODEL RUNS [DEVICE]: live membership changes
# of a BSP job started on 4 ranks, on Fashion-MNIST, MODEL `mlr` or `mlp` (one
# hidden layer of 32 ReLUs, a small MLP so that 6 ranks fit on 2 cores; MLR multicasts
# to 2 random peers, so every replica differs). RUNS, any of:
#   grow         `ctl grow 2`: 4 -> 6 ranks; the job ends on 6.
#   grow-shrink  `ctl grow 2`, then `ctl shrink 2 5` (one rank the job started with,
#                one it spawned): 4 -> 6 -> 4 ranks; the job ends on 4.
#   resume-grow  no live change: the job ends after half its clocks on 4 ranks and
#                `--resume --elastic` continues it on 6 (P' > P).
# Each: exit 0 after its clocks, one membership epoch per change, `restore` of every
# replica at the last clock (after the last change) equals the replica the rank
# held, bitwise; at each change clock every replica of the new epoch is the same
# average; the summary's traffic covers every epoch.
# DEVICE (default cpu): --device; on `strict` the replicas are resident and each
# minibatch is copied ahead by the data queue while the clock before computes, also
# at the clocks where the membership changes.
set -euo pipefail
orpheus=$1; compare=$2; mpiexec=$3; model=$4; runs=$5; device=${6:-cpu}
out=$(mktemp -d)
job=
trap '[ -n "$job" ] && kill -9 $(pgrep -P "$job" 2>/dev/null) "$job" 2>/dev/null; rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
clocks=160
flags=(--train "$data/train-images-idx3-ubyte.gz" --test "$data/t10k-images-idx3-ubyte.gz" --batch 20
       --eval-every 40 --progress off --ckpt sv --inject-delay 0:10 --device "$device")
if [ "$model" = mlp ]; then
  cat >"$out/mlp.loss" <<'EOF'
dim hidden = 32
param W1[hidden, features] init he
param b1[hidden] init zeros
param W2[classes, hidden] init glorot
param b2[classes] init zeros
input x[features]
label y[classes]
h = relu(W1 * x + b1)
a = W2 * h + b2
loss cross_entropy(softmax(a), y)
predict a
EOF
  flags+=(--model "$out/mlp.loss" --lr 0.05)
else
  flags+=(--multicast random --fanout 2)
fi

# The newest clock in the metrics $1 (none: empty).
lastClock() { grep -o '^{"clock": [0-9]*' "$1" 2>/dev/null | tail -n 1 | grep -o '[0-9]*$' || true; }
# Waits (bounded) until the metrics $1 have a line of clock $2 or later.
waitClock() {
  for _ in $(seq 1200); do
    c=$(lastClock "$1")
    [ -n "$c" ] && [ "$c" -ge "$2" ] && return 0
    kill -0 "$job" 2>/dev/null || { echo "the job ended before clock $2"; exit 1; }
    sleep 0.05
  done
  echo "no clock $2 within 60 s"; exit 1
}
# Waits (bounded) until the metrics $1 hold a line matching $2; prints its clock.
waitLine() {
  for _ in $(seq 1200); do
    if grep -q "$2" "$1" 2>/dev/null; then grep "$2" "$1" | head -n 1 | grep -o '"clock": [0-9]*' | grep -o '[0-9]*$'; return 0; fi
    kill -0 "$job" 2>/dev/null || { echo "the job ended without '$2'" >&2; exit 1; }
    sleep 0.05
  done
  echo "no '$2' within 60 s" >&2; exit 1
}
# checkTotals METRICS and checkEnd DIR RANKS (tests/e2e/live_checks.sh).
source "$(dirname "${BASH_SOURCE[0]}")/live_checks.sh"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# checkAverage DIR CLOCK RANKS: at the change clock every replica of the new epoch is the same.
checkAverage() {
  "$orpheus" restore --ckpt-dir "$1/ckpt" --replica 0 --clock "$2" --out "$1/at$2-first.h5" >/dev/null
  "$orpheus" restore --ckpt-dir "$1/ckpt" --replica $(($3 - 1)) --clock "$2" --out "$1/at$2-last.h5" >/dev/null
  "$compare" "$1/at$2-first.h5" "$1/at$2-last.h5" 0
}
launch() {
  local d=$1; mkdir -p "$d/replicas"
  "$mpiexec" -n 4 --oversubscribe "$orpheus" train "${flags[@]}" --clocks $clocks --ckpt-dir "$d/ckpt" --metrics "$d/m.jsonl" \
    --save "$d/final.h5" --save-replicas "$d/replicas" >"$d/log" 2>&1 &
  job=$!
}
finish() {
  local rc=0; wait "$job" || rc=$?
  job=
  [ "$rc" -eq 0 ] || { cat "$1/log"; echo "exit $rc"; exit 1; }
}

for run in $runs; do
  d="$out/$run"
  if [ "$run" = resume-grow ]; then
    mkdir -p "$d/replicas"
    "$mpiexec" -n 4 --oversubscribe "$orpheus" train "${flags[@]}" --clocks $((clocks / 2)) --ckpt-dir "$d/ckpt" \
      --log-level warn >/dev/null
    "$mpiexec" -n 6 --oversubscribe "$orpheus" train "${flags[@]}" --clocks $clocks --ckpt-dir "$d/ckpt" --resume --elastic \
      --metrics "$d/m.jsonl" --save "$d/final.h5" --save-replicas "$d/replicas" >"$d/log" 2>&1 \
      || { cat "$d/log"; exit 1; }
    [ "$(job_records "$orpheus" "$d/ckpt" epoch)" = "epoch 1 clock $((clocks / 2)) ranks 6" ] \
      || { job_records "$orpheus" "$d/ckpt" epoch; exit 1; }
    checkEnd "$d" 6
    checkAverage "$d" $((clocks / 2)) 6
    echo "$model $run: ok"
    continue
  fi
  launch "$d"
  waitClock "$d/m.jsonl" 20
  "$orpheus" ctl "$d/ckpt" grow 2
  grew=$(waitLine "$d/m.jsonl" '"joined": 2,')
  case $run in
    grow)
      finish "$d"
      [ "$(job_records "$orpheus" "$d/ckpt" epoch)" = "epoch 1 clock $grew ranks 6" ] \
        || { job_records "$orpheus" "$d/ckpt" epoch; exit 1; }
      checkEnd "$d" 6
      checkAverage "$d" "$grew" 6
      ;;
    grow-shrink)
      waitClock "$d/m.jsonl" $((grew + 20))
      "$orpheus" ctl "$d/ckpt" shrink 2 5
      finish "$d"
      shrank=$(grep -o '"left": true, "rank": 5, "clock": [0-9]*' "$d/m.jsonl" | grep -o '[0-9]*$')
      grep -q '"left": true, "rank": 2, "clock": '"$shrank," "$d/m.jsonl"
      [ "$(job_records "$orpheus" "$d/ckpt" epoch)" = "$(printf 'epoch 1 clock %s ranks 6\nepoch 2 clock %s ranks 4' "$grew" "$shrank")" ] \
        || { job_records "$orpheus" "$d/ckpt" epoch; exit 1; }
      checkEnd "$d" 4
      checkAverage "$d" "$grew" 6
      checkAverage "$d" "$shrank" 4
      # A spawned rank's replica stays restorable up to the change that dropped it.
      "$orpheus" restore --ckpt-dir "$d/ckpt" --replica 5 --clock "$shrank" --out "$d/old5.h5" >/dev/null
      ;;
    *) echo "unknown run '$run'"; exit 2 ;;
  esac
  echo "$model $run: ok (grew after clock $grew${shrank:+, shrank after clock $shrank})"
done
