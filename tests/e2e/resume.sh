#!/usr/bin/env bash
# resume.sh ORPHEUS COMPARE MPIEXEC: kill -9 of every process of a BSP job mid-run,
# then --resume with the same flags: the final parameters equal an uninterrupted
# run's (relative difference <= 1e-5; bitwise in practice); a checkpoint that holds no
# log yet: --resume says it starts over.
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

# A job stopped before its first segment reached the disk (here: its logs removed, its
# snapshots and job record kept) has nothing to resume from: --resume says so and
# starts over from clock 1, ending where an uninterrupted run does.
short=(--train "$data/train-images-idx3-ubyte.gz" --clocks 12 --batch 50 --progress off --ckpt sv --average-every 4)
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${short[@]}" --ckpt-dir "$out/early" --save "$out/early.h5" >/dev/null
rm -rf "$out"/early/replica-* "$out/early.h5"
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${short[@]}" --ckpt-dir "$out/early" --save "$out/early.h5" \
  --resume 2>"$out/early.err" >/dev/null
grep -q "holds no replica's log yet .*starts over from clock 1" "$out/early.err" ||
  { echo "FAIL: --resume of a checkpoint without logs did not say it starts over"; cat "$out/early.err"; exit 1; }
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${short[@]}" --ckpt-dir "$out/early2" --save "$out/early2.h5" >/dev/null
"$compare" "$out/early.h5" "$out/early2.h5" 0
