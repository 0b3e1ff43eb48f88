#!/usr/bin/env bash
# quasi_newton.sh ORPHEUS COMPARE MPIEXEC: --optimizer bfgs and dfp, distributed
# (MLR on synthetic data, 400 examples, full-batch clocks, full broadcast, BSP):
#  - at np 2 and np 4 every replica is bitwise the same, and equals the single-rank
#    run on the same 400 examples up to rounding (relative difference <= 1e-5);
#  - restore --clock T equals a run of T clocks bitwise, parameters and state (W,
#    x_prev, d_prev, skips), with averaging and rotation on;
#  - kill -9 of every process mid-run, then --resume: bitwise the uninterrupted run.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d); trap 'pkill -9 -f "ckpt-dir $out" 2>/dev/null || true; rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
data=(--train synthetic:examples=400,features=20,classes=3 --progress off --log-level warn --timeout 60)

for method in bfgs dfp; do
  "$mpiexec" -n 1 --oversubscribe "$orpheus" train "${data[@]}" --optimizer $method --batch 400 --clocks 8 \
    --save "$out/$method-np1.h5" >/dev/null
  for np in 2 4; do
    mkdir -p "$out/$method-np$np"
    "$mpiexec" -n $np --oversubscribe "$orpheus" train "${data[@]}" --optimizer $method --batch $((400 / np)) \
      --clocks 8 --save "$out/$method-np$np.h5" --save-replicas "$out/$method-np$np" >/dev/null
    for ((r = 1; r < np; ++r)); do
      "$compare" "$out/$method-np$np/replica-$r.h5" "$out/$method-np$np/replica-0.h5" 0 ||
        fail "$method np $np: replica $r differs from replica 0"
    done
    "$compare" "$out/$method-np$np.h5" "$out/$method-np1.h5" 1e-5 || fail "$method np $np against one rank"
  done
done

# restore(T) with averaging every 10 and rotation every 7 (np 3), bfgs.
common=("${data[@]}" --optimizer bfgs --batch 100 --average-every 10 --rotate-every 7)
"$mpiexec" -n 3 --oversubscribe "$orpheus" train "${common[@]}" --clocks 30 --ckpt sv --ckpt-dir "$out/ckpt" >/dev/null
for T in 17 30; do
  "$mpiexec" -n 3 --oversubscribe "$orpheus" train "${common[@]}" --clocks $T --save "$out/run$T.h5" >/dev/null
  "$orpheus" restore --ckpt-dir "$out/ckpt" --replica $(( ( (0 - T / 7) % 3 + 3) % 3 )) --clock $T \
    --out "$out/restored$T.h5" >/dev/null
  "$compare" "$out/restored$T.h5" "$out/run$T.h5" 0 || fail "restore($T): parameters"
  same_state "$out/restored$T.h5" "$out/run$T.h5" || fail "restore($T): optimizer state"
done

# kill -9 and --resume (dfp, slowed so that it is killed mid-run).
whole_and_resumed "$mpiexec" "$orpheus" 2 "$out" "${data[@]}" --optimizer dfp --batch 200 --clocks 200 --ckpt sv \
  --inject-delay 0:10 || fail "kill -9 and --resume"
"$compare" "$out/resumed.h5" "$out/whole.h5" 0 || fail "resume: parameters"
same_state "$out/resumed.h5" "$out/whole.h5" || fail "resume: optimizer state"
echo "quasi-Newton checks passed"
