#!/usr/bin/env bash
# topic_model.sh ORPHEUS MPIEXEC SRC: builds the bag-of-words corpus of the King
# James Bible (blocks of up to 30 verses, the 500 most frequent words), trains examples/tm.loss on 2 ranks,
# and requires the reconstruction loss on held-out documents to fall by >= 30%.
set -euo pipefail
orpheus=$1; mpiexec=$2; src=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
"$src/scripts/data/make_corpus.sh" "$out/kjv" --block 30 --vocab 500
"$mpiexec" -n 2 --oversubscribe "$orpheus" train --model "$src/examples/tm.loss" \
  --train "$out/kjv/kjv.train.libsvm" --test "$out/kjv/kjv.test.libsvm" \
  --clocks 400 --batch 50 --lr 10 --eval-every 100 --progress off --metrics "$out/metrics.jsonl"
initial=$(json_field "$out/metrics.jsonl" initial_test_loss)
final=$(json_field "$out/metrics.jsonl" test_loss)
echo "held-out reconstruction loss: $initial -> $final"
awk -v a="$initial" -v b="$final" 'BEGIN { drop = 1 - b / a; printf "drop %.1f%%\n", 100 * drop; exit !(drop >= 0.30) }'
