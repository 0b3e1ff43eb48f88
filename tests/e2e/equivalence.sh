#!/usr/bin/env bash
# equivalence.sh ORPHEUS COMPARE MPIEXEC NP: with full broadcast and no selection,
# --sync sv and --sync dense reach the same parameters after 50 clocks of MLR on
# Fashion-MNIST (relative Frobenius difference <= 1e-5).
set -euo pipefail
orpheus=$1; compare=$2; mpiexec=$3; np=$4
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
for sync in sv dense; do
  "$mpiexec" -n "$np" --oversubscribe "$orpheus" train --train "$data/train-images-idx3-ubyte.gz" \
    --clocks 50 --batch 100 --lr 0.1 --seed 7 --sync "$sync" --progress off --log-level warn --save "$out/$sync.h5"
done
"$compare" "$out/sv.h5" "$out/dense.h5" 1e-5
