#!/usr/bin/env bash
# elastic_restart.sh ORPHEUS COMPARE MPIEXEC CHECK: kill -9 of one rank of an np 4 BSP
# job (MLR on Fashion-MNIST), then --resume --elastic on 3 ranks: the job continues
# from the newest clock every replica's log reaches, records membership epoch 1 at
# that clock, reaches its target accuracy, and `restore` of each of the 3 replicas
# at the final clock (after the change) equals, bitwise, the replica the rank held.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
orpheus=$1; compare=$2; mpiexec=$3; check=$4
out=$(mktemp -d)
job=
trap '[ -n "$job" ] && kill -9 $(pgrep -P "$job" 2>/dev/null) "$job" 2>/dev/null; rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
flags=(--train "$data/train-images-idx3-ubyte.gz" --test "$data/t10k-images-idx3-ubyte.gz" --batch 50
       --eval-every 50 --target-accuracy 0.8 --progress off --ckpt sv --ckpt-dir "$out/ckpt"
       --inject-delay 0:5)

"$mpiexec" -n 4 --oversubscribe "$orpheus" train "${flags[@]}" --clocks 2000 --metrics "$out/killed.jsonl" \
  --save "$out/killed.h5" >"$out/killed.log" 2>&1 &
job=$!
# One rank is killed once two segments of every replica are durable.
kill_rank_when_logged "$job" "$out/ckpt/replica-3" 2
job=
[ ! -e "$out/killed.h5" ] || { echo "the job finished before a rank was killed"; exit 1; }
killedAt=$(grep -o '"clock": [0-9]*' "$out/killed.jsonl" | tail -n 1 | grep -o '[0-9]*$' || echo 0)

# A plain --resume on a different number of ranks is still refused.
set +e
msg=$("$mpiexec" -n 3 --oversubscribe "$orpheus" train "${flags[@]}" --clocks 2000 --resume 2>&1); rc=$?
set -e
[ "$rc" -eq 2 ] && echo "$msg" | grep -q "the number of ranks (mpirun -np) differs" \
  || { echo "a plain --resume on 3 ranks was not refused: $msg"; exit 1; }

mkdir "$out/replicas"
"$mpiexec" -n 3 --oversubscribe "$orpheus" train "${flags[@]}" --clocks 2000 --resume --elastic --metrics "$out/resumed.jsonl" \
  --save "$out/resumed.h5" --save-replicas "$out/replicas" 2>&1 | tee "$out/resumed.log"
from=$(grep -o 'resumed from clock [0-9]*' "$out/resumed.log" | grep -o '[0-9]*$')
echo "killed at clock $killedAt, resumed on 3 ranks from clock $from: $((killedAt - from)) clocks lost"
job_records "$orpheus" "$out/ckpt" epoch | grep -qx "epoch 1 clock $from ranks 3"
"$check" "$out/resumed.jsonl" test_accuracy\>=0.8 ranks\<=3 ranks\>=3
tail -n 1 "$out/resumed.jsonl" | grep -q '"reached_target": true' || { echo "target not reached"; exit 1; }

last=$(json_field "$out/resumed.jsonl" clocks)
[ "$last" -gt "$from" ]
for r in 0 1 2; do
  "$orpheus" restore --ckpt-dir "$out/ckpt" --replica "$r" --clock "$last" --out "$out/restored$r.h5"
  "$compare" "$out/restored$r.h5" "$out/replicas/replica-$r.h5" 0
done
"$compare" "$out/restored0.h5" "$out/resumed.h5" 0
# At the change clock every replica of the new epoch is the average.
"$orpheus" restore --ckpt-dir "$out/ckpt" --replica 0 --clock "$from" --out "$out/at0.h5"
"$orpheus" restore --ckpt-dir "$out/ckpt" --replica 2 --clock "$from" --out "$out/at2.h5"
"$compare" "$out/at0.h5" "$out/at2.h5" 0
# A replica of the killed job that no longer has a rank is still restorable before the change.
"$orpheus" restore --ckpt-dir "$out/ckpt" --replica 3 --clock $((from - 1)) --out "$out/old3.h5"
# And the job goes on again with the same 3 ranks (a plain --resume), its log and
# the membership it records still consistent.
"$mpiexec" -n 3 --oversubscribe "$orpheus" train "${flags[@]}" --resume --clocks $((last + 20)) \
  --save "$out/again.h5" --log-level warn
"$orpheus" restore --ckpt-dir "$out/ckpt" --replica 1 --clock latest --out "$out/latest1.h5" | grep -q "at clock $((last + 20))"
echo "elastic restart: ok"
