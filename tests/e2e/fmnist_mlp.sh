#!/usr/bin/env bash
# fmnist_mlp.sh ORPHEUS CHECK MPIEXEC SRC: the MLP of examples/mlp.loss
# (784-1024-1024-10), 4 ranks, batch 100 per rank, reaches test accuracy >= 0.85
# on Fashion-MNIST (it stops there: about 450 clocks).
set -euo pipefail
orpheus=$1; check=$2; mpiexec=$3; src=$4
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
"$mpiexec" -n 4 --oversubscribe "$orpheus" train --model "$src/examples/mlp.loss" \
  --train "$data/train-images-idx3-ubyte.gz" --test "$data/t10k-images-idx3-ubyte.gz" \
  --clocks 1200 --batch 100 --lr 0.1 --eval-every 50 --target-accuracy 0.85 --progress off \
  --metrics "$out/metrics.jsonl" --save "$out/mlp.h5"
"$check" "$out/metrics.jsonl" "test_accuracy>=0.85"
"$orpheus" eval --model "$src/examples/mlp.loss" --params "$out/mlp.h5" --test "$data/t10k-images-idx3-ubyte.gz"
