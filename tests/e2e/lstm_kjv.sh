#!/usr/bin/env bash
# lstm_kjv.sh ORPHEUS MPIEXEC SRC [tiny|long]: makes the KJV token stream, trains
# examples/lstm.loss on 4 ranks (broadcast, BSP, every SVG) and requires the
# validation perplexity to come within 10% of what PyTorch's nn.LSTM reaches with
# the same model, data, shards, streams, initial scale and SGD step after the same
# number of examples (scripts/bench/lstm_torch.py, measured once; the bounds are
# its result x 1.10). Then `orpheus eval` on the saved model must report the same
# perplexity for the same data.
#   tiny (default suite): vocabulary 500, embed = hidden = 32, T = 10, B = 8,
#     150 clocks (4,800 examples), lr 0.1. PyTorch: 100.25 -> bound 110.3.
#   long: vocabulary 2000, embed = hidden = 128 (examples/lstm.loss as written),
#     T = 20, B = 20, 200 clocks (16,000 examples), lr 0.1. PyTorch: 215.42 -> bound 237.0.
set -euo pipefail
orpheus=$1; mpiexec=$2; src=$3; size=${4:-tiny}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
case "$size" in
  tiny) vocab=500; dims=32; steps=10; batch=8; clocks=150; lr=0.1; bound=110.3 ;;
  long) vocab=2000; dims=128; steps=20; batch=20; clocks=200; lr=0.1; bound=237.0 ;;
  *) echo "size must be tiny or long" >&2; exit 2 ;;
esac
"$src/scripts/data/make_tokens.sh" "$out/kjv" --vocab "$vocab" --steps "$steps"
sed -e "s/^dim embed = .*/dim embed = $dims/" -e "s/^dim hidden = .*/dim hidden = $dims/" \
  "$src/examples/lstm.loss" >"$out/lstm.loss"
"$mpiexec" -n 4 --oversubscribe "$orpheus" train --model "$out/lstm.loss" \
  --train "$out/kjv/kjv.train.tokens" --test "$out/kjv/kjv.valid.tokens" \
  --clocks "$clocks" --batch "$batch" --lr "$lr" --eval-every "$clocks" --progress off \
  --metrics "$out/metrics.jsonl" --save "$out/model.h5"
final=$(json_field "$out/metrics.jsonl" test_perplexity)
echo "validation perplexity after $((clocks * batch * 4)) examples: $final (bound $bound)"
awk -v p="$final" -v b="$bound" 'BEGIN { exit !(p > 1 && p <= b) }'
# orpheus eval reads the validation file as one rank: 16 streams instead of 4 x B,
# so segment boundaries differ slightly; the perplexity must agree within 2%.
evaluated=$("$orpheus" eval --model "$out/lstm.loss" --params "$out/model.h5" --test "$out/kjv/kjv.valid.tokens" |
  json_value test_perplexity)
echo "orpheus eval: $evaluated"
awk -v a="$final" -v b="$evaluated" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.02 * a) }'
