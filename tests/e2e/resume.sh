#!/usr/bin/env bash
# resume.sh ORPHEUS COMPARE MPIEXEC: kill -9 of every process of a BSP job mid-run,
# then --resume with the same flags: the final parameters equal an uninterrupted
# run's (relative difference <= 1e-5; bitwise in practice); a job killed before its first
# segment resumes from its newest snapshot, bitwise, and without one says it starts over.
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

# A job killed before its first segment (50 clocks) reached the disk, but after its
# averaging barriers wrote snapshots (here: a finished job's log removed, and its
# snapshots past clock 40): --resume continues from the newest snapshot and ends
# bitwise where the uninterrupted run does. With no snapshot either, it says that it
# starts over from clock 1, and ends there too.
short=(--train "$data/train-images-idx3-ubyte.gz" --clocks 60 --batch 50 --progress off --ckpt sv --average-every 8
  --optimizer nesterov --lr 0.05)
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${short[@]}" --ckpt-dir "$out/early" --save "$out/early.h5" >/dev/null
for case in snapshot none; do
  rm -rf "$out/cut" "$out/cut.h5"; cp -r "$out/early" "$out/cut"; rm -rf "$out"/cut/replica-*
  for s in "$out"/cut/snapshot-*; do
    n=$((10#${s##*snapshot-})); { [ "$case" = none ] || [ "$n" -gt 40 ]; } && rm -rf "$s"
  done
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train "${short[@]}" --ckpt-dir "$out/cut" --save "$out/cut.h5" \
    --resume 2>"$out/cut.err" >/dev/null
  want="has a snapshot of clock 40, past the clock every replica's log reaches (0): the job resumes from the snapshot"
  [ "$case" = none ] && want="holds no replica's log yet .*starts over from clock 1"
  grep -q "$want" "$out/cut.err" || { echo "FAIL ($case): no '$want'"; cat "$out/cut.err"; exit 1; }
  "$compare" "$out/cut.h5" "$out/early.h5" 0
done
# --resume --elastic onto 3 ranks (and --clocks 70) continues from that snapshot too (it was started over).
rm -rf "$out/cut"; cp -r "$out/early" "$out/cut"; rm -rf "$out"/cut/replica-1
for s in "$out"/cut/snapshot-*; do n=$((10#${s##*snapshot-})); [ "$n" -gt 40 ] && rm -rf "$s"; done
"$mpiexec" -n 3 --oversubscribe "$orpheus" train "${short[@]/#60/70}" --ckpt-dir "$out/cut" --save "$out/cut.h5" \
  --metrics "$out/cut.jsonl" --resume --elastic 2>"$out/cut.err" >/dev/null
grep -q "has a snapshot of clock 40, past the clock every replica's log reaches (0): the job resumes from the snapshot" \
  "$out/cut.err" || { echo "FAIL (elastic): it did not resume from the snapshot"; cat "$out/cut.err"; exit 1; }
head -1 "$out/cut.jsonl" | grep -q '"clock": 41,' || { echo "FAIL (elastic): not from clock 41"; head -1 "$out/cut.jsonl"; exit 1; }
"$orpheus" restore --ckpt-dir "$out/cut" --clock 70 --replica 2 --out "$out/cut70.h5" >/dev/null
# The replica that joined after clock 40 has no earlier clock: inspect lists none, restore refuses one.
"$orpheus" inspect "$out/cut" | grep -q "replica 2: clocks 40..70 (via snapshot 40) restorable, .*(joined after clock 40)" ||
  { echo "FAIL (elastic): inspect of the joined replica"; "$orpheus" inspect "$out/cut"; exit 1; }
if "$orpheus" restore --ckpt-dir "$out/cut" --clock 32 --replica 2 --out "$out/early2.h5" 2>"$out/early2.err"; then
  echo "FAIL (elastic): restored replica 2 at clock 32, before it joined"; exit 1
fi
grep -q "replica 2 of '.*cut' joined the job after clock 40: it has no clock 32 (then the job ran on 2 ranks" \
  "$out/early2.err" || { echo "FAIL (elastic): no reason"; cat "$out/early2.err"; exit 1; }
[ ! -e "$out/early2.h5" ] || { echo "FAIL (elastic): a refused restore wrote --out"; exit 1; }
