#!/usr/bin/env bash
# lstm_resume.sh ORPHEUS COMPARE MPIEXEC: kill -9 of every process of a BSP job
# training a small LSTM language model (rotation on), then --resume with the same
# flags: the recurrent states each rank carried into the next segment of its streams
# come back with the parameters, so the final parameters are bitwise an
# uninterrupted run's.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
orpheus=$1; compare=$2; mpiexec=$3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out=$(mktemp -d); trap 'pkill -9 -f "ckpt-dir $out" 2>/dev/null || true; rm -rf "$out"' EXIT
# The synthetic stream of lstm_equivalence.sh: 6,000 tokens over a vocabulary of 40.
"$here/synthetic_tokens.sh" "$out/tokens"
sed -e 's/^dim embed = .*/dim embed = 8/' -e 's/^dim hidden = .*/dim hidden = 8/' \
  "$here/../../examples/lstm.loss" >"$out/lstm.loss"
flags=(--model "$out/lstm.loss" --train "$out/tokens" --clocks 300 --batch 4 --lr 0.05 --seed 7 --progress off
       --rotate-every 40 --ckpt sv --inject-delay 0:10)
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --ckpt-dir "$out/whole" --save "$out/whole.h5" \
  --log-level warn

"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --ckpt-dir "$out/killed" --save "$out/resumed.h5" \
  >/dev/null 2>&1 &
job=$!
# Kill every process once a few segments are durable.
wait_for_segments "$out/killed/replica-0" 2 || true
kill_job "ckpt-dir $out/killed" "$job"
[ ! -e "$out/resumed.h5" ] || { echo "the job finished before it was killed"; exit 1; }
ls "$out/killed"
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --ckpt-dir "$out/killed" --save "$out/resumed.h5" \
  --resume 2>&1 | tee "$out/resume.log"
grep -q "resumed from clock [1-9]" "$out/resume.log" || { echo "the job did not resume from a clock past 0"; exit 1; }
"$compare" "$out/resumed.h5" "$out/whole.h5" 0
