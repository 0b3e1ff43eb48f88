#!/usr/bin/env bash
# lstm_equivalence.sh ORPHEUS COMPARE MPIEXEC NP [SV FLAGS...]: an LSTM language
# model's SVs, per (example, step), sent in full to every rank under BSP, give the
# same parameters as dense-gradient allreduce training (relative Frobenius
# difference <= 1e-5 after 20 clocks) on a small synthetic token stream; SV FLAGS go
# to the SV run (e.g. --select-unit step: the same SVs as B*T columns).
set -euo pipefail
orpheus=$1; compare=$2; mpiexec=$3; np=$4; shift 4; svFlags=("$@")
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
# 6,000 tokens over a vocabulary of 40 from a fixed linear congruential sequence,
# 12 to a line, with some structure to learn (a token often repeats its predecessor + 1).
"$here/synthetic_tokens.sh" "$out/tokens"
sed -e 's/^dim embed = .*/dim embed = 8/' -e 's/^dim hidden = .*/dim hidden = 8/' \
  "$here/../../examples/lstm.loss" >"$out/lstm.loss"
for sync in sv dense; do
  extra=()
  [ "$sync" = sv ] && extra=("${svFlags[@]}")
  "$mpiexec" -n "$np" --oversubscribe "$orpheus" train --model "$out/lstm.loss" --train "$out/tokens" \
    --clocks 20 --batch 4 --lr 0.05 --seed 7 --sync "$sync" --progress off --log-level warn --save "$out/$sync.h5" \
    "${extra[@]}"
done
"$compare" "$out/sv.h5" "$out/dense.h5" 1e-5
