#!/usr/bin/env bash
# sv_dtype.sh ORPHEUS COMPARE MPIEXEC: --sv-dtype bf16 on MLR, Fashion-MNIST, np 2:
#  - a clock sends about half the bytes of f32 and the test accuracy stays within 0.01;
#  - every replica applies the rounded batch (the sender too): under BSP broadcast the
#    replicas end bitwise equal, with every SV sent and with --sv-rank;
#  - the log holds what was applied: restore(T) equals the live replica bitwise, also
#    with --select (where the sender applies its whole f32 batch);
#  - --sync dense and --overlap are refused in one line.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
common=(--train "$data/train-images-idx3-ubyte.gz" --test "$data/t10k-images-idx3-ubyte.gz" --batch 50
        --progress off --log-level warn --timeout 60)
run() {  # NAME FLAGS...: 60 clocks, logged, every replica saved
  local name=$1; shift
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train "${common[@]}" --clocks 60 --eval-every 60 "$@" \
    --ckpt sv --ckpt-dir "$out/$name.ckpt" --save-replicas "$out/$name" --metrics "$out/$name.jsonl" >/dev/null
}
run f32
run bf16 --sv-dtype bf16
run rank --sv-dtype bf16 --sv-rank 2
run select --sv-dtype bf16 --select 10
full=$(json_field "$out/f32.jsonl" bytes_per_clock); half=$(json_field "$out/bf16.jsonl" bytes_per_clock)
a0=$(json_field "$out/f32.jsonl" test_accuracy); a1=$(json_field "$out/bf16.jsonl" test_accuracy)
echo "bytes per clock $full -> $half; test accuracy $a0 -> $a1"
/usr/bin/python3 -c 'import sys; f, h, a, b = map(float, sys.argv[1:]); sys.exit(0 if 0.45 < h / f < 0.55 and abs(a - b) <= 0.01 else 1)' \
  "$full" "$half" "$a0" "$a1" || fail "bytes or accuracy out of bounds"
# Every clock says how long it waited for its minibatch (the prefetch queue).
wait=$(json_field "$out/f32.jsonl" data_wait_seconds 5)
[ -n "$wait" ] || fail "the clock records carry no data_wait_seconds"
for name in bf16 rank; do
  "$compare" "$out/$name/replica-0.h5" "$out/$name/replica-1.h5" 0 || fail "$name: the replicas differ under BSP broadcast"
done
"$compare" "$out/f32/replica-0.h5" "$out/bf16/replica-0.h5" 0 >/dev/null 2>&1 && fail "bf16 trained the same bits as f32"
for name in bf16 rank select; do
  "$orpheus" restore --ckpt-dir "$out/$name.ckpt" --replica 1 --clock 60 --out "$out/$name.restored.h5" >/dev/null
  "$compare" "$out/$name.restored.h5" "$out/$name/replica-1.h5" 0 || fail "$name: restore(60) differs from the live replica"
done
expect_refusal() {  # MESSAGE FLAGS...
  local want=$1; shift
  set +e; "$orpheus" train "${common[@]}" --clocks 2 "$@" >"$out/err" 2>&1; local rc=$?; set -e
  [ "$rc" = 2 ] && grep -q -- "$want" "$out/err" || { cat "$out/err"; fail "$* not refused with '$want'"; }
}
expect_refusal "--sv-dtype bf16 rounds a clock's batch before it is sent: it needs --sync sv" --sv-dtype bf16 --sync dense
expect_refusal "no --overlap" --sv-dtype bf16 --overlap on
expect_refusal "--sv-dtype" --sv-dtype f16
echo "sv-dtype checks passed"
