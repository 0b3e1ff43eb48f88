#!/usr/bin/env bash
# fmnist_mlr.sh ORPHEUS CHECK MPIEXEC: MLR on Fashion-MNIST, 4 ranks, batch 100 per
# rank, reaches test accuracy >= 0.82 within 1000 clocks; `orpheus eval` on the
# saved model reproduces the final accuracy.
set -euo pipefail
orpheus=$1; check=$2; mpiexec=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
"$mpiexec" -n 4 --oversubscribe "$orpheus" train --train "$data/train-images-idx3-ubyte.gz" \
  --test "$data/t10k-images-idx3-ubyte.gz" --clocks 1000 --batch 100 --eval-every 250 \
  --progress off --metrics "$out/metrics.jsonl" --save "$out/model.h5"
"$check" "$out/metrics.jsonl" "test_accuracy>=0.82" "clocks<=1000"
line=$("$orpheus" eval --params "$out/model.h5" --model mlr --test "$data/t10k-images-idx3-ubyte.gz")
echo "$line"
want=$(json_field "$out/metrics.jsonl" test_accuracy)
got=$(echo "$line" | json_value test_accuracy)
[ "$want" = "$got" ] || { echo "eval accuracy $got differs from training's $want"; exit 1; }

# --target-accuracy: the job stops at the first eval clock that reaches it, on every
# rank alike (SSP, so the ranks are not in lockstep when they agree).
"$mpiexec" -n 4 --oversubscribe "$orpheus" train --train "$data/train-images-idx3-ubyte.gz" \
  --test "$data/t10k-images-idx3-ubyte.gz" --clocks 1000 --batch 100 --eval-every 50 \
  --consistency ssp --staleness 2 --target-accuracy 0.80 --progress off --metrics "$out/target.jsonl"
tail -n 1 "$out/target.jsonl"
[ "$(json_field "$out/target.jsonl" reached_target)" = true ] || { echo "target 0.80 not reported as reached"; exit 1; }
stop=$(json_field "$out/target.jsonl" clocks)
[ "$stop" -lt 1000 ] && [ $((stop % 50)) -eq 0 ] || { echo "stopped at clock $stop"; exit 1; }
# The stopping clock's eval reached the target; no earlier eval did.
json_rows "$out/target.jsonl" clock test_accuracy |
  awk -v stop="$stop" '$1 < stop && $2 >= 0.80 { bad = 1 } $1 == stop && $2 >= 0.80 { ok = 1 }
                       END { if (bad || !ok) { print "evals disagree with the stop at " stop; exit 1 } }'
[ "$(grep -c '"clock"' "$out/target.jsonl")" -eq "$stop" ] || { echo "expected $stop clock lines"; exit 1; }
