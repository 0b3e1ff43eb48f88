#!/usr/bin/env bash
# fmnist_mlr.sh ORPHEUS CHECK MPIEXEC: MLR on Fashion-MNIST, 4 ranks, batch 100 per
# rank, reaches test accuracy >= 0.82 within 1000 clocks; `orpheus eval` on the
# saved model reproduces the final accuracy.
set -euo pipefail
orpheus=$1; check=$2; mpiexec=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
"$mpiexec" -n 4 --oversubscribe "$orpheus" train --train "$data/train-images-idx3-ubyte.gz" \
  --test "$data/t10k-images-idx3-ubyte.gz" --clocks 1000 --batch 100 --eval-every 250 \
  --progress off --metrics "$out/metrics.jsonl" --save "$out/model.h5"
"$check" "$out/metrics.jsonl" "test_accuracy>=0.82" "clocks<=1000"
line=$("$orpheus" eval --params "$out/model.h5" --model mlr --test "$data/t10k-images-idx3-ubyte.gz")
echo "$line"
want=$(grep '"summary": true' "$out/metrics.jsonl" | sed -E 's/.*"test_accuracy": ([0-9.]+).*/\1/')
got=$(echo "$line" | sed -E 's/.*"test_accuracy": ([0-9.]+).*/\1/')
[ "$want" = "$got" ] || { echo "eval accuracy $got differs from training's $want"; exit 1; }
