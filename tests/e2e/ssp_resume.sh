#!/usr/bin/env bash
# ssp_resume.sh ORPHEUS MPIEXEC: kill -9 of one rank of an np 4 SSP job (MLP on
# Fashion-MNIST, averaging and rotation, --param-digests), then:
#  - plain --resume is refused (an SSP job has no clock an uninterrupted run passes
#    through exactly), with one line and exit 2;
#  - --resume --elastic on 4 ranks continues from the log and finishes its clocks;
#  - restore of rank 0's replica at the last clock prints the digest the live run
#    wrote for that clock (param_crc32c), and so does restore at a clock before the kill;
#  - an SSP job with a stateful optimizer (Adam, whose step of a clock waits for that
#    clock's last batches): restore(T) prints the live digest at every clock T.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
orpheus=$1; mpiexec=$2
out=$(mktemp -d)
job=
trap '[ -n "$job" ] && kill -9 $(pgrep -P "$job" 2>/dev/null) "$job" 2>/dev/null; rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
flags=(--train "$data/train-images-idx3-ubyte.gz" --test "$data/t10k-images-idx3-ubyte.gz"
       --model "$(dirname "${BASH_SOURCE[0]}")/../../scripts/bench/mlp_small.loss" --batch 32 --select 8
       --consistency ssp --staleness 2 --average-every 20 --rotate-every 30 --snapshot-every 1
       --clocks 400 --eval-every 100 --progress off --ckpt sv --ckpt-dir "$out/ckpt" --param-digests
       --inject-delay 0:5)

"$mpiexec" -n 4 --oversubscribe "$orpheus" train "${flags[@]}" --metrics "$out/killed.jsonl" >"$out/killed.log" 2>&1 &
job=$!
kill_rank_when_logged "$job" "$out/ckpt/replica-3" 2
job=

# Plain --resume: refused.
set +e
"$mpiexec" -n 4 --oversubscribe "$orpheus" train "${flags[@]}" --resume >"$out/plain.log" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || { echo "plain --resume of an SSP job: exit $rc, expected 2"; cat "$out/plain.log"; exit 1; }
grep -q "under ssp, --resume --elastic continues it from the log" "$out/plain.log" || { cat "$out/plain.log"; exit 1; }

"$mpiexec" -n 4 --oversubscribe "$orpheus" train "${flags[@]}" --resume --elastic --metrics "$out/resumed.jsonl" \
  >"$out/resumed.log" 2>&1 || { echo "--resume --elastic failed"; cat "$out/resumed.log"; exit 1; }
grep -q '"summary": true, "clocks": 400,' "$out/resumed.jsonl" || { echo "the resumed job did not finish"; exit 1; }

# restore(T) against the live digests: the last clock (resumed run) and one before the kill.
check() {
  local metrics=$1 clock=$2 ckpt=${3:-$out/ckpt}
  read -r replica digest < <(json_rows "$metrics" clock replica param_crc32c | awk -v c="$clock" '$1 == c {r = $2 " " $3} END {print r}')
  [ -n "$digest" ] || { echo "no digest of clock $clock in $metrics"; exit 1; }
  got=$("$orpheus" restore --ckpt-dir "$ckpt" --replica "$replica" --clock "$clock" --out "$out/r$clock.h5" |
        sed -n 's/^parameters crc32c //p')
  [ "$got" = "$digest" ] || { echo "restore(clock $clock, replica $replica): crc32c $got, live $digest"; exit 1; }
}
check "$out/resumed.jsonl" 400
check "$out/killed.jsonl" 25

"$mpiexec" -n 3 --oversubscribe "$orpheus" train --train synthetic:examples=600,features=12,classes=4 --batch 10 \
  --clocks 8 --consistency ssp --staleness 1 --optimizer adam --progress off --ckpt sv --ckpt-dir "$out/adam" \
  --param-digests --metrics "$out/adam.jsonl" >/dev/null
for clock in 1 2 3 4 5 6 7 8; do check "$out/adam.jsonl" "$clock" "$out/adam"; done
echo "ssp_resume: refused plain --resume, resumed --elastic to clock 400, restore(T) equals the live digests (sgd, and adam at every clock)"
