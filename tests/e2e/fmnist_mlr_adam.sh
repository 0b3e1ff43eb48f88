#!/usr/bin/env bash
# fmnist_mlr_adam.sh ORPHEUS CHECK MPIEXEC: MLR on Fashion-MNIST, 4 ranks, batch 100
# per rank, with --optimizer adam at its default lr (no --lr given): reaches test
# accuracy >= 0.82 within 1000 clocks (550 when measured); the saved model carries
# its Adam state in /optimizer and `orpheus eval` reads it.
set -euo pipefail
orpheus=$1; check=$2; mpiexec=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
"$mpiexec" -n 4 --oversubscribe "$orpheus" train --train "$data/train-images-idx3-ubyte.gz" \
  --test "$data/t10k-images-idx3-ubyte.gz" --clocks 1000 --batch 100 --eval-every 50 --target-accuracy 0.82 \
  --optimizer adam --progress off --metrics "$out/metrics.jsonl" --save "$out/model.h5" | tee "$out/log"
"$check" "$out/metrics.jsonl" "test_accuracy>=0.82" "clocks<=1000"
grep -q '"reached_target": true' "$out/metrics.jsonl" || { echo "target not reached"; exit 1; }
"$orpheus" eval --params "$out/model.h5" --model mlr --test "$data/t10k-images-idx3-ubyte.gz"
/usr/bin/python3 -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r'); assert 'optimizer/W/m' in f and 'optimizer/W/v' in f, list(f)" "$out/model.h5"
