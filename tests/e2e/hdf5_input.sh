#!/usr/bin/env bash
# hdf5_input.sh ORPHEUS COMPARE WRITER MPIEXEC: HDF5 input files give the same model
# as the same data in text form, and a damaged one is refused in one line.
#  1. A small data set as LIBSVM and CSV (every line padded to one length, so the
#     byte ranges of 2 ranks split the rows where HDF5's row ranges do) and, through
#     WRITER (tests/tools/write_h5_input.cc), as HDF5: CSR in a group X with its
#     rows' indices unsorted, CSR at the root, dense float32 and dense float64.
#     Trained on 2 ranks, CSR == LIBSVM and dense == CSV bitwise (COMPARE with
#     tolerance 0); dense and sparse agree to 1e-5. `eval` on an HDF5 file prints
#     what it prints on the same data as text.
#  2. Each defect WRITER can make, a text file named .h5 and a truncated file: exit 2, one
#     "orpheus:" line naming the file and the defect, no model written.
set -uo pipefail
orpheus=$1; compare=$2; writer=$3; mpiexec=$4
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fail=0

# 240 examples, 24 features (indices 0..23, 0-based), 3 classes; a line's features
# and values follow from its number, and its label from its features.
awk 'BEGIN {
  n = 240; d = 24; width = 0
  for (i = 0; i < n; i++) {
    line = ""; score = 0
    for (j = 0; j < d; j++) {
      if ((i * 7 + j * 13) % 5 >= 2 && !(i == 0 && j == d - 1)) continue
      v = ((i * 31 + j * 17) % 997) / 997
      line = line sprintf(" %d:%.3f", j, v); dense[i, j] = sprintf("%.3f", v)
      score += (j % 3 == 0 ? v : -v / 2)
    }
    label[i] = score < -0.5 ? 0 : (score < 0.3 ? 1 : 2)
    lines[i] = label[i] line
    if (length(lines[i]) > width) width = length(lines[i])
    csv[i] = label[i]
    for (j = 0; j < d; j++) csv[i] = csv[i] "," ((i, j) in dense ? dense[i, j] : "0")
  }
  for (i = 0; i < n; i++) printf "%-" width "s\n", lines[i] > "'"$out"'/data.libsvm"
  for (i = 0; i < n; i++) printf "%-" (length(csv[0]) + 8) "s\n", csv[i] > "'"$out"'/data.csv"
}'
for kind in csr csr-root dense dense64; do
  "$writer" "$kind" "$out/data.libsvm" "$out/$kind.h5" || { echo "FAIL writing $kind"; exit 1; }
done

train() {  # train NAME DATA [flags]: 2 ranks, 30 clocks of MLR; the model in $out/NAME.model
  local name=$1 data=$2; shift 2
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train --train "$data" --test "$data" --clocks 30 --batch 8 \
    --lr 0.5 --seed 3 --progress off --log-level warn --save "$out/$name.model" "$@" >"$out/$name.log" 2>&1 ||
    { echo "FAIL training on $name:"; cat "$out/$name.log"; fail=1; }
}
same() {  # same A B TOLERANCE
  if "$compare" "$out/$1.model" "$out/$2.model" "$3" >"$out/cmp.txt"; then
    echo "ok   $1 == $2 ($(cat "$out/cmp.txt"))"
  else
    echo "FAIL $1 != $2: $(cat "$out/cmp.txt")"; fail=1
  fi
}
train libsvm "$out/data.libsvm"
train csv "$out/data.csv"
for kind in csr csr-root dense dense64; do train "$kind" "$out/$kind.h5"; done
cp "$out/csr.h5" "$out/csr.data"
train signature "$out/csr.data"                 # found by its signature
train format "$out/csr.data" --format hdf5
same csr libsvm 0
same csr-root libsvm 0
same signature libsvm 0
same format libsvm 0
same dense csv 0
same dense64 csv 0
same dense libsvm 1e-5

eval_line() { "$orpheus" eval --params "$out/libsvm.model" --test "$1" | sed 's/"params": "[^"]*", //'; }
for pair in "csr.h5 data.libsvm" "dense.h5 data.csv"; do
  set -- $pair
  if [ "$(eval_line "$out/$1")" = "$(eval_line "$out/$2")" ]; then
    echo "ok   eval on $1 == eval on $2: $(eval_line "$out/$1")"
  else
    echo "FAIL eval differs: $1 $(eval_line "$out/$1") vs $2 $(eval_line "$out/$2")"; fail=1
  fi
done

# refuse NP KIND PATTERN [test]: training on WRITER's KIND file (as the test file
# with "test") exits 2 with one line.
refuse() {
  local np=$1 kind=$2 pattern=$3 role=${4:-train}
  local file="$out/bad-$kind.h5"
  [ -e "$file" ] || "$writer" "$kind" "$out/data.libsvm" "$file"
  local run=("$orpheus") data=(--train "$file")
  [ "$np" -gt 1 ] && run=("$mpiexec" -n "$np" --oversubscribe "$orpheus")
  [ "$role" = test ] && data=(--train "$out/data.libsvm" --test "$file")
  timeout 60 "${run[@]}" train "${data[@]}" --clocks 5 --batch 4 --progress off \
    --save "$out/bad.model" >/dev/null 2>"$out/err.txt"
  local code=$? lines; lines=$(grep -c '^orpheus:' "$out/err.txt")
  if [ $code -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -qE -- "bad-$kind.h5: .*$pattern" "$out/err.txt" ||
     [ -e "$out/bad.model" ]; then
    echo "FAIL $kind: exit $code, $lines orpheus lines, expected /bad-$kind.h5: .*$pattern/:"; cat "$out/err.txt"
    fail=1
  else
    echo "ok   $kind: $(grep '^orpheus:' "$out/err.txt")"
  fi
}
refuse 1 no-x "no 'X'"
refuse 1 no-y "no dataset 'y'"
refuse 2 short-y "X has 240 rows but y has 239 labels"
refuse 1 rank-x "'X' must be N x D.*has 1 dimensions"
refuse 2 indptr-length "'X/indptr' has 240 entries for the 240 labels"
refuse 2 indptr-decreasing "'X/indptr' decreases: entry 239"
refuse 2 indptr-end "'X/indptr' ends at [0-9]+ but 'X/data' has [0-9]+ entries"
refuse 2 index-negative "'X/indices\[[0-9]+\]' is -3 .*must be >= 0"
refuse 1 index-range "'X/indices\[[0-9]+\]' is 29 .*beyond the 24 columns"
refuse 1 index-duplicate "row 0 has column [0-9]+ twice"
refuse 2 label-fraction "y\[120\] = 1.5 is not an integer"
refuse 2 label-negative "y\[120\] = -1 is negative"
echo "1 0:0.5" >"$out/bad-text.h5"
refuse 1 text "not an HDF5 file"
# Cut short: its signature is there, the rest is not.
head -c 3000 "$out/dense.h5" >"$out/bad-truncated.h5"
refuse 1 truncated "an HDF5 file that cannot be opened \(3000 bytes\): truncated or damaged"
refuse 1 dangling-x "'X' is an external link to '/X' in 'missing-data.h5', which cannot be opened"
# A bad test file is refused as well, naming it.
refuse 2 short-y "X has 240 rows" test
exit $fail
