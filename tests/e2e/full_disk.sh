#!/usr/bin/env bash
# full_disk.sh ORPHEUS MPIEXEC: training with --ckpt sv into a checkpoint directory
# on a small file system that fills up mid-run. The job must stop with exit code 3 (IO)
# and one line naming the directory and the problem (no core dump, no hang), without
# saving a model, and the segments written before must stay intact: inspect finds no
# damage and every replica restores at its latest clock. Needs a tmpfs mount (root);
# skipped (exit 77) where mounting is not permitted.
set -euo pipefail
orpheus=$1; mpiexec=$2
out=$(mktemp -d); mnt="$out/small"
mkdir -p "$mnt"
cleanup() { umount "$mnt" 2>/dev/null || true; rm -rf "$out"; }
trap cleanup EXIT
if ! mount -t tmpfs -o size=16m orpheus-full-disk "$mnt" 2>/dev/null; then
  echo "cannot mount a tmpfs here (needs root): skipped"
  exit 77
fi
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
ckpt="$mnt/ckpt"

# MLR, batch 10 at np 2: about 3.2 MB of log per replica every 50 clocks, so two
# segments per replica fit and the third does not.
set +e
(cd "$out" && ulimit -c unlimited 2>/dev/null; timeout 600 "$mpiexec" -n 2 --oversubscribe "$orpheus" train \
  --train "$data/train-images-idx3-ubyte.gz" --batch 10 --clocks 1000 --progress off --log-level warn \
  --ckpt sv --ckpt-dir "$ckpt" --save "$out/model.h5" >"$out/stdout" 2>"$out/stderr")
rc=$?
set -e
cat "$out/stderr"
echo "exit code $rc"
[ "$rc" -eq 3 ] || { echo "expected exit code 3"; exit 1; }
lines=$(grep -c '^orpheus:' "$out/stderr" || true)
[ "$lines" -eq 1 ] || { echo "expected one line from orpheus, got $lines"; exit 1; }
line=$(grep '^orpheus:' "$out/stderr")
echo "$line" | grep -qF "$ckpt" || { echo "the line does not name the directory"; exit 1; }
echo "$line" | grep -q "No space left on device" || { echo "the line does not name the problem"; exit 1; }
! grep -qiE "core dumped|segmentation fault|terminate called|signal [0-9]" "$out/stderr"
[ -z "$(ls "$out" | grep '^core' || true)" ] || { echo "a core dump"; exit 1; }
[ ! -e "$out/model.h5" ] || { echo "a model was saved"; exit 1; }

# The disk filled mid-run: whole segments were written before, and they are intact.
for r in 0 1; do
  [ "$(ls "$ckpt/replica-$r" | grep -c '^seg-')" -ge 1 ] || { echo "replica $r has no segment"; exit 1; }
done
"$orpheus" inspect "$ckpt" | tee "$out/inspect"
! grep -q damaged "$out/inspect"
for r in 0 1; do
  "$orpheus" restore --ckpt-dir "$ckpt" --replica "$r" --clock latest --out "$out/r$r.h5"
done
echo "full disk checks passed"
