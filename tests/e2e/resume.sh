#!/usr/bin/env bash
# resume.sh ORPHEUS COMPARE MPIEXEC: kill -9 of every process of a BSP job mid-run,
# then --resume with the same flags: the final parameters equal an uninterrupted
# run's (relative difference <= 1e-5; bitwise in practice).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d); trap 'pkill -9 -f "ckpt-dir $out" 2>/dev/null || true; rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
flags=(--train "$data/train-images-idx3-ubyte.gz" --clocks 400 --batch 50 --progress off
       --ckpt sv --inject-delay 0:5)
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --ckpt-dir "$out/whole" --save "$out/whole.h5" >/dev/null

"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --ckpt-dir "$out/killed" --save "$out/resumed.h5" \
  >/dev/null 2>&1 &
job=$!
# Kill every process once a few segments are durable.
wait_for_segments "$out/killed/replica-0" 2 || true
kill_job "ckpt-dir $out/killed" "$job"
[ ! -e "$out/resumed.h5" ] || { echo "the job finished before it was killed"; exit 1; }
"$orpheus" inspect "$out/killed"
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --ckpt-dir "$out/killed" --save "$out/resumed.h5" \
  --resume
"$compare" "$out/resumed.h5" "$out/whole.h5" 1e-5
