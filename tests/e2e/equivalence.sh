#!/usr/bin/env bash
# equivalence.sh ORPHEUS COMPARE MPIEXEC NP [TOLERANCE FLAGS...]: with full broadcast
# and no selection, --sync sv and --sync dense reach the same parameters after 50
# clocks of MLR on Fashion-MNIST (relative Frobenius difference <= TOLERANCE, 1e-5 by
# default); FLAGS replace --lr 0.1 in both runs (e.g. --optimizer adam: its default lr).
set -euo pipefail
orpheus=$1; compare=$2; mpiexec=$3; np=$4; tolerance=${5:-1e-5}; shift $(( $# < 5 ? $# : 5 ))
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
[ $# -gt 0 ] || set -- --lr 0.1
for sync in sv dense; do
  "$mpiexec" -n "$np" --oversubscribe "$orpheus" train --train "$data/train-images-idx3-ubyte.gz" \
    --clocks 50 --batch 100 --seed 7 --sync "$sync" --progress off --log-level warn --save "$out/$sync.h5" "$@"
done
"$compare" "$out/sv.h5" "$out/dense.h5" "$tolerance"
