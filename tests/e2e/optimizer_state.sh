#!/usr/bin/env bash
# optimizer_state.sh ORPHEUS COMPARE MPIEXEC: the optimizer state travels with its
# replica, so restore and resume stay bitwise (np 3, BSP, MLR on synthetic data,
# random multicast with fanout 1 so the replicas differ, replicas rotated every 15
# clocks and averaged every 20 with a snapshot):
#  - restore --clock T equals, bitwise, the parameters and the /optimizer state a
#    run of T clocks saved, for adam (warmup + step schedule) and momentum (weight
#    decay), at a snapshot, between barriers and at the end; and for nesterov with
#    the outer step (--outer-lr) at every averaging;
#  - kill -9 of every process mid-run, then --resume: parameters and state equal an
#    uninterrupted run's, bitwise (adam; nesterov with the outer step);
#  - failures inside the job (--fail-prob, adam): restore of the last clock equals,
#    bitwise with its state, the replica each rank ended with;
#  - the files are readable by h5py, the state in its own group.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d); trap 'pkill -9 -f "ckpt-dir $out" 2>/dev/null || true; rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
np=3
common=(--train synthetic:examples=3000,features=30,classes=4 --batch 20 --progress off --log-level warn
        --multicast random --fanout 1 --rotate-every 15 --average-every 20)

# held T: the replica rank 0 holds after T clocks (rotation every 15 at np 3).
held() { echo $(( ( (0 - $1 / 15) % np + np) % np )); }

# restore_matches NAME "T..." FLAGS...: the restore of each T equals a run of T clocks.
restore_matches() {
  local name=$1 clocks=$2; shift 2
  "$mpiexec" -n $np --oversubscribe "$orpheus" train "${common[@]}" "$@" --clocks 60 --ckpt sv \
    --ckpt-dir "$out/$name" >/dev/null
  local T r
  for T in $clocks; do
    "$mpiexec" -n $np --oversubscribe "$orpheus" train "${common[@]}" "$@" --clocks "$T" --save "$out/$name-run$T.h5" \
      >/dev/null
    r=$(held "$T")
    "$orpheus" restore --ckpt-dir "$out/$name" --replica "$r" --clock "$T" --out "$out/$name-restored$T.h5"
    "$compare" "$out/$name-restored$T.h5" "$out/$name-run$T.h5" 0 || fail "$name: parameters at clock $T"
    same_state "$out/$name-restored$T.h5" "$out/$name-run$T.h5" || fail "$name: optimizer state at clock $T"
  done
}

restore_matches adam "20 33 60" --optimizer adam --warmup 5 --lr-schedule step --lr-step-every 25 --lr-gamma 0.5
restore_matches momentum "33 60" --optimizer momentum --momentum 0.8 --weight-decay 1e-3 --lr 0.05
# DiLoCo's outer step at each averaging: the snapshot holds W, the replay goes on from it.
restore_matches outer "20 33 60" --optimizer nesterov --momentum 0.8 --outer-lr 0.7 --outer-momentum 0.9

# kill -9 and --resume (adam).
whole_and_resumed "$mpiexec" "$orpheus" $np "$out" "${common[@]}" --optimizer adam --clocks 300 --ckpt sv \
  --inject-delay 0:10 || fail "kill -9 and --resume"
"$compare" "$out/resumed.h5" "$out/whole.h5" 0 || fail "resume: parameters"
same_state "$out/resumed.h5" "$out/whole.h5" || fail "resume: optimizer state"

# kill -9 and --resume with the outer step: its anchor and momentum come back from the
# snapshot of the last averaging.
mkdir -p "$out/outer-resume"
whole_and_resumed "$mpiexec" "$orpheus" $np "$out/outer-resume" "${common[@]}" --optimizer nesterov --momentum 0.8 \
  --outer-lr 0.7 --outer-momentum 0.9 --clocks 300 --ckpt sv --inject-delay 0:10 || fail "outer: kill -9 and --resume"
"$compare" "$out/outer-resume/resumed.h5" "$out/outer-resume/whole.h5" 0 || fail "outer: resume: parameters"
same_state "$out/outer-resume/resumed.h5" "$out/outer-resume/whole.h5" || fail "outer: resume: optimizer state"

# Failures inside the job (adam): each replica comes back with its state.
"$mpiexec" -n $np --oversubscribe "$orpheus" train "${common[@]}" --optimizer adam --clocks 80 --ckpt sv \
  --ckpt-dir "$out/fail" --fail-prob 0.05 --metrics "$out/fail.jsonl" --save-replicas "$out/fail-replicas" >/dev/null
failures=$(grep -v '"summary"' "$out/fail.jsonl" | grep -o '"failures": [0-9]*' | awk '{s += $2} END {print s + 0}')
echo "failures: $failures"
[ "$failures" -ge 1 ] || fail "no failure happened"
for r in 0 1 2; do
  "$orpheus" restore --ckpt-dir "$out/fail" --replica "$r" --clock 80 --out "$out/fail-r$r.h5" >/dev/null
  "$compare" "$out/fail-r$r.h5" "$out/fail-replicas/replica-$r.h5" 0 || fail "failures: parameters of replica $r"
  same_state "$out/fail-r$r.h5" "$out/fail-replicas/replica-$r.h5" || fail "failures: state of replica $r"
done
echo "optimizer state checks passed"
