#!/usr/bin/env bash
# sv_rank.sh ORPHEUS COMPARE MPIEXEC: --sv-rank R (engine/worker/low_rank.h) on MLR,
# Fashion-MNIST, np 4, batch 100, 200 clocks:
#  - the bytes a clock sends fall to under a tenth, the test accuracy stays within 0.02
#    of the uncompressed run's, and the metrics carry sv_rank_error;
#  - every replica applies the same batches (the sender what it sends): under BSP
#    broadcast the replicas end bitwise equal;
#  - the log holds what was applied: restore(T) equals the live replica bitwise;
#  - --resume continues bitwise (the error feedback is in the checkpoint), f32 and bf16;
#  - --resume --elastic onto more ranks continues from the log (the new ranks' error
#    feedback starts at zero), and restore of a new replica equals it bitwise;
#  - a carried state of the wrong shape, or incomplete, is refused on --resume (exit 2);
#  - the LSTM (token streams): one rank-R matrix per parameter for its steps' sites, under
#    a third of the full SVs' bytes; replicas, restore(T) and --resume bitwise;
#  - sparse LIBSVM rows (a sparse V, as the LSTM's embedding has): under half the bytes,
#    the test accuracy within 0.02, replicas and restore(T) bitwise.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
common=(--train "$data/train-images-idx3-ubyte.gz" --test "$data/t10k-images-idx3-ubyte.gz" --batch 100
        --progress off --log-level warn --timeout 60)
for r in 0 2; do
  "$mpiexec" -n 4 --oversubscribe "$orpheus" train "${common[@]}" --clocks 200 --eval-every 200 --sv-rank $r --metrics "$out/r$r.jsonl" \
    --save "$out/r$r.h5" >/dev/null
done
full=$(json_field "$out/r0.jsonl" bytes_per_clock); low=$(json_field "$out/r2.jsonl" bytes_per_clock)
a0=$(json_field "$out/r0.jsonl" test_accuracy); a2=$(json_field "$out/r2.jsonl" test_accuracy)
err=$(json_field "$out/r2.jsonl" sv_rank_error 5)
echo "bytes per clock $full -> $low; test accuracy $a0 -> $a2; sv_rank_error at clock 5: $err"
/usr/bin/python3 -c 'import sys; f, l, a, b, e = map(float, sys.argv[1:]); sys.exit(0 if l < f / 10 and abs(a - b) <= 0.02 and 0 < e < 1 else 1)' \
  "$full" "$low" "$a0" "$a2" "$err" || fail "bytes, accuracy or sv_rank_error out of bounds"

# restore(T) of a --sv-rank job: bitwise the live replica.
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${common[@]}" --clocks 40 --sv-rank 3 \
  --ckpt sv --ckpt-dir "$out/ckpt" --save-replicas "$out/live" >/dev/null
"$orpheus" restore --ckpt-dir "$out/ckpt" --replica 1 --clock 40 --out "$out/restored.h5" >/dev/null
"$compare" "$out/restored.h5" "$out/live/replica-1.h5" 0 || fail "restore(40) differs from the live replica"
"$compare" "$out/live/replica-0.h5" "$out/live/replica-1.h5" 0 || fail "the two replicas differ under BSP broadcast"
# --resume of a --sv-rank job: the error feedback (E, Q and, in bf16, the bias's
# rounding error) is in the checkpoint, so 20 clocks and a resume to 40 end bitwise
# as the uninterrupted run.
for dtype in f32 bf16; do
  whole=(--sv-rank 3 --sv-dtype $dtype --ckpt sv)
  if [ $dtype = bf16 ]; then
    "$mpiexec" -n 2 --oversubscribe "$orpheus" train "${common[@]}" "${whole[@]}" --clocks 40 --ckpt-dir "$out/$dtype.whole" \
      --save-replicas "$out/live-$dtype" >/dev/null
  fi
  live=$out/live-$dtype; [ $dtype = f32 ] && live=$out/live
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train "${common[@]}" "${whole[@]}" --clocks 20 \
    --ckpt-dir "$out/$dtype.part" >/dev/null
  [ $dtype = f32 ] && cp -r "$out/$dtype.part" "$out/damaged"
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train "${common[@]}" "${whole[@]}" --clocks 40 --ckpt-dir "$out/$dtype.part" --resume \
    --save-replicas "$out/resumed-$dtype" >/dev/null 2>"$out/resume.err"
  grep -q "not bitwise" "$out/resume.err" && fail "$dtype: the resume says it is not bitwise: $(cat "$out/resume.err")"
  for r in 0 1; do
    "$compare" "$out/resumed-$dtype/replica-$r.h5" "$live/replica-$r.h5" 0 ||
      fail "$dtype: replica $r resumed at 20 differs from the uninterrupted run"
  done
done
# --resume --elastic onto more ranks: the new epoch starts every rank's error feedback
# afresh, so the states of the old ranks are not asked for on the new ones. (It asked
# for this launch's ranks' states, found none past the old count, and started over from
# clock 1 without a word, setting the log aside.)
grow=(--train "$data/train-images-idx3-ubyte.gz" --batch 100 --progress off --timeout 60 --sv-rank 3 --ckpt sv
      --ckpt-dir "$out/grow")
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${grow[@]}" --clocks 10 --log-level warn >/dev/null
"$mpiexec" -n 3 --oversubscribe "$orpheus" train "${grow[@]}" --clocks 20 --resume --elastic --log-level info \
  --save-replicas "$out/grown" >"$out/grow.log" 2>&1
grep -q "resumed from clock 10 of .* on 3 ranks (was 2)" "$out/grow.log" ||
  fail "--resume --elastic of a --sv-rank job on 3 ranks did not resume from clock 10: $(grep -v 'clock .*/20' "$out/grow.log")"
"$orpheus" restore --ckpt-dir "$out/grow" --replica 2 --clock 20 --out "$out/grown-2.h5" >/dev/null
"$compare" "$out/grown-2.h5" "$out/grown/replica-2.h5" 0 || fail "restore(20) of the grown job's replica 2 differs"
# A damaged or foreign carried state is refused on resume, one line naming the file and
# what is wrong, never a silent restart from zero (or a product of mismatched shapes).
states=$out/damaged/states-000000000020/rank-0.h5
damage() { cp "$out/damaged.orig/states-000000000020/rank-0.h5" "$states"; /usr/bin/python3 -c "
import h5py, numpy, sys
h = h5py.File(sys.argv[1], 'r+')
$1" "$states"; }
cp -r "$out/damaged" "$out/damaged.orig"
resume_damaged=("$mpiexec" -n 2 --oversubscribe "$orpheus" train "${common[@]}" --sv-rank 3 --ckpt sv --clocks 40
                --ckpt-dir "$out/damaged" --resume)
damage "del h['sv-rank:0.q']; h['sv-rank:0.q'] = numpy.zeros((100, 3), 'f4')"
"$here/expect_error.sh" "rank-0.h5.*matrix 0 holds a 10x784 residual and a 100x3 basis" - -- "${resume_damaged[@]}" ||
  fail "a basis of the wrong shape"
damage "del h['sv-rank:0.e']; h['sv-rank:0.e'] = numpy.zeros((3, 784), 'f4')"
"$here/expect_error.sh" "rank-0.h5.*matrix 0 is 3x784, but the model's matrix is 10x784" - -- "${resume_damaged[@]}" ||
  fail "a residual of the wrong shape"
damage "e = h['sv-rank:0.e']; e[0, 0] = e[0, 0] + 1.0"
"$here/expect_error.sh" "dataset 'sv-rank:0.e' in .*rank-0.h5' does not match its crc32c" - -- "${resume_damaged[@]}" ||
  fail "a residual whose values changed on disk"
damage "del h['sv-rank:0.q']"
"$here/expect_error.sh" "rank-0.h5.*lacks its \.q" - -- "${resume_damaged[@]}" || fail "a missing basis"
# Rewritten without its crc32c (read as it is) but out of any run's range: refused, and the
# job's marker for ctl (DIR/live) goes with the failed job.
damage "e = h['sv-rank:0.e'][()]; e[0, 0] = 1e30; del h['sv-rank:0.e']; h['sv-rank:0.e'] = e"
"$here/expect_error.sh" "rank-0.h5.*the --sv-rank residual of matrix 0 holds 1e.30, beyond the 1e.15" - -- \
  "${resume_damaged[@]}" || fail "a residual out of range"
[ ! -e "$out/damaged/live" ] || fail "a failed resume left its live marker"
# The LSTM: the sites of its steps go as one rank-R matrix per parameter (the embedding's
# one-hot V through sparse products), so a clock sends a small fraction of the full SVs; replicas,
# restore and --resume stay bitwise.
sed -e 's/^dim embed = .*/dim embed = 6/' -e 's/^dim hidden = .*/dim hidden = 5/' "$here/../../examples/lstm.loss" \
  >"$out/lstm.loss"
lstm=(--model "$out/lstm.loss" --train "$here/../data/e2e/small.tokens" --batch 4 --progress off --log-level warn
      --timeout 60)
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${lstm[@]}" --clocks 6 --metrics "$out/lstm-full.jsonl" >/dev/null
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${lstm[@]}" --clocks 6 --sv-rank 2 --metrics "$out/lstm-r2.jsonl" \
  --ckpt sv --ckpt-dir "$out/lstm-ck" --save-replicas "$out/lstm-live" >/dev/null
full=$(json_field "$out/lstm-full.jsonl" bytes_per_clock); low=$(json_field "$out/lstm-r2.jsonl" bytes_per_clock)
echo "lstm bytes per clock $full -> $low"
/usr/bin/python3 -c 'import sys; f, l = map(float, sys.argv[1:]); sys.exit(0 if 0 < l < f / 3 else 1)' "$full" "$low" ||
  fail "the LSTM's --sv-rank 2 clock sends $low bytes, full SVs $full"
"$compare" "$out/lstm-live/replica-0.h5" "$out/lstm-live/replica-1.h5" 0 || fail "the LSTM's replicas differ"
"$orpheus" restore --ckpt-dir "$out/lstm-ck" --replica 1 --clock 6 --out "$out/lstm-6.h5" >/dev/null
"$compare" "$out/lstm-6.h5" "$out/lstm-live/replica-1.h5" 0 || fail "restore(6) of the LSTM differs from the live replica"
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${lstm[@]}" --clocks 3 --sv-rank 2 --ckpt sv \
  --ckpt-dir "$out/lstm-part" >/dev/null
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${lstm[@]}" --clocks 6 --sv-rank 2 --ckpt sv --ckpt-dir "$out/lstm-part" \
  --resume --save-replicas "$out/lstm-resumed" >/dev/null
for r in 0 1; do
  "$compare" "$out/lstm-resumed/replica-$r.h5" "$out/lstm-live/replica-$r.h5" 0 ||
    fail "the LSTM's replica $r resumed at 3 differs from the uninterrupted run"
done
# Sparse rows: 60 features, 6 of them set in each row, 4 classes from a random linear
# map; the first layer's V is the rows themselves, sparse.
/usr/bin/python3 - "$out" <<'PY'
import random, sys
rng = random.Random(3)
w = [[rng.gauss(0, 1) for _ in range(60)] for _ in range(4)]
for name, rows in (("train", 2000), ("test", 500)):
    with open(f"{sys.argv[1]}/sparse-{name}.libsvm", "w") as f:
        for _ in range(rows):
            x = {j: rng.gauss(0, 1) for j in sorted(rng.sample(range(60), 6))}
            y = max(range(4), key=lambda c: sum(w[c][j] * v for j, v in x.items()))
            f.write(f"{y} " + " ".join(f"{j + 1}:{v:.4f}" for j, v in x.items()) + "\n")
PY
sparse=(--train "$out/sparse-train.libsvm" --test "$out/sparse-test.libsvm" --features 60 --batch 50 --lr 0.5
        --clocks 100 --eval-every 100 --progress off --log-level warn --timeout 60)
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${sparse[@]}" --metrics "$out/sparse-full.jsonl" >/dev/null
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${sparse[@]}" --sv-rank 2 --metrics "$out/sparse-r2.jsonl" \
  --ckpt sv --ckpt-dir "$out/sparse-ck" --save-replicas "$out/sparse-live" >/dev/null
full=$(json_field "$out/sparse-full.jsonl" bytes_per_clock); low=$(json_field "$out/sparse-r2.jsonl" bytes_per_clock)
a0=$(json_field "$out/sparse-full.jsonl" test_accuracy); a2=$(json_field "$out/sparse-r2.jsonl" test_accuracy)
echo "sparse rows: bytes per clock $full -> $low; test accuracy $a0 -> $a2"
/usr/bin/python3 -c 'import sys; f, l, a, b = map(float, sys.argv[1:]); sys.exit(0 if 0 < l < f / 2 and abs(a - b) <= 0.02 else 1)' \
  "$full" "$low" "$a0" "$a2" || fail "sparse rows: bytes or accuracy out of bounds"
"$compare" "$out/sparse-live/replica-0.h5" "$out/sparse-live/replica-1.h5" 0 || fail "sparse rows: the replicas differ"
"$orpheus" restore --ckpt-dir "$out/sparse-ck" --replica 0 --clock 100 --out "$out/sparse-100.h5" >/dev/null
"$compare" "$out/sparse-100.h5" "$out/sparse-live/replica-0.h5" 0 || fail "sparse rows: restore(100) differs"
echo "sv-rank checks passed"
