#!/usr/bin/env bash
# recovery.sh ORPHEUS COMPARE MPIEXEC CHECK: failures inside a job (--fail-prob). A
# failed rank loses its replica and the part of its SV log that was only staged in
# memory; it comes back at the newest clock the log on disk or a snapshot reaches,
# the clocks since are lost, and the log records the reset. Checked at np 2 (BSP):
#  - failures happen and lose clocks (lost_clocks in the metrics, summed in the summary);
#  - restore of the last clock equals, bitwise, the replica each rank ended with, with
#    averaging + snapshots (broadcast) and with rotation (random multicast);
#  - restore of a lost clock says it was lost; inspect finds no damage;
#  - the whole-matrix baseline falls back to its last matrix and loses clocks too.
set -euo pipefail
orpheus=$1; compare=$2; mpiexec=$3; check=$4
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
flags=(--train "$data/train-images-idx3-ubyte.gz" --batch 50 --progress off --log-level warn)

# Sum of a field over the per-clock lines of a metrics file.
field_sum() { grep -v '"summary"' "$1" | grep -o "\"$2\": [0-9]*" | awk '{s += $2} END {print s + 0}'; }

# run NAME CLOCKS FLAGS...: trains with the SV checkpoint and failures, then checks
# the log against the replicas the ranks ended with.
run() {
  local name=$1 clocks=$2; shift 2
  mkdir -p "$out/$name-replicas"
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --clocks "$clocks" "$@" --ckpt sv \
    --ckpt-dir "$out/$name" --fail-prob 0.05 --metrics "$out/$name.jsonl" --save-replicas "$out/$name-replicas" \
    >/dev/null
  local failures lost
  failures=$(field_sum "$out/$name.jsonl" failures)
  lost=$(field_sum "$out/$name.jsonl" lost_clocks)
  echo "$name: $failures failures, $lost clocks lost"
  [ "$failures" -ge 1 ] && [ "$lost" -ge 1 ]
  "$check" "$out/$name.jsonl" "failures>=$failures" "failures<=$failures" "lost_clocks>=$lost" "lost_clocks<=$lost"
  "$orpheus" inspect "$out/$name" | tee "$out/$name.inspect"
  ! grep -q damaged "$out/$name.inspect"
  for r in 0 1; do
    "$orpheus" restore --ckpt-dir "$out/$name" --replica "$r" --clock "$clocks" --out "$out/$name-r$r.h5" >/dev/null
    "$compare" "$out/$name-r$r.h5" "$out/$name-replicas/replica-$r.h5" 0
  done
}

run avg 120 --average-every 20
run rot 150 --multicast random --fanout 1 --rotate-every 30

# A clock a failure lost cannot be restored, and the message says why: take a
# clock at which one rank failed and lost at least two clocks; the clock before it
# is lost for the replica that rank held.
T=$(awk '/"summary"/ {next} {
  c = f = l = -1
  for (i = 1; i < NF; ++i) {
    if ($i ~ /"clock":$/) c = $(i + 1) + 0
    if ($i == "\"failures\":") f = $(i + 1) + 0
    if ($i == "\"lost_clocks\":") l = $(i + 1) + 0
  }
  if (!found && f == 1 && l >= 2) { print c; found = 1 }
}' "$out/rot.jsonl")
if [ -n "$T" ]; then
  said=0
  for r in 0 1; do
    set +e
    msg=$("$orpheus" restore --ckpt-dir "$out/rot" --replica "$r" --clock $((T - 1)) --out "$out/lost.h5" 2>&1); rc=$?
    set -e
    if [ "$rc" -ne 0 ]; then
      echo "$msg"
      [ "$rc" -eq 2 ] && echo "$msg" | grep -q "is lost" && said=1
    fi
  done
  [ "$said" -eq 1 ]
fi

# The whole-matrix baseline: back to the last matrix, the clocks since are lost.
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --clocks 120 --average-every 20 --ckpt matrix \
  --ckpt-every 20 --ckpt-dir "$out/mx" --fail-prob 0.05 --metrics "$out/mx.jsonl" >/dev/null
ls "$out/mx" | grep -q matrix-
"$check" "$out/mx.jsonl" "clocks>=120" "failures>=1" "lost_clocks>=1"
echo "recovery checks passed"
