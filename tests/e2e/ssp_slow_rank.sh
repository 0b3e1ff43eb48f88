#!/usr/bin/env bash
# ssp_slow_rank.sh ORPHEUS CHECK MPIEXEC: MLR on Fashion-MNIST at np 4 with random
# multicast and SSP (s = 2) while rank 1 sleeps every clock: no rank ever runs more
# than 2 clocks ahead (from the metrics), and training still reaches 0.82.
set -euo pipefail
orpheus=$1; check=$2; mpiexec=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
"$mpiexec" -n 4 --oversubscribe "$orpheus" train --train "$data/train-images-idx3-ubyte.gz" \
  --test "$data/t10k-images-idx3-ubyte.gz" --clocks 2000 --batch 100 --eval-every 500 \
  --multicast random --fanout 2 --consistency ssp --staleness 2 --inject-delay 1:2 \
  --progress off --metrics "$out/metrics.jsonl"
"$check" "$out/metrics.jsonl" "max_clock_gap<=2" "max_clock_gap>=1" "test_accuracy>=0.82"
# Every per-clock line too.
if grep -v summary "$out/metrics.jsonl" | grep -Eq '"clock_gap": ([3-9]|[1-9][0-9])'; then
  echo "a clock ran more than 2 clocks ahead"; exit 1
fi
