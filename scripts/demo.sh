#!/usr/bin/env bash
# Installs what is missing, builds Orpheus (Release) and trains multinomial logistic
# regression on Fashion-MNIST with 4 MPI ranks exchanging sufficient vectors.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$ROOT/scripts/setup.sh"
build "$ROOT/build-release" Release -DORPHEUS_BUILD_TESTS=OFF

DATA=/usr/share/datasets/fashion-mnist
OUT="$ROOT/demo-output"
mkdir -p "$OUT"
mpirun -np 4 --oversubscribe "$ROOT/build-release/engine/orpheus" train \
  --model mlr \
  --train "$DATA/train-images-idx3-ubyte.gz" --test "$DATA/t10k-images-idx3-ubyte.gz" \
  --clocks 1000 --batch 100 --lr 0.1 --sync sv --eval-every 100 \
  --metrics "$OUT/metrics.jsonl" --save "$OUT/mlr.h5"

echo
echo "evaluating the saved model on its own:"
"$ROOT/build-release/engine/orpheus" eval --params "$OUT/mlr.h5" --model mlr --test "$DATA/t10k-images-idx3-ubyte.gz"
