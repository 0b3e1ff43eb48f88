#!/usr/bin/env bash
# coordinator.sh ORPHEUS COMPARE MPIEXEC: real processes at np 4 with random
# multicast (replicas drift apart). With --average-every, the replicas read back
# from every rank are bitwise equal after the last barrier; with --rotate-every,
# every replica id is still held by exactly one rank, and the metrics name the
# replica rank 0 holds.
set -euo pipefail
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
common=(--train "$data/train-images-idx3-ubyte.gz" --batch 50 --multicast random --fanout 1 --progress off --log-level warn)

mkdir -p "$out/avg"
"$mpiexec" -n 4 --oversubscribe "$orpheus" train "${common[@]}" --clocks 40 --average-every 20 \
  --save-replicas "$out/avg" --metrics "$out/avg.jsonl" >/dev/null
for r in 1 2 3; do "$compare" "$out/avg/replica-0.h5" "$out/avg/replica-$r.h5" 0; done
grep '"clock": 20,' "$out/avg.jsonl" | grep -q '"divergence_max": [0-9]' || { echo "no divergence at the barrier"; exit 1; }

mkdir -p "$out/rot"
"$mpiexec" -n 4 --oversubscribe "$orpheus" train "${common[@]}" --clocks 30 --rotate-every 10 \
  --save-replicas "$out/rot" --metrics "$out/rot.jsonl" >/dev/null
[ "$(ls "$out/rot" | sort | tr '\n' ' ')" = "replica-0.h5 replica-1.h5 replica-2.h5 replica-3.h5 " ] || {
  echo "replicas after rotation: $(ls "$out/rot")"; exit 1; }
# Three rotations at np 4: rank 0 holds the replica that started on rank 1.
grep '"summary": true' "$out/rot.jsonl" | grep -q '"replica": 1' || { echo "rank 0 should hold replica 1"; exit 1; }
echo "averaged replicas bitwise equal; rotated replicas all present"
