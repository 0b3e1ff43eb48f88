#!/usr/bin/env bash
# checkpoint.sh ORPHEUS COMPARE MPIEXEC: the incremental SV checkpoint at np 2 (BSP,
# MLR on Fashion-MNIST, averaging every 20 clocks with snapshots).
#  - restore --clock T equals, bitwise, the parameters a run of T clocks saved, for
#    T at a snapshot, just after one, between two, and T = latest;
#  - a truncated last segment is ignored; a corrupted middle segment makes restore
#    name the file and the last clock it can reach; a clock past the log names the
#    latest one; an unwritable checkpoint directory stops training with exit 2;
#  - restore replays with the job's --threads (BLAS rounds a product differently with
#    another thread count): an MLP trained with 1 and with 3 threads restores bitwise,
#    and --resume with other --threads is refused naming it.
set -euo pipefail
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
train() { "$mpiexec" -n 2 --oversubscribe "$orpheus" train --train "$data/train-images-idx3-ubyte.gz" \
  --batch 50 --average-every 20 --multicast random --fanout 1 --progress off --log-level warn "$@" >/dev/null; }

train --clocks 60 --ckpt sv --ckpt-dir "$out/ckpt" --save "$out/full.h5"
"$orpheus" inspect "$out/ckpt"
for T in 20 21 30 60; do
  train --clocks "$T" --save "$out/run$T.h5"
  "$orpheus" restore --ckpt-dir "$out/ckpt" --clock "$T" --out "$out/restored$T.h5"
  "$compare" "$out/restored$T.h5" "$out/run$T.h5" 0
done
"$orpheus" restore --ckpt-dir "$out/ckpt" --clock latest --out "$out/latest.h5"
"$compare" "$out/latest.h5" "$out/full.h5" 0

# A clock past the log names the latest one.
set +e
msg=$("$orpheus" restore --ckpt-dir "$out/ckpt" --clock 999 --out "$out/x.h5" 2>&1); rc=$?
set -e
echo "$msg"; [ "$rc" -eq 2 ] && echo "$msg" | grep -q "latest: 60" && [ ! -e "$out/x.h5" ]

# Damage: truncate the last segment of replica 1, corrupt a middle one of replica 0.
segs0=($(ls "$out"/ckpt/replica-0/seg-*.h5)); segs1=($(ls "$out"/ckpt/replica-1/seg-*.h5))
last1=${segs1[${#segs1[@]}-1]}
truncate -s 1000 "$last1"
"$orpheus" restore --ckpt-dir "$out/ckpt" --replica 1 --clock latest --out "$out/r1.h5" 2>&1 | tee "$out/r1.log"
mid=${segs0[0]}
printf '\xff\xff\xff\xff\xff\xff\xff\xff' | dd of="$mid" bs=1 seek=$(( $(stat -c %s "$mid") / 2 )) conv=notrunc status=none
set +e
msg=$("$orpheus" restore --ckpt-dir "$out/ckpt" --replica 0 --clock 59 --out "$out/y.h5" 2>&1); rc=$?
set -e
echo "$msg"; [ "$rc" -eq 2 ] && echo "$msg" | grep -q "$(basename "$mid")" && [ ! -e "$out/y.h5" ]
"$orpheus" inspect "$out/ckpt" | grep -q damaged

# An unwritable checkpoint directory: one clear line, exit 2.
touch "$out/afile"
set +e
msg=$(train --clocks 5 --ckpt sv --ckpt-dir "$out/afile/ckpt" 2>&1); rc=$?
set -e
echo "$msg" | grep '^orpheus:'; [ "$rc" -eq 2 ]
# Restore computes with the job's BLAS threads, whatever the host's cores.
mlp=$(cd "$(dirname "$0")/../.." && pwd)/examples/mlp.loss
for threads in 1 3; do
  "$orpheus" train --model "$mlp" --train "$data/train-images-idx3-ubyte.gz" --batch 100 --clocks 12 \
    --optimizer adam --lr 0.01 --threads "$threads" --progress off --log-level error --ckpt sv \
    --ckpt-dir "$out/mlp$threads" --save "$out/mlp$threads.h5" >/dev/null
  "$orpheus" restore --ckpt-dir "$out/mlp$threads" --clock 12 --out "$out/mlp$threads-restored.h5" >/dev/null
  "$compare" "$out/mlp$threads-restored.h5" "$out/mlp$threads.h5" 0
done
set +e
msg=$("$orpheus" train --model "$mlp" --train "$data/train-images-idx3-ubyte.gz" --batch 100 --clocks 14 \
  --optimizer adam --lr 0.01 --threads 2 --progress off --ckpt sv --ckpt-dir "$out/mlp3" --resume 2>&1); rc=$?
set -e
echo "$msg"; [ "$rc" -eq 2 ] && echo "$msg" | grep -q -- "--threads differs .*it was 3 and is now 2"
echo "checkpoint checks passed"
