#!/usr/bin/env bash
# recovery.sh ORPHEUS COMPARE MPIEXEC CHECK: failures inside a job (--fail-prob). With
# the SV checkpoint a failed rank rebuilds its replica from snapshot + log, so a BSP
# run with failures ends bitwise where the same run without failures does; with the
# matrix checkpoint it falls back to the last whole matrix and the clocks since are lost.
set -euo pipefail
orpheus=$1; compare=$2; mpiexec=$3; check=$4
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
flags=(--train "$data/train-images-idx3-ubyte.gz" --clocks 120 --batch 50 --average-every 20 --progress off --log-level warn)
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --save "$out/clean.h5" >/dev/null
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --ckpt sv --ckpt-dir "$out/sv" --fail-prob 0.05 \
  --metrics "$out/sv.jsonl" --save "$out/sv.h5" >/dev/null
failures=$(grep -v summary "$out/sv.jsonl" | grep -o '"failures": [0-9]*' | awk '{s += $2} END {print s}')
echo "SV checkpoint: $failures failures recovered"
[ "$failures" -ge 1 ]
"$compare" "$out/sv.h5" "$out/clean.h5" 0
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --ckpt matrix --ckpt-every 20 --ckpt-dir "$out/mx" \
  --fail-prob 0.05 --metrics "$out/mx.jsonl" --save "$out/mx.h5" >/dev/null
ls "$out/mx" | grep -q matrix-
"$check" "$out/mx.jsonl" "clocks>=120"
