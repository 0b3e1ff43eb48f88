#!/usr/bin/env bash
# hardening.sh ORPHEUS MPIEXEC: inputs that must be refused before any work, with one
# line naming the cause and exit 2, and files that must survive it:
#  - eval, inspect and ctl given a checkpoint's job.h5: the command or directory named;
#  - restore --out inside the checkpoint it reads (job.h5, a log segment), or empty, and any
#    command's output inside another job's checkpoint: refused,
#    the checkpoint unchanged and still restorable to the same clock; --resume of a
#    job already past --clocks: refused, the checkpoint unchanged;
#  - an output inside an output directory (--save inside --save-replicas);
#  - --adapt with a --max-bytes-per-clock no setting can meet (an earlier --metrics file kept);
#    a job killed mid-run keeps the earlier --metrics file as FILE.prev;
#  - a token stream given to a model of feature vectors;
#  - --select-unit step with --select or --adapt-select above B*T;
#  - a --warmup as long as the job, whatever the schedule;
#  - simulate with --elastic, and simulate under mpirun;
#  - CRLF token files read; a sequence model on other data and token streams for other
#    models, in --train and --test of train and eval; gzip-compressed text files named
#    as such; open range ends and a
#    sub-millisecond --timeout named as such;
#  - sizes that cannot fit (replicas x parameters, minibatches, outputs, a synthetic
#    shard) and absurd thread counts, refused before anything is allocated;
#  - a synthetic spec with a key twice, or with --format / --features meant for files;
#    eval of a synthetic test set scores the training job's own;
#  - --ckpt-dir, --overwrite, --ckpt-every and --snapshot-every without the checkpoint
#    they shape: refused;
#  - --select-method without --select, --transfer and --resident on the cpu, and
#    --threads past the host's cores, --sync powersgd at a rank that compresses nothing,
#    --average-every (without an outer step) and --rotate-every under an all-reduce, an --sv-rank
#    that saves nothing on a matrix, --select-unit step without --sync sv, --adapt and --balance
#    on one rank, --param-digests without --metrics, periods longer than the job,
#    --drop-links on one rank, averaging replicas that BSP broadcast keeps equal: warned;
#  - --adapt knobs outside their bounds moved in before the first clock, and a trace that
#    ends before the job: said on the console;
#  - an unreadable --adapt-trace: one line, not one a rank;
#  - a parameter file whose classes attribute disagrees with its W, or whose features
#    attribute is negative or past any data's width: the attribute named;
#  - --overlap where SVs cannot stream, --balance that can move nothing, --select-unit step
#    under --sv-rank: warned; simulate's --sim-slow that slows nobody: refused;
#  - --target-accuracy met or not: said on the console, and counted at the last clock;
#  - a job of one rank trains with any --multicast (nothing to refuse), and under --sync sv
#    says that no SV leaves it;
#  - simulate refuses the model and data flags train refuses;
#  - an unknown command, or ctl's, named with the commands there are;
#  - a single process that diverges: its one line, no launcher banner; ranks that diverge
#    together: one line naming them;
#  - simulate's link rates below 1 kbit/s; token streams' bad ids named by the file's
#    line on any rank, a test stream of other steps or vocabulary, a huge vocabulary;
#  - restore of the newest clock when none restores: said so, no clock named;
#  - --features beside a token stream (train and eval), and an --adapt-comm-share past 100.
set -uo pipefail
orpheus=$1; mpiexec=$2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fix=$here/../data/e2e
fail=0

# refused PATTERN -- COMMAND...: exit 2 and exactly one "orpheus:" line matching PATTERN.
refused() {
  local pattern=$1; shift 2
  "$here/expect_error.sh" "$pattern" - -- "$@" || { echo "FAIL: $*"; fail=1; }
}

"$orpheus" train --train "$fix/small.libsvm" --clocks 12 --batch 2 --ckpt sv --ckpt-dir "$out/ck" --progress off \
  --log-level warn --transport mpi >/dev/null || { echo "FAIL: the job that writes the checkpoint"; exit 1; }
before=$(cd "$out/ck" && find . -type f -exec sha256sum {} + | sort)
segment=$(cd "$out/ck" && find . -path './replica-*' -name '*.h5' -type f | head -1)
[ -n "$segment" ] || { echo "FAIL: no log segment in the checkpoint"; exit 1; }
refused "--out '.*job.h5' is inside --ckpt-dir" -- "$orpheus" restore --ckpt-dir "$out/ck" --clock 12 --out "$out/ck/job.h5"
refused "--out .* is inside --ckpt-dir" -- "$orpheus" restore --ckpt-dir "$out/ck" --clock 12 --out "$out/ck/$segment"
refused "--out .* is inside --ckpt-dir" -- "$orpheus" restore --ckpt-dir "$out/ck/" --clock 12 --out "$out/ck/new.h5"
refused "--out is empty: give the file" -- "$orpheus" restore --ckpt-dir "$out/ck" --clock 12 --out ""
# Another command's outputs inside the checkpoint (its job.h5, a segment, a new file) are refused too.
refused "--save '.*ck/job.h5' is inside the checkpoint '.*ck' .it holds a job.h5., whose files belong to that job" -- \
  "$orpheus" train --train "$fix/small.libsvm" --clocks 2 --batch 2 --save "$out/ck/job.h5"
refused "--metrics '.*' is inside the checkpoint '.*ck'" -- "$orpheus" train --train "$fix/small.libsvm" --clocks 2 \
  --batch 2 --metrics "$out/ck/$segment"
refused "--save '.*ck/new.h5' is inside the checkpoint '.*ck'" -- "$orpheus" simulate --ranks 2 \
  --train "$fix/small.libsvm" --clocks 2 --batch 2 --save "$out/ck/new.h5"
# simulate has its own network and stragglers: --transport and --inject-delay would go unused.
refused "simulate sends over its own network model, not --transport loopback: leave it out" -- "$orpheus" simulate \
  --ranks 2 --train "$fix/small.libsvm" --clocks 2 --batch 2 --transport loopback
refused "simulate times a worker's compute in simulated seconds.*use --sim-slow FRACTION:FACTOR" -- "$orpheus" simulate \
  --ranks 2 --train "$fix/small.libsvm" --clocks 2 --batch 2 --inject-delay 1:5
after=$(cd "$out/ck" && find . -type f -exec sha256sum {} + | sort)
[ "$before" = "$after" ] || { echo "FAIL: the checkpoint changed"; fail=1; }
"$orpheus" restore --ckpt-dir "$out/ck" --clock 12 --out "$out/r12.h5" >/dev/null || { echo "FAIL: restore after"; fail=1; }
# eval of the job record names what to run instead.
refused "'.*ck/job.h5' is a checkpoint's job record, not a parameter file: write a clock's parameters with 'orpheus restore" \
  -- "$orpheus" eval --params "$out/ck/job.h5" --test "$fix/small.libsvm"
# A job file given where its directory belongs: the directory is named.
refused "'.*ck/job.h5' is not a checkpoint directory .*; it is a checkpoint's job file: give its directory '.*ck'" \
  -- "$orpheus" inspect "$out/ck/job.h5"
refused "ctl: .*; it is a checkpoint's job file: give its directory '.*ck'" -- "$orpheus" ctl "$out/ck/job.h5" grow 1
# --resume of a job already past --clocks: refused (restore gives an earlier clock), the checkpoint unchanged.
refused "--resume: the job in '.*ck' is at clock 12, past --clocks 5: nothing is left to train" -- "$orpheus" train \
  --train "$fix/small.libsvm" --clocks 5 --batch 2 --ckpt sv --ckpt-dir "$out/ck" --transport mpi --resume --save "$out/r5.h5"
[ ! -e "$out/r5.h5" ] || { echo "FAIL: a model saved by the refused --resume"; fail=1; }
[ "$before" = "$(cd "$out/ck" && find . -type f -exec sha256sum {} + | sort)" ] || { echo "FAIL: --resume changed it"; fail=1; }
# inspect names a replica whose log directory is gone, or is a file.
cp -r "$out/ck" "$out/gone"
rm -rf "$out/gone/replica-0"
"$orpheus" inspect "$out/gone" | grep -q "replica 0: no log: '.*replica-0' is missing" || { echo "FAIL: inspect, log gone"; fail=1; }
# restore with no --clock when no clock restores: says so, and names no clock it was not asked for.
cp -r "$out/ck" "$out/dmg"
find "$out/dmg/replica-0" -name '*.h5' -type f -exec truncate -s 100 {} +
refused "cannot restore replica 0 to its newest clock \(none is restorable\): .*damaged" -- \
  "$orpheus" restore --ckpt-dir "$out/dmg" --out "$out/dmg.h5"
[ ! -e "$out/dmg.h5" ] || { echo "FAIL: restore of nothing restorable wrote --out"; fail=1; }
touch "$out/gone/replica-0"
"$orpheus" inspect "$out/gone" | grep -q "replica 0: no log: '.*replica-0' is not a directory" ||
  { echo "FAIL: inspect, log a file"; fail=1; }

refused "--save .* is inside --save-replicas" -- "$orpheus" train --train "$fix/small.libsvm" --clocks 2 --batch 2 \
  --save-replicas "$out/reps" --save "$out/reps/model.h5"
refused "--max-bytes-per-clock 1: even with every knob at its bound" -- "$mpiexec" -n 2 --oversubscribe "$orpheus" \
  train --train "$fix/small.libsvm" --clocks 20 --batch 2 --adapt --adapt-every 5 --max-bytes-per-clock 1 \
  --metrics "$out/kept.jsonl"
# ... and a metrics file there from before is kept as it was (opened at the first line).
echo '{"an earlier job": 1}' >"$out/kept.jsonl"
refused "--max-bytes-per-clock 1: even with every knob at its bound" -- "$mpiexec" -n 2 --oversubscribe "$orpheus" \
  train --train "$fix/small.libsvm" --clocks 20 --batch 2 --adapt --adapt-every 5 --max-bytes-per-clock 1 \
  --metrics "$out/kept.jsonl"
[ "$(cat "$out/kept.jsonl")" = '{"an earlier job": 1}' ] || { echo "FAIL: a refused job emptied --metrics"; fail=1; }
printf '#orpheus-tokens vocabulary=10 steps=3\n1 2 3 4 5 6 7 8 9 0 1 2\n3 4 5 6 7 8 9 0 1 2 3 4\n' >"$out/tokens"
refused "is a token stream, but model 'mlr' takes feature vectors" -- "$orpheus" train --train "$out/tokens" \
  --clocks 2 --batch 2
sed -e 's/^dim embed = .*/dim embed = 4/' -e 's/^dim hidden = .*/dim hidden = 4/' \
  "$here/../../examples/lstm.loss" >"$out/lstm.loss"
refused "--select 1000 must be at most B\*T = 6" -- "$orpheus" train --model "$out/lstm.loss" --train "$out/tokens" \
  --clocks 2 --batch 2 --select-unit step --select 1000
# --adapt moves C over (example, step) pairs there: its bounds lie in 1:B*T, and a C above B is kept.
refused "--adapt-select 1:7 must lie in 1:6, the B\*T with --select-unit step" -- "$orpheus" train \
  --model "$out/lstm.loss" --train "$out/tokens" --clocks 2 --batch 2 --select-unit step --select 4 --adapt \
  --adapt-select 1:7
"$orpheus" train --model "$out/lstm.loss" --train "$out/tokens" --clocks 2 --batch 2 --select-unit step --select 5 \
  --adapt --adapt-select 1:6 --progress off --log-level warn >/dev/null || { echo "FAIL: --adapt-select 1:6 of pairs"; fail=1; }
for a in "" --adapt; do
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train --model "$out/lstm.loss" --train "$out/tokens" --clocks 2 --batch 2 \
    --select-unit step --select 4 $a --metrics "$out/pairs$a.jsonl" --progress off --log-level warn >/dev/null
done
[ "$(grep -m1 -o '"bytes_sent": [0-9]*' "$out/pairs.jsonl")" = "$(grep -m1 -o '"bytes_sent": [0-9]*' "$out/pairs--adapt.jsonl")" ] &&
  [ -n "$(grep -m1 -o '"bytes_sent": [1-9]' "$out/pairs.jsonl")" ] ||
  { echo "FAIL: --adapt changed --select 4 of 6 pairs before its first decision"; fail=1; }
for schedule in constant step; do
  refused "--warmup 2000000000 must be shorter than --clocks 10" -- "$orpheus" train --train "$fix/small.libsvm" \
    --clocks 10 --batch 2 --lr-schedule "$schedule" $([ "$schedule" = step ] && echo --lr-step-every 5) \
    --warmup 2000000000
done
# A token file with CRLF line ends reads as with LF; a sequence model on other data is named as such.
printf '#orpheus-tokens vocabulary=10 steps=3\r\n1 2 3 4 5 6 7 8 9 0 1 2\r\n3 4 5 6 7 8 9 0 1 2 3 4\r\n' >"$out/crlf"
"$orpheus" train --model "$out/lstm.loss" --train "$out/crlf" --clocks 2 --batch 2 --progress off --log-level warn \
  >/dev/null || { echo "FAIL: a CRLF token file"; fail=1; }
refused "model '.*lstm.loss' is a sequence model: it reads token streams" -- "$orpheus" train --model "$out/lstm.loss" \
  --train "$fix/small.libsvm" --clocks 2 --batch 2
# A gzip-compressed text file is named as such (IDX alone is read compressed).
gzip -c "$fix/small.libsvm" >"$out/small.libsvm.gz"
refused "small.libsvm.gz: the file is gzip-compressed: LIBSVM, CSV and token files are read uncompressed" -- \
  "$orpheus" train --train "$out/small.libsvm.gz" --clocks 2 --batch 2
# So are the test sets of train and eval, each way round.
refused "--test '.*tokens' is a token stream, but model 'mlr' takes feature vectors" -- "$orpheus" train \
  --train "$fix/small.libsvm" --test "$out/tokens" --clocks 2 --batch 2
refused "model '.*lstm.loss' is a sequence model: it reads token streams .*, and --test '.*small.libsvm' is not one" \
  -- "$orpheus" train --model "$out/lstm.loss" --train "$out/tokens" --test "$fix/small.libsvm" --clocks 2 --batch 2
"$orpheus" train --model "$out/lstm.loss" --train "$out/tokens" --clocks 2 --batch 2 --save "$out/lstm.h5" \
  --progress off --log-level warn >/dev/null || { echo "FAIL: the LSTM job eval reads"; fail=1; }
refused "model '.*lstm.loss' is a sequence model: it reads token streams .*, and --test '.*small.libsvm' is not one" \
  -- "$orpheus" eval --params "$out/lstm.h5" --model "$out/lstm.loss" --test "$fix/small.libsvm"
refused "--test '.*tokens' is a token stream, but model 'mlr' takes feature vectors" -- "$orpheus" eval \
  --params "$out/r12.h5" --test "$out/tokens"
# --sv-rank against a sequence model's B*T columns, not its B examples: rank 1 at --batch 2.
"$orpheus" train --model "$out/lstm.loss" --train "$out/tokens" --clocks 2 --batch 2 --sv-rank 1 --progress off \
  --log-level warn >/dev/null || { echo "FAIL: --sv-rank 1 of an LSTM at --batch 2"; fail=1; }
# eval under another model whose parameters fit by name and shape: said (the scores are the given model's).
sed 's/^a = W \* x + b/a = relu(W * x + b)/' "$here/../../examples/mlr.loss" >"$out/relu.loss"
"$orpheus" eval --params "$out/r12.h5" --model "$out/relu.loss" --test "$fix/small.libsvm" 2>&1 >/dev/null |
  grep -q "warning: '.*r12.h5' was trained as model 'mlr' .* and is evaluated as 'relu.loss'" ||
  { echo "FAIL: eval under another model unsaid"; fail=1; }
# eval of a token stream: other steps named as steps, and --features refused beside it.
printf '#orpheus-tokens vocabulary=10 steps=4\n1 2 3 4 5 6 7 8 9 0 1 2 3 4 5\n' >"$out/steps4.tokens"
refused "--test '.*steps4.tokens' has steps=4, the model '.*lstm.h5' was trained on steps=3" -- "$orpheus" eval \
  --params "$out/lstm.h5" --model "$out/lstm.loss" --test "$out/steps4.tokens"
refused "--features applies to feature data; '.*tokens' is a token stream" -- "$orpheus" eval \
  --params "$out/lstm.h5" --model "$out/lstm.loss" --test "$out/tokens" --features 6
# A stream on one line cannot be split between ranks: said as such.
printf '#orpheus-tokens vocabulary=10 steps=3\n1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4\n' >"$out/oneline"
refused "got no tokens: a token stream is split between ranks at line ends" -- "$mpiexec" -n 2 --oversubscribe \
  "$orpheus" train --model "$out/lstm.loss" --train "$out/oneline" --clocks 2 --batch 1
# Ranges say their open ends; a timeout shorter than a millisecond cannot be kept.
refused "--beta2: must be a number >= 0 and < 1, got 1" -- "$orpheus" train --train "$fix/small.libsvm" \
  --optimizer adam --beta2 1
refused "--timeout: must be a number >= 1" -- "$orpheus" train --train "$fix/small.libsvm" --timeout 1e-9
refused "--timeout: must be a number >= 1" -- "$orpheus" train --train "$fix/small.libsvm" --timeout 0.001
# Sizes priced before anything is allocated: replicas, minibatches and outputs; threads.
# Flags the model or data cannot honour: --classes on a token stream, --target-accuracy without
# a predicted class, --balance with per-row data-dependent variables (they would follow the wrong rows).
refused "--classes 20 applies to labelled examples; the token stream '.*small.tokens' sets its words" -- \
  "$orpheus" train --model "$here/../../examples/lstm.loss" --train "$fix/small.tokens" --batch 2 --clocks 3 --classes 20
refused "--target-accuracy 0.5: model '.*tm.loss' predicts no class" -- "$orpheus" train \
  --model "$here/../../examples/tm.loss" --train "$fix/small.libsvm" --test "$fix/small.libsvm" --batch 2 --clocks 4 \
  --target-accuracy 0.5
refused "--balance moves rows between ranks, but model '.*tm.loss' keeps data-dependent variables" -- "$mpiexec" -n 2 \
  --oversubscribe "$orpheus" train --model "$here/../../examples/tm.loss" --train "$fix/small.libsvm" --batch 2 \
  --clocks 4 --balance --balance-every 1 --chunk-rows 1
# --sim-membership onto more ranks than the data has examples: refused before the first clock.
refused "--sim-membership grows the job to 8 ranks, more than the 6 examples of '.*small.libsvm'" -- "$orpheus" \
  simulate --ranks 2 --train "$fix/small.libsvm" --clocks 4 --batch 1 --sim-membership 1:+6
refused "2 replicas of model 'mlr' .* with --batch 2000000000 .* needs .* more than" -- "$orpheus" simulate --ranks 2 \
  --train "$fix/small.libsvm" --batch 2000000000 --clocks 2
refused "1000 replicas of model .* needs .* more than" -- "$orpheus" simulate --ranks 1000 \
  --model "$here/../../examples/mlp_wide.loss" --train "${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}/train-images-idx3-ubyte.gz" \
  --batch 2 --clocks 2 --optimizer adam
refused "--threads: must be an integer in \[1, 1024\], got 100000" -- "$orpheus" train --train "$fix/small.libsvm" \
  --blas-threads 100000
refused "simulate has no checkpoint to continue: leave out --elastic" -- "$orpheus" simulate --ranks 2 \
  --train "$fix/small.libsvm" --clocks 2 --batch 2 --elastic
refused "simulate runs every worker in one process: start it without mpirun" -- "$mpiexec" -n 2 --oversubscribe \
  "$orpheus" simulate --ranks 2 --train "$fix/small.libsvm" --clocks 2 --batch 2
# Synthetic data: its spec sets its shape, each key once, and a shard that cannot fit is priced first.
refused "a shard of 1000000000000 examples of 20 features needs .* more than" -- "$orpheus" train \
  --train synthetic:examples=1000000000000,features=20,classes=3 --clocks 2
refused "synthetic data .*: 'examples' is given twice" -- "$orpheus" train \
  --train synthetic:examples=10,features=20,classes=3,examples=5 --clocks 2
refused "--format applies to data files; synthetic data .* has none" -- "$orpheus" train \
  --train synthetic:examples=10,features=20,classes=3 --format hdf5 --clocks 2
refused "--features 5 applies to LIBSVM and CSV files; synthetic data" -- "$orpheus" train \
  --train synthetic:examples=10,features=20,classes=3 --features 5 --clocks 2
# eval of a synthetic test set scores the training job's own (drawn from the job's seed).
syn=(--test synthetic:examples=50,features=20,classes=3)
"$orpheus" train --train synthetic:examples=200,features=20,classes=3 "${syn[@]}" --clocks 10 --batch 50 --seed 4 \
  --progress off --log-level warn --save "$out/syn.h5" --metrics "$out/syn.jsonl" >/dev/null || { echo "FAIL: synthetic job"; fail=1; }
trained=$(tail -1 "$out/syn.jsonl" | grep -o '"test_loss": *[0-9.e-]*' | sed 's/.*: *//')
scored=$("$orpheus" eval --params "$out/syn.h5" "${syn[@]}" | grep -o '"test_loss": *[0-9.e-]*' | sed 's/.*: *//')
[ -n "$trained" ] && [ "$trained" = "$scored" ] || { echo "FAIL: eval of the synthetic test set: $scored, the job's $trained"; fail=1; }
# A parameter file whose classes attribute disagrees with its W names the attribute.
cp "$out/syn.h5" "$out/syn-attr.h5"
/usr/bin/python3 -c "import h5py, numpy, sys; f = h5py.File(sys.argv[1], 'r+'); f.attrs['classes'] = numpy.int64(7)" \
  "$out/syn-attr.h5"
refused "parameter 'W' in '.*syn-attr.h5' has shape 3x20, but model 'mlr' expects 7x20 at the file's attributes features=20, classes=7" \
  -- "$orpheus" eval --params "$out/syn-attr.h5" "${syn[@]}"
# A features attribute past any data's width, or negative, is named as the file's.
/usr/bin/python3 -c "import h5py, numpy, sys; f = h5py.File(sys.argv[1], 'r+'); f.attrs['features'] = numpy.int64(3000000000)" \
  "$out/syn-attr.h5"
refused "features is too many .*the width of '.*syn-attr.h5''s features attribute, 3000000000" -- "$orpheus" eval \
  --params "$out/syn-attr.h5" --test "$fix/small.libsvm"
/usr/bin/python3 -c "import h5py, numpy, sys; f = h5py.File(sys.argv[1], 'r+'); f.attrs['features'] = numpy.int64(-1)" \
  "$out/syn-attr.h5"
refused "parameter file '.*syn-attr.h5': its features \(-1\) and classes \(7\) attributes must not be negative" -- \
  "$orpheus" eval --params "$out/syn-attr.h5" --test "$fix/small.libsvm"
refused "--format and --features apply to data files; synthetic data" -- "$orpheus" eval --params "$out/syn.h5" \
  "${syn[@]}" --format csv
# An unreadable --adapt-trace is one line for the job, not one a rank.
printf '{"summary": true}\n' >"$out/trace.jsonl"
refused "--adapt-trace '.*trace.jsonl' holds no per-clock metrics line" -- "$mpiexec" -n 2 --oversubscribe "$orpheus" \
  train --train "$fix/small.libsvm" --clocks 20 --batch 2 --adapt --adapt-every 5 --adapt-trace "$out/trace.jsonl"
# Checkpoint flags with no checkpoint to shape: refused (the job would keep none, unsaid).
small=(--train "$fix/small.libsvm" --clocks 2 --batch 2)
refused "--ckpt-dir '.*nock' is written with --ckpt sv or --ckpt matrix, and read with --resume" -- "$orpheus" train \
  "${small[@]}" --ckpt-dir "$out/nock"
[ ! -e "$out/nock" ] || { echo "FAIL: --ckpt-dir made without a checkpoint"; fail=1; }
refused "--overwrite replaces the job in --ckpt-dir: it needs --ckpt sv or --ckpt matrix" -- "$orpheus" train \
  "${small[@]}" --overwrite
refused "--ckpt-every 5 applies to --ckpt matrix" -- "$orpheus" train "${small[@]}" --ckpt sv --ckpt-dir "$out/c5" \
  --ckpt-every 5
refused "--snapshot-every shape the SV log: they need --ckpt sv" -- "$orpheus" train "${small[@]}" --ckpt matrix \
  --ckpt-dir "$out/c6" --snapshot-every 2
refused "--snapshot-every 2 counts averaging barriers: it needs --average-every R" -- "$orpheus" train "${small[@]}" \
  --ckpt sv --ckpt-dir "$out/c7" --snapshot-every 2
# --target-accuracy: reached or not, the console says so (train and simulate), and a
# target first met at the last clock counts as reached.
target=(--train synthetic:examples=400,features=20,classes=3 --test synthetic:examples=100,features=20,classes=3
        --eval-every 1 --progress off --log-level warn)
"$orpheus" train "${target[@]}" --target-accuracy 0.99 --clocks 3 | grep -q -- "--target-accuracy 0.99 not reached in 3 clocks" ||
  { echo "FAIL: an unmet target unsaid"; fail=1; }
for command in train "simulate --ranks 2"; do
  # shellcheck disable=SC2086
  "$orpheus" $command "${target[@]}" --target-accuracy 0.3 --clocks 1 --metrics "$out/t.jsonl" |
    grep -q -- "--target-accuracy 0.3 reached at clock 1" || { echo "FAIL: $command: a met target unsaid"; fail=1; }
  grep -q '"reached_target": *true' "$out/t.jsonl" || { echo "FAIL: $command: reached_target at the last clock"; fail=1; }
done
# A job of one rank has no peer to multicast to: every --multicast trains, with the summary line's grammar.
for multicast in random ring fixed; do
  "$orpheus" train "${target[@]}" --clocks 2 --multicast $multicast --fanout 1 | grep -q "on 1 rank: 2 clocks" ||
    { echo "FAIL: one rank with --multicast $multicast --fanout 1 did not train"; fail=1; }
done
# Flags that shape nothing in a job are said on the console (warned: a resumed job repeats its record's flags).
said() {
  local pattern=$1 err; shift
  # Read whole first: grep -q on a pipe may leave before the job ends, which then dies of SIGPIPE.
  err=$("$@" --progress off --log-level warn 2>&1 >/dev/null)
  grep -q -- "$pattern" <<<"$err" || { echo "FAIL: no '$pattern' from $*"; fail=1; }
}
# --resume sets a damaged segment aside by name, not without a word (here the snapshot of clock 60 is the
# resume point, so nothing is redone).
resumed=(--train "$fix/small.libsvm" --batch 2 --ckpt sv --ckpt-dir "$out/damaged-seg" --average-every 20 --timeout 30)
"$mpiexec" -n 2 --oversubscribe "$orpheus" train "${resumed[@]}" --clocks 60 --progress off --log-level warn >/dev/null ||
  { echo "FAIL: the job whose segment is damaged"; fail=1; }
truncate -s 1000 "$out/damaged-seg/replica-0/seg-000000000051-000000000060.h5"
said "warning: '.*replica-0/seg-000000000051-000000000060.h5' is damaged (.*): set aside as" "$mpiexec" -n 2 \
  --oversubscribe "$orpheus" train "${resumed[@]}" --clocks 70 --resume
# A .loss model's parameters record its text's digest: an edited file under the same name
# is said, a renamed copy of the same text is not.
mkdir -p "$out/edited" "$out/renamed"
cp "$out/relu.loss" "$out/edited/relu.loss"
"$orpheus" train --model "$out/edited/relu.loss" --train "$fix/small.libsvm" --clocks 2 --batch 4 \
  --save "$out/relu.h5" --progress off --log-level warn >/dev/null || { echo "FAIL: the relu job eval reads"; fail=1; }
cp "$out/relu.loss" "$out/renamed/other.loss"
! "$orpheus" eval --params "$out/relu.h5" --model "$out/renamed/other.loss" --test "$fix/small.libsvm" 2>&1 \
  >/dev/null | grep -q "warning" || { echo "FAIL: a renamed copy of the same .loss text warned of"; fail=1; }
sed -i 's/relu(W \* x + b)/relu(W * x + b) * 2/' "$out/edited/relu.loss"
"$orpheus" eval --params "$out/relu.h5" --model "$out/edited/relu.loss" --test "$fix/small.libsvm" 2>&1 >/dev/null |
  grep -q "warning: '.*relu.h5' was trained with another text of '.*edited/relu.loss' (digest [0-9a-f]*:[0-9a-f]* then, [0-9a-f]*:[0-9a-f]* now)" ||
  { echo "FAIL: eval under an edited .loss of the same name unsaid"; fail=1; }
said "warning: --eval-every 5 evaluates on the test data: without --test it has nothing to do" "$orpheus" train \
  --train "$fix/small.libsvm" --clocks 2 --batch 2 --eval-every 5
said "--select-method jmcss has nothing to select" "$orpheus" train --train "$fix/small.libsvm" --clocks 2 --batch 2 \
  --select-method jmcss
said "on --device cpu they have nothing to do" "$orpheus" train --train "$fix/small.libsvm" --clocks 2 --batch 2 \
  --transfer sync
# A quasi-Newton optimizer on compressed gradients is warned of.
said "warning: --optimizer bfgs with --sv-rank 1: its curvature pairs" "$orpheus" train \
  --train synthetic:examples=200,features=8,classes=3 --clocks 2 --batch 4 --optimizer bfgs --sv-rank 1
# Averaging and rotation of replicas an all-reduce keeps the same change nothing, and say so.
said "warning: --average-every 2: --sync dense keeps every replica the same" "$mpiexec" -n 2 --oversubscribe \
  "$orpheus" train --train "$fix/small.libsvm" --clocks 2 --batch 2 --sync dense --average-every 2
said "warning: --rotate-every 2: --sync powersgd keeps every replica the same" "$mpiexec" -n 2 --oversubscribe \
  "$orpheus" train --train "$fix/small.libsvm" --clocks 2 --batch 2 --sync powersgd --sv-rank 1 --rotate-every 2
# --sync powersgd at a rank that compresses no parameter is dense all-reduce, and says so.
said "warning: --sync powersgd --sv-rank 1: no parameter of this model is compressed" "$orpheus" train \
  --train synthetic:examples=100,features=4,classes=2 --clocks 2 --batch 4 --sync powersgd --sv-rank 1
# Flags that shape nothing in this job: --select-unit step without --sync sv, --adapt and
# --balance on one rank, --param-digests without --metrics.
said "warning: --select-unit step shapes the SVGs --sync sv sends: --sync dense sends gradients" "$orpheus" train \
  --model "$out/lstm.loss" --train "$out/tokens" --clocks 2 --batch 2 --select-unit step --sync dense
said "warning: one rank: --adapt has nothing to do" "$orpheus" train --train "$fix/small.libsvm" --clocks 2 --batch 2 \
  --adapt
# --adapt: knobs outside their bounds move in before the first clock, and it is said; a
# trace that ends before the job is said too.
printf '{"clock": 1, "compute_seconds": 0.01}\n{"clock": 2, "compute_seconds": 0.01}\n' >"$out/short.jsonl"
said "warning: --adapt starts at C=3 Q=1 s=0 R=0, not at the flags' knobs: C=2 Q=1 s=0 R=0 lies outside the --adapt-\* bounds" \
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train --train "$fix/small.libsvm" --clocks 6 --batch 4 --select 2 \
  --adapt --adapt-every 3 --adapt-select 3:4
said "warning: --adapt-trace '.*short.jsonl' ends at clock 2: the 4 clocks after it take its last line's times" \
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train --train "$fix/small.libsvm" --clocks 6 --batch 4 --adapt \
  --adapt-every 3 --adapt-trace "$out/short.jsonl"
# Periods past the job, links to drop on one rank, averaging of replicas that cannot differ.
said "warning: --average-every 50 is longer than the job's 6 clocks: it never averages the replicas" \
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train --train "$fix/small.libsvm" --clocks 6 --batch 2 --select 1 \
  --average-every 50
said "warning: --lr-step-every 9 is longer than the job's 2 clocks: it never decays --lr" "$orpheus" train \
  --train "$fix/small.libsvm" --clocks 2 --batch 2 --lr-schedule step --lr-step-every 9
said "warning: one rank: --drop-links 0.5 has no links to drop" "$orpheus" train --train "$fix/small.libsvm" \
  --clocks 2 --batch 2 --drop-links 0.5
said "warning: one rank: --fanout 3 has no peers to send to" "$orpheus" train --train "$fix/small.libsvm" \
  --clocks 2 --batch 2 --multicast random --fanout 3
said "warning: --average-every 2: under BSP, with every SVG sent to every rank, every replica applies the same" \
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train --train "$fix/small.libsvm" --clocks 4 --batch 2 --average-every 2
# --overlap where a clock's SVs cannot stream; --balance that can move nothing; --select-unit
# step under --sv-rank.
said "warning: --overlap: under --consistency ssp a clock's SVs are sent once the backward pass ends" \
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train --model "$here/../../examples/mlp.loss" \
  --train "$fix/small.libsvm" --clocks 2 --batch 2 --overlap on --consistency ssp --staleness 1
said "warning: --chunk-rows 256: rank 0's shard of [0-9]* rows is one chunk, and a rank keeps at least one" \
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train --train "$fix/small.libsvm" --clocks 2 --batch 2 --balance
said "warning: --balance-every 20 is longer than the job's 2 clocks: it never moves data between ranks" \
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train --train "$fix/small.libsvm" --clocks 2 --batch 2 --balance \
  --chunk-rows 1
said "warning: --select-unit step picks the (example, step) pairs a selection sends: --sv-rank 1 compresses" \
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train --model "$out/lstm.loss" --train "$out/tokens" --clocks 2 \
  --batch 2 --sv-rank 1 --select-unit step
# simulate's stragglers: a fraction of 0 or a factor of 1 slows nobody.
refused "--sim-slow: FRACTION in \(0, 1\] and FACTOR > 1 \(else no worker is slowed\)" -- "$orpheus" simulate \
  --ranks 2 --train "$fix/small.libsvm" --clocks 2 --batch 2 --sim-slow 0:2
refused "--sim-slow: FRACTION in \(0, 1\] and FACTOR > 1" -- "$orpheus" simulate --ranks 2 --train "$fix/small.libsvm" \
  --clocks 2 --batch 2 --sim-slow 0.5:1
said "warning: one rank: --balance has nothing to do" "$orpheus" train --train "$fix/small.libsvm" --clocks 2 \
  --batch 2 --balance
said "warning: --param-digests adds each clock's digest to the metrics" "$orpheus" train --train "$fix/small.libsvm" \
  --clocks 2 --batch 2 --param-digests
# --sv-rank past what a matrix holds saves nothing on it, and says so; a rank that saves says nothing.
said "warning: --sv-rank 40: its 41 SVGs of J + K floats are no fewer than the J K floats of 'W' (3x4)" "$orpheus" \
  train --train "$fix/small.libsvm" --clocks 2 --batch 50 --sv-rank 40
if "$orpheus" train --train synthetic:examples=100,features=20,classes=3 --clocks 2 --batch 4 --sv-rank 1 --progress off \
  --log-level warn 2>&1 | grep -q "the rank saves nothing"; then echo "FAIL: --sv-rank 1 of a 3x20 matrix warned"; fail=1; fi
# simulate takes the model and data rules train takes.
refused "--select-unit step selects \(example, step\) pairs: model 'mlr' has no steps" -- "$orpheus" simulate \
  --ranks 2 --train synthetic:examples=100,features=4,classes=2 --clocks 2 --select-unit step
refused "--features 5 applies to LIBSVM and CSV files; the token stream '.*small.tokens' sets its vocabulary" -- \
  "$orpheus" simulate --ranks 2 --train "$fix/small.tokens" --model "$here/../../examples/lstm.loss" --features 5 \
  --clocks 2 --batch 4
# A word where a command belongs is named, with the commands there are.
refused "'frobnicate' is not a command: train, simulate, eval, restore, ctl, inspect" -- "$orpheus" frobnicate
refused "ctl: 'frobnicate' is not a command: shrink, grow" -- "$orpheus" ctl "$out" frobnicate
refused "ctl: give a command: shrink, grow" -- "$orpheus" ctl "$out"
# A job of one rank under --sync sv says that no SV leaves it, and what --sync dense saves.
"$orpheus" train --train "$fix/small.libsvm" --clocks 2 --batch 2 --progress off 2>&1 >/dev/null |
  grep -q -- "note: one rank: no SV leaves it, .*--sync dense computes the same update" ||
  { echo "FAIL: no one-rank note from --sync sv"; fail=1; }
# More compute threads than the host gives (or than BLAS runs) are said, not silently time-sliced.
said "warning: --threads 1024: " "$orpheus" train --train "$fix/small.libsvm" \
  --clocks 2 --batch 2 --threads 1024
# A single process that diverges ends with its one line: no launcher banner under it.
{ printf 'param W[classes, features]\ninput x[features]\nlabel y[classes]\na0 = W * x\n'
  for i in $(seq 1 59); do printf 'a%d = a%d + a%d\n' "$i" $((i - 1)) $((i - 1)); done
  printf 'loss cross_entropy(softmax(a59), y)\n'; } >"$out/chain.loss"
"$orpheus" train --model "$out/chain.loss" --train synthetic:examples=200,features=8,classes=3 --clocks 30 --batch 4 \
  --progress off --log-level warn --lr 1000000 --save "$out/diverged.h5" >/dev/null 2>"$out/diverged.err"
rc=$?
if [ $rc -ne 2 ] || [ "$(grep -c . "$out/diverged.err")" -ne 1 ] ||
  ! grep -q "^orpheus: training diverged at clock [0-9]*: the loss is not finite on rank 0 " "$out/diverged.err" ||
  [ -e "$out/diverged.h5" ]; then
  echo "FAIL: divergence of one process (exit $rc):"; cat "$out/diverged.err"; fail=1
fi
printf 'param W[classes, features] init normal(0.01)\nparam b[classes] init zeros\ninput x[features]\nlabel y[classes]\na = W * x + b\nloss sum(log(a))\npredict a\n' >"$out/log.loss"
# Ranks that diverge at one clock are named in one line, not one line each.
refused "training diverged at clock [0-9]+: the loss is not finite on ranks 0, 1 \(lower --lr\)" -- \
  "$mpiexec" -n 2 --oversubscribe "$orpheus" train --model "$out/chain.loss" \
  --train synthetic:examples=200,features=8,classes=3 --clocks 30 --batch 4 --progress off --log-level warn \
  --lr 1000000 --save "$out/diverged2.h5"
# The metrics file of an earlier job is kept aside as FILE.prev while the live log
# replaces it, and goes only when a job ends well: a job killed mid-run loses nothing.
echo '{"an earlier job": 2}' >"$out/live.jsonl"
"$orpheus" train --train "$fix/small.libsvm" --clocks 100000 --batch 2 --inject-delay 0:20 --metrics "$out/live.jsonl" \
  --progress off --log-level warn >/dev/null 2>&1 &
killed=$!
for _ in $(seq 1 300); do grep -q '"clock": 2,' "$out/live.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -9 "$killed"; wait "$killed" 2>/dev/null
[ "$(cat "$out/live.jsonl.prev" 2>&1)" = '{"an earlier job": 2}' ] && grep -q '"clock": 1,' "$out/live.jsonl" ||
  { echo "FAIL: a job that was killed lost the earlier --metrics file"; fail=1; }
# The next job keeps that FILE.prev (the failed job's partial file is what it replaces).
# (Output to a file, not a pipe into grep -q, whose early exit would end the job.)
"$orpheus" train --train "$fix/small.libsvm" --clocks 2 --batch 2 --metrics "$out/live.jsonl" --progress off \
  >"$out/live.out" 2>&1
grep -q -- "the earlier '$out/live.jsonl.prev' stays until this job ends well" "$out/live.out" ||
  { echo "FAIL: --metrics did not say it kept the earlier file"; fail=1; }
[ ! -e "$out/live.jsonl.prev" ] && [ "$(grep -c '"clock": [12],' "$out/live.jsonl")" -eq 2 ] ||
  { echo "FAIL: a job that ended well kept --metrics' earlier file"; fail=1; }
"$orpheus" train --train "$fix/small.libsvm" --clocks 2 --batch 2 --metrics "$out/live.jsonl" --progress off \
  >"$out/live.out" 2>&1
grep -q -- "the earlier '$out/live.jsonl' is kept as '$out/live.jsonl.prev' until this job ends well" "$out/live.out" ||
  { echo "FAIL: --metrics did not say it set the earlier file aside"; fail=1; }
[ ! -e "$out/live.jsonl.prev" ] || { echo "FAIL: a job that ended well kept --metrics' earlier file"; fail=1; }
# From the first clock the model is named before the learning rate, and a weight decay is named.
refused "training diverged at clock 1: the loss is not finite on rank 0 \(at the first clock: check the model.s init" -- \
  "$orpheus" train --model "$out/log.loss" --train "$fix/small.libsvm" --batch 2 --clocks 3
refused "training diverged at clock [0-9]*: the loss is not finite on rank 0 \(lower --lr or --weight-decay 1000000\)" -- \
  "$orpheus" train --train synthetic:examples=60,features=8,classes=3 --batch 4 --clocks 20 --weight-decay 1e6
[ ! -e "$out/diverged2.h5" ] || { echo "FAIL: a model saved by the job that diverged"; fail=1; }
# simulate's network model: rates below 1 kbit/s would overflow the virtual clock.
sim=(simulate --ranks 2 --train synthetic:examples=100,features=4,classes=2 --clocks 2 --batch 4)
refused "--sim-link-gbps 2.3e-308 must be at least 1e-06" -- "$orpheus" "${sim[@]}" --sim-link-gbps 2.3e-308
refused "--sim-core-gbps 1e-300 must be 0 \(full bisection\) or at least 1e-06" -- "$orpheus" "${sim[@]}" \
  --sim-core-gbps 1e-300
# Token streams: the file's line of a bad id from any rank; a test stream of other steps
# or a larger vocabulary named as such; a vocabulary too large for the header said so.
printf '#orpheus-tokens vocabulary=10 steps=3\n1 2 3 4 5 6 7 8 9 0 1 2\n3 4 5 6 7 8 9 10 1 2 3 4\n' >"$out/beyond.tokens"
refused "beyond.tokens:3: '10' is not a token id below the vocabulary size 10" -- "$mpiexec" -n 2 --oversubscribe \
  "$orpheus" train --model "$out/lstm.loss" --train "$out/beyond.tokens" --clocks 2 --batch 1
printf '#orpheus-tokens vocabulary=10 steps=4\n' >"$out/train4.tokens"
printf '#orpheus-tokens vocabulary=10 steps=2\n' >"$out/test2.tokens"
printf '#orpheus-tokens vocabulary=12 steps=4\n' >"$out/test12.tokens"
for f in train4 test2 test12; do for i in $(seq 1 20); do echo "1 2 3 4 5 6 7 8 9"; done >>"$out/$f.tokens"; done
echo "11 11 11" >>"$out/test12.tokens"
refused "--test '.*test2.tokens' has steps=2, the training stream '.*train4.tokens' steps=4" -- "$orpheus" train \
  --model "$out/lstm.loss" --train "$out/train4.tokens" --test "$out/test2.tokens" --clocks 2 --batch 2
refused "--test '.*test12.tokens' has vocabulary=12, more than the model's 10 words" -- "$orpheus" train \
  --model "$out/lstm.loss" --train "$out/train4.tokens" --test "$out/test12.tokens" --clocks 2 --batch 2
printf '#orpheus-tokens vocabulary=99999999999999999999 steps=4\n1 2 3\n' >"$out/hugevocab.tokens"
refused "hugevocab.tokens:1: 'vocabulary' is too large" -- "$orpheus" train --model "$out/lstm.loss" \
  --train "$out/hugevocab.tokens" --clocks 2 --batch 2
# --features is for files of feature vectors: a token stream's vocabulary is its header's.
refused "--features 5 applies to LIBSVM and CSV files; the token stream '.*train4.tokens' sets its vocabulary" -- \
  "$orpheus" train --model "$out/lstm.loss" --train "$out/train4.tokens" --features 5 --clocks 2 --batch 2
# --adapt-comm-share is a share of the compute time: bounded.
refused "--adapt-comm-share 1e\+308 must be > 0 and at most 100" -- "$orpheus" train --train "$fix/small.libsvm" \
  --clocks 2 --batch 2 --adapt --adapt-comm-share 1e308
exit $fail
