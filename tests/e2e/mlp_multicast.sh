#!/usr/bin/env bash
# mlp_multicast.sh ORPHEUS CHECK MPIEXEC SRC: an MLP at np 8 (oversubscribed) with
# --select 25 --multicast random --fanout 3 --consistency ssp --staleness 4 reaches
# test accuracy >= 0.85 on Fashion-MNIST, and the bytes sent per clock match the
# analytic count: per sender Q x (header + C coefficients + per layer (matrix entry
# + C(J + K) + C^2 core + C bias coefficients)) x 4 bytes, within 5%. The MLP is
# examples/mlp.loss (784-1024-1024-10); about 5 minutes on 2 cores, so this test is
# labelled "long" and runs with ORPHEUS_LONG_TESTS=1 scripts/test.sh (or ctest -L long).
set -euo pipefail
orpheus=$1; check=$2; mpiexec=$3; src=$4
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
model=${MLP:-$src/examples/mlp.loss}
clocks=${MLP_MULTICAST_CLOCKS:-2000}
"$mpiexec" -n 8 --oversubscribe "$orpheus" train --model "$model" \
  --train "$data/train-images-idx3-ubyte.gz" --test "$data/t10k-images-idx3-ubyte.gz" \
  --clocks "$clocks" --batch 100 --eval-every 100 --select 25 --multicast random --fanout 3 \
  --consistency ssp --staleness 4 --progress off --metrics "$out/metrics.jsonl"
C=25; Q=3; P=8
h1=$(sed -nE 's/^dim hidden1 = ([0-9]+).*/\1/p' "$model"); h2=$(sed -nE 's/^dim hidden2 = ([0-9]+).*/\1/p' "$model")
layers="$h1:784 $h2:$h1 10:$h2"
per=$((64 + 4 * C))
for l in $layers; do J=${l%%:*}; K=${l##*:}; per=$((per + 32 + 4 * C * (J + K) + 4 * C * C + 4 * C)); done
analytic=$((per * Q * P))
lo=$((analytic * 95 / 100)); hi=$((analytic * 105 / 100))
echo "analytic bytes per clock: $analytic"
"$check" "$out/metrics.jsonl" "best_test_accuracy>=0.85" "bytes_per_clock>=$lo" "bytes_per_clock<=$hi" "max_clock_gap<=4"
